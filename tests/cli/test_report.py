"""summary.json for every ending, and `elastic-hydra report RUN_DIR` re-rendering it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from elastic_hydra.agent.events import WorkersStarted
from elastic_hydra.records import RunStatus, RunSummary
from tests.conftest import ELASTIC_HYDRA, WORKERS

FAIL = str(WORKERS / "fail.py")
EXIT_CODE = str(WORKERS / "exit_code.py")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_HYDRA")}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [*ELASTIC_HYDRA, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def only_run_dir(root: Path) -> Path:
    (summary,) = root.rglob("summary.json")
    return summary.parent


def load(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def test_restarts_exhausted_keep_every_failure_and_report_shows_the_timeline(
    tmp_path: Path,
) -> None:
    proc = cli(
        tmp_path, f"script={EXIT_CODE}", "nproc_per_node=2", "restart.max_restarts=2",
        "logs=quiet", "stop_grace=5", "--", "--code", "3", "--rank", "1",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    run_dir = only_run_dir(tmp_path / "eh_logs")
    summary = load(run_dir)
    assert summary["status"] == "failed" and summary["attempts"] == 3
    real = [f for f in summary["failures"] if not f["terminated_by_launcher"]]
    assert [(f["rank"], f["attempt"], f["returncode"]) for f in real] == [
        (1, 0, 3),
        (1, 1, 3),
        (1, 2, 3),
    ]
    collateral = [f for f in summary["failures"] if f["terminated_by_launcher"]]
    assert {(f["rank"], f["signal"]) for f in collateral} == {(0, "SIGTERM")}
    assert len(collateral) == 3
    # The root cause is the failure that ended the job: the last attempt's.
    assert (summary["root_cause"]["rank"], summary["root_cause"]["attempt"]) == (1, 2)
    assert summary["root_cause"]["exit"] == "exit code 3"

    report = cli(tmp_path, "report", str(run_dir))
    assert report.returncode == 1, report.stderr  # the run failed
    out = report.stdout
    assert re.search(r"delay=\d+(\.\d{1,3})?\b", out) and not re.search(r"=\d+\.\d{4,}", out)
    assert out.count("restart ") >= 2 and "workers_started" in out and "finish" in out
    assert "root cause  rank 1 (local rank 1)" in out and "restart count 2" in out
    assert "terminated by launcher (SIGTERM)" in out
    assert "\x1b[" not in out  # not a terminal: plain text
    lines = [ln.strip() for ln in out.splitlines()]
    section = lines[lines.index("attempts") + 2 : lines.index("attempts") + 5]
    assert [ln.split()[0] for ln in section] == ["0", "1", "2"]
    assert all(ln.endswith("rank 1 exit code 3") for ln in section), section


def test_success_summary_and_report(tmp_path: Path) -> None:
    proc = cli(tmp_path, f"script={FAIL}", "nproc_per_node=2", "logs=quiet", "--", "ok")
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "eh_logs")
    summary = load(run_dir)
    assert summary["status"] == "succeeded" and summary["exit_code"] == 0
    assert summary["root_cause"] is None and summary["failures"] == []
    assert sorted(e["rank"] for e in summary["exits"]) == [0, 1]
    report = cli(tmp_path, "report", str(run_dir))
    assert report.returncode == 0
    assert "elastic-hydra: succeeded" in report.stdout and "workers_started" in report.stdout
    latest = cli(tmp_path, "report")  # no directory: the latest run under ./eh_logs
    assert latest.returncode == 0 and latest.stdout == report.stdout
    assert f"the latest run, {run_dir.relative_to(tmp_path)}" in latest.stderr
    usage = cli(tmp_path, "report", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: elastic-hydra report")


def test_report_of_a_sweep_shows_its_table_and_fails_with_it(tmp_path: Path) -> None:
    sweep = cli(tmp_path, "-m", f"script={EXIT_CODE}", "logs=quiet", "env.CODE=0,3")
    assert sweep.returncode == 1, sweep.stderr
    (sweep_dir,) = (tmp_path / "eh_logs" / "multirun").glob("*/*")
    report = cli(tmp_path, "report", str(sweep_dir))
    assert report.returncode == 1, report.stderr
    rows = [ln for ln in report.stdout.splitlines() if "env.CODE=" in ln]
    assert [("ok" in r.split(), "failed" in r.split()) for r in rows] == [
        (True, False),
        (False, True),
    ]


def test_report_of_a_directory_without_a_summary_is_one_line(tmp_path: Path) -> None:
    for args in (["report", str(tmp_path)], ["report"], ["report", "a", "b"]):  # no eh_logs
        proc = cli(tmp_path, *args)
        assert proc.returncode == 2, args
        assert "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("elastic-hydra: error: report:"), line


def test_report_says_a_run_dir_without_a_summary_is_running_or_was_killed(tmp_path: Path) -> None:
    done = tmp_path / "eh_logs" / "2026-11-25" / "10-00-00-000000_vm"
    killed = tmp_path / "eh_logs" / "2026-11-25" / "11-00-00-000000_vm"
    for run_dir in (done, killed):
        run_dir.mkdir(parents=True)
        (run_dir / "events.jsonl").write_text("")
    summary = RunSummary(status=RunStatus.SUCCEEDED, exit_code=0, run_dir=str(done))
    (done / "summary.json").write_text(json.dumps(summary.to_json()))
    os.utime(done / "summary.json", (1, 1))  # the killed run's timeline is newer
    proc = cli(tmp_path, "report", str(killed))
    assert proc.returncode == 2
    assert "still running, or was killed (SIGKILL) before its end" in proc.stderr
    latest = cli(tmp_path, "report")
    assert latest.returncode == 0, latest.stderr
    assert f"the latest run, {done.relative_to(tmp_path)}" in latest.stderr
    assert "a newer run dir has no summary (still running, or killed before its end): " in (
        latest.stderr
    )
    assert str(killed.relative_to(tmp_path)) in latest.stderr


def test_report_reads_what_it_can_of_a_timeline_and_says_what_it_skipped(tmp_path: Path) -> None:
    summary = RunSummary(status=RunStatus.SUCCEEDED, exit_code=0, attempts=1, run_dir=str(tmp_path))
    (tmp_path / "summary.json").write_text(json.dumps(summary.to_json()))
    started = WorkersStarted(wall_time=10.0, mono_time=1.0, pids=(7,), attempt=0)
    lines = [
        json.dumps(started.to_json()),
        json.dumps({"event": "preflight", "time": 10.5, "monotonic": 1.5}),  # a newer kind
        '{"event": "finish", "time": 11.0, "monotonic": 2.0, "status": "succ',  # cut short
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(lines))
    report = cli(tmp_path, "report", str(tmp_path))
    assert report.returncode == 0, report.stderr
    assert "workers_started" in report.stdout and "pids=[7], attempt=0" in report.stdout
    assert report.stderr.strip() == (
        "elastic-hydra: warning: 2 line(s) of events.jsonl skipped: 1 of a kind this "
        "elastic-hydra does not know, 1 that did not read as an event (cut short?)"
    )

    newer = {**started.to_json(), "format": 99}
    (tmp_path / "events.jsonl").write_text(json.dumps(newer) + "\n")
    refused = cli(tmp_path, "report", str(tmp_path))
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("elastic-hydra: error: events.jsonl: written in format 99, newer"), line
