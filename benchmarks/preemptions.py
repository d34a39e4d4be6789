"""Preemptions saved: SIGTERM to the agent of an 8-rank job at a random step, again and again.

    python benchmarks/preemptions.py [--trials 20] [--nproc 8] [--out DIR]

Each trial launches examples/ddp_snapshots.py (gloo on CPU, a snapshot every step, warm workers:
`warm.imports=[torch,torch._dynamo]`) with `--nproc` ranks, sends SIGTERM to the agent once rank
0 holds the snapshot of a random step (3 to 15), and checks what a preemption must leave:

- the agent exits 75 ("preempted, saved") and names the step it kept;
- every rank said it stopped after that same step;
- the same command again resumes every rank after that step (attempt 0) and ends with 0.

A trial passes when all of that holds. Writes preemptions.md and preemptions.json into --out
(default: results/ beside this file).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recovery import RESULTS, run_meta

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "ddp_snapshots.py"
AREA_PREFIX = "elastic-hydra-snapshots-"  # elastic_hydra.checkpoint.layout's
STEPS, STEP_TIME = 40, 0.2


def held_step(pid: int) -> int:
    """The newest step rank 0 of agent `pid` holds a snapshot of (-1: none yet)."""
    found = Path("/dev/shm").glob(f"{AREA_PREFIX}{pid}-*/rank-0/step-*.snap")
    steps = [int(p.stem.removeprefix("step-")) for p in found]
    return max(steps, default=-1)


def one_trial(work: Path, nproc: int, at: int) -> dict[str, object]:
    case = Path(tempfile.mkdtemp(dir=work))
    argv = [sys.executable, "-m", "elastic_hydra", f"script={EXAMPLE}", f"nproc_per_node={nproc}",
            f"logs.root={case / 'logs'}", "warm.imports=[torch,torch._dynamo]",
            "--", "--steps", str(STEPS), "--step-time", str(STEP_TIME)]  # fmt: skip
    agent = subprocess.Popen(argv, cwd=case, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while held_step(agent.pid) < at and agent.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no snapshot of step {at} within 300 s")
            time.sleep(0.02)
        began = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    saved_s = time.monotonic() - began
    kept = re.search(r"checkpoint: step (\d+) of ranks \S+ kept in", err.decode())
    stopped = re.findall(r"rank (\d+): stopping after step (\d+), kept by the agent", out.decode())
    step = int(kept.group(1)) if kept else None
    same = step is not None and sorted(int(r) for r, s in stopped if int(s) == step) == list(
        range(nproc)
    )
    again = subprocess.run(argv, cwd=case, capture_output=True, timeout=600, check=False)
    resumed = re.findall(r"rank \d+: resumed after step (\d+) \(attempt 0\)", again.stdout.decode())
    return {
        "signalled at step": at,
        "exit": agent.returncode,
        "kept step": step,
        "every rank stopped after it": same,
        "relaunch resumed every rank there": resumed == [str(step)] * nproc,
        "relaunch exit": again.returncode,
        "signal to exit (s)": round(saved_s, 3),
        "passed": agent.returncode == 75
        and same
        and resumed == [str(step)] * nproc
        and again.returncode == 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    pick = random.Random(args.seed)
    trials = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.trials):
            trials.append(one_trial(Path(tmp), args.nproc, pick.randint(3, 15)))
            print(n, trials[-1], flush=True)
    passed = sum(bool(t["passed"]) for t in trials)
    meta = run_meta(args.trials, "preemptions.py")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "preemptions.json").write_text(json.dumps({"meta": meta, "trials": trials},
                                                          indent=2) + "\n")  # fmt: skip
    waits = sorted(float(str(t["signal to exit (s)"])) for t in trials)
    keys = list(trials[0])
    rows = ["| " + " | ".join(keys) + " |", "|---" * len(keys) + "|"]
    rows += ["| " + " | ".join(str(t[k]) for k in keys) + " |" for t in trials]
    text = "\n".join([
        f"# Preemptions saved ({args.nproc} ranks, gloo on CPU, warm workers, "
        f"{STEP_TIME:g} s steps)", "",
        *[f"- {k}: {v}" for k, v in meta.items()],
        f"- saved at the same step on every rank, resumed there: {passed}/{len(trials)}",
        f"- SIGTERM to the agent's exit: median {waits[len(waits) // 2]:.2f} s, "
        f"max {waits[-1]:.2f} s", "",
        *rows, "",
    ])  # fmt: skip
    (args.out / "preemptions.md").write_text(text)
    print(text)
    return 0 if passed == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
