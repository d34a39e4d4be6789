"""Test worker: snapshots of a plain-Python state (no torch), with faults asked for by env.

Resumes from `ckpt.restore()` (prints "resumed after step K", or "fresh start"), then runs the
steps from there to STEPS, snapshotting each.
- KILL_AT=S: on the first attempt, the snapshot of step S SIGKILLs its own worker halfway
  through the write;
- UNCOPYABLE_AT=S: the state of step S holds a lambda (the snapshot is skipped, the job goes on);
- BIG_AT=S: the state of step S is 1 MiB (over a small checkpoint.max_memory);
- STEP_TIME=T: each step takes T seconds more; it stops (prints "stopping after step K") when
  `ckpt.save_requested()` says so.
Appends each step it ran to `$OUT_DIR/steps-<rank>.txt`. With several ranks, a rank starts a step
only once every rank has run the one before (through those files, as a collective keeps a real
job's ranks at most a step apart), however far apart their workers started.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from elastic_hydra import checkpoint as ckpt

LOCKSTEP_TIMEOUT = 60.0  # seconds a rank waits for the others to run a step


class KillMidWrite:
    """Pickled after the bulk of the state: the worker dies with the file half-written."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        os.kill(os.getpid(), signal.SIGKILL)
        return (tuple, ())


def main() -> None:
    rank = int(os.environ["RANK"])
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    steps = int(os.environ.get("STEPS", "6"))
    out = Path(os.environ["OUT_DIR"]) / f"steps-{rank}.txt"

    def at(name: str) -> int:
        return int(os.environ.get(name, "-1"))

    state = ckpt.restore()
    if state is None:
        print("fresh start", flush=True)
        start, total = 0, []
    else:
        print(f"resumed after step {state['step']}", flush=True)
        start, total = state["step"] + 1, state["total"]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for step in range(start, steps):
        if step > start and world > 1:
            in_step(out, world, step - 1)
        total = [*total, step]
        snap: dict[str, object] = {"total": total, "bulk": list(range(50_000))}
        if step == at("UNCOPYABLE_AT"):
            snap["fn"] = lambda: None
        if step == at("BIG_AT"):
            snap["bulk"] = "x" * (1 << 20)
        if step == at("KILL_AT") and first:
            snap["zz_kill"] = KillMidWrite()  # after the bulk: the file is half-written
        with out.open("a") as sink:
            sink.write(f"{step}\n")
        ckpt.snapshot(snap, step=step)
        if ckpt.save_requested():
            print(f"stopping after step {step}", flush=True)
            return
        time.sleep(float(os.environ.get("STEP_TIME", "0")))  # a step's work


def in_step(out: Path, world: int, step: int) -> None:
    """Wait until every rank's steps file has `step` (at most LOCKSTEP_TIMEOUT seconds)."""
    files = [out.with_name(f"steps-{rank}.txt") for rank in range(world)]
    deadline = time.monotonic() + LOCKSTEP_TIMEOUT
    while not all(f.exists() and str(step) in f.read_text().split() for f in files):
        if time.monotonic() > deadline:
            raise SystemExit(f"not every rank ran step {step} within {LOCKSTEP_TIMEOUT} s")
        time.sleep(0.01)


if __name__ == "__main__":
    main()
