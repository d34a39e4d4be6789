"""The straggler score on gloo: how soon a slowed rank is named, and silence on healthy runs.

    python benchmarks/stragglers.py [--ranks 4 8] [--healthy-steps 2000] [--out DIR]

Each run launches `--ranks` gloo ranks through elastic-hydra with the defaults (no straggler or
hang key). A step is `sleep(STEP)` (the compute) then an all_reduce.

- slowed: the last rank sleeps 20 % longer from step ONSET on, for SLOW_STEPS steps. Measured:
  the first straggler event's rank, and how many of the slowed rank's steps began between its
  first slow step and the event (its own arrivals, noted by the script).
- healthy: `--healthy-steps` steps, every rank alike (STEP_HEALTHY). Measured: straggler events
  and hang verdicts (both must be 0).

Writes stragglers.md and stragglers.json into --out (default: results/ beside this file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
STEP, STEP_HEALTHY, ONSET, SLOW_STEPS, FACTOR = 0.2, 0.01, 30, 60, 1.2
WORKER = r"""
import os, sys, time
import torch
import torch.distributed as dist

steps, step = int(sys.argv[1]), float(sys.argv[2])
slow_from, factor = int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
slowed = rank == world - 1 and slow_from >= 0
t, arrived = torch.ones(1), []
for i in range(steps):
    time.sleep(step * (factor if slowed and i >= slow_from else 1.0))
    arrived.append(time.time())
    dist.all_reduce(t)
if slowed:
    with open(os.path.join(os.environ["OUT_DIR"], "arrived"), "w") as f:
        f.write("\n".join(map(str, arrived)))
dist.destroy_process_group()
"""


def run(work: Path, ranks: int, slowed: bool, healthy_steps: int) -> dict[str, object]:
    case = Path(tempfile.mkdtemp(dir=work, prefix=f"{ranks}-"))
    (case / "w.py").write_text(WORKER)
    out, logs = case / "out", case / "logs"
    out.mkdir()
    args = (
        [str(ONSET + SLOW_STEPS), str(STEP), str(ONSET), str(FACTOR)]
        if slowed
        else [str(healthy_steps), str(STEP_HEALTHY), "-1", "1"]
    )
    argv = [
        sys.executable, "-m", "elastic_hydra", f"script={case / 'w.py'}",
        f"nproc_per_node={ranks}", "logs.tee=false", f"logs.root={logs}", f"env.OUT_DIR={out}",
        "--", *args,
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    events = [
        json.loads(line) for line in next(logs.rglob("events.jsonl")).read_text().splitlines()
    ]
    named = [e for e in events if e["event"] == "straggler" and e["named"]]
    hangs = [e for e in events if e["event"] == "hang"]
    steps_to_name = None
    if slowed and named:
        arrived = [float(x) for x in (out / "arrived").read_text().split()]
        steps_to_name = sum(1 for t in arrived[ONSET:] if t < named[0]["time"])
    return {
        "ranks": ranks, "run": "slowed 20 %" if slowed else f"healthy {healthy_steps} steps",
        "exit": proc.returncode, "named": [e["rank"] for e in named],
        "first_line": named[0] if named else None, "steps_to_name": steps_to_name,
        "hang_verdicts": len(hangs), "wall_s": round(time.time() - started, 1),
    }  # fmt: skip


def right(r: dict[str, object]) -> bool:
    if str(r["run"]).startswith("healthy"):
        return r["exit"] == 0 and r["named"] == [] and r["hang_verdicts"] == 0
    return bool(r["exit"] == 0 and r["named"] == [int(r["ranks"]) - 1])  # type: ignore[call-overload]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[4, 8])
    parser.add_argument("--healthy-steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load, results = os.getloadavg(), []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            for slowed in (True, False):
                result = run(Path(tmp), ranks, slowed, args.healthy_steps)
                result["right"] = right(result)
                print(json.dumps(result), flush=True)
                results.append(result)
    meta = {"host": platform.node(), "cpus": os.cpu_count(), "loadavg_before": load,
            "loadavg_after": os.getloadavg(), "time": time.time()}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stragglers.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1) + "\n"
    )
    lines = [
        "# The straggler score on gloo (defaults: no straggler or hang key)", "",
        f"Slowed: the last rank 20 % slower from step {ONSET} ({STEP:g} s steps). Healthy: every"
        f" rank alike ({STEP_HEALTHY:g} s steps). Load average before {load[0]:.2f}, after"
        f" {meta['loadavg_after'][0]:.2f}; {meta['cpus']} CPUs.", "",  # type: ignore[index]
        "| ranks | run | right | straggler lines | slowed steps to the line | hang verdicts |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in results:
        took = "-" if r["steps_to_name"] is None else str(r["steps_to_name"])
        named = ", ".join(f"rank {n}" for n in r["named"]) or "none"  # type: ignore[attr-defined]
        lines.append(f"| {r['ranks']} | {r['run']} | {'yes' if r['right'] else 'NO'} | {named} |"
                     f" {took} | {r['hang_verdicts']} |")  # fmt: skip
    (args.out / "stragglers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
