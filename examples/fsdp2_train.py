"""A small, deterministic FSDP2 training script (`torch.distributed.fsdp.fully_shard`).

Run it with elastic-hydra (or torchrun, unchanged):

    elastic-hydra script=examples/fsdp2_train.py nproc_per_node=2
    elastic-hydra script=examples/fsdp2_train.py nproc_per_node=2 -- --steps 50
    elastic-hydra script=examples/fsdp2_train.py nproc_per_node=2 restart=on_failure \\
        -- --crash-at-step 7    # rank 1 fails once; the restart resumes after step 6
    torchrun --nproc-per-node=2 examples/fsdp2_train.py --out runs/fsdp2.json

- gloo on CPU, nccl when CUDA is present (one GPU per local rank).
- A residual MLP; every block and then the root are `fully_shard`ed, so each rank holds 1/world
  of every parameter (a DTensor sharded on dim 0) and FSDP2 all-gathers a block's parameters
  before its forward and backward and reduce-scatters its gradients after.
- The batch of step s on rank r is drawn from a generator seeded with (seed, s, r).
- Every step ends with `ckpt.snapshot(...)` of the sharded state: each rank's model and
  optimizer state dicts hold its shards (DTensors), kept in memory the agent owns. A restarted
  worker's `ckpt.restore()` returns them, loaded into the re-sharded model as they are; the
  resumed run ends with the weights of an uninterrupted one, bit for bit. A resume needs the
  world size the snapshot was taken at.
- `--crash-at-step S`: rank 1 exits with code 1 at step S on the first attempt only.
- At the end the full state dict is gathered to rank 0 (`get_model_state_dict` with
  `full_state_dict=True`), which writes the last loss (averaged over the ranks) and a SHA-256 of
  the weights as JSON to `--out`, by default `final.json` in this launch's run directory
  (`$ELASTIC_HYDRA_RUN_DIR`): equal runs write equal bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from elastic_hydra import checkpoint as ckpt

FEATURES, HIDDEN, BATCH = 16, 64, 32


class Block(nn.Module):
    """x + MLP(LayerNorm(x)): the unit FSDP2 shards and gathers at once."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(FEATURES)
        self.up, self.down = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
        self.head = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    parser.add_argument("--depth", type=int, default=3, help="residual blocks")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    parser.add_argument("--out", default="", help="default: $ELASTIC_HYDRA_RUN_DIR/final.json")
    args = parser.parse_args(argv)
    where = args.out or os.path.join(os.environ.get("ELASTIC_HYDRA_RUN_DIR", ""), "final.json")
    if not args.out and "ELASTIC_HYDRA_RUN_DIR" not in os.environ:
        parser.error("--out is needed outside elastic-hydra (no ELASTIC_HYDRA_RUN_DIR here)")
    args.out = Path(where)
    return args


def batch(seed: int, step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """This rank's batch at `step`: a pure function of (seed, step, rank)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.01 * torch.randn(BATCH, 1, generator=gen)
    return x.to(device), y.to(device)


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().flatten().view(torch.uint8)
        digest.update(bytes(flat.tolist()))
    return digest.hexdigest()


def resume(
    model: nn.Module, optimizer: torch.optim.Optimizer, who: str, attempt: str
) -> tuple[int, float]:
    """The first step to train and the last loss: after the snapshot `ckpt.restore()` returns
    (this rank's shards, DTensors as they were snapshotted), loaded into the sharded model;
    else 0 and NaN. A relaunch of a finished run trains nothing and writes what it wrote."""
    if (state := ckpt.restore()) is None:
        return 0, float("nan")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"{who}: resumed after step {state['step']} (attempt {attempt})", flush=True)
    return int(state["step"]) + 1, float(state["loss"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")

    torch.manual_seed(args.seed)  # the same initial weights on every rank, then sharded
    model = Model(args.depth).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)  # the root: the head's parameters
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if rank == 0:
        weight = model.blocks[0].up.weight
        print(f"rank 0 holds {tuple(weight.to_local().shape)} of {tuple(weight.shape)} blocks.0.up")

    start, loss_value = resume(model, optimizer, f"rank {rank}", attempt)

    for step in range(start, args.steps):
        if step == args.crash_at_step and rank == 1 and attempt == "0":
            print(f"rank {rank}: crashing at step {step} as asked", file=sys.stderr, flush=True)
            os._exit(1)  # a hard failure: no clean shutdown of the process group
        x, y = batch(args.seed, step, rank, device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # FSDP2 reduce-scatters (averages) each block's gradients here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        loss_value = mean.item() / world
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        ckpt.snapshot({**state, "loss": loss_value}, step=step)
        if rank == 0 and (step + 1) % 5 == 0:
            print(f"step {step + 1}/{args.steps} loss {loss_value:.6f}")
        if ckpt.save_requested():  # a preemption: every rank stops after the same step
            print(f"rank {rank}: stopping after step {step}, kept by the agent", flush=True)
            dist.destroy_process_group()
            return 0

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # the whole, on rank 0
    state = get_model_state_dict(model, options=options)
    if rank == 0:
        result = {"steps": args.steps, "loss": loss_value, "weights_sha256": weights_sha256(state)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(f".{args.out.name}.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, args.out)
        print(f"rank 0: {json.dumps(result)} written to {args.out}")
    # Every rank tears gloo down together: a rank that destroys its group while another still
    # works was seen to abort at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
