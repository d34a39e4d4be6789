"""elastic-hydra vs torchrun, side by side on the same machine in the same run.

    python benchmarks/run.py [--runs 5] [--quick] [--only launch,restart,...]

Every workload runs both launchers alternately (elastic-hydra, torchrun, elastic-hydra, ...) after
one warm-up round that is discarded; workers are plain Python scripts that never import torch, so
what is measured is the launchers' own overhead. The launch and restart workloads add a third
runner to each round, the floor: no launcher, a bare program that starts the same workers
(elastic-hydra, torchrun, floor, elastic-hydra, ...). Writes latest.md, latest.json and latest.svg
into --out (default: results/ next to this file) and prints the Markdown table. Metric families
for --only: launch, restart, detection, memory (peak RSS and CPU), logs, shutdown, rendezvous
(several agents on this host over c10d), departure (elastic-hydra only: a killed agent noticed).
"""

from __future__ import annotations

import argparse
import compileall
import functools
import importlib.util
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from host import others_cores, read_cpu
from measure import (
    LOGS_NPROC,
    MEMORY_NPROC,
    SHUTDOWN_NPROC,
    Bench,
    run_departure,
    run_launch,
    run_launch_floor,
    run_logs,
    run_memory,
    run_rendezvous,
    run_restart,
    run_restart_floor,
    run_shutdown,
)
from procs import BenchError, sweep
from report import FAMILIES, Samples, metric_of, rows, write
from svg import write_svg
from workloads import FLOOR, LAUNCHERS, Launcher, write_worker

RESULTS = Path(__file__).resolve().parent / "results"


Measure = Callable[[Bench, int], dict[str, float]]


@dataclass(frozen=True)
class Workload:
    """One kind of run, the metric families it measures, its sizes (nproc, or agents for the
    multi-agent workloads), the launchers it compares and, optionally, its floor (no launcher)."""

    name: str
    families: frozenset[str]
    measure: Callable[[Launcher, Bench, int], dict[str, float]]
    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...]
    launchers: tuple[Launcher, ...] = LAUNCHERS
    floor: Measure | None = None

    def runners(self) -> list[tuple[str, Measure]]:
        """(name samples are filed under, measurement) for one round: the launchers, the floor."""
        out: list[tuple[str, Measure]] = [
            (launcher, functools.partial(self.measure, launcher)) for launcher in self.launchers
        ]
        return out if self.floor is None else [*out, (FLOOR, self.floor)]


