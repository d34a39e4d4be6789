"""Test worker for multi-node jobs: a gloo all_reduce, one record line, then wait or leave.

Sums RANK + 1 over the ranks of its round and appends {rank, world_size, sum, ...} to
`$OUT_DIR/records.jsonl`. With GLOO=1 (or LOOP=1) the sum is a gloo all_reduce, the worker joining
through env:// as a torchrun worker does: for the tests about torch's side of a job. Otherwise it
is exchanged through files in `$OUT_DIR` among the round's live ranks (no torch: its import costs
about 2 s of CPU per worker), which still needs every rank of the round, each with its own RANK,
one WORLD_SIZE and one MASTER_ADDR/MASTER_PORT. Then:
- FAIL_RANK=R: rank R raises ValueError("boom from rank R") on its first attempt, after the
  all_reduce and once every rank of its round wrote its record, leaving the file
  `$OUT_DIR/failed`; only workers started after that may exit 0;
- it exits 0 when WORLD_SIZE == EXIT_AT_WORLD and the file $RELEASE (if set) exists;
- HARDWARE=1: on its first attempt, once every rank of its round wrote its record, it raises
  CUDA's words for a broken GPU (a hardware failure: its node leaves the job);
- LOOP=1: it keeps all_reducing meanwhile (every rank leaves together), so a peer that dies
  makes it fail, as a training loop would;
- otherwise it waits (at most 120 s) until the launcher stops it for the next round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

if os.environ.get("GLOO") == "1" or os.environ.get("LOOP") == "1":
    import torch
    import torch.distributed as dist

EXCHANGE_TIMEOUT = 60.0  # seconds, as the gloo group's


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exchange_sum(env: os._Environ[str], rank: int, world_size: int) -> int:
    """RANK + 1 summed over the round's ranks, through files: each rank writes its value (whole:
    written beside, renamed), then waits until every rank 0..WORLD_SIZE-1 of the same master
    endpoint has one from a live process (a stopped round's workers are gone), and marks that it
    read them; it leaves once every rank has read them (a peer that is slower to look still
    finds every writer alive)."""
    master = f"{env['MASTER_ADDR']}-{env['MASTER_PORT']}-{world_size}"
    here = Path(env["OUT_DIR"]) / "rounds" / master
    here.mkdir(parents=True, exist_ok=True)
    mine = here / f"rank-{rank}"
    part = here / f".rank-{rank}.{os.getpid()}"
    part.write_text(json.dumps({"pid": os.getpid(), "value": rank + 1}))
    os.replace(part, mine)
    deadline = time.monotonic() + EXCHANGE_TIMEOUT
    peers: dict[int, int] = {}  # pid -> value, of this round's ranks
    while len(peers) < world_size:
        peers = {}
        for peer in range(world_size):
            try:
                got = json.loads((here / f"rank-{peer}").read_text())
            except (OSError, ValueError):
                break
            if not alive(int(got["pid"])):
                break
            peers[int(got["pid"])] = int(got["value"])
        if len(peers) < world_size:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: the round of {world_size} never completed")
            time.sleep(0.01)
    (here / f"read-{os.getpid()}").touch()
    while time.monotonic() < deadline and not all(
        (here / f"read-{pid}").exists() or not alive(pid) for pid in peers
    ):
        time.sleep(0.01)
    return sum(peers.values())


def released(world_size: int, after_failure: bool) -> bool:
    if "FAIL_RANK" in os.environ and not after_failure:
        return False
    if world_size != int(os.environ.get("EXIT_AT_WORLD", world_size)):
        return False
    release = os.environ.get("RELEASE")
    return release is None or Path(release).exists()


def wait_for_peers(path: Path, mine: dict[str, object]) -> None:
    """Until every rank of this round wrote its record (at most 30 s): a failure that stops them
    must not cost a peer its line."""
    keys = ("restart_count", "world_size", "master")  # torchrun nodes have no attempt
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.endswith("}")]
        peers = [r for r in lines if all(r[k] == mine[k] for k in keys)]
        if len(peers) >= int(str(mine["world_size"])):
            return
        time.sleep(0.01)


def main() -> int:
    env = os.environ
    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    failed_marker = Path(env["OUT_DIR"]) / "failed"
    after_failure = failed_marker.exists()
    if "torch" in sys.modules:
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        total = int(value.item())
        if env.get("LOOP") != "1":
            dist.destroy_process_group()
    else:
        total = exchange_sum(env, rank, world_size)
    record = {
        "rank": rank,
        "world_size": world_size,
        "sum": total,
        "expected": world_size * (world_size + 1) // 2,
        "group_rank": int(env["GROUP_RANK"]),
        "group_world_size": int(env["GROUP_WORLD_SIZE"]),
        "restart_count": int(env["TORCHELASTIC_RESTART_COUNT"]),
        "attempt": int(env.get("ELASTIC_HYDRA_ATTEMPT", -1)),  # -1: under torchrun
        "log_dir": Path(env.get("TORCHELASTIC_ERROR_FILE", "")).parent.parent.name,
        "run_id": env["TORCHELASTIC_RUN_ID"],
        "master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
        "pid": os.getpid(),
        "slurm_node_id": env.get("SLURM_NODEID"),
    }
    with open(Path(env["OUT_DIR"]) / "records.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")  # one short write: lines never interleave
    if env.get("FAIL_RANK") == str(rank) and record["restart_count"] == 0:
        wait_for_peers(Path(env["OUT_DIR"]) / "records.jsonl", record)
        failed_marker.touch()
        raise ValueError(f"boom from rank {rank}")
    if env.get("HARDWARE") == "1" and record["restart_count"] == 0:
        wait_for_peers(Path(env["OUT_DIR"]) / "records.jsonl", record)
        raise RuntimeError("CUDA error: uncorrectable ECC error encountered")
    deadline = time.monotonic() + 120
    if (
        env.get("LOOP") == "1"
    ):  # collectives until every rank is released (a peer's death breaks them)
        while time.monotonic() < deadline:
            done = torch.tensor([float(released(world_size, after_failure))])
            dist.all_reduce(done, op=dist.ReduceOp.SUM)
            if int(done.item()) == world_size:
                dist.destroy_process_group()
                return 0
            time.sleep(0.05)
        return 1
    while time.monotonic() < deadline:
        if released(world_size, after_failure):
            return 0
        time.sleep(0.05)
    return 1


if __name__ == "__main__":
    sys.exit(main())
