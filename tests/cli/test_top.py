"""`elastic-hydra top`: a running job's ranks, read back from the status records its agent
publishes (real launches, plain-Python workers)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.agent import events
from elastic_hydra.agent.outcome import Status
from elastic_hydra.observe.status import Tracker, encode
from tests.conftest import ELASTIC_HYDRA, WORKERS, wait_for
from tests.harness import launcher_env, run, started


def top_json(*args: str, cwd: Path) -> dict[str, Any] | None:
    """One `top --once --json` snapshot; None while there is nothing to show yet."""
    shown = run("top", *args, "--once", "--json", cwd=cwd, timeout=60)
    if shown.returncode != 0:
        assert shown.returncode == 1, shown.stderr
        return None
    data: dict[str, Any] = json.loads(shown.stdout)
    return data


def ranks(snap: dict[str, Any]) -> list[tuple[int, str]]:
    return [(w["rank"], w["state"]) for n in snap["nodes"] for w in n["workers"]]


def run_dir(logs: Path) -> Path | None:
    found = list(logs.glob("**/events.jsonl"))
    return found[0].parent if found else None


def test_top_lists_a_running_jobs_ranks_with_their_states(tmp_path: Path) -> None:
    logs, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    args = (
        f"script={WORKERS / 'hang_probe.py'}", "nproc_per_node=3", f"logs.root={logs}",
        f"env.OUT_DIR={out}", "--", "exit", "sleep", "sleep",
    )  # fmt: skip
    with started(*args, cwd=tmp_path) as agent:
        found = wait_for(lambda: run_dir(logs), 60, "the run dir")
        assert found is not None
        root = found
        pids = wait_for(
            lambda: [int(p.read_text()) for p in sorted(out.glob("*.ready"))][2:] and
            [int((out / f"{r}.ready").read_text()) for r in range(3)], 60, "the workers",
        )  # fmt: skip

        def settled() -> dict[str, Any] | None:
            snap = top_json(str(root), cwd=tmp_path)
            want = [(0, "done"), (1, "running"), (2, "running")]
            return snap if snap is not None and ranks(snap) == want else None

        snap = wait_for(settled, 60, "rank 0 done, ranks 1 and 2 running")
        assert snap is not None
        (node,) = snap["nodes"]
        assert snap["phase"] == "running" and node["phase"] == "running"
        assert [w["pid"] for w in node["workers"]] == pids
        assert node["agent_pid"] == agent.pid and not node["stale"]
        assert node["workers"][1]["rss_bytes"] > 1 << 20
        assert node["workers"][1]["progress_via"] in ("started", "python", "output", "cpu")
        mode = (root / "status.json").stat().st_mode & 0o777
        assert mode == 0o600
        # In a pipe, without --once: one snapshot as a table, then the command ends.
        table = run("top", str(root), cwd=tmp_path, timeout=60)
        assert table.returncode == 0, table.stderr
        assert "job: running" in table.stdout and str(pids[2]) in table.stdout
        assert "progress" in table.stdout and max(map(len, table.stdout.splitlines())) <= 80
        os.kill(agent.pid, signal.SIGTERM)
        agent.wait(timeout=60)
    after = top_json(str(root), cwd=tmp_path)
    assert after is not None
    assert after["phase"] == "done"
    assert ranks(after) == [(0, "done"), (1, "stopped"), (2, "stopped")]
    assert after["nodes"][0]["status"] == "stopped" and not after["nodes"][0]["stale"]


def test_top_ignores_a_malformed_record_with_one_warning(tmp_path: Path) -> None:
    job = tmp_path / "job"
    for name, text in (("a", '{"format": 1, "node": 5}'), ("b", "x" * (70 << 10))):
        (job / name).mkdir(parents=True)
        (job / name / "events.jsonl").write_text("")
        (job / name / "status.json").write_text(text)
    shown = run("top", str(job), "--once", "--json", cwd=tmp_path, timeout=60)
    assert shown.returncode == 1  # nothing left to show
    assert json.loads(shown.stdout)["ignored"] == 2
    assert shown.stderr.count("warning") == 1 and "2 status record(s) ignored" in shown.stderr


def test_top_refuses_bad_words_in_one_line(tmp_path: Path) -> None:
    for args in (["--endpoint", "nowhere"], ["--endpoint", "h:1"], [str(tmp_path / "none")]):
        shown = run("top", *args, "--once", cwd=tmp_path, timeout=60)
        assert shown.returncode == 2, shown
        assert shown.stderr.startswith("elastic-hydra: error: ") and shown.stderr.count("\n") == 1
        assert "Traceback" not in shown.stderr


def test_top_without_a_run_dir_and_no_running_job_says_so(tmp_path: Path) -> None:
    shown = run("top", "--once", cwd=tmp_path, timeout=60)
    assert shown.returncode == 2 and "no live run" in shown.stderr


def a_run_dir(tmp_path: Path) -> Path:
    """A run dir with one node's record, as an agent writes it (phase done: never stale)."""
    tracker = Tracker(node="node-a", nproc=2, agent_pid=1, period=2.0)
    tracker.emit(events.WorkersStarted(wall_time=1.0, mono_time=1.0, pids=(4242, 4343), attempt=0))
    tracker.emit(events.Finish(wall_time=1.0, mono_time=1.0, status=Status.SUCCEEDED,
                               exit_code=0, reason="", attempts=1))  # fmt: skip
    root = tmp_path / "run"
    root.mkdir()
    record = tracker.record(now=time.time(), samples={}, progress={})
    (root / "status.json").write_bytes(encode(record))
    return root


