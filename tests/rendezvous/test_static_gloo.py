"""Static rendezvous across two agents: 2 nodes x 2 workers form one gloo job on loopback.

Two `elastic-hydra rdzv=static` agents run as separate processes (as on two machines), each with
its node_rank; rank 0's worker hosts the store at master_addr:master_port (env://) and all four
workers all_reduce RANK + 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ELASTIC_HYDRA, WORKERS, free_port

pytestmark = [
    pytest.mark.timeout(180),
]

NNODES, NPROC = 2, 2
DEADLINE = 150.0  # both agents, all four workers (each imports torch: ~2 s of CPU apiece)


def start_agent(node_rank: int, port: int, tmp: Path, out: Path) -> subprocess.Popen[str]:
    cmd = [
        *ELASTIC_HYDRA,
        f"script={WORKERS / 'allreduce.py'}",
        "rdzv=static",
        f"nnodes={NNODES}",
        f"node_rank={node_rank}",
        "master_addr=127.0.0.1",
        f"master_port={port}",
        f"nproc_per_node={NPROC}",
        f"logs.root={tmp / f'node{node_rank}'}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"OUT_DIR": str(out)}
    return subprocess.Popen(
        cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(agents: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    """Wait for every agent against one deadline; on failure stop the rest (SIGTERM, then KILL)."""
    deadline = time.monotonic() + DEADLINE
    results: list[tuple[int, str]] = []
    try:
        for agent in agents:
            output, _ = agent.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append((agent.returncode, output))
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()  # the agent forwards it to its workers
                try:
                    agent.communicate(timeout=40)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.communicate()
    return results


def summary_of(root: Path) -> dict[str, Any]:
    (path,) = root.glob("**/summary.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_two_static_agents_form_one_gloo_job(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    agents = [start_agent(node_rank, port, tmp_path, out) for node_rank in range(NNODES)]
    for node_rank, (code, output) in enumerate(finish(agents)):
        assert code == 0, f"agent of node {node_rank} exited {code}:\n{output}"

    results = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    assert sorted(results) == [0, 1, 2, 3]
    for rank, result in results.items():
        assert result["sum"] == 10, result
        assert result["world_size"] == 4, result
        assert result["group_rank"] == rank // NPROC, result
        assert result["local_rank"] == rank % NPROC, result
        assert result["master"] == f"127.0.0.1:{port}", result
    for node_rank in range(NNODES):
        summary = summary_of(tmp_path / f"node{node_rank}")
        assert (summary["status"], summary["exit_code"], summary["attempts"]) == (
            "succeeded",
            0,
            1,
        )
        assert sorted(e["rank"] for e in summary["exits"]) == [2 * node_rank, 2 * node_rank + 1]
