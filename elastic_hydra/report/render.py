"""Rich renderings for people: the launch plan, the sweep table and the failure report. With
`report.history` (the `report` command's timeline, attempts and nodes), the only module importing
rich.

On a terminal these use colour; elsewhere (CI logs, pipes) rich emits plain text without ANSI codes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.traceback import Frame as RichFrame
from rich.traceback import Stack as RichStack
from rich.traceback import Trace, Traceback

from elastic_hydra import tracebacks
from elastic_hydra.hangs import verdict
from elastic_hydra.plan import FailureClass
from elastic_hydra.records.failures import FailureRecord, FailureSource, PeerFailure
from elastic_hydra.records.hangs import HangRecord
from elastic_hydra.records.preflight import PreflightVerdict
from elastic_hydra.records.summary import JobResult, RunStatus, RunSummary
from elastic_hydra.report.notices import took
from elastic_hydra.rundir import RunDir


def console(stderr: bool = False, soft_wrap: bool = False) -> Console:
    # Off a terminal (CI logs, pipes) do not fold long paths and commands at 80 columns, unless
    # COLUMNS says how wide the reader is.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS", "").isdigit() else 200
    return Console(stderr=stderr, soft_wrap=soft_wrap, highlight=False, width=width)


def sweep_table(results: Sequence[JobResult]) -> Table:
    table = Table(title="elastic-hydra sweep", box=box.SIMPLE_HEAVY)
    for name in ("#", "overrides", "status", "exit", "attempts", "duration", "run dir"):
        table.add_column(name, overflow="fold")
    for i, r in enumerate(results):
        status = (
            "[green]ok[/]"
            if r.exit_code == 0
            else "[yellow]stopped[/]"
            if r.exit_code > 128
            else "[red]failed[/]"
        )
        duration = r.summary.duration_s if r.summary else None
        table.add_row(
            str(i),
            Text(" ".join(o for o in r.overrides if not o.startswith("args=")) or "(none)"),
            status,
            str(r.exit_code),
            str(r.summary.attempts) if r.summary else "-",
            f"{duration:.2f} s" if isinstance(duration, float) else "-",
            Text(_relative(r.run_dir)),
        )
    return table


def _relative(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def print_sweep(results: Sequence[JobResult]) -> None:
    _print(console(), sweep_table(results))


# --------------------------------------------------------------------------------- run summary
def print_failure(summary: RunSummary) -> None:
    """The closing report of a launch that did not succeed, on stderr: rich on a terminal, plain
    text elsewhere. (The success line is `notices.succeeded`, which needs no rich.)"""
    out = console(stderr=True)
    _print(out, outcome_report(summary, plain=not out.is_terminal, width=out.width))


def show(out: Console, *renderables: RenderableType) -> None:
    """Print renderables as every report of this package does (see `_print`)."""
    _print(out, *renderables)


def _print(out: Console, *renderables: RenderableType) -> None:
    """Print; off a terminal (CI logs, diffs, grep) lines of text stay whole, without the padding
    rich adds to the ends of lines."""
    if out.is_terminal:
        out.print(*renderables)
        return
    with out.capture() as captured:
        out.print(*renderables, soft_wrap=True)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    out.file.write(text + "\n")
    out.file.flush()


def preflight_section(found: PreflightVerdict | None) -> list[RenderableType]:
    """The preflight verdict's lines: a failed check in red, the round's figures plain, then what
    this node put into the quarantine ledger."""
    if found is None:
        return []
    lines: list[RenderableType] = [
        Text(f.line, style="red" if f.fatal else "") for f in found.findings
    ]
    if found.quarantined and found.quarantined_until is not None:
        until = datetime.fromtimestamp(found.quarantined_until, UTC).strftime("%Y-%m-%d %H:%M UTC")
        what = ", ".join(found.quarantined)
        lines.append(Text(f"quarantined {what} until {until} (this node, in quarantine.ledger)"))
    return lines


def outcome_report(
    summary: RunSummary, *, plain: bool, width: int = 100, earlier_in_full: bool = False
) -> RenderableType:
    """The failure report: root cause and its traceback, the other ranks, the failures of
    earlier attempts (one line each, or `earlier_in_full` as the root cause), where the logs
    are."""
    title = f"elastic-hydra: {summary.status.replace('_', ' ')}"  # not a field name
    told = summary.status in (RunStatus.FAILED, RunStatus.EXCLUDED)  # others say it already
    if told and summary.failure_class not in (None, FailureClass.UNKNOWN):
        title += f" ({summary.failure_class})"
    headline = Text(f"{summary.message} ({took(summary)})")
    parts: list[RenderableType] = []
    cause = summary.root_cause
    if cause is not None:
        parts += _root_cause(cause, plain=plain, width=width)
    elif summary.hang is not None:
        parts += hang_section(summary.hang, plain=plain)
    parts += peer_section(summary.peer_failures)
    parts += preflight_section(summary.preflight)
    others = _other_ranks(summary, cause, plain=plain)
    if others is not None:
        parts.append(others)
    parts += earlier_section(summary, plain=plain, width=width, full=earlier_in_full)
    if summary.stuck_pids:
        parts.append(Text(f"processes that would not die: {list(summary.stuck_pids)}", style="red"))
    parts.append(Text(f"run dir: {summary.run_dir}"))
    if cause is not None:
        there = "" if cause.host == summary.host else f" on {cause.host}"
        parts.append(Text(f"logs of rank {cause.rank}{there}: {cause.stderr_log}"))
    if plain:
        return Group(Text.assemble((f"{title}: ", "bold red"), headline), *parts)
    return Panel(
        Group(headline, *parts),
        title=Text(title, style="bold red"),
        title_align="left",
        border_style="red",
        box=box.ROUNDED,
    )


def earlier_section(
    summary: RunSummary, *, plain: bool, width: int, full: bool
) -> list[RenderableType]:
    """The failures of attempts before the last (`RunSummary.earlier_failures`): in full, each as
    the root cause is shown (an error already shown is named, not repeated); else one line each
    and where the full story is."""
    earlier = summary.earlier_failures
    if not earlier:
        return []
    recovered = summary.status is RunStatus.SUCCEEDED
    title = "recovered failures" if recovered else "earlier failures"
    parts: list[RenderableType] = [
        Text(f"{title} (each was followed by a new attempt)", style="bold yellow")
    ]
    if not full:
        for f in earlier:
            parts.append(Text(f"  attempt {f.attempt}: {_who(f)}: {f.exit}: {_first_line(f)}"))
        parts.append(Text(f"their tracebacks: elastic-hydra report {summary.run_dir}", style="dim"))
        return parts
    shown: dict[tuple[object, ...], FailureRecord] = {}
    if summary.root_cause is not None:
        shown[_error_of(summary.root_cause)] = summary.root_cause
    for f in earlier:
        if (same := shown.get(_error_of(f))) is not None:
            parts += _root_cause(f, plain=plain, width=width, label="failure", details=False)
            parts.append(Text(f"same error as attempt {same.attempt}, rank {same.rank}", "dim"))
            continue
        shown.setdefault(_error_of(f), f)
        parts += _root_cause(f, plain=plain, width=width, label="failure")
    return parts


def _who(f: FailureRecord) -> str:
    return f"rank {f.rank} (local rank {f.local_rank}) on {_where(f)}"


def _first_line(f: FailureRecord) -> str:
    """A failure's error in one line: its message, else its last line of stderr."""
    lines = f.error_text.strip().splitlines()
    return lines[-1] if lines else "(no error text)"


