"""Preflight: time from the first agent's start to the verdict, and what the check costs.

    python benchmarks/preflight.py [--nodes 2,4,8] [--runs 1] [--healthy-runs 20] [--out DIR]
                                   [--min-ratio R] [--name preflight]

For each node count, one job of that many agents on this host (c10d on 127.0.0.1, one worker
each, a worker script that only prints) three ways:

- `off`: no preflight; reported: first agent's start to the last node's workers started;
- `quick`: `preflight=quick`, every node healthy; reported: first agent's start to the last node's
  verdict (its `preflight` event) and to its workers, and the difference to `off` (the cost);
- `throttled`: `preflight=quick`, the last agent started in a cgroup v1 `cpu` group whose
  `cpu.cfs_quota_us` drops to a tenth of a CPU once it is in the round; the job has a fixed size,
  so it stops: reported the time to the verdict and whether the throttled node was the one named.

Then --healthy-runs healthy `quick` jobs of 4 nodes: every node that a verdict names is a false
exclusion; reported their count. Each run's agents start one after the other, the first alone
until its store listens (it hosts the c10d store). Runs as root (the cgroup).

`--min-ratio` sets `preflight.min_ratio` (default: the quick preset's, 0.8); `--nodes ''` skips the
table and runs only the healthy series. Writes NAME.md and NAME.json into --out (default: results/
next to this file).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
WORKER = "import os\nprint('rank', os.environ['RANK'])\n"
FAST = ["rdzv.keep_alive_interval=1", "rdzv.keep_alive_max_attempt=3", "rdzv.last_call_timeout=1"]
DEADLINE = 600.0
FINDING = re.compile(r"preflight: (?:node|link) [^\n]*")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def events(root: Path) -> list[dict[str, Any]]:
    found = []
    for path in root.glob("**/events.jsonl"):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                found.append(json.loads(line))
    return found


def run_job(tmp: Path, nodes: int, mode: str, min_ratio: float | None = None) -> dict[str, Any]:
    """One job of `nodes` agents; mode off, quick or throttled."""
    job = tmp / uuid.uuid4().hex[:8]
    job.mkdir()
    script = job / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    common = [sys.executable, "-m", "elastic_hydra", f"script={script}", "rdzv=c10d",
              f"rdzv.endpoint=127.0.0.1:{port}", f"rdzv.id={job.name}", "local_addr=127.0.0.1",
              f"nnodes={nodes}", *FAST]  # fmt: skip
    if mode != "off":
        common.append("preflight=quick")
        if min_ratio is not None:
            common.append(f"preflight.min_ratio={min_ratio}")
    group = CPU_CGROUPS / f"elastic-hydra-bench-{job.name}"
    procs: list[subprocess.Popen[bytes]] = []
    outputs = [job / f"agent{i}.out" for i in range(nodes)]
    t0 = time.time()
    try:
        for i in range(nodes):
            argv = [*common, f"logs.root={job / f'agent{i}'}"]
            if mode == "throttled" and i == nodes - 1:
                group.mkdir()
                argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"),
                        *argv]  # fmt: skip
            with outputs[i].open("wb") as out:
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
            if i == 0:
                wait(lambda: listening(port), 120, "the store")
        if mode == "throttled":
            last = outputs[-1]
            wait(lambda: re.search(rf"node \d+ of {nodes},", last.read_text()), 300, "the round")
            (group / "cpu.cfs_quota_us").write_text("10000")
        deadline = time.monotonic() + DEADLINE
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if group.exists():
            wait(lambda: not (group / "cgroup.procs").read_text().split(), 30, "the group")
            group.rmdir()
    seen = [events(job / f"agent{i}") for i in range(nodes)]
    verdicts = [e for ev in seen for e in ev if e["event"] == "preflight"]
    started = [e["time"] for ev in seen for e in ev if e["event"] == "workers_started"]
    throttled = None
    if mode == "throttled":
        found = re.search(rf"node (\d+) of {nodes},", outputs[-1].read_text())
        throttled = int(found.group(1)) if found else None
    bad = sorted({n for e in verdicts for n in e["bad_nodes"]})
    texts = [out.read_text(errors="replace") for out in outputs]
    said = {m.group(0) for text in texts for m in FINDING.finditer(text)}
    return {
        "nodes": nodes,
        "mode": mode,
        "codes": codes,
        "verdict_s": max(e["time"] for e in verdicts) - t0 if verdicts else None,
        "battery_s": max(e["seconds"] for e in verdicts) if verdicts else None,
        "workers_s": max(started) - t0 if len(started) == nodes else None,
        "bad_nodes": bad,
        "throttled_node": throttled,
        "findings": sorted(said),  # every node's and link's finding, fatal or not
    }


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,4,8")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--healthy-runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--min-ratio", type=float, default=None)
    parser.add_argument("--name", default="preflight")
    args = parser.parse_args()
    rows, healthy = [], []
    with tempfile.TemporaryDirectory(prefix="eh-preflight-bench-") as tmp:
        for nodes in [int(n) for n in args.nodes.split(",") if n]:
            for mode in ("off", "quick", "throttled"):
                runs = [run_job(Path(tmp), nodes, mode, args.min_ratio) for _ in range(args.runs)]
                rows.append(runs)
                print(json.dumps(runs[-1]), flush=True)
        for _ in range(args.healthy_runs):
            healthy.append(run_job(Path(tmp), 4, "quick", args.min_ratio))
            print(json.dumps(healthy[-1]), flush=True)
    table = report(rows, healthy, args.min_ratio)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text(table)
    data = {"min_ratio": args.min_ratio, "jobs": rows, "healthy": healthy}
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1))
    print(table)
    return 0


def report(
    rows: list[list[dict[str, Any]]], healthy: list[dict[str, Any]], min_ratio: float | None
) -> str:
    ratio = "0.8 (the quick preset's)" if min_ratio is None else str(min_ratio)
    head = [
        f"preflight.min_ratio: {ratio}; load average at the end: {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs",
        "",
    ]
    lines = [
        "| nodes | preflight | to the verdict (s) | battery (s) | to the workers (s) | "
        "named | exit codes |",
        "|---|---|---|---|---|---|---|",
    ]
    off: dict[int, float | None] = {}
    for runs in rows:
        first = runs[0]
        workers = median([r["workers_s"] for r in runs])
        if first["mode"] == "off":
            off[first["nodes"]] = workers
        cost = ""
        if first["mode"] == "quick" and workers is not None and off.get(first["nodes"]):
            cost = f" (+{workers - off[first['nodes']]:.1f})"  # type: ignore[operator]
        named = ", ".join(str(r["bad_nodes"]) for r in runs)
        if first["mode"] == "throttled":
            named += " (throttled: " + ", ".join(str(r["throttled_node"]) for r in runs) + ")"
        lines.append(
            f"| {first['nodes']} | {first['mode']} | {fmt(median([r['verdict_s'] for r in runs]))}"
            f" | {fmt(median([r['battery_s'] for r in runs]))} | {fmt(workers)}{cost} | {named} |"
            f" {', '.join(str(r['codes']) for r in runs)} |"
        )
    if not rows:
        lines = []
    if healthy:
        false = sum(len(r["bad_nodes"]) for r in healthy)
        runs_with = sum(1 for r in healthy if r["bad_nodes"])
        lines.append("")
        lines.append(
            f"False exclusions over {len(healthy)} healthy 4-node quick runs: {false} node(s) "
            f"named in {runs_with} run(s); verdict median "
            f"{fmt(median([r['verdict_s'] for r in healthy]))} s, battery median "
            f"{fmt(median([r['battery_s'] for r in healthy]))} s."
        )
        kept = [line for r in healthy for line in r.get("findings", ()) if "not confirmed" in line]
        runs_kept = sum(1 for r in healthy if any("not confirmed" in x for x in r["findings"]))
        lines.append(
            f"Slow findings not confirmed (warned, kept): {len(kept)} in {runs_kept} run(s)."
        )
        lines += [f"- {line}" for r in healthy for line in r.get("findings", ())]
    return "\n".join([*head, *lines]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
