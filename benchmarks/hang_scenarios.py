"""Injected hangs and healthy loops on gloo: is the verdict right, and how soon does it come.

    python benchmarks/hang_scenarios.py [--timeout 10] [--defaults | --defaults-only]
        [--onset 3] [--step-sleep 0] [--ranks 3] [--out DIR] [--name hang_scenarios]

Each scenario runs `--ranks` gloo ranks through elastic-hydra with `hang.action=fail` and
`hang.timeout=--timeout` (with --defaults: also with no hang key, `hang.timeout=auto`;
--defaults-only: only so). The odd rank (the last) misbehaves at step `--onset` (each step
sleeps `--step-sleep` seconds first: with the defaults, a hang after the watch learned the job's
rhythm needs steps that take a while) and writes the time it did (the onset); the verdict's time
is the agent's hang event. Right: the verdict names the odd rank and nothing else (or, where
the evidence cannot tell, says so), the job fails only as expected, and a healthy loop gets no
verdict at all.

Scenarios: `sleep` (sleeps outside a collective), `stop` (SIGSTOPs itself), `loader` (a data
loader whose worker never delivers), `other` (enters a broadcast while the others all_reduce),
`deadlock` (two process groups entered in opposite orders), `raise` (raises while its peers wait:
a failure, never a hang), `skip` (skips one all_reduce and ends in the closing barrier), and the
healthy `sleepy` (all_reduce, print, sleep 0.5), `long` (2.5 s of computing per step) and
`eval` (one 25 s evaluation of computing, silent).

Writes NAME.md and NAME.json into --out (default: results/ beside this file).
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
WORKER = r"""
import os, signal, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

scenario, onset_step, step_sleep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
odd = rank == world - 1
group_a, group_b = dist.new_group(list(range(world))), dist.new_group(list(range(world)))


def onset():
    path = os.path.join(os.environ["OUT_DIR"], "onset")
    with open(path + ".part", "w") as f:
        f.write(str(time.time()))
    os.replace(path + ".part", path)


