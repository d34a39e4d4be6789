"""A small, deterministic PyTorch DDP training script that survives a restart.

Run it with elastic-hydra (or torchrun, unchanged):

    elastic-hydra examples/jobs/ddp.yaml
    elastic-hydra examples/jobs/ddp.yaml hp.crash_at_step=7     # rank 1 fails once, then resumes
    torchrun --nproc-per-node=2 examples/ddp_train.py --steps 20 --dir runs/ddp

- gloo on CPU, nccl when CUDA is present (one GPU per local rank).
- A linear model on synthetic data: the batch of step s on rank r is drawn from a generator seeded
  with (seed, s, r), so a resumed run sees exactly the data an uninterrupted run sees.
- Rank 0 checkpoints model, optimizer and step after every step (write a temporary file, then
  os.replace: a reader sees the old checkpoint or the new one, never half of one). Every rank
  resumes from the checkpoint when it exists, so a restarted group continues where it stopped and
  ends with the same weights, bit for bit, as an uninterrupted run.
- The checkpoint and the final weights go to `--dir`, by default this launch's own run
  directory, `$ELASTIC_HYDRA_RUN_DIR`: fresh for every launch and every job of a sweep (a second
  run, or a sweep's next job, never resumes another's checkpoint), and the same for every restart
  of one launch. Name a `--dir` to share one checkpoint between launches.
- `--crash-at-step S`: rank 1 exits with code 1 at step S on the first attempt only
  (TORCHELASTIC_RESTART_COUNT == "0"), to show a restart.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES, BATCH = 8, 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    parser.add_argument(
        "--dir",
        default="",
        help="where ckpt.pt (resumed if present) and final.pt go; default: $ELASTIC_HYDRA_RUN_DIR",
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum (checkpointed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--crash-at-step", type=int, default=-1, help="rank 1 exits 1 at this step (attempt 0)"
    )
    args = parser.parse_args(argv)
    where = args.dir or os.environ.get("ELASTIC_HYDRA_RUN_DIR", "")
    if not where:
        parser.error("--dir is needed outside elastic-hydra (no ELASTIC_HYDRA_RUN_DIR here)")
    args.ckpt, args.out = Path(where) / "ckpt.pt", Path(where) / "final.pt"
    return args


def batch(seed: int, step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """This rank's batch at `step`: a pure function of (seed, step, rank)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    true_w = torch.arange(1, FEATURES + 1, dtype=torch.float32) / FEATURES
    y = x @ true_w.unsqueeze(1) + 0.5 + 0.01 * torch.randn(BATCH, 1, generator=gen)
    return x.to(device), y.to(device)


def save_atomically(state: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")

    torch.manual_seed(args.seed)
    model = nn.Linear(FEATURES, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    start = 0
    if args.ckpt.exists():
        ckpt = torch.load(args.ckpt, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"]
        print(f"rank {rank}: resumed from {args.ckpt} at step {start} (attempt {attempt})")
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    for step in range(start, args.steps):
        if step == args.crash_at_step and rank == 1 and attempt == "0":
            print(f"rank {rank}: crashing at step {step} as asked", file=sys.stderr, flush=True)
            os._exit(1)  # a hard failure: no clean shutdown of the process group
        x, y = batch(args.seed, step, rank, device)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all_reduces (averages) the gradients here
        optimizer.step()
        if rank == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            save_atomically({**state, "step": step + 1}, args.ckpt)
            print(f"step {step + 1}/{args.steps} loss {loss.item():.6f}")

    if rank == 0:
        save_atomically({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
        print(f"rank 0: final weights written to {args.out}")
    # Every rank tears gloo down together: a rank that destroys its group while rank 0 still
    # writes was seen to abort at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