def _error_of(f: FailureRecord) -> tuple[object, ...]:
    """What makes two failures the same error: how it ended, its message and traceback, or
    without them its stderr's tail (not its pid, time or rank)."""
    told = f.message or f.traceback
    return (f.exit, f.message, f.traceback, () if told else f.stderr_tail)


def _root_cause(
    cause: FailureRecord,
    *,
    plain: bool,
    width: int,
    label: str = "root cause",
    details: bool = True,
) -> list[RenderableType]:
    """A failure as the report leads with it: who, how, when, then its traceback (or its stderr);
    without `details` the first three alone."""
    when = datetime.fromtimestamp(cause.time).isoformat(sep=" ", timespec="milliseconds")
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    head.add_row(
        label,
        Text.assemble(
            (f"rank {cause.rank}", "bold yellow"),
            f" (local rank {cause.local_rank}) on {_where(cause)}, pid {cause.pid}, "
            f"attempt {cause.attempt}, restart count {cause.restart_count}",
        ),
    )
    head.add_row("exit", Text(cause.exit, style="bold red"))
    if cause.failure_class is not FailureClass.UNKNOWN or cause.evidence:
        told = Text(cause.failure_class.value, style="bold")
        head.add_row("class", told.append(f": {cause.evidence}" if cause.evidence else "", ""))
    head.add_row("time", when)
    parts: list[RenderableType] = [head]
    if not details:
        return parts
    stacks = cause.traceback
    if stacks and plain:
        parts.append(Text(tracebacks.format_stacks(stacks)))
    elif stacks:
        parts.append(_rich_traceback(stacks, width))
    elif cause.message:
        parts.append(Text(cause.message, style="red"))
    # A crash's stack comes from its dump: show stderr beside it only when there is some.
    if not stacks or (cause.source is FailureSource.CRASH and cause.stderr_tail):
        parts += _stderr_tail(cause)
    return parts


