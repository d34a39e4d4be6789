"""One sweep, three Hydra launchers: the pool vs Hydra's basic launcher and hydra-joblib-launcher.

    python benchmarks/sweep_pool.py [--slots 4] [--scale 1.0] [--out DIR]

16 jobs of uneven durations (plain Python sleepers under elastic-hydra, the same job file for
every launcher) run as one `elastic-hydra -m` sweep with `hydra/launcher=basic` (one job after
another), `joblib` (`n_jobs=SLOTS`) and `pool` (`slots=SLOTS`). For each: the command's wall
time, the makespan (first job start to last job end, from each job's summary.json), the slots'
idle fraction while jobs were still queued (from the first start to the last start: the share
of SLOTS x that span with no job running; per-job start-up before the agent counts as idle for
every launcher), for the pool the mean gap between a job's end and the next start in its slot
(pool.json), and the processes the sweep left running after its command exited. Writes
sweep_pool.md and sweep_pool.json into --out (default: results/ next to this file).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
DURATIONS = (4, 1, 2, 6, 1, 3, 1, 5, 2, 1, 4, 2, 1, 3, 2, 6)  # seconds, x --scale
SLEEPER = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"
JOB = """defaults:
  - elastic_hydra_base
  - _self_
script: sleeper.py
args: ["${hp.d}"]
hp:
  d: 1.0
"""


@dataclass(frozen=True)
class Row:
    launcher: str
    wall_s: float
    makespan_s: float
    idle_while_queued: float
    left_running: int
    jobs_ok: int
    dispatch_gap_ms: float | None  # pool only: a slot's job ended -> its next job forked


def launcher_args(name: str, slots: int) -> list[str]:
    if name == "basic":
        return ["hydra/launcher=basic"]
    if name == "joblib":
        return ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={slots}"]
    return ["hydra/launcher=pool", f"hydra.launcher.slots={slots}", "hydra.launcher.cpus_per_job=0"]


def intervals(logs: Path) -> list[tuple[float, float]]:
    """Each job's agent lifetime (wall clock), from its result.json."""
    spans = []
    for path in logs.rglob("result.json"):
        summary = json.loads(path.read_text()).get("summary") or {}
        if summary.get("exit_code") == 0:
            spans.append((summary["started"], summary["started"] + summary["duration_s"]))
    return sorted(spans)


def idle_while_queued(spans: list[tuple[float, float]], slots: int) -> float:
    """The share of slot-time with no job running, from the first start to the last start."""
    first, last = spans[0][0], spans[-1][0]
    if last <= first:
        return 0.0
    edges = sorted({first, last, *(t for s in spans for t in s if first <= t <= last)})
    busy = 0.0
    for a, b in itertools.pairwise(edges):
        running = sum(1 for s, e in spans if s <= a and e >= b)
        busy += min(running, slots) * (b - a)
    return 1.0 - busy / (slots * (last - first))


def dispatch_gap_ms(logs: Path) -> float:
    """The pool's mean gap between a job's end and the next start in its slot (pool.json)."""
    record = json.loads(next(logs.rglob("pool.json")).read_text())
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for job in record["jobs"]:
        by_slot.setdefault(job["slot"], []).append((job["start_s"], job["end_s"]))
    gaps = [b[0] - a[1] for runs in by_slot.values() for a, b in itertools.pairwise(sorted(runs))]
    return round(1000 * sum(gaps) / len(gaps), 2) if gaps else 0.0


def left_behind(work: Path) -> list[psutil.Process]:
    """Processes still running in the sweep's directory (every job and worker starts there)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and Path(proc.cwd()).is_relative_to(work):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def run_one(name: str, slots: int, scale: float, work: Path) -> Row:
    logs = work / f"logs-{name}"
    values = ",".join(f"{d * scale:g}" for d in DURATIONS)
    cmd = [sys.executable, "-m", "elastic_hydra", "-m", "job.yaml", f"hp.d={values}",
           f"logs.root={logs}", *launcher_args(name, slots)]  # fmt: skip
    started = time.time()
    with open(work / f"{name}.out", "wb") as out:
        code = subprocess.run(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall = time.time() - started
    left = left_behind(work)
    for proc in left:
        proc.kill()
    psutil.wait_procs(left, timeout=5)
    spans = intervals(logs)
    if code.returncode != 0 or len(spans) != len(DURATIONS):
        tail = (work / f"{name}.out").read_text(errors="replace")[-2000:]
        raise SystemExit(f"{name}: exit {code.returncode}, {len(spans)} jobs ok\n{tail}")
    return Row(
        launcher=name,
        wall_s=round(wall, 2),
        makespan_s=round(spans[-1][1] - spans[0][0] if spans else 0.0, 2),
        idle_while_queued=round(idle_while_queued(spans, slots), 4),
        left_running=len(left),
        jobs_ok=len(spans),
        dispatch_gap_ms=dispatch_gap_ms(logs) if name == "pool" else None,
    )


def table(rows: list[Row], slots: int, scale: float) -> str:
    work = sum(DURATIONS) * scale
    lines = [
        f"Sweep of {len(DURATIONS)} jobs ({work:g} s of work in all) on {slots} slots, "
        f"{psutil.cpu_count()} CPUs.",
        "",
        "| launcher | wall (s) | vs pool | makespan (s) | slots idle while queued | "
        "dispatch gap (ms) | processes left running |",
        "|---|---|---|---|---|---|---|",
    ]
    pool = next(r for r in rows if r.launcher == "pool")
    for r in rows:
        lines.append(
            f"| {r.launcher} | {r.wall_s:.1f} | {r.wall_s / pool.wall_s:.2f}x | "
            f"{r.makespan_s:.1f} | {r.idle_while_queued:.1%} | "
            f"{'-' if r.dispatch_gap_ms is None else r.dispatch_gap_ms} | {r.left_running} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0, help="x every job's duration")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--launchers", default="pool,joblib,basic")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eh-sweep-bench-") as tmp:
        work = Path(tmp)
        (work / "sleeper.py").write_text(SLEEPER)
        (work / "job.yaml").write_text(JOB)
        rows = [run_one(n, args.slots, args.scale, work) for n in args.launchers.split(",")]
    text = table(rows, args.slots, args.scale)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep_pool.md").write_text(text)
    data = {"slots": args.slots, "scale": args.scale, "rows": [asdict(r) for r in rows]}
    (args.out / "sweep_pool.json").write_text(json.dumps(data, indent=2) + "\n")
    print(text, end="")


if __name__ == "__main__":
    main()
