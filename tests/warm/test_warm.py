"""Warm starts end to end: real launches (`python -m elastic_hydra`), real templates and forks.

The workers are plain Python (`warm.imports` names small standard or test modules, so the tests
stay fast); one test imports torch, as the feature is for. The differential tests launch the
same job cold and warm and compare what the workers saw, fact by fact, and the failure report.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic_hydra.agent.inherit import SNAPSHOTS
from tests.conftest import WORKERS, alive, wait_for
from tests.harness import run_raw, started

pytestmark = pytest.mark.timeout(120)

FACTS = str(WORKERS / "process_facts.py")
FAIL = str(WORKERS / "fail.py")
LAUNCH_TIMEOUT = 60
# A module that notes each import of it: a restart forked from the template imports nothing again.
COUNTED = "import os\nwith open(os.environ['COUNTED_FILE'], 'a') as f:\n    f.write('x')\n"


class Launch:
    def __init__(self, proc: subprocess.CompletedProcess[bytes], logs_root: Path) -> None:
        self.proc = proc
        self.stderr = proc.stderr.decode(errors="replace")
        (found,) = logs_root.glob("*/*/summary.json")
        self.run_dir = found.parent
        self.summary: dict[str, Any] = json.loads(found.read_text())

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = (self.run_dir / "events.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == kind]


def launch(
    tmp_path: Path, name: str, *overrides: str, args: tuple[str, ...] = (), **env: str
) -> Launch:
    logs_root = tmp_path / name
    proc = run_raw(
        *overrides,
        f"logs.root={logs_root}",
        "stop_grace=2",
        "logs=quiet",
        *(["--", *args] if args else []),
        cwd=tmp_path,
        env=env,
        timeout=LAUNCH_TIMEOUT,
    )
    return Launch(proc, logs_root)


def facts_of(out: Path, rank: int, attempt: int = 0) -> dict[str, Any]:
    return dict(json.loads((out / f"facts_{rank}_{attempt}.json").read_text()))


def forked(agent: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The live template and the live warm workers of the agent `agent`.

    A forked worker keeps the template's command line (`ps` shows template.py for both): the
    template's stdout is /dev/null, a worker's is its log file or pipe."""
    templates: list[psutil.Process] = []
    workers: list[psutil.Process] = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if not (any(p.endswith("warm/template.py") for p in cmd) and str(agent) in cmd):
            continue
        try:
            out = os.readlink(f"/proc/{proc.pid}/fd/1")
        except OSError:
            continue
        (templates if out == os.devnull else workers).append(proc)
    return templates, workers


# ------------------------------------------------------------------------------ forks, restarts
def test_workers_and_restarts_are_forked_from_one_template(tmp_path: Path) -> None:
    (tmp_path / "counted.py").write_text(COUNTED)
    counted = tmp_path / "imports.txt"
    out = tmp_path / "out"
    out.mkdir()
    run = launch(
        tmp_path, "logs", f"script={FACTS}", "nproc_per_node=2", "warm.imports=[counted]",
        "restart.max_restarts=1", args=(str(out),),
        PYTHONPATH=str(tmp_path), COUNTED_FILE=str(counted), FACTS_PROBE_MODULE="counted",
        FACTS_FAIL_ATTEMPT="0",
    )  # fmt: skip
    assert run.proc.returncode == 0, run.stderr
    assert run.summary["restarts"] == 1
    for rank in (0, 1):
        for attempt in (0, 1):
            facts = facts_of(out, rank, attempt)
            assert facts["probe_imported"] is True  # forked: the template's import is there
            assert facts["own_session"] and facts["own_group"]
    # Imported once, by the template: neither the four workers nor the restart imported it.
    assert counted.read_text() == "x"
    assert run.events("warm_fallback") == []


def test_a_module_beside_the_script_can_be_imported_warm(tmp_path: Path) -> None:
    app = tmp_path / "app"  # not the cwd, not on PYTHONPATH: found as the script's neighbour
    app.mkdir()
    (app / "facts.py").write_text(Path(FACTS).read_text())
    (app / "neighbour.py").write_text("VALUE = 1\n")
    out = tmp_path / "out"
    out.mkdir()
    run = launch(
        tmp_path, "logs", f"script={app / 'facts.py'}", "nproc_per_node=2",
        "warm.imports=[neighbour]", args=(str(out),), FACTS_PROBE_MODULE="neighbour",
    )  # fmt: skip
    assert run.proc.returncode == 0, run.stderr
    assert run.events("warm_fallback") == []
    assert facts_of(out, 1)["probe_imported"] is True


