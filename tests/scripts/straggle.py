"""Test worker: a gloo loop in which one rank is slower for a stretch of steps.

    straggle.py STEPS STEP_SECONDS SLOW_RANK FROM TO [FACTOR]

Every rank sleeps STEP_SECONDS (its compute) and all_reduces, STEPS times; rank SLOW_RANK sleeps
FACTOR (default 1.5) times as long in steps FROM to TO-1. When it starts its first slow step it
writes the step's time to `$OUT_DIR/slow_from`; each rank writes its arrival times (one per
step, `time.time()` just before the all_reduce) to `$OUT_DIR/arrived_<rank>` at its end.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    steps, step_s, slow = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    start, stop = int(sys.argv[4]), int(sys.argv[5])
    factor = float(sys.argv[6]) if len(sys.argv) > 6 else 1.5
    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), Path(os.environ["OUT_DIR"])
    t, arrived = torch.ones(1), []
    for step in range(steps):
        slowed = rank == slow and start <= step < stop
        if slowed and step == start:
            (out / "slow_from").write_text(f"{time.time()}\n")
        time.sleep(step_s * (factor if slowed else 1.0))
        arrived.append(time.time())
        dist.all_reduce(t)
    (out / f"arrived_{rank}").write_text("".join(f"{a}\n" for a in arrived))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
