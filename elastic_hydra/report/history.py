"""What `elastic-hydra report` shows of a finished run beside the end-of-run report: the events
timeline, one row per attempt, the failures restarts recovered, and a multi-node run dir's nodes.

Rendered with rich, like `render` (whose console, printing and failure sections it uses): the
two are the only modules importing rich.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from elastic_hydra.agent.events import (
    Event,
    Finish,
    Hang,
    MembershipChange,
    Restart,
    SignalReceived,
    WorkerExited,
    WorkersStarted,
)
from elastic_hydra.plan import HangAction
from elastic_hydra.records.goodput import Ledger, Phase
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.report import goodput
from elastic_hydra.report.notices import took
from elastic_hydra.report.render import (
    console,
    earlier_section,
    hang_section,
    outcome_report,
    peer_section,
    preflight_section,
    show,
)


def print_report(summary: RunSummary, events: Sequence[Event]) -> None:
    """`elastic-hydra report RUN_DIR`: the events timeline, the attempts, the saved summary."""
    out = console()
    show(out, *run_report(summary, events, plain=not out.is_terminal, width=out.width))


def run_report(
    summary: RunSummary, events: Sequence[Event], *, plain: bool, width: int
) -> list[RenderableType]:
    """One node's run: timeline, attempts, then how it ended (a failure's report, with the
    failures of earlier attempts in full; or what happened on the way to success)."""
    ending: RenderableType = Text(
        f"elastic-hydra: succeeded ({took(summary)}); run dir {summary.run_dir}"
    )
    if summary.status is not RunStatus.SUCCEEDED:
        ending = outcome_report(summary, plain=plain, width=width, earlier_in_full=True)
    else:  # what happened on the way: failures restarts recovered, a hang, torchrun nodes
        on_the_way = earlier_section(summary, plain=plain, width=width, full=True)
        if summary.hang is not None:
            on_the_way.append(Text(f"reported on the way: {summary.hang.verdict}", style="yellow"))
            on_the_way += hang_section(summary.hang, plain=plain)
        ending = Group(
            *preflight_section(summary.preflight),
            *on_the_way,
            *peer_section(summary.peer_failures),
            ending,
        )
    shown: list[RenderableType] = [timeline(events, plain=plain)]
    shown.append(attempts_table(events, plain=plain))
    if summary.ledger is not None:
        shown.append(ledger_table(summary.ledger, plain=plain))
    return [*shown, ending]


def ledger_table(ledger: Ledger, *, plain: bool, title: str = "") -> Table:
    """The goodput ledger in one short table: each phase that took time, its share of the wall
    time and its GPU-seconds; the work lost to failures below."""
    gpus = f"{ledger.gpus} GPU(s)" if ledger.gpus else "no GPU: GPU-s 0"
    table = Table(
        title=title or f"goodput ledger: node {', '.join(ledger.nodes)} ({gpus})",
        title_justify="left",
        box=None if plain else box.SIMPLE,
        pad_edge=False,
    )
    for name in ("phase", "wall (s)", "share", "GPU-s"):
        table.add_column(name, justify="left" if name == "phase" else "right")
    for row in ledger.phases:
        if round(row.wall_s, 3) > 0 or row.phase is Phase.RUNNING:
            share = row.wall_s / ledger.wall_s if ledger.wall_s > 0 else 0.0
            table.add_row(row.phase.value, f"{row.wall_s:.3f}", f"{share:.1%}", f"{row.gpu_s:.1f}")
    table.add_row("total", f"{ledger.wall_s:.3f}", f"{goodput.attributed_fraction(ledger):.1%}",
                  f"{sum(p.gpu_s for p in ledger.phases):.1f}", style="bold")  # fmt: skip
    for work in ledger.lost:
        lost = "not known (no progress seen)" if work.lost_s is None else f"{work.lost_s:.3f}"
        table.add_row(f"lost: attempt {work.attempt}, {work.cause}", lost, "", "")
    return table


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One start of the worker group as the timeline tells it."""

    attempt: int
    started: float | None  # monotonic; None: it never started (its workers could not be)
    ended: float | None  # monotonic; None: the timeline does not tell (the agent was killed)
    how: str


def attempts(events: Sequence[Event]) -> list[Attempt]:
    """Every start of the worker group and how it ended: the first worker that failed, or what
    ended it (a restart, a membership change, a stop signal, the end of the run). A start whose
    end the timeline lacks, and a last attempt whose workers could not be started, are rows too.
    """
    rows: list[Attempt] = []
    start: WorkersStarted | None = None
    failed = ""

    def close(at: float | None, how: str) -> None:
        nonlocal start
        assert start is not None
        rows.append(Attempt(attempt=start.attempt, started=start.mono_time, ended=at, how=how))
        start = None

    for ev in events:
        match ev:
            case WorkersStarted():
                if start is not None:
                    close(None, "no end recorded")
                start, failed = ev, ""
            case WorkerExited() if start is not None and not failed:
                if ev.returncode != 0 and not ev.terminated_by_launcher:
                    failed = f"rank {ev.rank} {ev.exit}"
            case Hang() if start is not None and not failed and ev.action != HangAction.REPORT:
                failed = f"hung: {ev.verdict}"
            case MembershipChange() if start is not None:
                how = f"membership change: {ev.reason}"
                if ev.collateral:
                    how += f" (rank(s) {','.join(map(str, ev.collateral))} failed with it)"
                close(ev.mono_time, how)
            case SignalReceived() if start is not None:
                close(ev.mono_time, f"stopped by {ev.signal}")
            case Restart() if start is not None:
                close(ev.mono_time, failed or ev.reason)
            case Finish():
                if start is not None:
                    close(ev.mono_time, failed or ev.reason)
                elif ev.attempts > (rows[-1].attempt + 1 if rows else 0):
                    rows.append(Attempt(attempt=ev.attempts - 1, started=None,
                                        ended=ev.mono_time, how=ev.reason))  # fmt: skip
    if start is not None:
        close(None, failed or "no end recorded (the agent was killed?)")
    return rows


