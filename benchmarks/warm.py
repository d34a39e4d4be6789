"""Warm starts: torch workers under torchrun, elastic-hydra cold and elastic-hydra warm.

    python benchmarks/warm.py [--runs 3] [--launch 2,4,8] [--restart 2,8] [--memory 4] [--out DIR]

Every worker imports torch, joins a gloo group through env:// and all_reduces once; then it
writes a stamp (time.time()). The three runners take turns within each round (torchrun,
elastic-hydra cold, elastic-hydra with `warm.imports=[torch]`), after one discarded warm-up round.

- launch@N: from just before the launcher is started to the last rank past its all_reduce.
- restart@N: rank 0 exits 1 once every rank is past its all_reduce; from that moment to the last
  rank of the new attempt past its all_reduce (failure to restarted-and-past-init_process_group).
- PSS (MiB, /proc/PID/smaps_rollup) of the workers while they hold after the all_reduce, and of
  the template: copy-on-write keeps a forked worker's own memory small.

Every runner gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (torchrun's restarts fail otherwise, see
docs/multi-node.md). The load average of the machine is printed with the table: it is shared.
Writes warm.md and warm.json into --out (default: results/ next to this file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
RUNNERS = ("torchrun", "cold", "warm")
TIMEOUT_S = 240.0
WORKER = """\
import os, sys, time
def stamp(name):
    d = os.environ["BENCH_STAMPS"]
    with open(os.path.join(d, "." + name), "w") as f:
        f.write(f"{time.time()!r} {os.getpid()}")
    os.replace(os.path.join(d, "." + name), os.path.join(d, name))
def wait_for(names, cap=120):
    end = time.time() + cap
    while time.time() < end and not all(os.path.exists(os.path.join(os.environ["BENCH_STAMPS"], n))
                                        for n in names):
        time.sleep(0.01)
from datetime import timedelta
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
value = torch.ones(1)
dist.all_reduce(value)
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
world, mode = int(os.environ["WORLD_SIZE"]), os.environ["BENCH_MODE"]
stamp(f"ready_{attempt}_{rank}")
if mode == "fail" and attempt == "0":
    if rank == "0":
        wait_for([f"ready_0_{r}" for r in range(world)])
        stamp("fail")
        os._exit(1)
    time.sleep(120)
if mode == "hold":
    wait_for(["release"])
dist.destroy_process_group()
"""


def command(runner: str, script: Path, nproc: int, run_dir: Path, restarts: int) -> list[str]:
    if runner == "torchrun":
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", f"--max-restarts={restarts}",
            f"--log-dir={run_dir / 'torchrun_logs'}", str(script),
        ]  # fmt: skip
    return [
        sys.executable, "-m", "elastic_hydra", f"script={script}", f"nproc_per_node={nproc}",
        f"restart.max_restarts={restarts}", f"logs.root={run_dir / 'eh_logs'}", "logs=quiet",
        *(["warm.imports=[torch]"] if runner == "warm" else []),
    ]  # fmt: skip


@contextlib.contextmanager
def launched(cmd: list[str], run_dir: Path, mode: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELASTIC_HYDRA_", "BENCH_"))}
    env.update(BENCH_MODE=mode, BENCH_STAMPS=str(run_dir / "stamps"))
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    (run_dir / "stamps").mkdir()
    with open(run_dir / "err", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def stamp(run_dir: Path, name: str) -> float:
    return float((run_dir / "stamps" / name).read_text().split()[0])


def finish(proc: subprocess.Popen[bytes], run_dir: Path, what: str) -> None:
    code = proc.wait(timeout=TIMEOUT_S)
    if code != 0:
        tail = (run_dir / "err").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{what}: exit {code}\n{tail}")


def measure_launch(runner: str, script: Path, nproc: int, root: Path) -> float:
    run_dir = Path(tempfile.mkdtemp(prefix=f"launch-{runner}-", dir=root))
    started = time.time()
    with launched(command(runner, script, nproc, run_dir, 0), run_dir, "once") as proc:
        finish(proc, run_dir, f"launch {runner}@{nproc}")
    return max(stamp(run_dir, f"ready_0_{r}") for r in range(nproc)) - started


def measure_restart(runner: str, script: Path, nproc: int, root: Path) -> float:
    run_dir = Path(tempfile.mkdtemp(prefix=f"restart-{runner}-", dir=root))
    with launched(command(runner, script, nproc, run_dir, 1), run_dir, "fail") as proc:
        finish(proc, run_dir, f"restart {runner}@{nproc}")
    failed = stamp(run_dir, "fail")
    return max(stamp(run_dir, f"ready_1_{r}") for r in range(nproc)) - failed


def pss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure_memory(runner: str, script: Path, nproc: int, root: Path) -> dict[str, float]:
    """PSS of each worker (mean) and of the template, while every worker holds."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"memory-{runner}-", dir=root))
    stamps = run_dir / "stamps"
    with launched(command(runner, script, nproc, run_dir, 0), run_dir, "hold") as proc:
        deadline = time.time() + TIMEOUT_S
        names = [f"ready_0_{r}" for r in range(nproc)]
        while not all((stamps / n).exists() for n in names):
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"memory {runner}: workers never got ready")
            time.sleep(0.05)
        pids = [int((stamps / n).read_text().split()[1]) for n in names]
        workers = [pss_mib(pid) for pid in pids]
        template = [
            pss_mib(p.pid)
            for p in psutil.Process(proc.pid).children()
            if any(a.endswith("warm/template.py") for a in p.cmdline()) and p.pid not in pids
        ]
        agent = pss_mib(proc.pid)
        (stamps / "release").write_text("")
        finish(proc, run_dir, f"memory {runner}")
    return {
        "worker_pss": statistics.mean(workers),
        "workers_pss_total": sum(workers),
        "template_pss": sum(template),
        "launcher_pss": agent,
    }


