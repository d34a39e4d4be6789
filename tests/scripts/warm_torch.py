"""A torch worker for warm starts: was torch imported before the script ran (forked from a
template that imported it)? Then a gloo all_reduce; rank 1 fails on the first attempt.

warm_torch.py DIR  ->  DIR/<RANK>_<TORCHELASTIC_RESTART_COUNT>.json
"""

from __future__ import annotations

import sys

PRELOADED = "torch" in sys.modules  # before this script's own import

import json  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> None:
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    out = os.path.join(sys.argv[1], f"{rank}_{attempt}.json")
    with open(out, "w") as f:
        json.dump({"preloaded": PRELOADED, "sum": value.item()}, f)
    if rank == 1 and attempt == 0:
        raise RuntimeError("rank 1 fails once")


if __name__ == "__main__":
    main()