def attempts_table(events: Sequence[Event], *, plain: bool) -> Table:
    """One row per start of the worker group: when, for how long, and how it ended."""
    table = Table(title="attempts", title_justify="left", box=None if plain else box.SIMPLE)
    for name in ("attempt", "started (s)", "ran (s)", "ended"):
        table.add_column(name, overflow="fold")
    t0 = events[0].mono_time if events else 0.0
    for row in attempts(events):
        began = "-" if row.started is None else f"{row.started - t0:.3f}"
        ran = "-" if row.started is None or row.ended is None else f"{row.ended - row.started:.3f}"
        table.add_row(str(row.attempt), began, ran, Text(row.how))
    return table


_NOT_DETAILS = ("event", "time", "monotonic", "format")  # in their own columns, or not news


def _short(value: object) -> str:
    """An event's value for people: floats to 3 significant decimals (0.947, not 0.94729827)."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def timeline(events: Sequence[Event], *, plain: bool) -> Table:
    """One row per event: seconds since the first, what happened (its fields as written)."""
    table = Table(title="timeline", title_justify="left", box=None if plain else box.SIMPLE)
    table.add_column("t (s)", justify="right")
    table.add_column("event")
    table.add_column("details", overflow="fold")
    t0 = events[0].mono_time if events else 0.0
    for ev in events:
        data = {k: v for k, v in ev.to_json().items() if k not in _NOT_DETAILS}
        details = ", ".join(f"{k}={_short(v)}" for k, v in data.items())
        table.add_row(f"{ev.mono_time - t0:.3f}", Text(ev.kind.value), Text(details))
    return table


# ---------------------------------------------------------------------------- multi-node run dirs
@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRun:
    """One node's run dir inside a multi-node job's, as `report` found it."""

    name: str  # its directory's name: the node's
    path: str
    summary: RunSummary | None  # None: no summary to read (`missing` says why)
    events: Sequence[Event] = ()
    missing: str = ""


def print_nodes(where: str, nodes: Sequence[NodeRun]) -> None:
    """`elastic-hydra report JOB_DIR` of a multi-node run: a table of its nodes, then each
    node's report."""
    out = console()
    plain = not out.is_terminal
    parts: list[RenderableType] = [nodes_table(where, nodes, plain=plain)]
    if (job := job_ledger_table(nodes, plain=plain)) is not None:
        parts.append(job)
    for node in nodes:
        parts.append(Text(f"\nnode {node.name}: {node.path}", style="bold"))
        if node.summary is None:
            parts.append(Text(node.missing, style="yellow"))
            continue
        parts += run_report(node.summary, node.events, plain=plain, width=out.width)
    show(out, *parts)


def nodes_table(where: str, nodes: Sequence[NodeRun], *, plain: bool) -> Table:
    """One row per node: how its run ended."""
    table = Table(
        title=f"{len(nodes)} node(s) in {where}",
        title_justify="left",
        box=None if plain else box.SIMPLE,
        pad_edge=False,
    )
    for name in ("node", "status", "exit", "attempts", "restarts", "took (s)"):
        table.add_column(name, overflow="fold")
    for node in nodes:
        s = node.summary
        if s is None:
            table.add_row(node.name, Text(node.missing), "-", "-", "-", "-")
            continue
        status = Text(s.status.value, style="green" if s.status is RunStatus.SUCCEEDED else "red")
        table.add_row(
            node.name, status, str(s.exit_code), str(s.attempts), str(s.restarts),
            f"{s.duration_s:.2f}",
        )  # fmt: skip
    return table


def job_ledger_table(nodes: Sequence[NodeRun], *, plain: bool) -> Table | None:
    """The job's account: the sum of the ledgers of the nodes whose summary was read here
    (wall in node-seconds); the title names the nodes it covers and those it does not."""
    have = [n for n in nodes if n.summary is not None and n.summary.ledger is not None]
    job = goodput.job_ledger([n.summary.ledger for n in have if n.summary and n.summary.ledger])
    if job is None:
        return None
    missing = [n.name for n in nodes if n not in have]
    title = f"goodput ledger: job, the sum of node(s) {', '.join(n.name for n in have)}"
    if missing:
        title += f" (not counted, no ledger: {', '.join(missing)})"
    return ledger_table(job, plain=plain, title=title + "; wall in node-seconds")