def rounds(args: argparse.Namespace, script: Path, root: Path) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {r: {} for r in RUNNERS}
    jobs: list[tuple[str, int]] = [("launch", n) for n in args.launch]
    jobs += [("restart", n) for n in args.restart]
    for run in range(args.runs + 1):  # run 0: warm-up, discarded
        for kind, nproc in jobs:
            for runner in RUNNERS:
                fn = measure_launch if kind == "launch" else measure_restart
                value = fn(runner, script, nproc, root)
                if run:
                    samples[runner].setdefault(f"{kind}@{nproc}", []).append(value)
                print(f"  run {run} {kind}@{nproc} {runner}: {value:.2f} s", flush=True)
    for nproc in args.memory:
        for runner in RUNNERS:
            for key, value in measure_memory(runner, script, nproc, root).items():
                samples[runner].setdefault(f"{key}@{nproc}", []).append(value)
    return samples


def table(samples: dict[str, dict[str, list[float]]], load: tuple[float, float]) -> str:
    lines = [
        "| metric | torchrun | elastic-hydra cold | elastic-hydra warm | cold / torchrun "
        "| warm / torchrun |",
        "|---|---|---|---|---|---|",
    ]
    for key in samples["torchrun"]:
        med = {r: statistics.median(samples[r][key]) for r in RUNNERS}
        unit = "MiB" if "pss" in key else "s"
        ratio = (
            (f"{med['cold'] / med['torchrun']:.2f}x", f"{med['warm'] / med['torchrun']:.2f}x")
            if med["torchrun"]
            else ("-", "-")
        )
        lines.append(
            f"| {key} | {med['torchrun']:.2f} {unit} | {med['cold']:.2f} {unit} | "
            f"{med['warm']:.2f} {unit} | {ratio[0]} | {ratio[1]} |"
        )
    lines.append("")
    lines.append(
        f"Medians; {os.cpu_count()} CPUs; load average {load[0]:.2f} before, {load[1]:.2f} after."
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--launch", default="2,4,8")
    parser.add_argument("--restart", default="2,8")
    parser.add_argument("--memory", default="4")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    for name in ("launch", "restart", "memory"):
        setattr(args, name, [int(n) for n in getattr(args, name).split(",") if n])
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="eh-warm-bench-") as tmp:
        root = Path(tmp)
        script = root / "torch_worker.py"
        script.write_text(WORKER)
        samples = rounds(args, script, root)
    text = table(samples, (before, os.getloadavg()[0]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "warm.md").write_text(text + "\n")
    (args.out / "warm.json").write_text(json.dumps(samples, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
