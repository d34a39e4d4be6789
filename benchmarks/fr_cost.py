"""What torch's Flight Recorder (on in every elastic-hydra worker) costs a DDP training step.

    python benchmarks/fr_cost.py [--steps 300] [--runs 3] [--out DIR]

Two gloo ranks train a small MLP under DistributedDataParallel (a batch of 64, 4 layers of 512:
each step has its gradient all_reduce, as the DDP example's has), with TORCH_FR_BUFFER_SIZE=2000
(elastic-hydra's default) and 0 (off), alternately, --runs times each. Reported: the median step
time of rank 0 after 20 warm-up steps, medians over the runs, and the ratio.

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
    print(json.dumps(statistics.median(times[20:])))
dist.destroy_process_group()
"""


def step_time(steps: int, buffer: str) -> float:
    """Rank 0's median step time of one two-rank run."""
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
                [sys.executable, "-c", TRAIN, str(steps)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    out = [p.communicate(timeout=600)[0] for p in procs]
    return float(json.loads(out[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"2000": [], "0": []}
    for _ in range(args.runs):
        for buffer, found in times.items():
            found.append(step_time(args.steps, buffer))
    on, off = statistics.median(times["2000"]), statistics.median(times["0"])
    result = {"on_s": on, "off_s": off, "ratio": on / off, "runs": times, "steps": args.steps,
              "loadavg": os.getloadavg()}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fr_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    text = (
        "# The Flight Recorder's cost to a DDP step (2 gloo ranks)\n\n"
        "| TORCH_FR_BUFFER_SIZE | median step |\n|---|---|\n"
        f"| 2000 (default) | {on * 1e3:.2f} ms |\n"
        f"| 0 (off) | {off * 1e3:.2f} ms |\n\nratio {on / off:.3f} ({args.runs} runs of "
        f"{args.steps} steps each; load average {os.getloadavg()[0]:.2f})\n"
    )
    (args.out / "fr_cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
