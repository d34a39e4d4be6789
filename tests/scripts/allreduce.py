"""Test worker: a gloo all_reduce over the whole job; writes the result to `$OUT_DIR/<RANK>.json`.

Each rank contributes RANK + 1, so the sum must be 1 + 2 + ... + WORLD_SIZE. Initialised through
env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), exactly as a torchrun worker would be.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    try:
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        total = int(value.item())
    finally:
        dist.destroy_process_group()
    expected = world_size * (world_size + 1) // 2
    result = {
        "rank": rank,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "world_size": world_size,
        "sum": total,
        "expected": expected,
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "host": socket.gethostname(),
        "slurm_node_id": os.environ.get("SLURM_NODEID"),
    }
    out = Path(os.environ["OUT_DIR"]) / f"{rank}.json"
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(result) + "\n")
    os.replace(tmp, out)
    print(f"rank {rank}/{world_size}: all_reduce sum {total} (expected {expected})", flush=True)
    return 0 if total == expected else 1


if __name__ == "__main__":
    sys.exit(main())
