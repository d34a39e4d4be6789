"""The pool's progress for people: a live table on a terminal, one plain line per job start and
end elsewhere (CI logs, pipes). The final sweep table is `render.print_sweep`'s.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from elastic_hydra import tracebacks
from elastic_hydra.records.summary import JobResult
from elastic_hydra.report.render import console
from elastic_hydra.sweeps.pool import JobRow, PoolJob, PoolView, State
from elastic_hydra.sweeps.slots import Slot

_STYLE = {
    State.QUEUED: "dim",
    State.RUNNING: "cyan",
    State.SUCCEEDED: "green",
    State.FAILED: "red",
    State.STOPPED: "yellow",
}
_SHOWN_FIRST = (State.RUNNING, State.FAILED, State.STOPPED, State.QUEUED, State.SUCCEEDED)


@contextmanager
def view(jobs: Sequence[PoolJob], slots: Sequence[Slot], sweep_dir: Path) -> Iterator[PoolView]:
    """The view for this console: live on a terminal, plain lines elsewhere."""
    out = console()
    out.print(
        f"elastic-hydra pool: {len(jobs)} job(s), {len(slots)} at once "
        f"({_share(slots[0]) if slots else '-'}), in {sweep_dir}",
        soft_wrap=True,
    )
    labels = Labels(jobs)
    if not (out.is_terminal and not out.is_dumb_terminal):
        yield PlainLines(labels)
        return
    with Live(console=out, auto_refresh=False, transient=True) as live:
        yield LiveTable(live, out, labels)


def _share(slot: Slot) -> str:
    parts = [f"{len(slot.gpus)} GPU(s)"] if slot.gpus else []
    parts += [f"{len(slot.cpus)} CPU(s)"] if slot.cpus is not None else []
    return " and ".join(parts) + " each" if parts else "no GPU or CPU binding"


class Labels:
    """A job's label: the overrides that tell it from the sweep's other jobs."""

    def __init__(self, jobs: Sequence[PoolJob]) -> None:
        sets = [set(j.overrides) for j in jobs]
        self.common = set.intersection(*sets) if len(sets) > 1 else set()

    def __call__(self, row: JobRow) -> str:
        return " ".join(o for o in row.job.overrides if o not in self.common) or "(none)"


def result_text(row: JobRow) -> str:
    """A finished job in one line: ok, or its exit code and root cause."""
    result = row.result
    if result is None:
        return ""
    if result.exit_code == 0:
        return "ok"
    return f"exit {result.exit_code}: {cause_line(result)}"


def cause_line(result: JobResult) -> str:
    """The root cause in one line: `rank 1: ValueError: bad lr (train.py:42)`; else the
    outcome's message."""
    cause = result.summary.root_cause if result.summary else None
    if cause is None:
        lines = result.message.strip().splitlines()
        return lines[0] if lines else "no result"
    stacks = cause.traceback
    what, where = cause.message or cause.exit, ""
    tail = [line for line in cause.stderr_tail if line.strip()]
    if not cause.message and tail:  # e.g. sys.exit("message"): the last words it printed
        what = f"{cause.exit}: {tail[-1].strip()}"
    if stacks:
        what, frames = tracebacks.exception_line(stacks[-1]), stacks[-1].frames
        where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    lines = what.strip().splitlines()
    return f"rank {cause.rank}: {lines[0] if lines else cause.exit}{where}"


class PlainLines:
    """One line per start and per end, on stdout."""

    def __init__(self, label: Labels) -> None:
        self.label = label

    def started(self, row: JobRow) -> None:
        slot = row.slot.describe() if row.slot else "-"
        _line(f"[pool] #{row.job.number} started on {slot}: {self.label(row)}")

    def ended(self, row: JobRow) -> None:
        took = row.elapsed(time.monotonic()) or 0.0
        _line(f"[pool] #{row.job.number} {row.state.value} after {took:.1f} s: {result_text(row)}")

    def tick(self, rows: Sequence[JobRow], now: float) -> None:
        pass


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class LiveTable:
    """The jobs' table, redrawn at each start, end and second."""

    def __init__(self, live: Live, out: Console, label: Labels) -> None:
        self.live, self.out, self.label = live, out, label

    def started(self, row: JobRow) -> None:
        pass

    def ended(self, row: JobRow) -> None:
        pass

    def tick(self, rows: Sequence[JobRow], now: float) -> None:
        room = max(3, self.out.height - 8)
        self.live.update(pool_table(rows, now, self.label, max_rows=room), refresh=True)


def pool_table(
    rows: Sequence[JobRow], now: float, label: Callable[[JobRow], str], *, max_rows: int
) -> Table:
    """The jobs, running and failed ones first when they do not all fit."""
    counts = {s: sum(r.state is s for r in rows) for s in State}
    caption = " · ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    table = Table(box=box.SIMPLE_HEAVY, caption=caption, title="elastic-hydra pool")
    for name in ("#", "overrides", "state", "time", "slot", "result"):
        table.add_column(name, overflow="ellipsis", no_wrap=name != "overrides")
    shown = sorted(rows, key=lambda r: (_SHOWN_FIRST.index(r.state), r.job.number))[:max_rows]
    for row in sorted(shown, key=lambda r: r.job.number):
        elapsed = row.elapsed(now)
        table.add_row(  # Text: overrides and messages are the user's, never markup
            str(row.job.number),
            Text(label(row)),
            Text(row.state.value, style=_STYLE[row.state]),
            "" if elapsed is None else f"{elapsed:.{1 if elapsed < 10 else 0}f} s",
            Text(row.slot.describe() if row.slot else ""),
            Text(result_text(row)),
        )
    if len(rows) > len(shown):
        table.add_row("…", f"{len(rows) - len(shown)} more (see the counts below)", "", "", "", "")
    return table
