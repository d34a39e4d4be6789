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


def _size(value: float | None) -> str:
    """Bytes in 5 characters or fewer: 512M, 1.5G, 80G."""
    if value is None:
        return "-"
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            shown = value / scale
            return f"{shown:.1f}{unit}" if shown < 10 else f"{shown:.0f}{unit}"
    return f"{value:.0f}B"


def _age(value: float | None) -> str:
    """Seconds in 5 characters or fewer: 12.3s, 42m, 27.8h, 118h."""
    if value is None:
        return "-"
    if value < 100:
        return f"{value:.1f}s"
    if value < 6000:
        return f"{value / 60:.0f}m"
    hours = value / 3600
    return f"{hours:.1f}h" if hours < 100 else f"{hours:.0f}h"


def _gpu(w: WorkerStatus) -> str:
    if w.gpu_util is None and w.gpu_mem_bytes is None:
        return "-"
    util = "-" if w.gpu_util is None else f"{w.gpu_util:.0f}%"
    return f"{util} {_size(w.gpu_mem_bytes)}"


def table(snap: Snapshot) -> Group:
    """The snapshot as a heading (the job's phase), then each node's line and one row per rank;
    80 columns are enough."""
    phase = snap.phase.value if snap.phase is not None else "unknown"
    head = Text(f"job: {phase}   nodes: {len(snap.nodes)}", style="bold")
    if snap.ignored:
        head.append(f"   ({snap.ignored} record(s) ignored)", style="yellow")
    parts: list[Text | Table] = [head]
    for view in snap.nodes:
        r = view.record
        # What the node does first, its host name last: a long name is cut, never wrapped.
        line = Text(f"node {r.node if r.node_rank is None else r.node_rank}: ", no_wrap=True,
                    overflow="ellipsis")  # fmt: skip
        line.append(*(("stale", "bold red") if view.stale else (r.phase.value, "")))
        if view.stale:
            line.append(f" {view.age:.0f}s")
        line.append(f"   attempt {r.attempt}   restarts {r.restarts}")
        if r.node_rank is not None:
            line.append(f"   {r.node}")
        parts.append(line)
        grid = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
        for name in ("rank", "pid", "state", "idle", "progress", "last at", "cpu", "rss", "gpu"):
            left = name in ("state", "progress", "last at")
            grid.add_column(
                name, justify="left" if left else "right", no_wrap=True,
                max_width=17 if name == "progress" else None, overflow="ellipsis",
            )  # fmt: skip
        for w in r.workers or ():
            grid.add_row(
                str(w.rank), str(w.pid or "-"),
                Text(w.state.value, style="dim" if view.stale else _STYLE[w.state]),
                _age(w.progress_age), w.progress_via or "-", _last_at(w),
                "-" if w.cpu_percent is None else f"{w.cpu_percent:.0f}%",
                _size(w.rss_bytes), _gpu(w),
            )  # fmt: skip
        if r.workers:
            parts.append(grid)
    return Group(*parts)


def _last_at(w: WorkerStatus) -> Text:
    """The straggler score: the share of the last collectives the rank arrived last at and its
    median lateness then; red once it is named a straggler."""
    if w.last_at is None:
        return Text("-")
    behind = (
        ""
        if not w.behind
        else (f" +{w.behind * 1000:.0f}ms" if w.behind < 1 else f" +{w.behind:.1f}s")
    )
    text = f"{w.last_at:.0%}{behind}"
    return Text(text, style="bold red" if w.straggler else "")


def show(snap: Snapshot, console: Console | None = None) -> None:
    """Print one snapshot."""
    (console or Console()).print(table(snap))


def live(read: Callable[[], Snapshot], wait: Callable[[float], bool], every: float = 1.0) -> None:
    """Redraw `read()` every `every` seconds until `wait(every)` says to stop."""
    with Live(table(read()), auto_refresh=False, transient=False) as screen:
        while not wait(every):
            screen.update(table(read()), refresh=True)
