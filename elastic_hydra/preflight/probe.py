"""The preflight probe: what each worker of the preflight group measures. Runs in a worker process
(`python -m elastic_hydra.preflight.probe SETTINGS OUT`), with the job's own environment contract
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, CUDA_VISIBLE_DEVICES ...); never imported by an
agent (it imports torch).

1. a process group on the round's worker store, under a key prefix of its own (the user's workers
   later use the same store with torchrun's prefix: the probe leaves no key in their way);
2. a barrier, then an n x n float32 matrix multiply repeated for a fixed time, timed in
   `SAMPLES` equal windows: GFLOP/s of each window (the verdict wants the spread, not one figure:
   a node is only named slow when even its best window is slow);
3. an allreduce inside the node (when it has several workers) and across nodes (one worker per
   node), timed after a warm-up, each repetition apart: bus bandwidth, as nccl-tests counts it
   (2 (n-1)/n of the bytes), the median repetition and the best;
4. in `full`, with more than two nodes, every pair of nodes in rounds of disjoint pairs (each
   round side by side): the bus bandwidth of each link;
5. the result as JSON in OUT, written whole (renamed into place).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch is imported where it is used (it does work when imported: the layering test imports
# every module to prove that ours do none).

STORE_FD_ENV = "ELASTIC_HYDRA_STORE_FD"  # standalone: rank 0 hosts the store on this socket
SAMPLES = 5  # GEMM windows per worker


def main(argv: list[str]) -> int:
    settings, out = json.loads(argv[0]), Path(argv[1])
    env = os.environ
    local_rank, rank = int(env["LOCAL_RANK"]), int(env["RANK"])
    result: dict[str, Any] = {"local_rank": local_rank, "rank": rank, "device": "cpu"}
    try:
        result |= measure(settings, local_rank, rank)
    except Exception as exc:  # measured nothing: the verdict names the node and why
        traceback.print_exc()
        result["error"] = f"probe failed: {type(exc).__name__}: {exc}"[:300]
    tmp = out.with_name(f".{out.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # run dirs are private
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(result))
    tmp.rename(out)
    return 0


def measure(settings: dict[str, Any], local_rank: int, rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore  # type: ignore[attr-defined,unused-ignore]

    env = os.environ
    world, local_world = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}" if cuda else "cpu")
    found: dict[str, Any] = {"device": device.type, "gpu": gpu_index(device)}
    if cuda:
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=float(settings["timeout"]))
    if world > 1:
        store = worker_store(rank, world, timeout)
        prefixed = PrefixStore(f"elastic_hydra/preflight/{settings['key']}/", store)
        dist.init_process_group(
            "nccl" if cuda else "gloo", store=prefixed, rank=rank, world_size=world,
            timeout=timeout,
        )  # fmt: skip
        dist.barrier()
    samples = gemm(device, int(settings["gemm_size"]), settings["gemm_seconds"])
    found["gemm_gflops"] = statistics.median(samples)
    found["gemm_samples"] = samples
    if world > 1:
        nodes = world // local_world
        node = rank // local_world
        groups = [dist.new_group(list(range(n * local_world, (n + 1) * local_world)))
                  for n in range(nodes)]  # fmt: skip
        leaders = dist.new_group([n * local_world for n in range(nodes)])
        size, reps = int(settings["allreduce_bytes"]), int(settings["allreduce_reps"])
        if local_world > 1:
            busbw, best = allreduce(device, groups[node], local_world, size, reps)
            if local_rank == 0:
                found["intra_busbw"], found["intra_best"] = busbw, best
        if nodes > 1 and local_rank == 0:
            found["cross_busbw"] = allreduce(device, leaders, nodes, size, reps)[0]
        if settings.get("pairs") and nodes > 2:
            found["links"] = links(
                device,
                node if local_rank == 0 else None,
                nodes=nodes,
                local_world=local_world,
                size=size,
                reps=reps,
            )
        dist.barrier()
        dist.destroy_process_group()
    return found


def pairings(nodes: int) -> list[list[tuple[int, int]]]:
    """Every pair of nodes once, in rounds of disjoint pairs (the circle method): each round's
    pairs run side by side, so a job of n nodes takes n - 1 rounds (n rounds when n is odd)."""
    ring = list(range(nodes)) + ([-1] if nodes % 2 else [])
    rounds = []
    for _ in range(len(ring) - 1):
        half = len(ring) // 2
        pairs = [(min(ring[i], ring[-1 - i]), max(ring[i], ring[-1 - i])) for i in range(half)]
        rounds.append([(a, b) for a, b in pairs if a >= 0])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def links(
    device: torch.device, node: int | None, *, nodes: int, local_world: int, size: int, reps: int
) -> list[dict[str, Any]]:
    """Bus bandwidth of every pair of nodes (their local ranks 0), each measured by both; the
    lower node of a pair reports it. `node`: this worker's node if it is its local rank 0."""
    import torch.distributed as dist

    rounds = pairings(nodes)
    groups = {
        pair: dist.new_group([pair[0] * local_world, pair[1] * local_world])
        for pairs in rounds
        for pair in pairs
    }  # every rank makes every group, in the same order
    found = []
    for pairs in rounds:
        for a, b in pairs:
            if node in (a, b):
                busbw, best = allreduce(device, groups[(a, b)], 2, size, reps)
                if node == a:
                    found.append({"peer": b, "busbw": busbw, "best": best})
        dist.barrier()  # one round of pairs at a time
    return found


def worker_store(rank: int, world: int, timeout: timedelta) -> Any:
    """The round's worker store: the agent's (c10d), or rank 0's (standalone, on its socket)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]

    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    fd = os.environ.pop(STORE_FD_ENV, None)
    if rank == 0 and fd is not None:
        return TCPStore(
            addr, port, world, is_master=True, timeout=timeout, master_listen_fd=int(fd)
        )
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    return TCPStore(addr, port, world, is_master=hosts, timeout=timeout)


def gpu_index(device: torch.device) -> int | None:
    """The GPU's index on its host: its entry in CUDA_VISIBLE_DEVICES when that is a number."""
    if device.type != "cuda":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    entry = visible[device.index or 0].strip() if device.index is not None and visible[0] else ""
    return int(entry) if entry.isdigit() else device.index


def gemm(device: torch.device, n: int, seconds: float) -> list[float]:
    """GFLOP/s of n x n float32 multiplies repeated for `seconds` (one warm-up first), one figure
    per window of `seconds / SAMPLES`."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    torch.mm(a, b)
    sync(device)
    samples = []
    for _ in range(SAMPLES):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / SAMPLES:
            for _ in range(4):
                torch.mm(a, b)
            sync(device)
            count += 4
        samples.append(2 * n**3 * count / elapsed / 1e9)
    return samples


def allreduce(
    device: torch.device, group: Any, members: int, size: int, reps: int
) -> tuple[float, float]:
    """Bus bandwidth in GB/s of an allreduce of `size` bytes among `members` ranks: the median
    repetition and the best one."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)  # warm-up: connections, buffers
    sync(device)
    figures = []
    for _ in range(max(1, reps)):
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        sync(device)
        elapsed = max(time.perf_counter() - start, 1e-9)
        figures.append(size / elapsed * 2 * (members - 1) / members / 1e9)
    return statistics.median(figures), max(figures)


def sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
