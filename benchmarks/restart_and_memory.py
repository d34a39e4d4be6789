"""Restart gap, agent peak RSS and wall time: elastic-hydra and torchrun side by side (A B A B).

    python benchmarks/restart_and_memory.py [--runs 5] [--nproc 2]

Restart gap = the failing worker's last timestamp (written just before it exits) to the moment the
last restarted worker runs its first line. Agent RSS is sampled every 5 ms on the launcher process
alone (not its workers). Prints medians and the ratio of medians (ours / torchrun).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORKER = """\
import os, sys, time
t = time.time()
d = os.environ["STAMP_DIR"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
rank = os.environ["RANK"]
open(os.path.join(d, f"start_{attempt}_{rank}"), "w").write(repr(t))
if attempt == "0" and rank == "0":
    time.sleep(0.5)
    open(os.path.join(d, "fail"), "w").write(repr(time.time()))
    sys.exit(1)
if attempt == "0":
    time.sleep(30)
"""


def launchers(script: Path, nproc: int) -> dict[str, list[str]]:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    return {
        "elastic-hydra": [
            sys.executable, "-m", "elastic_hydra", f"script={script}", f"nproc_per_node={nproc}",
            "restart.max_restarts=1", "logs=quiet", "stop_grace=5",
        ],
        "torchrun": [
            torchrun, "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=1", str(script),
        ],
    }  # fmt: skip


def run_once(cmd: list[str], stamp_dir: Path, nproc: int) -> tuple[float, float, float]:
    """Returns (restart gap s, agent peak RSS MiB, wall s)."""
    for f in stamp_dir.iterdir():
        f.unlink()
    env = dict(os.environ, STAMP_DIR=str(stamp_dir))
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, cwd=stamp_dir.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    agent = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, agent.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.005)
    proc.wait(timeout=120)
    wall = time.monotonic() - started
    fail = float((stamp_dir / "fail").read_text())
    restarted = [float((stamp_dir / f"start_1_{r}").read_text()) for r in range(nproc)]
    return max(restarted) - fail, peak / 2**20, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "worker.py")
        script.write_text(WORKER)
        stamps = Path(tmp, "stamps")
        stamps.mkdir()
        cmds = launchers(script, args.nproc)
        results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cmds}
        for i in range(args.runs + 1):  # the first round warms caches and is dropped
            for name, cmd in cmds.items():
                measured = run_once(cmd, stamps, args.nproc)
                if i > 0:
                    results[name].append(measured)
    print(f"nproc={args.nproc}, {args.runs} runs each, medians (min-max)")
    medians: dict[str, list[float]] = {}
    for name, rows in results.items():
        cols = list(zip(*rows, strict=True))
        medians[name] = [statistics.median(c) for c in cols]
        labels = ("restart gap s", "agent peak RSS MiB", "wall s")
        text = ", ".join(
            f"{label} {statistics.median(c):.3f} ({min(c):.3f}-{max(c):.3f})"
            for label, c in zip(labels, cols, strict=True)
        )
        print(f"  {name:14} {text}")
    ours, theirs = medians["elastic-hydra"], medians["torchrun"]
    print(
        "  ratio (ours/torchrun): restart gap {:.2f}x, agent RSS {:.2f}x, wall {:.2f}x".format(
            *(a / b for a, b in zip(ours, theirs, strict=True))
        )
    )


if __name__ == "__main__":
    main()
