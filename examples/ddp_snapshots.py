"""DDP training that loses at most a step to a failure: each rank's snapshot kept by the agent.

    elastic-hydra script=examples/ddp_snapshots.py nproc_per_node=2 restart=on_failure \\
        -- --steps 20 --crash-at-step 7      # rank 1 fails once; the restart resumes at step 7

- Every step ends with `ckpt.snapshot(...)`: model, optimizer and step go into memory that the
  agent owns, so a worker that crashes takes nothing along. A restarted worker's
  `ckpt.restore()` returns the newest step every rank holds; no rank writes to shared storage.
- When the agent ends (success, failure, Ctrl-C, a preemption's SIGTERM), it copies the last
  snapshots into the job's checkpoint home (`checkpoint.home`, by default under `logs.root`): a
  relaunch of the same command resumes from there, with no flag. On a stop signal,
  `ckpt.save_requested()` turns True on every rank after the same step: the script stops there.
- The batches are a pure function of (seed, step, rank) (`ddp_train.batch`), so a resumed run
  ends with the same weights, bit for bit, as an uninterrupted one.
- `--crash-at-step S`: rank 1 exits with code 1 at step S on the first attempt only.
- `--step-time T`: each step takes at least T seconds (to watch it, or stop it mid-run).
- Outside elastic-hydra (torchrun) the calls do nothing: it trains from scratch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ddp_train import FEATURES, batch  # the same folder: the deterministic data
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_hydra import checkpoint as ckpt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    parser.add_argument(
        "--out", default="", help="the final weights (JSON); default: the run dir's final.json"
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    parser.add_argument("--step-time", type=float, default=0.0)
    args = parser.parse_args(argv)
    run_dir = os.environ.get("ELASTIC_HYDRA_RUN_DIR", ".")
    args.out = Path(args.out or Path(run_dir) / "final.json")
    return args


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
    if (state := ckpt.restore()) is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
        print(f"rank {rank}: resumed after step {state['step']} (attempt {attempt})", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    for step in range(start, args.steps):
        began = time.monotonic()
        if step == args.crash_at_step and rank == 1 and attempt == "0":
            print(f"rank {rank}: crashing at step {step} as asked", file=sys.stderr, flush=True)
            os._exit(1)  # a hard failure: no clean shutdown of the process group
        x, y = batch(args.seed, step, rank, device)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        ckpt.snapshot({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step=step)
        if rank == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.6f}", flush=True)
        if ckpt.save_requested():  # a preemption: every rank stops after the same step
            print(f"rank {rank}: stopping after step {step}, kept by the agent", flush=True)
            dist.destroy_process_group()
            return 0
        time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))

    if rank == 0:  # exact: a float32 is a double, and JSON writes a double's shortest repr
        final = {k: v.cpu().flatten().tolist() for k, v in model.state_dict().items()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(final))
        print(f"rank 0: final weights written to {args.out}", flush=True)
    # Every rank tears gloo down together: a rank that destroys its group while rank 0 still
    # writes was seen to abort at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
