"""summary.json for every ending, and `elastic-hydra report RUN_DIR` re-rendering it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

from elastic_hydra.agent.events import WorkersStarted
from elastic_hydra.records.summary import RunStatus, RunSummary
from tests.conftest import ELASTIC_HYDRA, WORKERS, free_port, wait_for
from tests.harness import started

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
        json.dumps({"event": "from_the_future", "time": 10.5, "monotonic": 1.5}),  # a newer kind
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


def test_report_shows_the_traceback_of_a_failure_a_restart_recovered(tmp_path: Path) -> None:
    proc = cli(
        tmp_path, f"script={FAIL}", "nproc_per_node=2", "restart.max_restarts=1",
        "logs=files_only", "--", "raise", "--rank", "1", "--attempt", "0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "eh_logs")
    summary = load(run_dir)
    assert (summary["status"], summary["attempts"], summary["restarts"]) == ("succeeded", 2, 1)
    # The end of the run says a failure was recovered, and where its traceback is.
    assert f"1 failure(s) recovered by a restart: elastic-hydra report {run_dir}" in proc.stderr

    report = cli(tmp_path, "report", str(run_dir))
    assert report.returncode == 0, report.stderr
    out = report.stdout
    assert "recovered failures" in out, out
    section = out[out.index("recovered failures") :]
    assert "rank 1 (local rank 1) on" in section and "attempt 0, restart count 0" in section
    assert "ValueError: boom from rank 1" in section
    assert f'File "{FAIL}", line' in section  # the worker's own traceback, not just its message
    assert 'raise ValueError(f"boom from rank {rank}")' in section
    assert section.index("recovered failures") < section.index("elastic-hydra: succeeded")


def test_a_failed_run_shows_its_earlier_failures_briefly_and_report_in_full(
    tmp_path: Path,
) -> None:
    proc = cli(
        tmp_path, f"script={FAIL}", "nproc_per_node=2", "restart.max_restarts=1",
        "logs=files_only", "--", "raise", "--rank", "1",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    run_dir = only_run_dir(tmp_path / "eh_logs")
    # At the end of the run: the root cause in full, the failure before it in one line.
    err = proc.stderr
    assert "root cause  rank 1 (local rank 1)" in err and "attempt 1, restart count 1" in err
    brief = err[err.index("earlier failures") :]
    assert "attempt 0: rank 1 (local rank 1)" in brief and "ValueError: boom from rank 1" in brief
    assert brief.count('File "') == 0, brief
    report = cli(tmp_path, "report", str(run_dir))
    assert report.returncode == 1, report.stderr
    full = report.stdout[report.stdout.index("earlier failures") :]
    assert "failure  rank 1 (local rank 1)" in full and "attempt 0, restart count 0" in full
    # The root cause above shows that very traceback: named, not repeated.
    assert "same error as attempt 1, rank 1" in full and 'File "' not in full, full


def test_the_attempts_table_has_a_row_for_every_start_and_how_it_ended(tmp_path: Path) -> None:
    """A stop by a signal ends the last attempt: its row says so."""
    ready = tmp_path / "ready"
    args = (f"script={WORKERS / 'sleeper.py'}", "nproc_per_node=2", "logs=quiet",
            "--", "--dir", str(ready))  # fmt: skip
    with started(*args, cwd=tmp_path) as agent:
        wait_for(lambda: len(list(ready.glob("ready_*"))) == 2, 60, "both workers")
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
    assert agent.returncode == 128 + signal.SIGTERM
    run_dir = only_run_dir(tmp_path / "eh_logs")
    report = cli(tmp_path, "report", str(run_dir))
    rows = attempt_rows(report.stdout)
    assert [r.split()[0] for r in rows] == ["0"], report.stdout
    assert rows[0].endswith("stopped by SIGTERM"), rows


def attempt_rows(out: str) -> list[str]:
    """The rows of the attempts table of a report."""
    lines = [ln.strip() for ln in out.splitlines()]
    start = lines.index("attempts") + 2
    rows = []
    for line in lines[start:]:
        if not line or not line.split()[0].isdigit():
            break
        rows.append(line)
    return rows


# -------------------------------------------------------------------------- multi-node run dirs
def static_node(tmp: Path, job_dir: Path, node: str, node_rank: int, *args: str, port: int) -> int:
    """One node of a two-node static job, its run dir `job_dir/<node>` (as on a shared
    filesystem, or in a Slurm step where every node gets the job's dir)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELASTIC_HYDRA", "SLURM"))}
    command = [
        *ELASTIC_HYDRA, f"script={FAIL}", "rdzv=static", "nnodes=2", f"node_rank={node_rank}",
        "master_addr=127.0.0.1", f"master_port={port}", "nproc_per_node=2", "logs=quiet",
        f"hydra.run.dir={job_dir}", "--", *args,
    ]  # fmt: skip
    proc = subprocess.run(
        command,
        cwd=tmp,
        env=env | {"SLURMD_NODENAME": node, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode


def test_report_of_a_multi_node_run_dir_shows_every_node(tmp_path: Path) -> None:
    job_dir, port = tmp_path / "runs" / "job", free_port()
    assert static_node(tmp_path, job_dir, "n0", 0, "ok", port=port) == 0
    assert static_node(tmp_path, job_dir, "n1", 1, "raise", "--rank", "3", port=port) == 1
    assert sorted(p.name for p in job_dir.iterdir()) == ["n0", "n1"]  # nothing but the nodes

    report = cli(tmp_path, "report", str(job_dir))
    assert report.returncode == 1, report.stderr  # one node failed
    out = report.stdout
    nodes = [ln.split() for ln in out.splitlines() if ln.startswith(("n0 ", "n1 "))]
    assert [(n[0], n[1]) for n in nodes] == [("n0", "succeeded"), ("n1", "failed")], out
    first, second = out.index(f"node n0: {job_dir / 'n0'}"), out.index(f"node n1: {job_dir / 'n1'}")
    assert "elastic-hydra: succeeded" in out[first:second]
    assert "ValueError: boom from rank 3" in out[second:]
    assert "root cause  rank 3 (local rank 1)" in out[second:]

    # A directory above run dirs names them.
    above = cli(tmp_path, "report", str(tmp_path / "runs"))
    assert above.returncode == 2
    (line,) = above.stderr.strip().splitlines()
    assert "run dirs under it: job/n0, job/n1" in line, line