_PLACES_SHOWN = 4  # stacks shown for a hang whose verdict cannot tell which rank


def hang_section(hang: HangRecord, *, plain: bool) -> list[RenderableType]:
    """The main-thread stacks of the ranks the verdict names as stuck or, when it cannot tell,
    of one rank per place (the others' are in their stacks.txt)."""
    parts: list[RenderableType] = []
    shown = [r for r in hang.ranks if r.odd] or [
        members[0] for _, members in verdict.groups(hang.ranks)[:_PLACES_SHOWN]
    ]
    for r in shown:
        where = f"rank {r.rank} (local rank {r.local_rank}) on {r.host}, pid {r.pid}: {r.state}"
        parts.append(Text(where, style="bold yellow"))
        parts += [Text(line) for line in verdict.main_stack_lines(r) or ()]
    parts.append(Text(f"every rank's stacks: {RunDir.stacks_shown(hang.attempt, '<local rank>')}"))
    if any(r.groups for r in hang.ranks):
        parts.append(Text(f"collectives: {RunDir.collectives_shown(hang.attempt)}"))
    if missing := verdict.no_collectives(hang.ranks):
        parts.append(Text(missing))
    return parts


def peer_section(peers: Sequence[PeerFailure]) -> list[RenderableType]:
    """What the job's torchrun agents did, as far as the store tells: their tracebacks stay in
    their own logs."""
    if not peers:
        return []
    lines: list[RenderableType] = [
        Text("torchrun nodes (their tracebacks are in their own logs):", style="bold")
    ]
    for p in peers:
        when = datetime.fromtimestamp(p.time).strftime("%H:%M:%S")
        lines.append(Text(f"  {when} round {p.rdzv_round}: {p.line()}"))
    return lines


def _where(cause: FailureRecord) -> str:
    node = cause.node_rank
    return cause.host if node is None else f"{cause.host} (node {node})"


def _rich_traceback(stacks: Sequence[tracebacks.Stack], width: int) -> RenderableType:
    trace = Trace(
        stacks=[
            RichStack(
                exc_type=s.exc_type,
                exc_value=s.exc_value,
                is_cause=s.link == "cause",
                frames=[RichFrame(f.filename, f.lineno, f.name, f.line) for f in s.frames],
            )
            for s in reversed(stacks)  # rich keeps the newest exception first
        ]
    )
    return Traceback(trace, width=width, extra_lines=1, max_frames=30)


def _stderr_tail(cause: FailureRecord) -> list[RenderableType]:
    tail = cause.stderr_tail
    if not tail:
        return [Text(f"(stderr was empty: {cause.stderr_log})", style="dim")]
    return [
        Text(f"last {len(tail)} line(s) of {cause.stderr_log}:", style="dim"),
        Text("\n".join(f"  {line}" for line in tail)),
    ]


def _other_ranks(summary: RunSummary, cause: FailureRecord | None, *, plain: bool) -> Table | None:
    exits = list(summary.exits)
    if cause is not None:  # the root cause's group only
        exits = [e for e in exits if e.attempt == cause.attempt and e.rank != cause.rank]
    elif exits:
        last = max(e.attempt for e in exits)
        exits = [e for e in exits if e.attempt == last]
    if not exits:
        return None
    table = Table(
        title="other ranks" if cause else "ranks",
        title_justify="left",
        box=None if plain else box.SIMPLE,
        pad_edge=False,
    )
    for name in ("rank", "local", "pid", "how it ended"):
        table.add_column(name, overflow="fold")
    for e in sorted(exits, key=lambda e: e.rank):
        how = e.exit
        if e.returncode == 0:  # done by itself, or it heard the launcher's stop and ended well
            how = "exited 0"
        elif e.terminated_by_launcher:
            how = f"terminated by launcher ({e.signal or how})"
        elif e.after_node_loss:
            how = f"{how}, collateral of another node's failure or loss"
        table.add_row(str(e.rank), str(e.local_rank), str(e.pid), Text(how))
    return table
