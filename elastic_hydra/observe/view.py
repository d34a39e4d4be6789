"""`elastic-hydra top`'s table: every rank on every node, the job's phase on top (rich).

`table` draws one snapshot; `live` redraws one about once a second until asked to stop.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from elastic_hydra.observe.snapshot import Snapshot
from elastic_hydra.observe.status import WorkerState, WorkerStatus

_STYLE = {
    WorkerState.RUNNING: "green", WorkerState.STARTING: "cyan", WorkerState.DONE: "dim",
    WorkerState.RESTARTING: "yellow", WorkerState.HUNG: "bold red", WorkerState.FAILED: "red",
    WorkerState.STOPPED: "magenta",
}  # fmt: skip


def _num(value: float | None, unit: str = "", scale: float = 1.0) -> str:
    return "-" if value is None else f"{value / scale:.1f}{unit}"


def table(snap: Snapshot) -> Group:
    """The snapshot as a heading (the job's phase) and one row per rank."""
    phase = snap.phase.value if snap.phase is not None else "unknown"
    head = Text(f"job: {phase}   nodes: {len(snap.nodes)}", style="bold")
    if snap.ignored:
        head.append(f"   ({snap.ignored} record(s) ignored)", style="yellow")
    grid = Table(box=None, pad_edge=False, header_style="bold")
    left = ("node", "state", "last progress", "last at", "phase")
    for name in ("node", "rank", "local", "pid", "state", "idle", "last progress", "last at",
                 "cpu", "rss", "gpu", "gpu mem", "attempt", "restarts", "phase"):  # fmt: skip
        grid.add_column(name, justify="left" if name in left else "right")
    for view in snap.nodes:
        r = view.record
        node = f"{r.node} ({r.node_rank})" if r.node_rank is not None else r.node
        node_phase = Text("stale", style="bold red") if view.stale else Text(r.phase.value)
        if view.stale:
            node_phase.append(f" {view.age:.0f}s")
        for w in r.workers or ():
            grid.add_row(
                node, str(w.rank), str(w.local_rank), str(w.pid or "-"),
                Text(w.state.value, style="dim" if view.stale else _STYLE[w.state]),
                _num(w.progress_age, "s"), w.progress_via or "-", _last_at(w),
                _num(w.cpu_percent, "%"),
                _num(w.rss_bytes, "M", 1 << 20), _num(w.gpu_util, "%"),
                _num(w.gpu_mem_bytes, "M", 1 << 20), str(r.attempt), str(r.restarts), node_phase,
            )  # fmt: skip
        if not r.workers:
            grid.add_row(node, *["-"] * 11, str(r.attempt), str(r.restarts), node_phase)
    return Group(head, grid)


def _last_at(w: WorkerStatus) -> Text:
    """The straggler score: the share of the last collectives the rank arrived last at and its
    median lateness then; red once it is named a straggler."""
    if w.last_at is None:
        return Text("-")
    text = f"{w.last_at:.0%}" + (f" +{w.behind * 1000:.0f}ms" if w.behind else "")
    return Text(text, style="bold red" if w.straggler else "")


def show(snap: Snapshot, console: Console | None = None) -> None:
    """Print one snapshot."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: every column, not 80 characters
            console = Console(width=160)
    console.print(table(snap))


def live(read: Callable[[], Snapshot], wait: Callable[[float], bool], every: float = 1.0) -> None:
    """Redraw `read()` every `every` seconds until `wait(every)` says to stop."""
    with Live(table(read()), auto_refresh=False, transient=False) as screen:
        while not wait(every):
            screen.update(table(read()), refresh=True)
