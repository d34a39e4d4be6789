"""minGPT's character-level GPT (its `projects/chargpt`), trained with DDP, as a Hydra app.

The model is minGPT's (model.py; minGPT by Andrej Karpathy, MIT License); the trainer loop is
minGPT's `Trainer.run` (AdamW with decay groups, gradient clipping) wrapped in
DistributedDataParallel. The worker is an `@hydra.main` app with its config in config.yaml:

    elastic-hydra script=examples/mingpt/train.py nproc_per_node=2
    elastic-hydra script=examples/mingpt/train.py nproc_per_node=2 restart.max_restarts=1 -- \\
        trainer.crash_at_iter=20                     # rank 1 fails once; the job resumes
    torchrun --nproc-per-node=2 examples/mingpt/train.py hydra.run.dir=outputs/torchrun
    python examples/mingpt/train.py                  # one process, no process group

- Data: a sonnet embedded below (no download). The batch of iteration i on rank r is drawn from a
  generator seeded with (seed, i, r), and the dropout generator is reseeded the same way before
  every iteration, so a resumed run trains on exactly what an uninterrupted run trains on.
- Files go to Hydra's output dir (`outputs/${now:...}` by default). Under elastic-hydra every
  rank and every restart of a launch has the same one, so rank 0's checkpoint (written after
  every iteration, atomically) is found by the restarted group, which resumes from it.
- At the end rank 0 writes `final.json`: the iterations, the last loss (averaged over the
  ranks), a SHA-256 of the weights and a greedy sample: equal runs write equal bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from model import GPT, GPTConfig
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

TEXT = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.
"""
CHARS = sorted(set(TEXT))
STOI = {ch: i for i, ch in enumerate(CHARS)}
DATA = torch.tensor([STOI[ch] for ch in TEXT], dtype=torch.long)


def iteration_seed(seed: int, it: int, rank: int) -> int:
    return seed * 1_000_003 + it * 1_009 + rank


def get_batch(seed: int, it: int, rank: int, batch_size: int, block_size: int) -> tuple[Any, Any]:
    """minGPT's CharDataset items, at offsets that are a pure function of (seed, it, rank)."""
    gen = torch.Generator().manual_seed(iteration_seed(seed, it, rank))
    starts = torch.randint(0, len(DATA) - block_size - 1, (batch_size,), generator=gen)
    x = torch.stack([DATA[s : s + block_size] for s in starts.tolist()])
    y = torch.stack([DATA[s + 1 : s + block_size + 1] for s in starts.tolist()])
    return x, y


def weights_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(
            bytes(tensor.detach().cpu().contiguous().flatten().view(torch.uint8).tolist())
        )
    return digest.hexdigest()


def save_atomically(obj: Any, path: Path, save: Any = torch.save) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    save(obj, tmp)
    os.replace(tmp, path)  # a reader sees the old file or the new one, never half of one


def build(cfg: DictConfig) -> tuple[GPT, torch.optim.AdamW]:
    torch.manual_seed(cfg.seed)
    m = cfg.model
    config = GPTConfig(
        vocab_size=len(CHARS), block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
        n_embd=m.n_embd, embd_pdrop=m.pdrop, resid_pdrop=m.pdrop, attn_pdrop=m.pdrop,
    )  # fmt: skip
    model = GPT(config)
    t = cfg.trainer
    optimizer = model.configure_optimizers(
        learning_rate=t.learning_rate, weight_decay=t.weight_decay, betas=tuple(t.betas)
    )
    return model, optimizer


def train(cfg: DictConfig, model: GPT, optimizer: torch.optim.AdamW, out: Path) -> float:
    """minGPT's Trainer.run under DDP, resuming from `out/ckpt.pt` when it is there."""
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    ckpt_path, t = out / "ckpt.pt", cfg.trainer
    start, loss_value = 0, float("nan")
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start, loss_value = ckpt["iter"], ckpt["loss"]
        print(f"rank {rank}: resumed from {ckpt_path} at iteration {start} (attempt {attempt})")
    ddp = DistributedDataParallel(model)
    ddp.train()
    for it in range(start, t.max_iters):
        if it == t.crash_at_iter and rank == 1 and attempt == "0":
            print(f"rank {rank}: crashing at iteration {it} as asked", file=sys.stderr, flush=True)
            os._exit(1)  # a hard failure: no clean shutdown of the process group
        x, y = get_batch(cfg.seed, it, rank, t.batch_size, cfg.model.block_size)
        torch.manual_seed(iteration_seed(cfg.seed, it, rank))  # this iteration's dropout
        _, loss = ddp(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks here
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_norm_clip)
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        loss_value = mean.item() / world
        if rank == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            save_atomically({**state, "iter": it + 1, "loss": loss_value}, ckpt_path)
            if (it + 1) % t.log_every == 0 or it + 1 == t.max_iters:
                print(f"iter {it + 1}/{t.max_iters}: loss {loss_value:.5f}")
    return loss_value


@hydra.main(version_base="1.3", config_path=".", config_name="config")
def main(cfg: DictConfig) -> None:
    if "RANK" not in os.environ:  # plain `python train.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    dist.init_process_group("gloo")
    out = Path(HydraConfig.get().runtime.output_dir)
    model, optimizer = build(cfg)
    loss = train(cfg, model, optimizer, out)
    if dist.get_rank() == 0:
        model.eval()
        prompt = DATA[: cfg.model.block_size].unsqueeze(0)
        sample = model.generate(prompt, cfg.sample_chars)[0, prompt.size(1) :]
        result = {
            "iters": cfg.trainer.max_iters, "loss": loss, "weights_sha256": weights_sha256(model),
            "sample": "".join(CHARS[i] for i in sample.tolist()),
        }  # fmt: skip
        path = out / cfg.result
        save_atomically(result, path, lambda obj, p: p.write_text(json.dumps(obj, indent=1)))
        print(f"rank 0: {json.dumps(result)} written to {path}")
    # Every rank tears the group down together: a rank that destroys it while rank 0 still
    # samples can abort in gloo's teardown ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
