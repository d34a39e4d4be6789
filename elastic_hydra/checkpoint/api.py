"""The worker's side: `restore`, `snapshot`, `save_requested`. Standard library only; torch is
used when the script imported it. Outside an elastic-hydra worker every call is a no-op.

    from elastic_hydra import checkpoint as ckpt

    state = ckpt.restore()              # None on a fresh start, else this rank's snapshot
    start = 0 if state is None else state["step"] + 1
    for step in range(start, steps):
        ...
        ckpt.snapshot({"model": model.state_dict(), "optim": opt.state_dict()}, step=step)

How a snapshot is taken: the training thread copies the state, a thread of its own writes the
copy. The next step changes tensors in place while the write goes on (`optimizer.step()`,
BatchNorm's running statistics), and nothing in torch tells a reader that a tensor is being
changed *now*: a tensor's `_version` counts a change once its kernel is done, and not at all
through `.data`. So the writer never reads the live tensors; it writes a copy made at the call:

- tensors (dense `torch.Tensor`s that need no grad): each storage copied once, into a buffer
  kept for the next snapshot, and the views rebuilt on it, so the file holds what `torch.save`
  of the live state would (a GPU's tensors as the CPU's: `restore` gives them so anyway). A
  GPU's are copied into pinned memory without waiting for the device; the writer waits for
  that copy. About a memcpy: 1.5 ms for 20 MB on one core.
- dicts (keyed by numbers or strings), lists and tuples are copied, each level; numbers,
  strings, bytes and None are shared (they cannot change).
- A state with anything else (a set, an object, a numpy array, a tensor subclass, a tensor
  that needs grad), or without any tensor (its copy would cost what its write does), or with
  torch not imported, is written on the training thread, as before.

One write is in flight at most: the next `snapshot` first waits for it (the memory is bounded:
one copy of the state besides the snapshots in the area). The writer's thread is not a daemon:
a normal exit (and a multiprocessing child's) waits for it, so the last step is kept (one taken
in an atexit hook is written there); a crash or a kill loses at most the step being written,
whose partial file is never read. What the writer
finds wrong (a full /dev/shm, `checkpoint.max_memory`) is one line on stderr, as before.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
from collections.abc import Mapping, Sequence
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
_lock = threading.Lock()  # _told and _last_step: the writer's thread sets them too
_writer: tuple[threading.Thread, int] | None = None  # the write in flight, and its step
# Where the last state's storages were copied (buffer, pinned): reused by the next.
_buffers: list[tuple[Any, bool]] = []
_IMMUTABLE = frozenset({type(None), bool, int, float, complex, str, bytes})
_DEPTH = 32  # deeper (or a container that holds itself): written on the training thread


class CheckpointError(RuntimeError):
    """What the agent offered to resume from cannot be read (the message says which file)."""


def _area() -> Area | None:
    root = os.environ.get(SNAPSHOTS)
    return Area(Path(root)) if root else None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _say(line: str) -> None:
    """One line on the rank's stderr, once per distinct line."""
    with _lock:
        if line in _told:
            return
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

    The snapshot is the state as it is at the call, complete or absent, never half: it is
    written beside, then renamed. Tensors are copied at the call and written by a thread of
    the worker's, while training goes on (a state that cannot be copied so is written before
    the call returns: the module's docstring says which); a step's in-place changes never reach
    the snapshot of the step before. A worker that crashes, is killed or restarts does not take
    its snapshots along; the agent keeps them until the job ends, persists them to the
    checkpoint home and offers them to the next attempt's workers. Call it once a step is done
    (after `optimizer.step()`), every step or every few.

    Returns whether the snapshot was taken: kept, or copied and being written (it is kept
    unless a line on stderr says otherwise). A state with a value that cannot be copied, or one
    larger than `checkpoint.max_memory`, or a full /dev/shm, is one line on stderr and the
    older snapshot stays; the job goes on.
    """
    area = _area()
    if area is None:
        return False
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an int >= 0, not {step!r}")
    _wait()  # one write in flight at most; its buffers are free again
    rank = _rank()
    area.rank_dir(rank).mkdir(mode=0o700, exist_ok=True)
    copied = _copy(state)
    if copied is None:
        return _write(area, rank, step, state)
    if not threading.main_thread().is_alive():  # an atexit hook: no thread would be waited for
        return _write(area, rank, step, *copied)
    global _writer
    thread = threading.Thread(
        target=_write, args=(area, rank, step, *copied), name="elastic-hydra-snapshot"
    )
    try:
        thread.start()
    except RuntimeError:  # no thread to be had: written here
        return _write(area, rank, step, *copied)
    _writer = (thread, step)
    return True


def _wait() -> None:
    """Wait for the write in flight, if any (only the training thread starts or waits)."""
    global _writer
    if _writer is not None:
        _writer[0].join()
        _writer = None


def _write(
    area: Area, rank: int, step: int, state: Mapping[str, Any], ready: Sequence[Any] = ()
) -> bool:
    """Write `state` as rank's snapshot of `step`, and keep the newest; whether it was kept.
    `ready`: the events of the device copies to wait for first."""
    for event in ready:
        event.synchronize()
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
    with _lock:
        os.replace(part, area.snapshot(rank, step))
        global _last_step
        _last_step = step
        _prune(area, rank, step)
    return True


def _prune(area: Area, rank: int, step: int) -> None:
    """Remove rank's snapshots older than the newest `KEEP_IN_MEMORY`, less those kept while
    the other nodes' copies lag (from the floor on, at most `KEEP_WHILE_COPIES_LAG`)."""
    older = [s for s in area.steps(rank) if s != step]
    kept = set(older[max(0, len(older) - (KEEP_IN_MEMORY - 1)) :])
    floor = _floor(area)
    if floor is not None:
        lagging = older[max(0, len(older) - (KEEP_WHILE_COPIES_LAG - 1)) :]
        kept.update(s for s in lagging if s >= floor)
    for old in older:
        if old not in kept:
            area.snapshot(rank, old).unlink(missing_ok=True)


