"""Elastic membership on one machine: how long a start, a join and a loss take.

    python benchmarks/membership.py [--runs 3] [--out DIR]

A `nnodes=2:4` c10d job on loopback, its store hosted by one of the first two agents (the third
is never the host: it is the one killed), one idle worker per
node (no torch: what is timed is the rendezvous, not a worker's imports). Each run: two agents
start together; once both run their workers, a third starts; once it runs its worker, it is
killed with SIGKILL (its whole process group). Times come from the agents' events.jsonl:

- first round: from the two agents' start to both running their workers;
- join: from the third agent's start to the others noticing it, and to all three running;
- loss: from the kill to every survivor naming the node that left, and to both running again.

Each run is made with elastic-hydra's defaults and with torchrun's timings
(`rdzv.last_call_timeout=30 rdzv.keep_alive_interval=5`, what every job had before). Writes
membership.md and membership.json into --out (default: results/ beside this file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TORCHRUN_TIMINGS = ("rdzv.last_call_timeout=30", "rdzv.keep_alive_interval=5")
WORKER = "import time\ntime.sleep(600)\n"
DEADLINE = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(root: Path) -> list[dict[str, object]]:
    found = list(root.rglob("events.jsonl"))
    if not found:
        return []
    lines = found[0].read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def until(what: str, check: Callable[[], float | None]) -> float:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if (found := check()) is not None:
            return found
        time.sleep(0.05)
    raise RuntimeError(f"no {what} within {DEADLINE:g} s")


def started(root: Path, nodes: int, after: float) -> float | None:
    """When this agent's workers of a round of `nodes` nodes started, after `after`."""
    rounds = [e for e in events(root) if e["event"] in ("rendezvous", "workers_started")]
    size = None
    for e in rounds:
        if e["event"] == "rendezvous":
            size = e["nodes"]
        elif size == nodes and float(str(e["time"])) > after:
            return float(str(e["time"]))
    return None


def changed(root: Path, kind: str, after: float) -> float | None:
    for e in events(root):
        if e["event"] == "membership" and e["change"] == kind and float(str(e["time"])) > after:
            return float(str(e["time"]))
    return None


def one_run(work: Path, overrides: tuple[str, ...]) -> dict[str, float]:
    case = Path(tempfile.mkdtemp(dir=work))
    (case / "w.py").write_text(WORKER)
    endpoint = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen[bytes]] = []

    def agent(i: int) -> Path:
        root = case / f"agent{i}"
        argv = [
            sys.executable, "-m", "elastic_hydra", f"script={case / 'w.py'}", "rdzv=c10d",
            f"rdzv.endpoint={endpoint}", "rdzv.id=membership", "nnodes=2:4", "local_addr=127.0.0.1",
            f"logs.root={root}", "logs.tee=false", *overrides,
        ]  # fmt: skip
        with (case / f"agent{i}.out").open("wb") as sink:
            procs.append(subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
        return root

    try:
        t0 = time.time()
        a, b = agent(0), agent(1)
        first = max(until("first round", partial(started, r, 2, t0)) for r in (a, b))
        t1 = time.time()
        c = agent(2)
        noticed = max(until("the join noticed", partial(changed, r, "joined", t1)) for r in (a, b))
        grown = max(until("the 3-node round", partial(started, r, 3, t1)) for r in (a, b, c))
        t2 = time.time()
        os.killpg(procs[2].pid, signal.SIGKILL)
        named = max(until("the loss noticed", partial(changed, r, "left", t2)) for r in (a, b))
        shrunk = max(until("the 2-node round", partial(started, r, 2, t2)) for r in (a, b))
        return {
            "first round": first - t0,
            "join noticed": noticed - t1,
            "join: 3 nodes running": grown - t1,
            "loss noticed": named - t2,
            "loss: 2 nodes running": shrunk - t2,
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"defaults": [], "torchrun's timings": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for name, overrides in (("defaults", ()), ("torchrun's timings", TORCHRUN_TIMINGS)):
                results[name].append(one_run(Path(tmp), overrides))
                print(name, results[name][-1], flush=True)
    load = os.getloadavg()
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load average at the end": " ".join(f"{x:.2f}" for x in load),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": args.runs,
        "command": "python benchmarks/membership.py " + " ".join(sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "membership.json").write_text(json.dumps({"meta": meta, "runs": results},
                                                         indent=2) + "\n")  # fmt: skip
    rows = ["| what | defaults (s) | torchrun's timings (s) |", "|---|---|---|"]
    for metric in results["defaults"][0]:
        cells = []
        for runs in results.values():
            values = sorted(r[metric] for r in runs)
            cells.append(f"{values[0]:.1f} / {values[len(values) // 2]:.1f} / {values[-1]:.1f}")
        rows.append(f"| {metric} | {cells[0]} | {cells[1]} |")
    text = "\n".join([
        "# Elastic membership: a start, a join and a loss (nnodes=2:4, c10d, loopback)", "",
        *[f"- {k}: {v}" for k, v in meta.items()],
        "- Cells: min / median / max over the runs; defaults: rdzv.last_call_timeout=2, "
        "rdzv.keep_alive_interval=1 (x 3); torchrun's: 30 and 5 (x 3)", "", *rows, "",
    ])  # fmt: skip
    (args.out / "membership.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
