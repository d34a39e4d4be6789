"""The files the bootstrap keeps beside a worker's logs for the agent, and their tidying.

While a worker runs, its rank dir holds a crash dump file (faulthandler), a stacks file (dumped on
a hang or for `elastic-hydra stacks`) and a progress note (the hang watch's input). Once the worker
is gone only the files that hold something stay: a healthy run's rank dirs hold its logs alone,
and a file there means something happened.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerNotes:
    """Files the bootstrap keeps for the agent while its worker runs. When the worker is gone
    only those that hold something stay, so a healthy run's rank dirs hold its logs alone, and
    a file there means something happened."""

    fault: Path  # a crash's Python stack (faulthandler): kept when one was written
    stacks: Path  # stacks the agent asked for (a hang, `elastic-hydra stacks`): kept if dumped
    progress: Path  # the hang watch's progress note: only of use while the worker runs


def tidy_notes(notes: WorkerNotes) -> None:
    """Remove the notes that hold nothing: an empty crash dump, a stacks file with only its first
    line (which thread is main), the progress note."""
    with contextlib.suppress(OSError):
        if notes.fault.stat().st_size == 0:
            notes.fault.unlink()
    with contextlib.suppress(OSError):
        with open(notes.stacks, "rb") as f:
            head = f.read(1 << 12)
        if head.count(b"\n") <= 1 and len(head) < 1 << 12:
            notes.stacks.unlink()
    with contextlib.suppress(OSError):
        notes.progress.unlink()
