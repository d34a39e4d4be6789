"""What torch's Flight Recorder (on in every elastic-hydra worker) costs a DDP training step, and
what elastic-hydra's reads of it (the straggler score's arrivals) add.

    python benchmarks/fr_cost.py [--steps 300] [--runs 3] [--out DIR]

Two gloo ranks train a small MLP under DistributedDataParallel (a batch of 64, 4 layers of 512:
each step has its gradient all_reduce, as the DDP example's has), started directly with
TORCH_FR_BUFFER_SIZE=2000 (elastic-hydra's default) and 0 (off), and under elastic-hydra with its
defaults (the recorder on, its entries read for the straggler score) and with
`straggler.action=off`, in turn, --runs times each. Reported: the median step time of rank 0
after 20 warm-up steps, medians over the runs, and the ratios to the recorder off.

Writes fr_cost.md and fr_cost.json into --out (default: results/ next to this file).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TRAIN = r"""
import json, statistics, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 512)
times = []
for step in range(int(sys.argv[1])):
    start = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    times.append(time.perf_counter() - start)
if dist.get_rank() == 0:
    with open(sys.argv[2], "w") as f:
        f.write(json.dumps(statistics.median(times[20:])))
dist.destroy_process_group()
"""


def step_time(steps: int, config: str, work: Path) -> float:
    """Rank 0's median step time of one two-rank run under `config` (see CONFIGS)."""
    out = work / "step_time"
    if config.startswith("elastic-hydra"):
        (work / "train.py").write_text(TRAIN)
        keys = ["straggler.action=off"] if config.endswith("off") else []
        argv = [sys.executable, "-m", "elastic_hydra", f"script={work / 'train.py'}",
                "nproc_per_node=2", "logs.quiet=true", f"logs.root={work / 'logs'}", *keys,
                "--", str(steps), str(out)]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True, timeout=600)
        return float(json.loads(out.read_text()))
    buffer = "2000" if config == "direct, recorder on" else "0"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = os.environ | {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": buffer,
        }  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", TRAIN, str(steps), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    for p in procs:
        p.communicate(timeout=600)
    return float(json.loads(out.read_text()))


CONFIGS = (
    "direct, recorder off", "direct, recorder on", "elastic-hydra, defaults",
    "elastic-hydra, straggler.action=off",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    times: dict[str, list[float]] = {config: [] for config in CONFIGS}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for config, found in times.items():
                found.append(step_time(args.steps, config, Path(tmp)))
    medians = {config: statistics.median(found) for config, found in times.items()}
    off = medians[CONFIGS[0]]
    result = {"medians_s": medians, "ratios": {c: m / off for c, m in medians.items()},
              "runs": times, "steps": args.steps, "loadavg_before": load,
              "loadavg_after": os.getloadavg()}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fr_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = "".join(f"| {c} | {m * 1e3:.2f} ms | {m / off:.3f} |\n" for c, m in medians.items())
    text = (
        "# The Flight Recorder's cost to a DDP step (2 gloo ranks)\n\n"
        "| run | median step | to the recorder off |\n|---|---|---|\n"
        + rows
        + f"\n{args.runs} runs of {args.steps} steps each; load average before {load[0]:.2f},"
        f" after {os.getloadavg()[0]:.2f}\n"
    )
    (args.out / "fr_cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
