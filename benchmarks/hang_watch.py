"""Hang detection: what the watch costs a worker, and how soon a hang is named, vs torchrun.

    python benchmarks/hang_watch.py [--runs 5] [--timeout 10] [--silence 60] [--out DIR]

1. Cost. A tight pure-Python loop (a fixed amount of work) runs through elastic-hydra's
   bootstrap with its progress watch and stacks handler on (looking every 1 s, the default,
   and every 0.05 s, the fastest) and off, alternately. Reported: the worker's CPU time (total
   differences of a few % are this shared machine's noise), the CPU the watch thread itself used
   (the process's CPU minus its main thread's: exact) and peak RSS; medians of --runs.
2. Onset to verdict. Two gloo ranks, one sleeping before the all_reduce: elastic-hydra with
   `hang.timeout=--timeout hang.action=fail`, and torchrun on the same script. The onset is the
   time the stuck rank wrote before sleeping; the verdict, elastic-hydra's hang event. torchrun
   prints nothing until gloo's own timeout (30 minutes by default): the benchmark stops it after
   --silence seconds and reports how long it stayed silent.

Writes hang_watch.md and hang_watch.json into --out (default: results/ next to this file).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BOOTSTRAP = Path(__file__).resolve().parents[1] / "elastic_hydra" / "workers" / "bootstrap.py"
LOOP = """import json, sys, time
total = 0
for i in range(25_000_000):
    total += i & 7
# The process's CPU minus its main thread's: what every other thread (the watch) used.
print(json.dumps({"process": time.process_time(), "main": time.thread_time()}))
"""
STUCK = """import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    with open(os.path.join(os.environ["OUT_DIR"], "stuck_at"), "w") as f:
        f.write(str(time.time()))
    time.sleep(3600)
dist.all_reduce(torch.ones(1))
"""


def worker_cost(work: Path, every: str | None) -> tuple[float, float, float]:
    """(CPU seconds, of which the watch thread's, peak RSS MiB) of one run of the loop."""
    script = work / "loop.py"
    script.write_text(LOOP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_HYDRA_")}
    if every is not None:
        env |= {
            "ELASTIC_HYDRA_PROGRESS_FILE": str(work / "progress"),
            "ELASTIC_HYDRA_PROGRESS_EVERY": every,
            "ELASTIC_HYDRA_STACKS_FILE": str(work / "stacks.txt"),
            "ELASTIC_HYDRA_STACKS_SIGNAL": str(38),
        }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "-u", str(BOOTSTRAP), str(script)],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, times["process"] - times["main"], after.ru_maxrss / 1024


def cost(runs: int, work: Path) -> dict[str, dict[str, float]]:
    samples: dict[str, list[tuple[float, float, float]]] = {"off": [], "1 s": [], "0.05 s": []}
    kinds = [("off", None), ("1 s", "1"), ("0.05 s", "0.05")]
    for i in range(runs):  # each round in another order: drift on a shared machine evens out
        for name, every in kinds[i % 3 :] + kinds[: i % 3]:
            samples[name].append(worker_cost(work, every))
    return {
        name: {
            "cpu_s": round(statistics.median(c for c, _, _ in s), 4),
            "watch_cpu_s": round(statistics.median(w for _, w, _ in s), 5),
            "watch_share": round(statistics.median(w / c for c, w, _ in s), 6),
            "rss_mib": round(max(r for _, _, r in s), 1),
        }
        for name, s in samples.items()
    }


def verdict_time(work: Path, timeout: float) -> float:
    """Seconds from the stuck rank's onset to elastic-hydra's hang event."""
    out, logs = work / "eh_out", work / "eh_logs"
    out.mkdir()
    cmd = [sys.executable, "-m", "elastic_hydra", "script=stuck.py", "nproc_per_node=2",
           f"hang.timeout={timeout:g}", "hang.warmup=0", "hang.action=fail", "stop_grace=2",
           "logs.quiet=true", f"logs.root={logs}"]  # fmt: skip
    env = os.environ | {"OUT_DIR": str(out)}
    subprocess.run(cmd, cwd=work, env=env, capture_output=True, check=False, timeout=timeout + 120)
    events = next(logs.rglob("events.jsonl")).read_text().splitlines()
    hang = next(json.loads(e) for e in events if '"event": "hang"' in e)
    return float(hang["time"]) - float((out / "stuck_at").read_text())


def torchrun_silence(work: Path, silence: float) -> tuple[float, bool]:
    """(seconds torchrun stayed silent after the onset, whether it ever said anything)."""
    out = work / "tr_out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "stuck.py"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=work, env=os.environ | {"OUT_DIR": str(out)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + silence + 60
    while not (out / "stuck_at").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    onset = float((out / "stuck_at").read_text())
    try:
        proc.wait(timeout=max(0.0, onset + silence - time.time()))
        spoke = True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        spoke = False
    return time.time() - onset, spoke


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--silence", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eh-hang-bench-") as tmp:
        work = Path(tmp)
        (work / "stuck.py").write_text(STUCK)
        costs = cost(args.runs, work)
        eh = verdict_time(work, args.timeout)
        silent, spoke = torchrun_silence(work, args.silence)
    off = costs["off"]["cpu_s"]
    lines = [
        "| measure | elastic-hydra | torchrun |",
        "|---|---|---|",
        *(
            f"| tight loop, watch {name}: worker CPU; the watch thread's share; peak RSS | "
            f"{c['cpu_s']:.3f} s ({(c['cpu_s'] / off - 1) * 100:+.1f} %); "
            f"{c['watch_cpu_s'] * 1000:.2f} ms ({c['watch_share']:.3%}); {c['rss_mib']:.1f} MiB | |"
            for name, c in costs.items()
        ),
        f"| hang onset to verdict (hang.timeout={args.timeout:g}) | {eh:.1f} s, every rank's "
        f"stack saved | {'error after' if spoke else 'nothing in'} {silent:.0f} s"
        f"{'' if spoke else ' (stopped by the benchmark; gloo waits 30 min)'} |",
    ]
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hang_watch.md").write_text(text)
    data = {"cost": costs, "verdict_s": eh, "torchrun_silent_s": silent, "torchrun_spoke": spoke}
    (args.out / "hang_watch.json").write_text(json.dumps(data, indent=2) + "\n")
    print(text, end="")


if __name__ == "__main__":
    main()
