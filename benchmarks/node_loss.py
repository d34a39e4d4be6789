"""Recovery from a lost node: steps lost, and the time back to the lost step.

    python benchmarks/node_loss.py [--runs 3] [--steps 40] [--lose-after 25] [--mb 100] [--out DIR]

Two nodes on this machine (one rank each, gloo on CPU, recovery.py's MLP of about `--mb` MB),
their rendezvous in `elastic-hydra rdzv-server` (a store apart from both). When rank 1 has
finished step `--lose-after`, node 1 is lost: its agent's whole process group is SIGKILLed (the
agent and its worker, as when a machine dies), and its memory and its disk go with it. A fresh
agent takes its place. Three ways to keep the state:

- torchrun + disk: rank 0 saves with `torch.save` every 10 steps into a directory both nodes
  see (the usual practice); the replacement reads it back;
- elastic-hydra, snapshots + buddy: `ckpt.snapshot(...)` every step, each node's snapshots
  copied into the other node's memory (`checkpoint.buddy`), each node with its own disk;
- elastic-hydra, snapshots, no buddy (`checkpoint.buddy=false`): what the buddy saves.

From each rank's step lines (recovery.py's): steps lost (trained again after the loss) and
the time from the loss to the job finishing the lost step again. Writes node_loss.md and
node_loss.json into --out (default: results/ beside this file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from recovery import SCRIPT, lines

RESULTS = Path(__file__).resolve().parent / "results"
WAYS = ("torchrun + disk", "elastic-hydra, snapshots + buddy", "elastic-hydra, snapshots, no buddy")
TIMEOUT = 600.0


def wait(predicate: Callable[[], object], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def steps_of(path: Path) -> list[dict[str, object]]:
    return [r for r in lines(path) if "step" in r] if path.exists() else []


def one_run(work: Path, way: str, steps: int, lose_after: int, mb: float) -> dict[str, float]:
    case = Path(tempfile.mkdtemp(dir=work))
    (case / "train.py").write_text(SCRIPT)
    mode = "disk" if way.startswith("torchrun") else "snapshots"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    server_log = case / "server.out"
    with server_log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "elastic_hydra", "rdzv-server", "--port", "0"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    agents: list[subprocess.Popen[bytes]] = []
    try:

        def listening() -> list[str]:
            return re.findall(r"listening on 127\.0\.0\.1:(\d+)", server_log.read_text())

        wait(listening, "the store")
        port, run_id = listening()[0], f"bench-{uuid.uuid4().hex[:8]}"
        args = [mode, str(steps), "-1", str(mb), str(case), str(case / "shared" / "ckpt.pt")]
        (case / "shared").mkdir()

        def start(name: str) -> subprocess.Popen[bytes]:
            node = case / f"node-{name}"  # this node's memory and disk
            (node / "shm").mkdir(parents=True)
            if way.startswith("torchrun"):
                argv = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    "--rdzv-backend=c10d",
                    f"--rdzv-id={run_id}",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-conf=is_host=false",
                    "--max-restarts=3",
                    str(case / "train.py"),
                    *args,
                ]
            else:
                argv = [
                    sys.executable,
                    "-m",
                    "elastic_hydra",
                    f"script={case / 'train.py'}",
                    "nnodes=2",
                    "nproc_per_node=1",
                    "rdzv=c10d",
                    f"rdzv.id={run_id}",
                    f"rdzv.endpoint=127.0.0.1:{port}",
                    "rdzv.is_host=false",
                    "rdzv.await_replacement=true",
                    "restart=on_failure",
                    f"checkpoint.memory={node / 'shm'}",
                    f"checkpoint.home={node / 'home'}",
                    f"checkpoint.buddy={'no buddy' not in way}",
                    f"logs.root={node}",
                    "logs.tee=false",
                    "--",
                    *args,
                ]
            with (node / "agent.out").open("wb") as sink:
                proc = subprocess.Popen(
                    argv,
                    cwd=node,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            agents.append(proc)
            return proc

        start("0")
        lost = start("1")
        rank1 = case / "rank1.jsonl"
        wait(
            lambda: any(r["step"] == lose_after for r in steps_of(rank1)), "the step to lose after"
        )
        os.killpg(lost.pid, signal.SIGKILL)  # the machine is gone: agent and worker
        lost_at = time.time()
        lost.wait()
        shutil.rmtree(case / "node-1")
        done = max(int(str(r["step"])) for r in steps_of(rank1))  # rank 1's last step
        start("2")
        for proc in (agents[0], agents[2]):
            code = proc.wait(timeout=TIMEOUT)
            if code != 0:
                out = case / ("node-0" if proc is agents[0] else "node-2") / "agent.out"
                raise RuntimeError(f"{way}: exit {code}\n{out.read_text()[-3000:]}")
        after = [r for r in steps_of(case / "rank0.jsonl") if float(str(r["t"])) > lost_at]
        resumed = min(int(str(r["start"])) for r in after)
        back = next(float(str(r["t"])) for r in after if r["step"] == done + 1)
        return {
            "steps lost": done + 1 - resumed,
            "loss to back at the lost step (s)": back - lost_at,
        }
    finally:
        for proc in agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lose-after", type=int, default=25)
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for way in WAYS:
                results[way].append(one_run(Path(tmp), way, args.steps, args.lose_after, args.mb))
                print(way, results[way][-1], flush=True)
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load average at the end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": args.runs,
        "command": "python benchmarks/node_loss.py " + " ".join(sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "node_loss.json").write_text(
        json.dumps({"meta": meta, "runs": results}, indent=2) + "\n"
    )
    rows = ["| what | " + " | ".join(WAYS) + " |", "|---|" + "---|" * len(WAYS)]
    for metric in results[WAYS[0]][0]:
        cells = []
        for way in WAYS:
            value = statistics.median(r[metric] for r in results[way])
            cells.append(f"{value:.0f}" if metric == "steps lost" else f"{value:.3f}")
        rows.append(f"| {metric} | " + " | ".join(cells) + " |")
    back = "loss to back at the lost step (s)"
    ratio = statistics.median(r[back] for r in results[WAYS[1]]) / statistics.median(
        r[back] for r in results[WAYS[0]]
    )
    text = "\n".join(
        [
            f"# Recovery from a lost node (2 nodes of 1 rank, gloo on CPU, {args.mb:g} MB of "
            f"weights, node 1 lost after step {args.lose_after} of {args.steps})",
            "",
            *[f"- {k}: {v}" for k, v in meta.items()],
            "- Cells: the median over the runs; disk: a save every 10 steps by rank 0, in a "
            "directory both nodes see; the elastic-hydra nodes have a disk each",
            f"- snapshots + buddy against torchrun + disk, back at the lost step: {ratio:.2f}x",
            "",
            *rows,
            "",
        ]
    )
    (args.out / "node_loss.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
