"""`elastic-hydra report [RUN_DIR | SWEEP_DIR]`: a finished launch shown again.

A run's summary.json and events.jsonl, or a sweep's result files, read back and rendered as at
the end of the launch; the exit code says whether it succeeded.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from elastic_hydra.errors import ConfigError
from elastic_hydra.records import JobResult, RunStatus, RunSummary
from elastic_hydra.report import notices
from elastic_hydra.report.events_file import EventsRead, read_events
from elastic_hydra.rundir import LOGS_ROOT, RunDir, SweepDir, finished_runs, running_runs

REPORT_USAGE = f"""usage: elastic-hydra report [RUN_DIR | SWEEP_DIR]

Show a finished launch again: its summary, its timeline and, for a failure, the root cause.
Without a directory: the latest run under ./{LOGS_ROOT}. A sweep's directory shows its table.
Exits 0 for a run (or sweep) that succeeded, 1 for one that did not, 2 for bad input."""


def report(args: Sequence[str]) -> int:
    """`elastic-hydra report [DIR]`: re-render a finished run's summary and timeline."""
    if list(args) in (["-h"], ["--help"]):
        print(REPORT_USAGE)
        return 0
    if len(args) > 1:
        raise ConfigError(
            "report", "takes one run dir", " ".join(args), "expected elastic-hydra report [RUN_DIR]"
        )
    where = Path(args[0]) if args else _latest_run(Path(LOGS_ROOT))
    run = RunDir(where)
    if not run.summary.exists() and (sweep := _sweep_results(where)):
        from elastic_hydra.report import render

        render.print_sweep(sweep)
        return 0 if all(r.exit_code == 0 for r in sweep) else 1
    try:
        summary = RunSummary.from_json(json.loads(run.summary.read_text()))
    except FileNotFoundError:
        started = run.plan.exists() or run.events.exists()
        raise ConfigError(
            "report",
            f"no {run.summary.name} in this directory"
            + (
                ": the launch is still running, or was killed (SIGKILL) before its end"
                if started
                else ""
            ),
            str(where),
            "expected the run dir of a launch (it is printed at the end of each run)",
        ) from None
    except ValueError as exc:
        raise ConfigError(
            "report",
            f"{run.summary.name} does not read as a run summary ({exc})",
            str(where),
            "expected a run dir written by elastic-hydra",
        ) from None
    try:
        read = read_events(run.events)
    except FileNotFoundError:
        read = EventsRead(events=())
    if (skipped := read.skipped()) is not None:
        notices.warn(skipped)
    from elastic_hydra.report import render

    render.print_report(summary, read.events)
    return 0 if summary.status is RunStatus.SUCCEEDED else 1


def _latest_run(root: Path) -> Path:
    """The run dir under `root` whose summary was written last."""
    summaries = [run.summary for run in finished_runs(root)]
    if not summaries:
        raise ConfigError(
            "report", "no run found under", str(root),
            "run it from the directory you launched in, or give the run dir",
        )  # fmt: skip
    latest = max(summaries, key=lambda p: p.stat().st_mtime)
    print(f"elastic-hydra report: the latest run, {latest.parent}", file=sys.stderr)
    since = latest.stat().st_mtime
    newer = [r for r in running_runs(root) if _mtime(r.events) > since]
    if newer:
        newest = max(newer, key=lambda r: _mtime(r.events)).root
        notices.warn(
            f"a newer run dir has no summary (still running, or killed before its end): {newest}"
        )
    return latest.parent


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile
        return 0.0


def _sweep_results(sweep: Path) -> list[JobResult]:
    """The results of a sweep's jobs (`<sweep>/<job#>/result.json`, or a multi-node job's first
    node's), in job order; [] where `sweep` is no sweep."""
    results = []
    for found in SweepDir(sweep).job_results():
        for path in found:
            with contextlib.suppress(OSError, ValueError):
                results.append(JobResult.from_json(json.loads(path.read_text())))
                break
    return results
