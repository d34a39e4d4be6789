"""Recovery from a worker crash: steps lost, and the time back to the crashed step.

    python benchmarks/recovery.py [--runs 3] [--steps 30] [--crash 25] [--mb 100] [--out DIR]

A 2-rank DDP job on this machine (gloo on CPU), an MLP with about `--mb` MB of weights (SGD
without momentum: the weights are the whole state). Rank 1 exits with code 1 at step `--crash`
of the first attempt; the job restarts once. Four ways to keep the state:

- torchrun + disk: `torchrun --max-restarts=1`, rank 0 saves model and optimizer with
  `torch.save` every 10 steps (write beside, rename: the usual practice), every rank resumes
  from that file;
- elastic-hydra + disk: the same script and saves under elastic-hydra (`restart=on_failure`);
- elastic-hydra + snapshots: `ckpt.snapshot(...)` after every step, `ckpt.restore()` on start;
- elastic-hydra + snapshots + warm: the same with a warm worker (`warm.imports=[torch,
  torch._dynamo]`: the restarted rank is forked from a process that imported them; torch's
  optimizers import torch._dynamo on their first call, about 2 s of CPU, docs/warm.md).

Each rank appends a line per step to a file: when it ended, and how long `ckpt.snapshot` or the
disk save took on the training thread. From those:

- steps lost: the crashed step less the step the restart resumed at (steps trained twice);
- back at the crashed step: from rank 1's crash to the restarted job ending that step again;
- save cost: the median time a save takes on the training thread, against the median step time
  of steps without a save (per step, for snapshots: one every step); and how much longer a
  step takes with snapshots than with disk saves, the write beside the training included.

A run that does not recover (a launcher whose restarted attempt fails) is counted, with the line
that says why, and left out of the medians.

Writes recovery.md and recovery.json into --out (default: results/ beside this file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# An exception's line in a launcher's stderr, not torchrun's wrapper of its workers' failure.
_ERROR = re.compile(r"(?![\w.]*ChildFailedError)[\w.]*(Error|Exception): .+")
SAVE_EVERY = 10  # the disk runs' interval

SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
from torch import nn
from elastic_hydra import checkpoint as ckpt

mode, steps, crash, mb, out, disk = sys.argv[1:7]
steps, crash, mb = int(steps), int(crash), float(mb)
rank = int(os.environ["RANK"])
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
dist.init_process_group("gloo")
torch.manual_seed(0)
width = 1024
layers = max(1, round(mb * 2**20 / 4 / (width * width)))
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
ddp = nn.parallel.DistributedDataParallel(model)
start = 0
if mode == "snapshots":
    state = ckpt.restore()
    if state is not None:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
        start = state["step"] + 1
elif os.path.exists(disk):
    state = torch.load(disk)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
    start = state["step"] + 1
log = open(f"{out}/rank{rank}.jsonl", "a")
for step in range(start, steps):
    if step == crash and rank == 1 and attempt == "0":
        log.write(json.dumps({"crash": step, "t": time.time()}) + "\\n"); log.flush()
        os._exit(1)
    began = time.perf_counter()
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(step * 10 + rank))
    loss = ddp(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    trained = time.perf_counter()
    if mode == "snapshots":
        ckpt.snapshot({"model": model.state_dict(), "optim": opt.state_dict()}, step=step)
    elif (step + 1) % {every} == 0 and rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                   disk + ".part")
        os.replace(disk + ".part", disk)
    saved = time.perf_counter()
    log.write(json.dumps({"step": step, "attempt": attempt, "start": start, "t": time.time(),
                          "pid": os.getpid(),
                          "train_s": trained - began, "save_s": saved - trained}) + "\\n")
    log.flush()
dist.destroy_process_group()
""".replace("{every}", str(SAVE_EVERY))


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


class RunFailedError(RuntimeError):
    """A launcher that did not recover: its exit code and the line of its stderr that says why."""

    def __init__(self, way: str, code: int, stderr: str) -> None:
        said = [m[0] for ln in stderr.splitlines() if (m := _ERROR.match(ln.strip()))]
        self.why = said[0][:240] if said else f"exit {code}"  # the first: the workers' own
        super().__init__(f"{way}: exit {code}: {self.why}")


