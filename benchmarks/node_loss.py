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
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
from recovery import SCRIPT, lines, run_meta

RESULTS = Path(__file__).resolve().parent / "results"
WAYS = ("torchrun + disk", "elastic-hydra, snapshots + buddy", "elastic-hydra, snapshots, no buddy")
TIMEOUT = 600.0


def wait(predicate: Callable[[], object], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def lose(pid: int) -> None:
    """The machine is gone: SIGKILL to the agent and to everything it started at once (torchrun's
    workers run in sessions of their own, so the agent's process group is not all of it)."""
    agent = psutil.Process(pid)
    for proc in [agent, *agent.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def steps_of(path: Path) -> list[dict[str, object]]:
    return [r for r in lines(path) if "step" in r] if path.exists() else []


def command(
    way: str, node: Path, *, script: Path, endpoint: str, run_id: str, args: list[str]
) -> list[str]:
    """The agent's command line of `way` on `node` (its memory and disk under that directory)."""
    if way.startswith("torchrun"):
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-id={run_id}",
            f"--rdzv-endpoint={endpoint}",
            "--rdzv-conf=is_host=false",
            "--max-restarts=3",
            str(script),
            *args,
        ]
    return [
        sys.executable,
        "-m",
        "elastic_hydra",
        f"script={script}",
        "nnodes=2",
        "nproc_per_node=1",
        "rdzv=c10d",
        f"rdzv.id={run_id}",
        f"rdzv.endpoint={endpoint}",
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


@contextlib.contextmanager
def store(case: Path, env: dict[str, str]) -> Iterator[str]:
    """`elastic-hydra rdzv-server`: the job's store, apart from both nodes; its port."""
    log = case / "server.out"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "elastic_hydra", "rdzv-server", "--port", "0"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:

        def listening() -> list[str]:
            return re.findall(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())

        wait(listening, "the store")
        yield listening()[0]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def one_run(work: Path, way: str, steps: int, lose_after: int, mb: float) -> dict[str, float]:
    case = Path(tempfile.mkdtemp(dir=work))
    (case / "train.py").write_text(SCRIPT)
    mode = "disk" if way.startswith("torchrun") else "snapshots"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    agents: list[subprocess.Popen[bytes]] = []
    outputs: dict[int, Path] = {}  # an agent's pid -> its output
    with store(case, env) as port:
        run_id = f"bench-{uuid.uuid4().hex[:8]}"
        args = [mode, str(steps), "-1", str(mb), str(case), str(case / "shared" / "ckpt.pt")]
        (case / "shared").mkdir()

        def start(name: str, run_id: str) -> subprocess.Popen[bytes]:
            node = case / f"node-{name}"  # this node's memory and disk
            (node / "shm").mkdir(parents=True)
            argv = command(
                way,
                node,
                script=case / "train.py",
                endpoint=f"127.0.0.1:{port}",
                run_id=run_id,
                args=args,
            )
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
            outputs[proc.pid] = node / "agent.out"
            return proc

        try:
            start("0", run_id)
            lost = start("1", run_id)
            rank1 = case / "rank1.jsonl"
            wait(
                lambda: any(r["step"] == lose_after for r in steps_of(rank1)),
                "the step to lose after",
            )
            lose(lost.pid)
            lost_at = time.time()
            lost.wait()
            shutil.rmtree(case / "node-1")
            if way.startswith("torchrun"):
                # torchrun's survivor cannot take a new node in (its next round waits for the lost
                # node's role info, and fails): the job is relaunched on two nodes at once, as a
                # scheduler that restarts a job at its first failure does, torchrun's best case.
                lose(agents[0].pid)
                agents[0].wait()
                survivors = [start("2", run_id + "-again"), start("3", run_id + "-again")]
            else:
                survivors = [agents[0], start("2", run_id)]
            for proc in survivors:
                code = proc.wait(timeout=TIMEOUT)
                if code != 0:
                    tail = outputs[proc.pid].read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{way}: exit {code}\n{tail}")
            # The workers that ran before the loss (a survivor may end one more step then), and
            # the furthest step they finished: the one after it is the lost step.
            rank0 = steps_of(case / "rank0.jsonl")
            before = [r for r in rank0 + steps_of(rank1) if float(str(r["t"])) <= lost_at]
            old = {r["pid"] for r in before}
            done = max(int(str(r["step"])) for r in rank0 + steps_of(rank1) if r["pid"] in old)
            after = [r for r in rank0 if r["pid"] not in old]
            resumed = min(int(str(r["start"])) for r in after)
            back = next(float(str(r["t"])) for r in after if r["step"] == done + 1)
            return {
                "steps lost": done + 1 - resumed,
                "loss to back at the lost step (s)": back - lost_at,
            }
        finally:
            for proc in agents:
                if proc.poll() is None:
                    lose(proc.pid)
                    proc.wait()


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
    meta = run_meta(args.runs, "node_loss.py")
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