@pytest.mark.parametrize("how", ["q", "SIGINT"])
def test_top_on_a_terminal_draws_the_table_live_and_quits_cleanly(tmp_path: Path, how: str) -> None:
    root = a_run_dir(tmp_path)
    main_fd, term_fd = pty.openpty()
    proc = subprocess.Popen(
        [*ELASTIC_HYDRA, "top", str(root)], stdin=term_fd, stdout=term_fd, stderr=term_fd,
        env=launcher_env(TERM="xterm-256color"), start_new_session=True,
    )  # fmt: skip
    os.close(term_fd)
    screen = b""
    try:

        def drawn() -> bool:
            nonlocal screen
            if select.select([main_fd], [], [], 0.1)[0]:
                screen += os.read(main_fd, 65536)
            return screen.count(b"4343") >= 2  # drawn, then redrawn a second later

        wait_for(drawn, 60, "the table, twice", detail=lambda: screen.decode(errors="replace"))
        if how == "q":
            os.write(main_fd, b"q")
        else:
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        with contextlib.suppress(OSError):
            while select.select([main_fd], [], [], 0.2)[0]:
                screen += os.read(main_fd, 65536)
    finally:
        os.close(main_fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = screen.decode(errors="replace")
    assert code == 0, text
    assert "job: done" in text and "node-a" in text and "\x1b[" in text  # colour: a terminal
    assert "Traceback" not in text and "KeyboardInterrupt" not in text


def a_node(root: Path, *, written: float, nproc: int = 2, phase_done: bool = False) -> None:
    """A run dir with one node's record of `nproc` running workers, written at `written`."""
    tracker = Tracker(node="node-a", nproc=nproc, agent_pid=1, period=2.0)
    pids = tuple(range(4000, 4000 + nproc))
    tracker.emit(events.WorkersStarted(wall_time=1.0, mono_time=1.0, pids=pids, attempt=0))
    if phase_done:
        tracker.emit(events.Finish(wall_time=1.0, mono_time=1.0, status=Status.SUCCEEDED,
                                   exit_code=0, reason="", attempts=1))  # fmt: skip
    root.mkdir(parents=True)
    (root / "events.jsonl").write_text("")
    (root / "status.json").write_bytes(encode(tracker.record(now=written, samples={},
                                                             progress={})))  # fmt: skip


def test_top_without_a_run_dir_opens_the_newest_live_run_not_a_dead_one(tmp_path: Path) -> None:
    logs = tmp_path / "eh_logs"
    a_node(logs / "live", written=time.time() + 600)  # fresh for the whole test
    a_node(logs / "killed", written=time.time() - 600)  # an agent SIGKILLed: stale, no summary
    os.utime(logs / "live" / "events.jsonl", (1, 1))  # the dead one is the newer
    shown = run("top", "--once", "--json", cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == f"elastic-hydra top: the newest live run, {Path('eh_logs/live')}\n"
    assert json.loads(shown.stdout)["phase"] == "running"
    (logs / "live" / "summary.json").write_text("{}")  # it ended
    gone = run("top", "--once", cwd=tmp_path, timeout=60)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr
    assert f"no live run (the newest, {Path('eh_logs/killed')}, stopped publishing)" in gone.stderr


def test_top_fits_80_columns_with_64_ranks_and_every_field_at_its_widest(tmp_path: Path) -> None:
    root = tmp_path / "run"
    a_node(root, written=time.time() + 600, nproc=64)
    record = json.loads((root / "status.json").read_text())
    for w in record["workers"]:
        w.update(rank=w["rank"] + 1000, state="restarting", progress_age=99999.9,
                 progress_via="collective #123456789", last_at=1.0, behind=9.999, pid=4194304,
                 cpu_percent=1600.0, rss_bytes=999 << 30, gpu_util=100.0,
                 gpu_mem_bytes=141 << 30)  # fmt: skip
    record["node"] = "a-rather-long-host-name.cluster.example.org"
    (root / "status.json").write_text(json.dumps(record))
    shown = run("top", str(root), "--once", cwd=tmp_path, env={"COLUMNS": "80"}, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(map(len, lines)) <= 80, shown.stdout
    assert len(lines) == 3 + 64  # the job, the node, the header, one row a rank: none wrapped
    assert (
        "collective #1234" in shown.stdout
        and "999G" in shown.stdout
        and "100% 141G" in shown.stdout
    )