class Stuck(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(3600)
        return i


def compute(seconds):
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


t = torch.ones(2)
steps = {"sleepy": 40, "long": 8, "eval": 8}.get(scenario, onset_step + 3)
for step in range(steps):
    if scenario not in ("sleepy", "long", "eval"):
        time.sleep(step_sleep)
    if step == onset_step and odd:
        if scenario == "sleep":
            onset(); time.sleep(3600)
        elif scenario == "stop":
            onset(); os.kill(os.getpid(), signal.SIGSTOP)
        elif scenario == "loader":
            onset(); next(iter(DataLoader(Stuck(), num_workers=1)))
        elif scenario == "other":
            onset(); dist.broadcast(t, 0)
        elif scenario == "raise":
            onset(); raise RuntimeError("injected")
        elif scenario == "skip":
            onset(); continue
    if step == onset_step and scenario == "deadlock":
        if odd:
            onset()
        first, second = (group_b, group_a) if odd else (group_a, group_b)
        dist.all_reduce(t, group=first); dist.all_reduce(t, group=second)
    if scenario == "eval" and step == 3:
        compute(25.0)
    dist.all_reduce(t)
    if scenario == "long":
        compute(2.5)
    if scenario == "sleepy":
        print("step", step, flush=True)
        time.sleep(0.5)
dist.barrier()
dist.destroy_process_group()
"""
HANGS = ("sleep", "stop", "loader", "other", "deadlock", "skip")
FAILURE = ("raise",)
HEALTHY = ("sleepy", "long", "eval")


def run(
    work: Path, scenario: str, ranks: int, hang: tuple[str, ...], pace: tuple[int, float]
) -> dict[str, object]:
    """One launch: what it ended with, the verdict and the time from onset to verdict."""
    case = Path(tempfile.mkdtemp(dir=work, prefix=f"{scenario}-"))
    (case / "w.py").write_text(WORKER)
    out, logs = case / "out", case / "logs"
    out.mkdir()
    argv = [
        sys.executable, "-m", "elastic_hydra", f"script={case / 'w.py'}",
        f"nproc_per_node={ranks}", "hang.action=fail", "logs.quiet=true", "stop_grace=5",
        f"logs.root={logs}", f"env.OUT_DIR={out}", *hang, "--", scenario, str(pace[0]),
        str(pace[1]),
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    summary = json.loads(next(logs.rglob("summary.json")).read_text())
    events = [
        json.loads(line) for line in next(logs.rglob("events.jsonl")).read_text().splitlines()
    ]
    hung = next((e for e in events if e["event"] == "hang"), None)
    onset_file = out / "onset"
    onset = float(onset_file.read_text()) if onset_file.exists() else None
    verdict = (summary.get("hang") or {}).get("verdict", "")
    named = sorted(r["rank"] for r in (summary.get("hang") or {}).get("ranks", []) if r["odd"])
    return {
        "scenario": scenario, "hang": " ".join(hang) or "defaults", "exit": proc.returncode,
        "verdict": verdict, "named": named, "cannot_tell": "cannot tell" in verdict,
        "onset_to_verdict_s": round(hung["time"] - onset, 1) if hung and onset else None,
        "wall_s": round(time.time() - started, 1),
        "root_cause": summary.get("message", "")[:160],
    }  # fmt: skip


def right(result: dict[str, object], ranks: int) -> bool:
    """Right: a healthy loop without a verdict; a failure without one; a hang with the odd
    rank named alone, or a verdict that says it cannot tell."""
    scenario = result["scenario"]
    if scenario in HEALTHY:
        return bool(result["exit"] == 0 and not result["verdict"])
    if scenario in FAILURE:
        return bool(result["exit"] == 1 and not result["verdict"])
    alone = result["named"] == [ranks - 1]
    return bool(result["verdict"]) and bool(
        alone or (result["cannot_tell"] and not result["named"])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--defaults", action="store_true", help="also with no hang key")
    parser.add_argument("--defaults-only", action="store_true", help="only with no hang key")
    parser.add_argument("--onset", type=int, default=3, help="the step the odd rank misbehaves")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds before each step")
    parser.add_argument("--name", default="hang_scenarios", help="the results' file name")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="scenarios to run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    configs: list[tuple[str, ...]] = (
        [] if args.defaults_only else [(f"hang.timeout={args.timeout:g}",)]
    )
    configs += [()] if args.defaults or args.defaults_only else []
    pace = (args.onset, args.step_sleep)
    results = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in args.only or (*HANGS, *FAILURE, *HEALTHY):
            for hang in configs:
                result = run(Path(tmp), scenario, args.ranks, hang, pace)
                result["right"] = right(result, args.ranks)
                print(json.dumps(result), flush=True)
                results.append(result)
    meta = {
        "ranks": args.ranks,
        "onset_step": args.onset,
        "step_sleep": args.step_sleep,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_before": load,
        "loadavg_after": os.getloadavg(),
        "time": time.time(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1) + "\n"
    )
    lines = [
        f"# Injected hangs and healthy loops ({args.ranks} gloo ranks, hang.action=fail)", "",
        f"The odd rank misbehaves at step {args.onset}; each step of the hang scenarios sleeps"
        f" {args.step_sleep:g} s first. Load average before {load[0]:.2f}, after"
        f" {meta['loadavg_after'][0]:.2f}; {meta['cpus']} CPUs.", "",
        "| scenario | hang keys | right | exit | onset to verdict | verdict |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in results:
        took = "-" if r["onset_to_verdict_s"] is None else f"{r['onset_to_verdict_s']} s"
        text = str(r["verdict"] or r["root_cause"] or "no verdict").replace("|", "\\|")
        lines.append(f"| {r['scenario']} | {r['hang']} | {'yes' if r['right'] else 'NO'} | "
                     f"{r['exit']} | {took} | {text} |")  # fmt: skip
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
