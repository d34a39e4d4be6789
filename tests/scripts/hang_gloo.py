"""Test worker: a gloo all_reduce that one rank is late for.

    hang_gloo.py STUCK_RANK SECONDS [ATTEMPTS]

Rank STUCK_RANK sleeps SECONDS before the all_reduce (a stuck data loader) in the first
ATTEMPTS attempts (default: every attempt); the others wait inside the collective. Before it
sleeps it writes the time to `$OUT_DIR/stuck_at`, so a test can time the verdict from the hang's
onset.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def load_batch(rank: int, stuck: int, seconds: float, attempts: int) -> torch.Tensor:
    if rank == stuck and int(os.environ["TORCHELASTIC_RESTART_COUNT"]) < attempts:
        Path(os.environ["OUT_DIR"], "stuck_at").write_text(f"{time.time()}\n")
        time.sleep(seconds)
    return torch.ones(2)


def main() -> None:
    stuck, seconds = int(sys.argv[1]), float(sys.argv[2])
    attempts = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    batch = load_batch(rank, stuck, seconds, attempts)
    dist.all_reduce(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
