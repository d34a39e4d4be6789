"""The worker's side: `restore`, `snapshot`, `save_requested`. Standard library only; torch is
used when the script imported it. Outside an elastic-hydra worker every call is a no-op.

    from elastic_hydra import checkpoint as ckpt

    state = ckpt.restore()              # None on a fresh start, else this rank's snapshot
    start = 0 if state is None else state["step"] + 1
    for step in range(start, steps):
        ...
        ckpt.snapshot({"model": model.state_dict(), "optim": opt.state_dict()}, step=step)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastic_hydra.agent.inherit import SNAPSHOT_LIMIT, SNAPSHOTS
from elastic_hydra.checkpoint import codec
from elastic_hydra.checkpoint.layout import Area

KEEP_IN_MEMORY = 2  # a rank's newest snapshots kept: its ranks may be a step apart at a failure
# At most this many while the other nodes' copies on their buddies lag (checkpoint.buddy): the
# steps from the floor the agent names on are kept, so every rank still holds the step a lost
# node's copy reaches.
KEEP_WHILE_COPIES_LAG = 8
STEP = "step"

_told: set[str] = set()
_last_step: int | None = None  # the step of this process's newest snapshot


class CheckpointError(RuntimeError):
    """What the agent offered to resume from cannot be read (the message says which file)."""


def _area() -> Area | None:
    root = os.environ.get(SNAPSHOTS)
    return Area(Path(root)) if root else None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _say(line: str) -> None:
    """One line on the rank's stderr, once per distinct line."""
    if line not in _told:
        _told.add(line)
        print(f"elastic-hydra: {line}", file=sys.stderr, flush=True)


def restore() -> dict[str, Any] | None:
    """This rank's state as of the step the job resumes from, or None on a fresh start.

    The agent chose that step before starting the workers: the newest one every rank of the job
    holds a complete snapshot of (in memory after a restart, else the newest complete copy in
    the checkpoint home). The state is the dict given to `snapshot`, with its `step`; tensors
    come back on the CPU.

    Raises:
        CheckpointError: the snapshot the agent offered cannot be read.
    """
    area = _area()
    if area is None:
        return None
    try:
        offer = json.loads(area.restore.read_bytes())
    except (OSError, ValueError):
        return None
    step, source = offer.get("step"), offer.get("source")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    rank = _rank()
    if source == "memory":
        path = area.snapshot(rank, step)
    elif isinstance(source, str) and os.path.isabs(source):
        path = Path(source) / f"rank-{rank}.snap"
    else:
        return None
    if not path.exists():  # a rank the snapshot's job did not have (the world grew)
        _say(f"rank {rank} has no snapshot of step {step}: it starts afresh")
        return None
    try:
        state = codec.read(path)
    except (OSError, codec.SnapshotReadError) as exc:
        raise CheckpointError(f"the snapshot of step {step} cannot be read: {exc}") from None
    state[STEP] = step
    return state


def snapshot(state: Mapping[str, Any], *, step: int) -> bool:
    """Copy `state` into the memory the agent owns, as this rank's snapshot of `step`.

    The copy is complete or absent, never half: it is written beside, then renamed. A worker
    that crashes, is killed or restarts does not take it along; the agent keeps it until the
    job ends, persists it to the checkpoint home and offers it to the next attempt's workers.
    Call it once a step is done (after `optimizer.step()`), every step or every few.

    Returns whether the snapshot was kept. A state with a value that cannot be copied, or one
    larger than `checkpoint.max_memory`, or a full /dev/shm, is one line on stderr and the
    older snapshot stays; the job goes on.
    """
    area = _area()
    if area is None:
        return False
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an int >= 0, not {step!r}")
    rank = _rank()
    area.rank_dir(rank).mkdir(mode=0o700, exist_ok=True)
    part = area.partial(rank, step, os.getpid())
    part.unlink(missing_ok=True)
    try:
        size = codec.write(state, part)
    except codec.UncopyableStateError as exc:
        _say(f"the snapshot is skipped: {exc}; the job goes on (older snapshots are kept)")
        return False
    except OSError as exc:
        _say(f"the snapshot of step {step} is skipped: {exc.strerror or exc} in {area.root}")
        return False
    limit = int(os.environ.get(SNAPSHOT_LIMIT, "0") or 0)
    if limit and size > limit:
        part.unlink(missing_ok=True)
        _say(
            f"the snapshot of step {step} is skipped: {size} bytes, more than "
            f"checkpoint.max_memory ({limit}); the older snapshot is kept"
        )
        return False
    os.replace(part, area.snapshot(rank, step))
    global _last_step
    _last_step = step
    older = [s for s in area.steps(rank) if s != step]
    kept = set(older[max(0, len(older) - (KEEP_IN_MEMORY - 1)) :])
    floor = _floor(area)
    if floor is not None:
        lagging = older[max(0, len(older) - (KEEP_WHILE_COPIES_LAG - 1)) :]
        kept.update(s for s in lagging if s >= floor)
    for old in older:
        if old not in kept:
            area.snapshot(rank, old).unlink(missing_ok=True)
    return True


def _floor(area: Area) -> int | None:
    """The oldest step the other nodes' copies reach (the agent's floor.json), or None."""
    try:
        floor = json.loads(area.floor.read_bytes()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return floor if isinstance(floor, int) and not isinstance(floor, bool) else None


def save_requested() -> bool:
    """Whether the agent asked this rank to stop: a stop signal came (a preemption, Ctrl-C,
    `scancel`), and this rank's snapshot of the step every rank agreed on is taken. Call it
    after `snapshot`, every step; when it says True, stop training (`break`): every rank says
    True at the same step, and the agent keeps that step in the checkpoint home.
    """
    area = _area()
    if area is None or _last_step is None:
        return False
    try:
        asked = json.loads(area.save_request.read_bytes()).get("step")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(asked, int) and not isinstance(asked, bool) and _last_step >= asked
