"""The local agent end to end: the real CLI, real worker processes, real signals and files.

Every launch runs `python -m elastic_hydra` in a subprocess with `tmp_path` as its working directory
(so run dirs land there) and plain-Python workers from tests/scripts/ (no torch). Nothing sleeps to
wait for the launcher: tests poll files and conditions against deadlines. Workers that outlive their
agent are reparented away from this process, so the tests check their pids themselves (a zombie
counts as gone: this machine's pid 1 does not reap orphans) and kill leftovers by pid.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml  # type: ignore[import-untyped]

from elastic_hydra.agent.events import Event, Finish, SignalReceived, WorkerExited, WorkersStarted
from elastic_hydra.agent.outcome import Status
from elastic_hydra.report import events_file
from tests.conftest import ELASTIC_HYDRA, REPO, WORKERS, wait_for
from tests.harness import launcher_env, on_a_terminal, run_raw, started

pytestmark = pytest.mark.timeout(60)

SLEEPER = str(WORKERS / "sleeper.py")
EXIT_CODE = str(WORKERS / "exit_code.py")
SPAM = str(WORKERS / "spam.py")
DUMP_ENV = str(WORKERS / "dump_env.py")
WAIT_FILE = str(WORKERS / "wait_file.py")
LAUNCH_TIMEOUT = 30  # seconds for one launch that should end by itself


# ------------------------------------------------------------------------------------- helpers
def gone(pid: int) -> bool:
    """The process no longer runs (exited and reaped, or a zombie nobody reaps)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def kill_leftovers(pids: Sequence[int]) -> None:
    """SIGKILL processes this test started (indirectly) that are still alive."""
    for pid in pids:
        if not gone(pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def read_markers(marker_dir: Path, nproc: int) -> list[dict[str, Any]]:
    """The ready markers of all ranks, once every one exists."""
    paths = [marker_dir / f"ready_{r}" for r in range(nproc)]
    wait_for(lambda: all(p.exists() for p in paths), 20, f"{nproc} ready markers in {marker_dir}")
    return [json.loads(p.read_text()) for p in paths]


def marker_pids(marker_dir: Path) -> list[int]:
    pids = []
    for path in marker_dir.glob("ready_*"):
        if not path.name.endswith(".tmp"):
            info = json.loads(path.read_text())
            pids += [p for p in (info["pid"], info["grandchild"]) if p]
    return pids


def find_run_dir(logs_root: Path) -> Path:
    """The one run dir under `logs_root` (it has plan.json from the moment workers start)."""
    found = wait_for(lambda: list(logs_root.rglob("plan.json")), 20, f"a run dir in {logs_root}")
    assert len(found) == 1, found
    return found[0].parent


def read_events(run_dir: Path, *, live: bool = False) -> list[Event]:
    """The run's events, through the reader `report` uses; every line of a run that ended reads
    (a live run's last line may be half written)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    read = events_file.read_events(path)
    assert live or read.skipped() is None, read.skipped()
    return list(read.events)


def kinds(events: list[Event]) -> list[str]:
    return [e.kind.value for e in events]


def summary(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def load_worker_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"worker_{name}", WORKERS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------- 1 success
def test_success_writes_run_dir_events_and_overrides(tmp_path: Path) -> None:
    out = tmp_path / "dumps"
    script_args = [str(out), "--lr", "0.1", "two words", "k=v,w", "${not.interpolated}"]
    proc = run_raw(f"script={DUMP_ENV}", "nproc_per_node=2", "--", *script_args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")

    run_dir = find_run_dir(tmp_path / "eh_logs")
    assert json.loads((run_dir / "plan.json").read_text())["nproc_per_node"] == 2
    result = summary(run_dir)
    assert result["status"] == "succeeded"
    assert result["exit_code"] == 0
    assert result["attempts"] == 1

    events = read_events(run_dir)
    assert kinds(events) == [
        "joining", "rendezvous", "workers_started", "hang_watch", "worker_exited",
        "worker_exited", "finish",
    ]  # fmt: skip
    for event in events:
        assert isinstance(event.wall_time, float) and isinstance(event.mono_time, float)
    monotonic = [e.mono_time for e in events]
    assert monotonic == sorted(monotonic)
    assert isinstance(events[2], WorkersStarted)
    pids = events[2].pids
    assert len(pids) == 2 and len(set(pids)) == 2
    assert {e.pid for e in events if isinstance(e, WorkerExited)} == set(pids)
    assert isinstance(events[-1], Finish)
    assert events[-1].status is Status.SUCCEEDED and events[-1].exit_code == 0

    # The script got its arguments byte for byte, and Hydra recorded them.
    for rank in (0, 1):
        dumped = json.loads((out / f"env_{rank}_0.json").read_text())
        assert dumped["argv"][1:] == script_args
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    assert overrides[-len(script_args) - 1 :] == ["--", *script_args]  # as typed, after --


# ------------------------------------------------------------------------------------- 2 restart
def test_restart_after_failure_on_first_attempt(tmp_path: Path) -> None:
    out = tmp_path / "records"
    proc = run_raw(
        f"script={EXIT_CODE}",
        "nproc_per_node=2",
        "restart.max_restarts=1",
        "--",
        "--code",
        "3",
        "--rank",
        "1",
        "--attempt",
        "0",
        "--dir",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")

    run_dir = find_run_dir(tmp_path / "eh_logs")
    result = summary(run_dir)
    assert result["status"] == "succeeded"
    assert result["attempts"] == 2
    for attempt in (0, 1):
        for rank in (0, 1):
            record = json.loads((out / f"attempt{attempt}_rank{rank}.json").read_text())
            assert record["env"]["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
            assert record["env"]["TORCHELASTIC_MAX_RESTARTS"] == "1"
            assert (run_dir / f"attempt_{attempt}" / str(rank) / "stdout.log").exists()
    failed_log = run_dir / "attempt_0" / "1" / "stderr.log"
    assert b"rank 1 failing with exit code 3" in failed_log.read_bytes()
    events = kinds(read_events(run_dir))
    assert events.count("restart") == 1
    assert events.count("workers_started") == 2
    assert events[-1] == "finish"


def test_failure_without_restarts_names_root_cause(tmp_path: Path) -> None:
    proc = run_raw(
        f"script={EXIT_CODE}",
        "nproc_per_node=3",
        "stop_grace=5",
        "--",
        "--code",
        "3",
        "--rank",
        "1",
        "--dir",
        str(tmp_path / "records"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr

    result = summary(find_run_dir(tmp_path / "eh_logs"))
    assert result["status"] == "failed"
    assert result["attempts"] == 1
    cause = result["root_cause"]
    assert (cause["rank"], cause["returncode"], cause["terminated_by_launcher"]) == (1, 3, False)
    peers = {e["rank"]: e for e in result["exits"] if e["rank"] != 1}
    assert sorted(peers) == [0, 2]
    for peer in peers.values():
        assert peer["terminated_by_launcher"] is True
        assert peer["returncode"] == -signal.SIGTERM


# ------------------------------------------------------------------------------------- 3 stop path
def test_worker_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    with started(
        f"script={SLEEPER}",
        "nproc_per_node=2",
        "stop_grace=1",
        "--",
        "--dir",
        str(markers),
        "--ignore-term",
        "0",
        "--fail-rank",
        "1",
        "--fail-code",
        "3",
        cwd=tmp_path,
    ) as agent:
        try:
            stubborn = read_markers(markers, 2)[0]["pid"]
            began = time.monotonic()
            _, err = agent.communicate(timeout=20)
            took = time.monotonic() - began
        finally:
            kill_leftovers(marker_pids(markers))
    assert agent.returncode == 1, err.decode(errors="replace")
    assert took < 1 + 5, f"the agent took {took:.1f} s to stop a stubborn worker (grace 1 s)"
    assert gone(stubborn)

    result = summary(find_run_dir(tmp_path / "eh_logs"))
    assert result["root_cause"]["rank"] == 1 and result["root_cause"]["returncode"] == 3
    (killed,) = [e for e in result["exits"] if e["rank"] == 0]
    assert killed["returncode"] == -signal.SIGKILL
    assert killed["terminated_by_launcher"] is True
    assert result["stuck_pids"] == []


def test_a_second_ctrl_c_kills_at_once_and_the_first_says_so(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    with started(
        f"script={SLEEPER}", "nproc_per_node=2", "stop_grace=60",
        "--", "--dir", str(markers), "--ignore-term", "all",
        cwd=tmp_path,
    ) as agent:  # fmt: skip
        try:
            pids = [m["pid"] for m in read_markers(markers, 2)]
            events = find_run_dir(tmp_path / "eh_logs") / "events.jsonl"
            agent.send_signal(signal.SIGINT)
            wait_for(lambda: '"stopping"' in events.read_text(), 20, "the stopping event")
            began = time.monotonic()
            agent.send_signal(signal.SIGINT)  # the workers ignore SIGTERM: only a kill ends them
            _, err = agent.communicate(timeout=20)
            took = time.monotonic() - began
        finally:
            kill_leftovers(marker_pids(markers))
    assert agent.returncode == 130
    assert took < 10, f"the second Ctrl-C took {took:.1f} s (stop_grace=60)"
    assert all(gone(pid) for pid in pids)
    assert (
        "elastic-hydra: SIGINT: stopping 2 worker(s), up to 60 s (stop_grace); Ctrl-C again to "
        "kill them now"
    ) in err.decode()


# ------------------------------------------------------------------------------- 4 grandchildren
def test_grandchildren_die_with_their_worker(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    go = tmp_path / "go"
    with started(
        f"script={SLEEPER}",
        "nproc_per_node=2",
        "stop_grace=20",
        "--",
        "--dir",
        str(markers),
        "--grandchild",
        "0",
        "--fail-rank",
        "1",
        "--go",
        str(go),
        cwd=tmp_path,
    ) as agent:
        try:
            grandchild = read_markers(markers, 2)[0]["grandchild"]
            assert grandchild and not gone(grandchild)
            go.touch()  # now rank 1 fails
            began = time.monotonic()
            _, err = agent.communicate(timeout=20)
            took = time.monotonic() - began
            assert gone(grandchild)
        finally:
            kill_leftovers(marker_pids(markers))
    assert agent.returncode == 1, err.decode(errors="replace")
    # SIGTERM ends both at once: nothing may wait for the 20 s grace (nor for someone to reap the
    # grandchild's zombie: this machine's pid 1 does so only every ~2 s).
    assert took < 10, f"stopping took {took:.1f} s"
    result = summary(find_run_dir(tmp_path / "eh_logs"))
    assert result["stuck_pids"] == []


# The agent as the reaper of orphans, as when it runs as PID 1 of a container (or under a
# subreaper): orphaned grandchildren are reparented to it, and their zombies stay in the worker's
# process group until it reaps them.
AS_SUBREAPER = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1); "  # PR_SET_CHILD_SUBREAPER
    "os.execv(sys.executable, [sys.executable, '-m', 'elastic_hydra', *sys.argv[1:]])"
)


def test_stop_is_not_stalled_by_zombie_grandchild(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", AS_SUBREAPER, f"script={SLEEPER}", "nproc_per_node=2",
             "stop_grace=0.5",
             "--", "--dir", str(markers), "--grandchild", "0", "--fail-rank", "1"],
            cwd=tmp_path, env=launcher_env(), capture_output=True, timeout=LAUNCH_TIMEOUT,
            check=False,
        )  # fmt: skip
    finally:
        kill_leftovers(marker_pids(markers))
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")
    run_dir = find_run_dir(tmp_path / "eh_logs")
    exits = {e.rank: e for e in read_events(run_dir) if isinstance(e, WorkerExited)}
    stop_took = exits[0].mono_time - exits[1].mono_time
    assert summary(run_dir)["stuck_pids"] == []
    assert stop_took < 1.5, f"stopping a worker whose grandchild died took {stop_took:.1f} s"


# --------------------------------------------------------------------------------- 5 agent kill -9
def test_workers_die_when_agent_is_sigkilled(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    with started(
        f"script={SLEEPER}", "nproc_per_node=2", "--", "--dir", str(markers), cwd=tmp_path
    ) as agent:
        try:
            pids = [m["pid"] for m in read_markers(markers, 2)]
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=10)
            wait_for(lambda: all(gone(p) for p in pids), 2, f"workers {pids} to die with the agent")
        finally:
            kill_leftovers(marker_pids(markers))


def test_grandchildren_die_when_agent_is_sigkilled(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    with started(
        f"script={SLEEPER}",
        "nproc_per_node=1",
        "--",
        "--dir",
        str(markers),
        "--grandchild",
        "all",
        cwd=tmp_path,
    ) as agent:
        try:
            grandchild = read_markers(markers, 1)[0]["grandchild"]
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=10)
            wait_for(lambda: gone(grandchild), 2, f"grandchild {grandchild} to die")
        finally:
            kill_leftovers(marker_pids(markers))


# ------------------------------------------------------------------------------------- 6 signals
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name
)
def test_signal_to_agent_stops_everything(tmp_path: Path, sig: signal.Signals) -> None:
    markers = tmp_path / "markers"
    with started(
        f"script={SLEEPER}", "nproc_per_node=2", "--", "--dir", str(markers), cwd=tmp_path
    ) as agent:
        try:
            pids = [m["pid"] for m in read_markers(markers, 2)]
            agent.send_signal(sig)
            out, err = agent.communicate(timeout=20)
            wait_for(lambda: all(gone(p) for p in pids), 2, f"workers {pids} to be gone")
        finally:
            kill_leftovers(marker_pids(markers))
    assert agent.returncode == 128 + sig, err.decode(errors="replace")
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err
    assert b"Traceback" not in out and b"KeyboardInterrupt" not in out

    run_dir = find_run_dir(tmp_path / "eh_logs")
    result = summary(run_dir)
    assert result["status"] == "stopped"
    assert result["exit_code"] == 128 + sig
    assert result["signal"] == signal.Signals(sig).name
    events = read_events(run_dir)
    assert isinstance(events[-1], Finish)
    assert events[-1].status is Status.STOPPED and events[-1].exit_code == 128 + sig
    assert any(isinstance(e, SignalReceived) and e.signal == sig.name for e in events)
    exits = [e for e in events if isinstance(e, WorkerExited)]
    assert sorted(e.pid for e in exits) == sorted(pids)
    assert all(e.terminated_by_launcher for e in exits)
    assert all(e.returncode == -sig for e in exits)  # the same signal was forwarded


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return "<gone>"


def _importing_launcher(pid: int) -> bool:
    """The agent is importing its dependencies (hydra -> omegaconf -> yaml's C extension)."""
    maps = _maps(pid)
    return "_yaml.cpython" in maps or maps == "<gone>"


def _composing(tmp_path: Path) -> bool:
    """Hydra has created the run dir: composition is done, the agent is about to start."""
    return any((tmp_path / "eh_logs").rglob(".hydra/config.yaml"))


def _ctrl_c_at(tmp_path: Path, reached: Any) -> tuple[int, bytes]:
    """Start a launch, freeze it once `reached(pid)`, queue a SIGINT, let it go on.

    Returns the agent's exit status and stderr. The worker sleeps 5 s, so a lost SIGINT shows as
    a launch that succeeded instead of a hang.
    """
    markers = tmp_path / "markers"
    try:
        with started(
            f"script={SLEEPER}", "--", "--dir", str(markers), "--seconds", "5", cwd=tmp_path
        ) as agent:
            wait_for(lambda: reached(agent.pid), 10, "the start-up stage", interval=0.001)
            agent.send_signal(signal.SIGSTOP)  # the SIGINT lands exactly where we looked
            agent.send_signal(signal.SIGINT)
            agent.send_signal(signal.SIGCONT)
            _, err = agent.communicate(timeout=20)
    finally:
        kill_leftovers(marker_pids(markers))
    return agent.returncode, err


@pytest.mark.parametrize("stage", ["importing", "composed"])
def test_ctrl_c_during_start_up_exits_130_quietly(tmp_path: Path, stage: str) -> None:
    def reached(pid: int) -> bool:
        return _importing_launcher(pid) if stage == "importing" else _composing(tmp_path)

    returncode, err = _ctrl_c_at(tmp_path, reached)
    assert b"KeyboardInterrupt" not in err and b"Traceback" not in err, err.decode()[-600:]
    assert returncode == 130, err.decode()[-600:]


def test_ctrl_c_once_the_run_dir_exists_leaves_a_summary_that_report_reads(
    tmp_path: Path,
) -> None:
    def run_dir_made(_pid: int) -> bool:  # eh_logs/DATE/TIME_HOST: before anything is saved
        return any(p.is_dir() for p in (tmp_path / "eh_logs").glob("*/*"))

    returncode, err = _ctrl_c_at(tmp_path, run_dir_made)
    assert returncode == 130, err.decode()[-600:]
    (saved,) = (tmp_path / "eh_logs").rglob("summary.json")
    data = json.loads(saved.read_text())
    assert (data["status"], data["exit_code"], data["signal"]) == ("stopped", 130, "SIGINT")
    report = run_raw("report", str(saved.parent), cwd=tmp_path)
    assert report.returncode == 1, report.stderr
    assert b"stopped" in report.stdout
    latest = run_raw("report", cwd=tmp_path)  # the latest run is this one
    assert latest.returncode == 1, latest.stderr
    assert str(saved.parent.relative_to(tmp_path)).encode() in latest.stderr


def test_sigterm_during_restart_backoff_exits_at_once(tmp_path: Path) -> None:
    with started(
        f"script={EXIT_CODE}",
        "nproc_per_node=1",
        "restart.max_restarts=5",
        "restart.backoff.initial=30",
        "--",
        "--code",
        "1",
        cwd=tmp_path,
    ) as agent:
        run_dir = find_run_dir(tmp_path / "eh_logs")
        wait_for(
            lambda: "restart" in kinds(read_events(run_dir, live=True)), 20, "the restart event"
        )
        began = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=20)
        took = time.monotonic() - began
    assert agent.returncode == 143, err.decode(errors="replace")
    assert took < 10, f"the agent took {took:.1f} s to leave a 30 s backoff"
    assert b"Traceback" not in err
    assert summary(run_dir)["status"] == "stopped"
    events = kinds(read_events(run_dir))
    assert events[-1] == "finish"
    assert events.count("workers_started") == 1  # no new attempt after the signal
    assert not (run_dir / "attempt_1").exists()


# ---------------------------------------------------------------------------- 7 logs, nothing lost
def assert_files_hold_everything(run_dir: Path, spam: Any, nproc: int, lines: int) -> None:
    """Every byte each rank wrote is in its attempt_0 log files."""
    for rank in range(nproc):
        out, err = spam.expected(rank, lines)
        assert (run_dir / "attempt_0" / str(rank) / "stdout.log").read_bytes() == out
        assert (run_dir / "attempt_0" / str(rank) / "stderr.log").read_bytes() == err


def _console_lines(data: bytes, prefix: bytes) -> bytes:
    """The lines of `data` that carry `prefix`, prefix removed, newline-terminated."""
    return b"".join(
        line[len(prefix) :] + b"\n" for line in data.split(b"\n") if line.startswith(prefix)
    )


def _as_console(stream: bytes) -> bytes:
    """How a stream appears on the console: a last line without newline gets one."""
    return stream if stream.endswith(b"\n") or not stream else stream + b"\n"


def test_logs_keep_every_byte_and_console_gets_every_line_once(tmp_path: Path) -> None:
    lines, nproc = 100_000, 4
    spam = load_worker_module("spam")
    proc = run_raw(f"script={SPAM}", f"nproc_per_node={nproc}", "--", str(lines), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:].decode(errors="replace")
    run_dir = find_run_dir(tmp_path / "eh_logs")
    for rank in range(nproc):
        out, err = spam.expected(rank, lines)
        rank_dir = run_dir / "attempt_0" / str(rank)
        assert (rank_dir / "stdout.log").read_bytes() == out
        assert (rank_dir / "stderr.log").read_bytes() == err
        prefix = b"[default%d]:" % rank
        assert _console_lines(proc.stdout, prefix) == _as_console(out)
        assert _console_lines(proc.stderr, prefix) == _as_console(err)
    # Nothing else on stdout: every line is some rank's line.
    assert all(re.match(rb"\[default\d\]:", line) for line in proc.stdout.splitlines())


def test_logs_ranks_filters_the_console_only(tmp_path: Path) -> None:
    lines, nproc = 2000, 3
    spam = load_worker_module("spam")
    proc = run_raw(
        f"script={SPAM}",
        f"nproc_per_node={nproc}",
        "logs.ranks=[1]",
        "--",
        str(lines),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:].decode(errors="replace")
    run_dir = find_run_dir(tmp_path / "eh_logs")
    out1, err1 = spam.expected(1, lines)
    assert _console_lines(proc.stdout, b"[default1]:") == _as_console(out1)
    assert _console_lines(proc.stderr, b"[default1]:") == _as_console(err1)
    for rank in (0, 2):
        assert b"[default%d]:" % rank not in proc.stdout + proc.stderr
        assert b"rank %d " % rank not in proc.stdout + proc.stderr
    assert_files_hold_everything(run_dir, spam, nproc, lines)


def test_logs_quiet_prints_no_worker_line(tmp_path: Path) -> None:
    lines, nproc = 2000, 2
    spam = load_worker_module("spam")
    proc = run_raw(
        f"script={SPAM}", f"nproc_per_node={nproc}", "logs=quiet", "--", str(lines), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:].decode(errors="replace")
    assert b"rank " not in proc.stdout and b"rank " not in proc.stderr
    assert b"[default" not in proc.stdout + proc.stderr
    run_dir = find_run_dir(tmp_path / "eh_logs")
    assert_files_hold_everything(run_dir, spam, nproc, lines)


def test_console_closed_early_loses_nothing_in_files(tmp_path: Path) -> None:
    """A console that goes away (`elastic-hydra ... | head`) stops neither the run nor the logs."""
    lines = 20_000
    spam = load_worker_module("spam")
    with started(f"script={SPAM}", "nproc_per_node=2", "--", str(lines), cwd=tmp_path) as agent:
        assert agent.stdout is not None
        assert agent.stdout.read(100)
        agent.stdout.close()
        _, err = agent.communicate(timeout=LAUNCH_TIMEOUT)
    assert agent.returncode == 0, err[-2000:].decode(errors="replace")
    assert b"Traceback" not in err and b"BrokenPipe" not in err
    run_dir = find_run_dir(tmp_path / "eh_logs")
    for rank in (0, 1):
        out, _ = spam.expected(rank, lines)
        assert (run_dir / "attempt_0" / str(rank) / "stdout.log").read_bytes() == out
    assert summary(run_dir)["status"] == "succeeded"


# --------------------------------------------------------------------------- 8 concurrent launches
def test_concurrent_launches_get_distinct_run_dirs_ports_and_ids(tmp_path: Path) -> None:
    n = 4
    procs = [
        subprocess.Popen(
            [
                *ELASTIC_HYDRA,
                f"script={DUMP_ENV}",
                "nproc_per_node=2",
                "--",
                str(tmp_path / f"out{i}"),
            ],
            cwd=tmp_path,
            env=launcher_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(n)
    ]
    try:
        results = [p.communicate(timeout=LAUNCH_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=10)
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err.decode(errors="replace")

    run_dirs, ports, run_ids = set(), set(), set()
    for i in range(n):
        dumps = [json.loads((tmp_path / f"out{i}" / f"env_{r}_0.json").read_text()) for r in (0, 1)]
        envs = [d["env"] for d in dumps]
        # Within a launch the ranks agree; across launches nothing is shared.
        for key in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "ELASTIC_HYDRA_RUN_DIR"):
            assert envs[0][key] == envs[1][key], key
        run_dirs.add(envs[0]["ELASTIC_HYDRA_RUN_DIR"])
        ports.add(envs[0]["MASTER_PORT"])
        run_ids.add(envs[0]["TORCHELASTIC_RUN_ID"])
    assert len(run_dirs) == n and len(ports) == n and len(run_ids) == n
    summaries = sorted((tmp_path / "eh_logs").rglob("summary.json"))
    assert len(summaries) == n
    assert {str(s.parent) for s in summaries} == run_dirs
    assert all(json.loads(s.read_text())["status"] == "succeeded" for s in summaries)


# ------------------------------------------------------------------------------------ 9 entrypoints
BOOTSTRAP = str(REPO / "elastic_hydra" / "workers" / "bootstrap.py")


@pytest.mark.parametrize("bootstrap", [True, False])
def test_module_entrypoint_runs_with_user_cwd(tmp_path: Path, bootstrap: bool) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "dump.py").write_text(Path(DUMP_ENV).read_text())
    proc = run_raw(
        "module=mypkg.dump",
        "nproc_per_node=2",
        f"bootstrap={bootstrap}",
        "--",
        "out",
        "extra arg",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    for rank in (0, 1):
        dumped = json.loads((tmp_path / "out" / f"env_{rank}_0.json").read_text())
        assert dumped["cwd"] == str(tmp_path)
        assert dumped["argv"][0] == str(package / "dump.py")
        assert dumped["argv"][1:] == ["out", "extra arg"]
        assert dumped["unbuffered"] is True
        # Without the bootstrap: exactly torchrun's `python -u -m module`.
        boot = [BOOTSTRAP] if bootstrap else []
        assert dumped["orig_argv"][1:] == ["-u", *boot, "-m", "mypkg.dump", "out", "extra arg"]
        assert dumped["env"]["RANK"] == str(rank) and dumped["env"]["WORLD_SIZE"] == "2"


@pytest.mark.parametrize("bootstrap", [True, False])
def test_script_entrypoint_runs_unbuffered_in_user_cwd(tmp_path: Path, bootstrap: bool) -> None:
    proc = run_raw(f"script={DUMP_ENV}", f"bootstrap={bootstrap}", "--", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    dumped = json.loads((tmp_path / "out" / "env_0_0.json").read_text())
    assert dumped["cwd"] == str(tmp_path)
    assert dumped["unbuffered"] is True
    assert dumped["argv"] == [DUMP_ENV, "out"]
    boot = [BOOTSTRAP] if bootstrap else []
    assert dumped["orig_argv"][1:] == ["-u", *boot, DUMP_ENV, "out"]
    assert dumped["executable"] == sys.executable


def test_cmd_entrypoint_runs_a_program(tmp_path: Path) -> None:
    program = tmp_path / "prog.sh"
    program.write_text(
        '#!/bin/sh\necho "RANK=$RANK WORLD_SIZE=$WORLD_SIZE PWD=$(pwd) ARGS=$*" > "$1/cmd_$RANK"\n'
    )
    program.chmod(0o755)
    (tmp_path / "out").mkdir()
    proc = run_raw("cmd=./prog.sh", "nproc_per_node=2", "--", "out", "a b", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    for rank in (0, 1):
        text = (tmp_path / "out" / f"cmd_{rank}").read_text()
        assert text == f"RANK={rank} WORLD_SIZE=2 PWD={tmp_path} ARGS=out a b\n"


def test_cmd_env_prints_the_worker_environment(tmp_path: Path) -> None:
    proc = run_raw("cmd=env", "nproc_per_node=2", "env.EXTRA_VAR=hello", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    for rank in (0, 1):
        for line in (f"RANK={rank}", f"LOCAL_RANK={rank}"):
            assert f"[default{rank}]:{line}\n".encode() in proc.stdout
    for line in ("WORLD_SIZE=2", "EXTRA_VAR=hello"):  # the same on both ranks: shown once
        assert f"[default0-1]:{line}\n".encode() in proc.stdout


def test_python_exec_override_is_used(tmp_path: Path) -> None:
    wrapper = tmp_path / "pywrap.sh"
    wrapper.write_text(
        f'#!/bin/sh\necho "$@" > "{tmp_path}/wrapper_used_$RANK"\nexec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    proc = run_raw(
        f"script={DUMP_ENV}",
        "nproc_per_node=2",
        "--",
        "out",
        env=launcher_env(PYTHON_EXEC=str(wrapper)),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    for rank in (0, 1):
        used = (tmp_path / f"wrapper_used_{rank}").read_text()
        assert used == f"-u {BOOTSTRAP} {DUMP_ENV} out\n"
        assert (tmp_path / "out" / f"env_{rank}_0.json").exists()


class LineReader:
    """Reads a pipe line by line on a thread, so a test can wait for a line with a deadline."""

    def __init__(self, pipe: Any) -> None:
        self.lines: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.seen: list[bytes] = []
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe: Any) -> None:
        for line in iter(pipe.readline, b""):
            self.lines.put(line)

    def wait_line(self, needle: bytes, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if needle in line:
                return line
        raise AssertionError(f"no line with {needle!r} within {timeout} s; saw {self.seen!r}")


def test_worker_output_reaches_console_before_worker_exits(tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*ELASTIC_HYDRA, f"script={WAIT_FILE}", "--", "TOKEN-1234", str(go)],
        cwd=tmp_path,
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = LineReader(proc.stdout).wait_line(b"TOKEN-1234", 20)
        assert line == b"[default0]:TOKEN-1234 rank 0\n"
        go.touch()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        err = proc.stderr.read() if proc.stderr else b""
    assert proc.returncode == 0, err.decode(errors="replace")


# ------------------------------------------------------------------------------------- 10 multirun
def test_multirun_reports_each_launch(tmp_path: Path) -> None:
    proc = run_raw("-m", f"script={EXIT_CODE}", "env.CODE=0,3", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")

    summaries = sorted((tmp_path / "eh_logs" / "multirun").rglob("summary.json"))
    assert len(summaries) == 2
    by_code = {}
    for path in summaries:
        result = json.loads(path.read_text())
        overrides = json.loads((path.parent / "result.json").read_text())["overrides"]
        by_code[overrides[-1]] = (result["status"], path.parent)
    assert by_code.keys() == {"env.CODE=0", "env.CODE=3"}
    assert by_code["env.CODE=0"][0] == "succeeded"
    assert by_code["env.CODE=3"][0] == "failed"
    assert by_code["env.CODE=0"][1] != by_code["env.CODE=3"][1]

    table = proc.stdout.decode()
    rows = [line for line in table.splitlines() if "env.CODE=" in line]
    assert len(rows) == 2, table
    (ok_row,) = [r for r in rows if "env.CODE=0" in r]
    (failed_row,) = [r for r in rows if "env.CODE=3" in r]
    assert " ok " in ok_row and "failed" not in ok_row, table
    assert " failed " in failed_row, table


def test_a_sweep_run_by_another_process_reports_each_jobs_true_outcome(tmp_path: Path) -> None:
    # submitit's local launcher runs each job in a process of its own, as its Slurm launcher runs
    # them on the nodes: the outcome comes home only in Hydra's JobReturn.
    proc = run_raw(
        "-m", "hydra/launcher=submitit_local", f"script={EXIT_CODE}", "env.CODE=0,3",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")
    table = proc.stdout.decode()
    rows = [line for line in table.splitlines() if "env.CODE=" in line]
    assert len(rows) == 2, table
    (ok_row,) = [r for r in rows if "env.CODE=0" in r]
    (failed_row,) = [r for r in rows if "env.CODE=3" in r]
    assert " ok " in ok_row and " failed " in failed_row, table


@pytest.mark.parametrize("no_color", [False, True])
def test_rank_prefixes_are_coloured_on_a_terminal_unless_no_color(
    tmp_path: Path, no_color: bool
) -> None:
    env = {k: v for k, v in launcher_env().items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    if no_color:
        env["NO_COLOR"] = "1"
    code, output = on_a_terminal("cmd=echo hello", cwd=tmp_path, env=env, stream="stdout")
    assert code == 0
    assert b"[default0]:" in output and b"hello" in output, output
    assert (b"\x1b[" in output) is not no_color, output


def test_each_restart_is_one_line_on_the_console(tmp_path: Path) -> None:
    proc = run_raw(
        f"script={EXIT_CODE}", "nproc_per_node=2", "restart.max_restarts=2",
        "--", "--code", "3", "--rank", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.decode().splitlines() if "failed: restart" in ln]
    assert lines == [
        "elastic-hydra: rank 1 failed: restart 1 of 2 after exit code 3, in 0.0 s",
        "elastic-hydra: rank 1 failed: restart 2 of 2 after exit code 3, in 0.0 s",
    ]
    quiet = run_raw(f"script={EXIT_CODE}", "restart.max_restarts=1", "logs=quiet", "--",
                    "--code", "3", cwd=tmp_path)  # fmt: skip
    assert b"failed: restart" not in quiet.stderr  # logs=quiet: the summary only


# ------------------------------------------------------------------- quiet, tidy ends of a run
PLAIN_WORKER = """
import os, sys, time
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
time.sleep(float(sys.argv[2]))
"""


def test_ctrl_c_stops_python_workers_without_a_traceback_on_the_console(tmp_path: Path) -> None:
    """Workers that leave SIGINT to Python: each ends as Python does on Ctrl-C, and the console
    shows no KeyboardInterrupt traceback of theirs."""
    script, markers = tmp_path / "plain.py", tmp_path / "markers"
    script.write_text(PLAIN_WORKER)
    markers.mkdir()
    with started(
        f"script={script}", "nproc_per_node=2", "--", str(markers), "30", cwd=tmp_path
    ) as agent:
        wait_for(lambda: len(list(markers.iterdir())) == 2, 20, "both workers")
        agent.send_signal(signal.SIGINT)
        out, err = agent.communicate(timeout=20)
    assert agent.returncode == 130, err.decode(errors="replace")
    for stream in (out, err):
        assert b"KeyboardInterrupt" not in stream and b"Traceback" not in stream, stream.decode()
    run_dir = find_run_dir(tmp_path / "eh_logs")
    exits = [e for e in read_events(run_dir) if isinstance(e, WorkerExited)]
    assert sorted(e.returncode for e in exits) == [-signal.SIGINT] * 2


def test_a_healthy_runs_rank_dirs_hold_its_logs_alone(tmp_path: Path) -> None:
    """The crash dump, stacks and progress notes the workers kept for the agent go when they hold
    nothing: no file in a healthy run's rank dir hints at a hang or a crash."""
    script, markers = tmp_path / "plain.py", tmp_path / "markers"
    script.write_text(PLAIN_WORKER)
    markers.mkdir()
    proc = run_raw(
        f"script={script}", "nproc_per_node=2", "--", str(markers), "0.3",  # the hang watch on
        cwd=tmp_path, timeout=LAUNCH_TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    run_dir = find_run_dir(tmp_path / "eh_logs")
    for rank in (0, 1):
        names = sorted(p.name for p in (run_dir / "attempt_0" / str(rank)).iterdir())
        assert names == ["stderr.log", "stdout.log"], names
