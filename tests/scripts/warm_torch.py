"""A torch worker for warm starts: was torch imported before the script ran (forked from a
template that imported it)? Then a gloo all_reduce; rank 1 fails on the first attempt.

warm_torch.py DIR  ->  DIR/<RANK>_<TORCHELASTIC_RESTART_COUNT>.json
"""

from __future__ import annotations

import sys
import time

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
    with open(out + ".tmp", "w") as f:
        json.dump({"preloaded": PRELOADED, "sum": value.item()}, f)
    os.replace(out + ".tmp", out)
    if rank == 1 and attempt == 0:  # once rank 0 wrote its record: the failure stops it
        peer, deadline = os.path.join(sys.argv[1], "0_0.json"), time.monotonic() + 30
        while not os.path.exists(peer) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("rank 1 fails once")


if __name__ == "__main__":
    main()
