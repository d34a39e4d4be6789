"""`elastic-hydra top`: a running job's ranks, read back from the status records its agent
publishes (real launches, plain-Python workers)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from tests.conftest import WORKERS, wait_for
from tests.harness import run, started


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
        mode = (root / "status.json").stat().st_mode & 0o777
        assert mode == 0o600
        # In a pipe, without --once: one snapshot as a table, then the command ends.
        table = run("top", str(root), cwd=tmp_path, timeout=60)
        assert table.returncode == 0, table.stderr
        assert "job: running" in table.stdout and str(pids[2]) in table.stdout
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
    assert shown.returncode == 2 and "no running job" in shown.stderr
