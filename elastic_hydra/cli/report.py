"""`elastic-hydra report [RUN_DIR | SWEEP_DIR]`: a finished launch shown again.

A run's summary.json and events.jsonl, or a sweep's result files, or every node's run of a
multi-node job's run dir, read back and rendered as at the end of the launch; the exit code says
whether it succeeded.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from elastic_hydra.errors import ConfigError
from elastic_hydra.records.summary import JobResult, RunStatus, RunSummary
from elastic_hydra.report import gantt, notices, timeline
from elastic_hydra.report.events_file import EventsRead, read_events
from elastic_hydra.report.timeline import NodeView
from elastic_hydra.rundir import (
    LOGS_ROOT,
    RunDir,
    SweepDir,
    finished_runs,
    running_runs,
    write_private,
)

POOL_JSON_MAX = 64 << 20  # bytes: a larger pool.json is no pool.json we wrote

REPORT_USAGE = f"""usage: elastic-hydra report [RUN_DIR | SWEEP_DIR] [--html FILE]

Show a finished launch again: its timeline, its attempts, its goodput ledger and, for a failure,
the root cause (failures that restarts recovered, with their tracebacks too). Without a
directory: the latest run under ./{LOGS_ROOT}. A sweep's directory shows its table; a multi-node
job's, every node. --html FILE also writes the run as one self-contained page (a row per rank
across attempts; for a sweep, a row per job on its pool slot). Exits 0 for a run (or sweep) that
succeeded, 1 for one that did not, 2 for bad input."""


def report(args: Sequence[str]) -> int:
    """`elastic-hydra report [DIR]`: re-render a finished run's summary and timeline."""
    if list(args) in (["-h"], ["--help"]):
        print(REPORT_USAGE)
        return 0
    rest, html = _html_option(args)
    if len(rest) > 1:
        raise ConfigError(
            "report", "takes one run dir", " ".join(args),
            "expected elastic-hydra report [RUN_DIR] [--html FILE]",
        )  # fmt: skip
    where = Path(rest[0]) if rest else _latest_run(Path(LOGS_ROOT))
    run = RunDir(where)
    if not run.summary.exists() and (sweep := _sweep_results(where)):
        from elastic_hydra.report import render

        if html is not None:
            write_page(html, _sweep_page(where, sweep))
        render.print_sweep(sweep)
        return 0 if all(r.exit_code == 0 for r in sweep) else 1
    if not run.summary.exists() and (nodes := run.nodes()):
        return _report_nodes(where, nodes, html)
    summary = _read_summary(run)
    from elastic_hydra.report import history

    events = _read_timeline(run).events
    if html is not None:
        view = NodeView(name=summary.host or where.name, summary=summary, events=events)
        write_page(html, timeline.page(f"elastic-hydra run {where}", [view]))
    history.print_report(summary, events)
    return 0 if summary.status is RunStatus.SUCCEEDED else 1


def _html_option(args: Sequence[str]) -> tuple[list[str], Path | None]:
    """The arguments without `--html FILE` (or `--html=FILE`), and FILE.

    Raises:
        ConfigError: --html without a file.
    """
    rest, html, it = [], None, iter(args)
    for arg in it:
        if arg == "--html" or arg.startswith("--html="):
            value = arg.partition("=")[2] or next(it, "")
            if not value:
                raise ConfigError(
                    "report --html", "needs the file to write", arg,
                    "expected elastic-hydra report RUN_DIR --html FILE",
                )  # fmt: skip
            html = Path(value)
        else:
            rest.append(arg)
    return rest, html


def _read_summary(run: RunDir) -> RunSummary:
    """A run dir's summary.

    Raises:
        ConfigError: there is none (naming the run dirs below, if any), or it is no summary.
    """
    try:
        return RunSummary.from_json(json.loads(run.summary.read_text()))
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
            str(run.root),
            _run_dirs_below(run.root)
            or "expected the run dir of a launch (it is printed at the end of each run)",
        ) from None
    except ValueError as exc:
        raise ConfigError(
            "report",
            f"{run.summary.name} does not read as a run summary ({exc})",
            str(run.root),
            "expected a run dir written by elastic-hydra",
        ) from None


def _run_dirs_below(where: Path, shown: int = 4) -> str:
    """'run dirs under it: a, b (give one)', or '' where there are none."""
    found = sorted(str(r.root.relative_to(where)) for r in finished_runs(where))
    if not found:
        return ""
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return f"run dirs under it: {', '.join(found[:shown])}{more} (give one)"


def _read_timeline(run: RunDir) -> EventsRead:
    """A run's events, what can be read of them (a notice says what was skipped)."""
    try:
        read = read_events(run.events)
    except FileNotFoundError:
        read = EventsRead(events=())
    if (skipped := read.skipped()) is not None:
        notices.warn(skipped)
    return read


def _report_nodes(where: Path, nodes: list[RunDir], html: Path | None = None) -> int:
    """A multi-node job's run dir: each node's run (0 when every node succeeded)."""
    from elastic_hydra.report import history

    found: list[history.NodeRun] = []
    for node in nodes:
        name, path = node.root.name, str(node.root)
        if not node.summary.exists():
            missing = f"no {node.summary.name}: still running, or killed before it wrote one"
            found.append(history.NodeRun(name=name, path=path, summary=None, missing=missing))
            continue
        try:
            summary = _read_summary(node)
        except ConfigError as exc:
            found.append(history.NodeRun(name=name, path=path, summary=None, missing=exc.line()))
            continue
        events = _read_timeline(node).events
        found.append(history.NodeRun(name=name, path=path, summary=summary, events=events))
    if html is not None:
        views = [
            NodeView(name=n.name, summary=n.summary, events=n.events, missing=n.missing)
            for n in found
        ]
        write_page(html, timeline.page(f"elastic-hydra job {where}", views))
    history.print_nodes(str(where), found)
    ok = all(n.summary is not None and n.summary.status is RunStatus.SUCCEEDED for n in found)
    return 0 if ok else 1


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


def write_page(path: Path, text: str) -> None:
    """Write a page for its owner only (0600, also where a file was there before).

    Raises:
        ConfigError: it cannot be written (names the file and why).
    """
    try:
        write_private(path, text)
    except OSError as exc:
        raise ConfigError(
            "report --html", f"cannot write the page ({exc.strerror})", str(path),
            "expected a writable file path",
        ) from None  # fmt: skip
    print(f"elastic-hydra report: wrote {path}", file=sys.stderr)


def _sweep_page(where: Path, results: list[JobResult]) -> str:
    """A sweep's Gantt page: from pool.json where the pool ran it, else from the results."""
    bars: list[gantt.JobBar] = []
    bad = 0
    with contextlib.suppress(OSError, ValueError, RecursionError):
        pool = SweepDir(where).pool
        if pool.stat().st_size < POOL_JSON_MAX:
            bars, bad = gantt.pool_bars(json.loads(pool.read_bytes()))
    if not bars:
        bars = gantt.result_bars(results)
    title = f"elastic-hydra sweep {where}"
    return gantt.sweep_page(title, bars, results, bad, SweepDir(where).pool.name)
