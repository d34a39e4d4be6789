"""Test worker: DDP on gloo where one rank sleeps before `backward()`.

    hang_ddp.py STUCK_RANK SECONDS

Rank STUCK_RANK sleeps SECONDS after its forward pass; the others call `backward()`, where DDP's
gradient allreduce runs inside autograd's engine and waits for the late rank.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    stuck, seconds = int(sys.argv[1]), float(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    loss = model(torch.ones(8, 4)).sum()
    if dist.get_rank() == stuck:
        time.sleep(seconds)
    loss.backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