def test_cold_without_warm_imports(tmp_path: Path) -> None:
    (tmp_path / "counted.py").write_text(COUNTED)
    out = tmp_path / "out"
    out.mkdir()
    run = launch(
        tmp_path, "logs", f"script={FACTS}", "nproc_per_node=2", args=(str(out),),
        PYTHONPATH=str(tmp_path), COUNTED_FILE=str(tmp_path / "n.txt"),
        FACTS_PROBE_MODULE="counted",
    )  # fmt: skip
    assert run.proc.returncode == 0, run.stderr
    assert facts_of(out, 0)["probe_imported"] is False


# ---------------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("raise RuntimeError('no GPU driver here')", "cannot import broken: RuntimeError: no GPU"),
        (
            "import threading, time\nthreading.Thread(target=time.sleep, args=(30,),"
            " daemon=True).start()\n",
            "2 threads alive after the imports",
        ),
    ],
    ids=["import-error", "thread"],
)
def test_an_unsafe_template_falls_back_to_cold_starts_once(
    tmp_path: Path, source: str, reason: str
) -> None:
    (tmp_path / "broken.py").write_text(source)
    out = tmp_path / "out"
    out.mkdir()
    logs_root = tmp_path / "logs"
    proc = run_raw(
        f"script={FACTS}", "nproc_per_node=2", "warm.imports=[broken]", "restart.max_restarts=1",
        f"logs.root={logs_root}", "--", str(out),
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "FACTS_FAIL_ATTEMPT": "0"},
        timeout=LAUNCH_TIMEOUT,
    )  # fmt: skip
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, stderr
    notices = [line for line in stderr.splitlines() if "warm starts off" in line]
    assert len(notices) == 1, stderr  # once, for two attempts of two workers
    assert reason in notices[0]
    (found,) = logs_root.glob("*/*/events.jsonl")
    events = [e for e in map(json.loads, found.read_text().splitlines())]
    fallbacks = [e for e in events if e["event"] == "warm_fallback"]
    assert len(fallbacks) == 1 and reason in fallbacks[0]["reason"]
    for attempt in (0, 1):  # both attempts ran, cold
        assert facts_of(out, 1, attempt)["own_session"] is True


def test_cmd_and_bootstrap_false_start_cold(tmp_path: Path) -> None:
    from tests.harness import plan_of

    script = str(WORKERS / "idle.py")
    assert plan_of(f"script={script}", "warm.imports=[json]").warm.imports == ("json",)
    assert plan_of(f"script={script}", "warm.imports=[json]", "bootstrap=false").warm.imports == ()
    assert plan_of("cmd=true", "warm.imports=[json]").warm.imports == ()


def test_a_bad_module_name_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run_raw(f"script={FACTS}", "warm.imports=[torch nn]", cwd=tmp_path, timeout=60)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert "error: warm.imports: not a module name (got 'torch nn')" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------- cold == warm, facts
def _normalised(facts: dict[str, Any], run: Launch, out: Path) -> dict[str, Any]:
    """Facts with what differs between any two launches (run dir, port, run id, time, the
    snapshot area) masked."""
    text = json.dumps(facts).replace(str(run.run_dir), "<run>").replace(str(out), "<out>")
    data = dict(json.loads(text))
    per_launch = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "ELASTIC_HYDRA_LAUNCH_TIME", SNAPSHOTS)
    for key in per_launch:
        data["env"][key] = "<per launch>"
    data.pop("ppid")
    # Descriptors above 2 by kind: rank 0's store socket has the number the agent's has.
    fds = data.pop("fds")
    data["stdio"] = [fds.get(str(n)) for n in range(3)]
    data["more_fds"] = sorted(kind for n, kind in fds.items() if int(n) > 2)
    return data


def test_a_warm_worker_sees_what_a_cold_one_sees(tmp_path: Path) -> None:
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode in ("cold", "warm"):
        out = tmp_path / f"out_{mode}"
        out.mkdir()
        options = ["warm.imports=[json,xml.dom.minidom]"] if mode == "warm" else []
        run = launch(
            tmp_path, mode, f"script={FACTS}", "nproc_per_node=2", *options,
            args=(str(out), "two words", "k=v,w"),
        )  # fmt: skip
        assert run.proc.returncode == 0, run.stderr
        runs[mode] = [_normalised(facts_of(out, r), run, out) for r in (0, 1)]
    for cold, warm in zip(runs["cold"], runs["warm"], strict=True):
        assert {k: v for k, v in warm["env"].items() if cold["env"].get(k) != v} == {}
        assert {k: v for k, v in cold["env"].items() if warm["env"].get(k) != v} == {}
        assert warm == cold
        assert warm["stdin"] == "/dev/null" and warm["unbuffered"] is True


