"""Restart success rate: torchrun vs elastic-hydra, one node, two nodes, and mixed jobs.

    python benchmarks/restart_rate.py [--trials 5] [--deadline 60] [--out DIR]

Each trial is one job of 2 workers in all (2 on one node, or 1 on each of 2 agents over c10d on
this host) running tests/scripts/elastic.py: every rank joins a gloo group and all_reduces;
rank 0 fails once, after its first all_reduce; every launcher restarts the group (max restarts
2), and the trial succeeds when every agent exits 0 within --deadline seconds. A trial still
running then counts as a failure (a hang) and is killed. Mixed jobs (one elastic-hydra agent and
one torchrun agent) run with and without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on both nodes.
The collateral rows keep every rank in a collective loop (a peer's death breaks it) and give the
node that does not hold rank 0 no restart: it succeeds only if its broken ranks are seen as the
collateral of the other node's failure.
Writes restart_rate.md and restart_rate.json into --out (default: results/ next to this file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "scripts" / "elastic.py"
RESULTS = Path(__file__).resolve().parent / "results"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
FAST = ("last_call_timeout=1", "keep_alive_interval=1", "keep_alive_max_attempt=3")
NO_SHARING = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
LOOP = {"LOOP": "1"}  # every rank all_reduces until all are released


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ours(
    port: int, run_id: str, nnodes: int, nproc: int, logs: Path, *, restarts: int
) -> list[str]:
    rdzv = (
        ["rdzv=standalone"]
        if nnodes == 1
        else ["rdzv=c10d", f"rdzv.endpoint=127.0.0.1:{port}", f"rdzv.id={run_id}",
              "local_addr=127.0.0.1", *(f"rdzv.{o}" for o in FAST)]
    )  # fmt: skip
    return [sys.executable, "-m", "elastic_hydra", f"script={WORKER}", f"nnodes={nnodes}",
            f"nproc_per_node={nproc}", f"restart.max_restarts={restarts}", "logs.quiet=true",
            f"logs.root={logs}", *rdzv]  # fmt: skip


def theirs(port: int, run_id: str, nnodes: int, nproc: int, restarts: int) -> list[str]:
    rdzv = (
        ["--standalone"]
        if nnodes == 1
        else ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
              f"--rdzv-conf={','.join(FAST)}", "--local-addr=127.0.0.1"]
    )  # fmt: skip
    return [TORCHRUN, f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            f"--max-restarts={restarts}", *rdzv, str(WORKER)]  # fmt: skip


def trial(
    kinds: list[str], env_extra: dict[str, str], restarts: list[int], deadline: float, work: Path
) -> bool:
    """One job: an agent per kind ("ours"/"theirs") with its max restarts; True when every
    agent exits 0 in time."""
    out = work / uuid.uuid4().hex[:8]
    out.mkdir()
    port, run_id = free_port(), f"rate-{out.name}"
    nnodes, nproc = (1, 2) if len(kinds) == 1 else (2, 1)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env |= {"OUT_DIR": str(out), "FAIL_RANK": "0", **env_extra}
    procs = []
    for kind, most in zip(kinds, restarts, strict=True):
        cmd = (
            ours(port, run_id, nnodes, nproc, out / "logs", restarts=most)
            if kind == "ours"
            else theirs(port, run_id, nnodes, nproc, most)
        )
        quiet = subprocess.DEVNULL
        proc = subprocess.Popen(
            cmd, env=env, cwd=out, stdout=quiet, stderr=quiet, start_new_session=True
        )
        procs.append(proc)
        time.sleep(1.0)  # the first agent hosts the c10d store
    end = time.monotonic() + deadline
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return codes == [0] * len(procs)


CASES: dict[str, tuple[list[str], dict[str, str]] | tuple[list[str], dict[str, str], list[int]]] = {
    "one node, torchrun": (["theirs"], {}),
    "one node, elastic-hydra": (["ours"], {}),
    "two nodes, torchrun": (["theirs", "theirs"], {}),
    "two nodes, elastic-hydra": (["ours", "ours"], {}),
    "two nodes, elastic-hydra hosts, torchrun joins": (["ours", "theirs"], {}),
    "two nodes, torchrun hosts, elastic-hydra joins": (["theirs", "ours"], {}),
    "mixed, elastic-hydra hosts, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (
        ["ours", "theirs"],
        NO_SHARING,
    ),
    "mixed, torchrun hosts, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (["theirs", "ours"], NO_SHARING),
    "two nodes, torchrun, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (["theirs", "theirs"], NO_SHARING),
    "collateral: two nodes, elastic-hydra, node 1 max restarts 0": (
        ["ours", "ours"], LOOP, [2, 0],
    ),
    "collateral: mixed, torchrun hosts, elastic-hydra max restarts 0, "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (["theirs", "ours"], NO_SHARING | LOOP, [2, 0]),
    "collateral: two nodes, torchrun, node 1 max restarts 0, "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (["theirs", "theirs"], NO_SHARING | LOOP, [2, 0]),
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--only", default="", help="cases whose name contains this")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="eh-restart-rate-") as tmp:
        for name, (kinds, extra, *most) in CASES.items():
            if args.only not in name:
                continue
            started = time.monotonic()
            restarts = most[0] if most else [2] * len(kinds)
            ok = sum(
                trial(kinds, extra, restarts, args.deadline, Path(tmp)) for _ in range(args.trials)
            )
            rows.append({"case": name, "ok": ok, "trials": args.trials,
                         "seconds": round(time.monotonic() - started, 1)})  # fmt: skip
            print(f"{name}: {ok}/{args.trials}", file=sys.stderr, flush=True)
    lines = ["| job (rank 0 fails once; max restarts 2 unless said) | restarted and succeeded |",
             "|---|---|"]  # fmt: skip
    lines += [f"| {r['case']} | {r['ok']}/{r['trials']} |" for r in rows]
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "restart_rate.md").write_text(text)
    (args.out / "restart_rate.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(text, end="")


if __name__ == "__main__":
    main()