def one_run(work: Path, way: str, steps: int, crash: int, mb: float) -> dict[str, float]:
    case = Path(tempfile.mkdtemp(dir=work))
    script = case / "train.py"
    script.write_text(SCRIPT)
    mode = "snapshots" if "snapshots" in way else "disk"
    args = [mode, str(steps), str(crash), str(mb), str(case), str(case / "ckpt.pt")]
    if way.startswith("torchrun"):
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=2", "--max-restarts=1", str(script), *args]  # fmt: skip
    else:
        argv = [sys.executable, "-m", "elastic_hydra", f"script={script}", "nproc_per_node=2",
                "restart=on_failure", "restart.max_restarts=1", f"logs.root={case / 'logs'}",
                "logs.tee=false"]  # fmt: skip
        if way.endswith("warm"):
            argv.append("warm.imports=[torch,torch._dynamo]")
        argv += ["--", *args]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(argv, cwd=case, env=env, capture_output=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RunFailedError(way, proc.returncode, proc.stderr.decode(errors="replace"))
    rank0, rank1 = lines(case / "rank0.jsonl"), lines(case / "rank1.jsonl")
    crashed = next(float(str(r["t"])) for r in rank1 if "crash" in r)
    again = [r for r in rank0 if r.get("attempt") != "0"]
    resumed = int(str(again[0]["start"]))
    back = next(float(str(r["t"])) for r in again if r["step"] == crash)
    saves = [float(str(r["save_s"])) for r in rank0 if "save_s" in r]
    trains = [float(str(r["train_s"])) for r in rank0 if "train_s" in r]
    if mode == "snapshots":
        save_s = statistics.median(saves)
    else:  # the saving steps alone, spread over the interval
        save_s = statistics.median(s for s in saves if s > 0.001) / SAVE_EVERY
    return {
        "steps lost": crash - resumed,
        "crash to back at the crashed step (s)": back - crashed,
        "save cost per step (s)": save_s,
        "step time (s)": statistics.median(trains),
    }


WAYS = ("torchrun + disk", "elastic-hydra + disk", "elastic-hydra + snapshots",
        "elastic-hydra + snapshots + warm")  # fmt: skip


def run_meta(runs: int, script: str) -> dict[str, object]:
    """What a results file says of its run: the machine, its load, the date, the command."""
    return {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load average at the end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": runs,
        "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--crash", type=int, default=25)
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    failed: dict[str, list[str]] = {way: [] for way in WAYS}  # a run that did not recover: why
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for way in WAYS:
                try:
                    results[way].append(one_run(Path(tmp), way, args.steps, args.crash, args.mb))
                except RunFailedError as exc:
                    failed[way].append(exc.why)
                    print(exc, flush=True)
                    continue
                print(way, results[way][-1], flush=True)
    if not all(results.values()):
        raise SystemExit(f"a way never recovered: {failed}")
    meta = run_meta(args.runs, "recovery.py")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "runs": results, "failed": failed}
    (args.out / "recovery.json").write_text(json.dumps(doc, indent=2) + "\n")
    metrics = list(results[WAYS[0]][0])
    rows = ["| what | " + " | ".join(WAYS) + " |", "|---|" + "---|" * len(WAYS)]
    for metric in metrics:
        cells = []
        for way in WAYS:
            values = sorted(r[metric] for r in results[way])
            fmt = "{:.0f}" if metric == "steps lost" else "{:.3f}"
            cells.append(fmt.format(values[len(values) // 2]))
        rows.append(f"| {metric} | " + " | ".join(cells) + " |")
    snap = results[WAYS[2]]

    def back(way: str) -> float:
        return statistics.median(r["crash to back at the crashed step (s)"] for r in results[way])

    ratios = [f"- {way} against torchrun + disk, back at the crashed step: "
              f"{back(way) / back(WAYS[0]):.2f}x" for way in WAYS[2:]]  # fmt: skip
    share = statistics.median(r["save cost per step (s)"] / r["step time (s)"] for r in snap)
    plain = statistics.median(r["step time (s)"] for r in results[WAYS[1]])
    slower = statistics.median(r["step time (s)"] for r in snap) / plain - 1
    failures = [f"- runs that did not recover: {way}, {len(why)} of {args.runs} ({why[0]})"
                for way, why in failed.items() if why]  # fmt: skip
    text = "\n".join([
        f"# Recovery from a worker crash (2 ranks, gloo on CPU, {args.mb:g} MB of weights, "
        f"crash at step {args.crash} of {args.steps})", "",
        *[f"- {k}: {v}" for k, v in meta.items()],
        f"- Cells: the median over the runs; disk: a save every {SAVE_EVERY} steps by rank 0",
        *ratios,
        f"- a snapshot every step costs {share:.1%} of a step on the training thread; the step "
        f"takes {slower:.0%} longer than elastic-hydra + disk's (the write beside it shares the "
        "cores)",
        *failures, "",
        *rows, "",
    ])  # fmt: skip
    (args.out / "recovery.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
