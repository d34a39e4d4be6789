"""What watching a job costs its agent: status records and metrics on vs off.

    python benchmarks/observe_cost.py [--runs 3] [--seconds 20] [--nproc 4] [--out DIR]

The same one-node job (plain-Python workers that wait for a file, no torch) runs in three
settings, alternately, each round in another order:

- off: no status records (`ELASTIC_HYDRA_STATUS=off`), no metrics;
- status: the default, a record every 2 s to the run dir;
- status + metrics: `metrics.port=0 metrics.textfile=...`, and this script scraping /metrics
  once a second (as a Prometheus with a 1 s interval would; the scrape's own CPU is this
  script's, what the agent spends answering it is the agent's).

Measured: the agent process's own CPU time (user + system, /proc via psutil; its workers are
other processes and do not count) over a window of --seconds once every worker runs, as % of
one core. Medians of --runs; the differences to `off` are the cost. Writes observe_cost.md and
observe_cost.json into --out (default: results/ next to this file).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
WAIT = """import os, sys, time
open(os.path.join(os.environ["OUT_DIR"], os.environ["RANK"] + ".ready"), "w").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""
SETTINGS = ("off", "status", "status + metrics")


def one(work: Path, setting: str, seconds: float, nproc: int) -> float:
    """The agent's CPU over the window, % of one core."""
    run = work / f"{setting.replace(' ', '')}-{time.monotonic_ns()}"
    run.mkdir()
    (run / "out").mkdir()
    script, release = run / "wait.py", run / "release"
    script.write_text(WAIT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_HYDRA_")}
    env["OUT_DIR"] = str(run / "out")
    args = [f"script={script}", f"nproc_per_node={nproc}", f"logs.root={run / 'logs'}"]
    if setting == "off":
        env["ELASTIC_HYDRA_STATUS"] = "off"
    if setting == "status + metrics":
        args += ["metrics.port=0", f"metrics.textfile={run / 'eh.prom'}"]
    cmd = [sys.executable, "-m", "elastic_hydra", *args, "--", str(release)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = _port(proc) if setting == "status + metrics" else None
        deadline = time.monotonic() + 60
        while len(list((run / "out").glob("*.ready"))) < nproc:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{setting}: the workers did not start")
            time.sleep(0.05)
        time.sleep(1.0)  # past the start
        agent = psutil.Process(proc.pid)
        before, started = agent.cpu_times(), time.monotonic()
        while (left := started + seconds - time.monotonic()) > 0:
            if port is not None:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            time.sleep(min(1.0, left))
        after, took = agent.cpu_times(), time.monotonic() - started
        release.touch()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    used = (after.user - before.user) + (after.system - before.system)
    return float(100 * used / took)


def _port(proc: subprocess.Popen[bytes]) -> int:
    assert proc.stderr is not None
    for _ in range(20):
        line = proc.stderr.readline().decode()
        if found := re.search(r"metrics on http://[^:]+:(\d+)/metrics", line):
            return int(found.group(1))
    raise RuntimeError("the agent did not say its metrics port")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {s: [] for s in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            order = SETTINGS[i % 3 :] + SETTINGS[: i % 3]
            for setting in order:
                samples[setting].append(one(Path(tmp), setting, args.seconds, args.nproc))
    median = {s: statistics.median(v) for s, v in samples.items()}
    lines = [
        f"# What watching a job costs its agent ({args.nproc} workers, {args.seconds:.0f} s "
        f"windows, median of {args.runs})",
        "",
        "| setting | agent CPU, % of one core | vs off | runs |",
        "|---|---:|---:|---|",
    ]
    for s in SETTINGS:
        runs = ", ".join(f"{v:.3f}" for v in samples[s])
        lines.append(f"| {s} | {median[s]:.3f} | {median[s] - median['off']:+.3f} | {runs} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "observe_cost.md").write_text(text)
    (args.out / "observe_cost.json").write_text(
        json.dumps({"samples": samples, "median": median, "args": vars(args) | {"out": ""}})
    )


if __name__ == "__main__":
    main()