def test_a_warm_worker_is_the_agents_child(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with started(
        f"script={FACTS}", "nproc_per_node=2", "warm.imports=[json]",
        f"logs.root={tmp_path / 'logs'}", "logs=quiet", "--", str(out), cwd=tmp_path,
    ) as agent:  # fmt: skip
        assert agent.wait(timeout=LAUNCH_TIMEOUT) == 0
    assert {facts_of(out, r)["ppid"] for r in (0, 1)} == {agent.pid}


# ------------------------------------------------------------------- cold == warm, the report
def _report(run: Launch) -> dict[str, Any]:
    cause = dict(run.summary["root_cause"])
    for key in ("pid", "time", "error_file", "stdout_log", "stderr_log"):
        cause.pop(key)
    return cause


@pytest.mark.parametrize("mode", ["raise", "segv", "kill", "exit3"])
def test_a_warm_failure_is_reported_as_a_cold_one(tmp_path: Path, mode: str) -> None:
    reports, printed = [], []
    for warm in ((), ("warm.imports=[json]",)):
        run = launch(
            tmp_path, f"logs{len(warm)}", f"script={FAIL}", "nproc_per_node=2", *warm,
            args=(mode,),
        )  # fmt: skip
        assert run.proc.returncode == 1, run.stderr
        reports.append(_report(run))
        text = run.stderr.replace(str(run.run_dir), "<run>")
        printed.append(re.sub(r"pid \d+|\d+:\d+:\d+\.\d+|\d+\.\d+ s|\n\d\s+\d\s+\d+", "#", text))
    assert reports[1] == reports[0]
    assert printed[1] == printed[0]


# -------------------------------------------------------------------- stop, agent death
def test_a_signal_to_the_agent_stops_warm_workers_as_cold_ones(tmp_path: Path) -> None:
    with started(
        f"script={WORKERS / 'idle.py'}", "nproc_per_node=2", "warm.imports=[json]",
        f"logs.root={tmp_path / 'logs'}", "logs=quiet", "stop_grace=5", cwd=tmp_path,
    ) as agent:  # fmt: skip
        wait_for(lambda: len(forked(agent.pid)[1]) == 2, 30, "two warm workers")
        templates, workers = forked(agent.pid)
        assert len(templates) == 1
        assert {w.ppid() for w in workers} == {agent.pid}
        os.kill(agent.pid, signal.SIGTERM)
        assert agent.wait(timeout=30) == 128 + signal.SIGTERM
    assert alive([*templates, *workers]) == []


def test_nothing_outlives_a_sigkilled_agent(tmp_path: Path) -> None:
    with started(
        f"script={WORKERS / 'idle.py'}", "nproc_per_node=2", "warm.imports=[json]",
        f"logs.root={tmp_path / 'logs'}", "logs=quiet", cwd=tmp_path,
    ) as agent:  # fmt: skip
        wait_for(lambda: len(forked(agent.pid)[1]) == 2, 30, "two warm workers")
        templates, workers = forked(agent.pid)
        left = [*psutil.Process(agent.pid).children(recursive=True), *templates, *workers]
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
        wait_for(lambda: not alive(left), 10, "the template and the workers to die with it")


# ---------------------------------------------------------------------------------- torch
def test_torch_workers_forked_warm_allreduce_and_restart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run = launch(
        tmp_path, "logs", f"script={WORKERS / 'warm_torch.py'}", "nproc_per_node=2",
        "warm.imports=[torch]", "restart.max_restarts=1", args=(str(out),),
    )  # fmt: skip
    assert run.proc.returncode == 0, run.stderr
    assert run.summary["restarts"] == 1
    assert run.events("warm_fallback") == []
    for name in ("0_0", "1_0", "0_1", "1_1"):
        result = json.loads((out / f"{name}.json").read_text())
        assert result == {"preloaded": True, "sum": 3.0}


# ---------------------------------------------------------------------------------- hang watch
def test_the_hang_watch_sees_a_warm_worker_hang(tmp_path: Path) -> None:
    run = launch(
        tmp_path, "logs", f"script={WORKERS / 'idle.py'}", "nproc_per_node=2",
        "warm.imports=[json]", "hang.timeout=1", "hang.action=fail", "hang.grace=1",
    )  # fmt: skip
    assert run.proc.returncode == 1, run.stderr
    (hang,) = run.events("hang")
    assert "idle.py" in run.stderr or "sleep" in hang["verdict"], (hang, run.stderr)
    stacks = (run.run_dir / "attempt_0" / "0" / "stacks.txt").read_text()
    assert "idle.py" in stacks
    assert "template.py" not in hang["verdict"] and "template.py" not in run.stderr
