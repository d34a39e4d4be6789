"""The ledger on the real two-node Slurm cluster (tests/slurm_cluster.py: hosts n1 and n2): a
quarantined n2 leaves the step before the rendezvous with Slurm's `--exclude=`, n1 trains alone
in the elastic job; once cleared, the next step runs on both."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_hydra.quarantine.ledger import Ledger, QuarantineEntry
from tests.conftest import ELASTIC_HYDRA, WORKERS, wait_for
from tests.harness import launcher_env
from tests.slurm_cluster import SlurmCluster

STEP_TIMEOUT = 120.0
FAST = ("rdzv.last_call_timeout=1", "rdzv.keep_alive_interval=1", "rdzv.keep_alive_max_attempt=3")


@pytest.fixture(autouse=True)
def queue_drains(slurm: SlurmCluster) -> Iterator[None]:
    yield
    wait_for(lambda: not slurm.job_ids(), 30.0, "the queue to empty", interval=0.1)


def step(
    slurm: SlurmCluster, cwd: Path, ledger: Path, *overrides: str
) -> subprocess.CompletedProcess[str]:
    """An elastic (1:2) step on both nodes that reads `ledger`."""
    out = cwd / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", *ELASTIC_HYDRA, "rdzv=slurm", "nnodes=1:2",
         f"script={WORKERS / 'node_task.py'}", *FAST, f"quarantine.ledger={ledger}",
         *overrides],
        cwd=cwd, env={**launcher_env(), **slurm.env, "OUT_DIR": str(out)},
        capture_output=True, text=True, timeout=STEP_TIMEOUT, check=False,
    )  # fmt: skip


def test_a_quarantined_node_leaves_the_step_and_clear_lets_it_back(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.json"
    now = time.time()
    Ledger(ledger).add([QuarantineEntry(
        host="n2", gpu=None, reason="preflight: n2 at 41 % of the median GEMM rate",
        added=now, until=now + 3600, job="run-7",
    )])  # fmt: skip

    first = tmp_path / "first"
    first.mkdir()
    proc = step(slurm, first, ledger)
    assert proc.returncode == 6, proc.stdout + proc.stderr  # srun: the highest task's code
    (line,) = [x for x in proc.stderr.splitlines() if "quarantine ledger until" in x]
    assert "this node (n2) is in the quarantine ledger until" in line
    assert "preflight: n2 at 41 % of the median GEMM rate (added by run-7)" in line
    assert ". Under Slurm, resubmit with --exclude=n2" in line
    ran = [json.loads(p.read_text()) for p in (first / "out").glob("*.json")]
    assert [(r["host"], r["world_size"]) for r in ran] == [("n1", 1)]  # n1 trained alone
    (job_dir,) = (first / "eh_logs" / "slurm").iterdir()
    statuses = {
        node.name: json.loads((node / "summary.json").read_text())["status"]
        for node in job_dir.iterdir()
    }
    assert statuses == {"n1": "succeeded", "n2": "quarantined"}

    cleared = subprocess.run(
        [*ELASTIC_HYDRA, "quarantine", "clear", "n2", "--ledger", str(ledger)],
        env=launcher_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cleared.returncode == 0, cleared.stderr

    second = tmp_path / "second"
    second.mkdir()
    # Both nodes in one round however far apart their agents load torch on a busy host: with a
    # 1 s last call, n1 could train alone and end (its store with it) before n2 joined. The
    # round still starts at once when the second node joins (nnodes' MAX).
    proc = step(slurm, second, ledger, "rdzv.last_call_timeout=60")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = [json.loads(p.read_text()) for p in (second / "out").glob("*.json")]
    assert sorted((r["host"], r["world_size"]) for r in ran) == [("n1", 2), ("n2", 2)]