class _NotCopiedError(Exception):
    """The state holds a value that `_copy` does not copy: it is written as it is."""


def _copy(state: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]] | None:
    """A copy of `state` that the training thread cannot change, and the device events it
    waits for; None where the state is written on the training thread (the module's docstring
    says which)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    copier = _Copier(torch, _buffers)
    try:
        copied = copier.value(dict(state), 0)
    except _NotCopiedError:
        return None
    except RuntimeError:  # a tensor torch cannot copy so (pinned memory refused, a meta tensor)
        _buffers.clear()
        return None
    if not copier.storages:
        return None
    _buffers[:] = copier.buffers
    return copied, [stream.record_event() for stream in copier.streams]


class _Copier:
    """Copies a state's containers and tensors: each tensor storage once, into a buffer (one of
    the last state's where its size matches), the views rebuilt on it."""

    def __init__(self, torch: Any, reuse: list[tuple[Any, bool]]) -> None:
        self.torch, self.reuse = torch, reuse
        self.atoms = {*_IMMUTABLE, torch.Size, torch.dtype, torch.device}
        self.storages: dict[int, Any] = {}  # a storage's identity -> its copy
        self.buffers: list[tuple[Any, bool]] = []  # (buffer, pinned), in the order copied
        self.streams: list[Any] = []  # the GPU streams the copies were queued on

    def value(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if kind in self.atoms:
            return value
        if depth > _DEPTH:
            raise _NotCopiedError
        if kind is list:
            return [self.value(item, depth + 1) for item in value]
        if kind is tuple:
            return tuple(self.value(item, depth + 1) for item in value)
        if isinstance(value, dict):  # an OrderedDict's attributes too (a state_dict's _metadata)
            copied = copy.copy(value)
            for key, item in value.items():
                if type(key) not in self.atoms:
                    raise _NotCopiedError
                copied[key] = self.value(item, depth + 1)
            return copied
        if kind is self.torch.Tensor:
            return self.tensor(value)
        raise _NotCopiedError

    def tensor(self, tensor: Any) -> Any:
        torch = self.torch
        if (
            tensor.layout != torch.strided
            or tensor.requires_grad
            or tensor.is_quantized
            or tensor.is_nested
            or tensor.is_conj()
            or tensor.is_neg()
            or tensor.__dict__
        ):
            raise _NotCopiedError
        storage = tensor.untyped_storage()
        if (copied := self.storages.get(storage._cdata)) is None:
            copied = self.storages[storage._cdata] = self.buffer(storage, tensor.device)
        view = torch.empty(0, dtype=tensor.dtype)
        return view.set_(copied, tensor.storage_offset(), tensor.size(), tensor.stride())

    def buffer(self, storage: Any, device: Any) -> Any:
        """A host copy of `storage`; a GPU's is queued on its current stream, into pinned
        memory."""
        torch, size, gpu = self.torch, storage.nbytes(), device.type == "cuda"
        i = len(self.buffers)
        old, pinned = self.reuse[i] if i < len(self.reuse) else (None, False)
        if old is None or old.numel() != size or pinned != gpu:
            old = torch.empty(size, dtype=torch.uint8, pin_memory=gpu)
        self.buffers.append((old, gpu))
        source = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
        old.copy_(source, non_blocking=gpu)
        if gpu:
            stream = torch.cuda.current_stream(device)
            if all(stream != known for known in self.streams):
                self.streams.append(stream)
        return old.untyped_storage()


def _floor(area: Area) -> int | None:
    """The oldest step the other nodes' copies reach (the agent's floor.json), or None."""
    try:
        floor = json.loads(area.floor.read_bytes()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return floor if isinstance(floor, int) and not isinstance(floor, bool) else None


def save_requested() -> bool:
    """Whether the agent asked this rank to stop: a stop signal came (a preemption, Ctrl-C,
    `scancel`), and this rank's snapshot of the step every rank agreed on is kept (when that
    snapshot is still being written, it waits for it). Call it after `snapshot`, every step;
    when it says True, stop training (`break`): every rank says True at the same step, and the
    agent keeps that step in the checkpoint home.
    """
    area = _area()
    if area is None:
        return False
    try:
        asked = json.loads(area.save_request.read_bytes()).get("step")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(asked, int) or isinstance(asked, bool):
        return False
    if _writer is not None and _writer[1] >= asked:
        _wait()
    with _lock:
        return _last_step is not None and _last_step >= asked