WORKLOADS = (
    Workload(
        "launch", frozenset({"launch"}), run_launch, (1, 4, 16, 64), (1, 4), floor=run_launch_floor
    ),
    Workload(
        "restart",
        frozenset({"restart", "detection"}),
        run_restart,
        (2, 8),
        (2,),
        floor=run_restart_floor,
    ),
    Workload("memory", frozenset({"memory"}), run_memory, (MEMORY_NPROC,), (MEMORY_NPROC,)),
    Workload("logs", frozenset({"logs"}), run_logs, (LOGS_NPROC,), (LOGS_NPROC,)),
    Workload("shutdown", frozenset({"shutdown"}), run_shutdown, (SHUTDOWN_NPROC,), (4,)),
    Workload("rendezvous", frozenset({"rendezvous"}), run_rendezvous, (2, 4, 8), (2, 4)),
    Workload("departure", frozenset({"departure"}), run_departure, (2,), (2,), ("elastic-hydra",)),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=None, help="measured runs (default 5; 2 quick)")
    parser.add_argument("--quick", action="store_true", help="fewer runs, smaller sizes")
    parser.add_argument(
        "--only", default=",".join(FAMILIES), help=f"metric families: {','.join(FAMILIES)}"
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"where latest.* go (default {RESULTS})"
    )
    args = parser.parse_args(argv)
    args.families = [f.strip() for f in args.only.split(",") if f.strip()]
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown metric {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    if args.runs is None:
        args.runs = 2 if args.quick else 5
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def machine() -> dict[str, Any]:
    """CPU model and core count from /proc/cpuinfo, load, versions."""
    model, cores, seen_model = platform.processor() or "unknown", 0, False
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not seen_model:
                model, seen_model = line.split(":", 1)[1].strip(), True
            cores += line.startswith("processor")
    except OSError:
        pass

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {
        "cpu_model": model,
        "cores": cores,
        "loadavg": load,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": version("torch"),
        "elastic_hydra": version("elastic-hydra"),
    }


def run_workload(
    workload: Workload,
    bench: Bench,
    nproc: int,
    *,
    runs: int,
    samples: Samples,
    meta: dict[str, Any],
) -> None:
    """Warm-up round, then `runs` rounds A B [floor] A B [floor]; file each measurement under its
    metric key and runner."""
    for i in range(runs + 1):
        for runner, measure in workload.runners():
            tag = f"{workload.name} nproc={nproc} {'warm-up' if i == 0 else f'run {i}'} {runner}"
            try:
                values = measure(bench, nproc)
            except (BenchError, subprocess.SubprocessError, OSError, ValueError) as exc:
                meta["errors"].append(f"{tag}: {exc}")
                print(f"  {tag}: ERROR {exc}", file=sys.stderr, flush=True)
                values = {}
            finally:
                left = sweep(str(bench.root))
                if left:
                    meta["leftovers"].append(f"{tag}: pids {left}")
            shown = ", ".join(f"{k}={v:.4g}" for k, v in values.items())
            print(f"  {tag}: {shown}", file=sys.stderr, flush=True)
            if i == 0:
                continue
            for key, value in values.items():
                samples.setdefault(key, {}).setdefault(runner, []).append(value)


def compile_package() -> str:
    """Byte-compile the elastic_hydra package as pip does on install; say how it is installed.

    An editable install under PYTHONDONTWRITEBYTECODE=1 (common in containers) would otherwise
    compile the package's source again at every launch (~0.05-0.1 s), which an installed launcher
    never pays; torch's modules were compiled when it was installed.
    """
    spec = importlib.util.find_spec("elastic_hydra")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("elastic_hydra is not installed")
    package = spec.submodule_search_locations[0]
    compileall.compile_dir(package, quiet=1)
    return "installed" if "site-packages" in Path(package).parts else "editable"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    meta: dict[str, Any] = machine()
    meta["compiled"] = compile_package()
    lines = 20_000 if args.quick else 200_000
    meta.update(
        runs=args.runs,
        quick=args.quick,
        lines=lines,
        families=args.families,
        command=shlex.join(["python", "benchmarks/run.py", *sys.argv[1:]]),
        errors=[],
        leftovers=[],
    )
    samples: Samples = {}
    started, cpu = time.monotonic(), read_cpu()
    with tempfile.TemporaryDirectory(prefix="eh-bench-") as tmp:
        root = Path(tmp)
        bench = Bench(root=root, worker=write_worker(root), lines=lines)
        try:
            for workload in WORKLOADS:
                if not workload.families & set(args.families):
                    continue
                for nproc in workload.quick_sizes if args.quick else workload.sizes:
                    print(f"{workload.name}, nproc {nproc}", file=sys.stderr, flush=True)
                    run_workload(workload, bench, nproc, runs=args.runs, samples=samples, meta=meta)
        finally:
            sweep(str(root))
    samples = {k: v for k, v in samples.items() if metric_of(k).family in args.families}
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    meta["others_cores"] = round(others_cores(cpu, read_cpu()), 3)
    text = write(args.out, meta, samples)
    write_svg(args.out / "latest.svg", rows(samples))
    print(text)
    print(f"wrote {args.out}/latest.md, latest.json, latest.svg in {meta['elapsed_s']} s")
    return 1 if meta["errors"] or meta["leftovers"] else 0


if __name__ == "__main__":
    sys.exit(main())
