"""Test worker for multi-host runs: records where it ran, then fails, sleeps or exits 0.

Writes $OUT_DIR/<attempt>_<RANK>.json = {rank, local_rank, group_rank, world_size, host,
slurm_node_id, attempt, restart_count, pid}; the attempt counts every start of this node's worker
group (a restart after another node's failure is a membership change here: the restart count
stays). FAIL_RANK=R: rank R raises ValueError("boom from rank R") in the first attempt only, or
always with FAIL_ALWAYS=1. SLEEP=1: in the first attempt every rank sleeps until it is stopped.
WAIT_FOR=PATH: every rank waits until PATH exists, then exits 0. Either wait lasts at most 120 s,
so a broken launcher cannot leave a worker running for long.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    env = os.environ
    rank, restart = int(env["RANK"]), int(env["TORCHELASTIC_RESTART_COUNT"])
    attempt = int(env["ELASTIC_HYDRA_ATTEMPT"])
    record = {
        "rank": rank,
        "local_rank": int(env["LOCAL_RANK"]),
        "group_rank": int(env["GROUP_RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "host": socket.gethostname(),
        "slurm_node_id": env.get("SLURM_NODEID"),
        "attempt": attempt,
        "restart_count": restart,
        "pid": os.getpid(),
    }
    out = Path(env["OUT_DIR"]) / f"{attempt}_{rank}.json"
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # jobs of a sweep share OUT_DIR
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, out)
    print(f"rank {rank} on {record['host']}", flush=True)
    if env.get("FAIL_RANK") == str(rank) and (attempt == 0 or env.get("FAIL_ALWAYS") == "1"):
        raise ValueError(f"boom from rank {rank}")
    if env.get("SLEEP") == "1" and attempt == 0:
        time.sleep(120)
    if "WAIT_FOR" in env:
        deadline = time.monotonic() + 120
        while not Path(env["WAIT_FOR"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
