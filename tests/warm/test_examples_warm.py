"""The examples the tests run, warm: the same outputs as cold.

- The DDP example job (examples/jobs/ddp.yaml): a warm run that loses rank 1 at step 7 and is
  restarted from the template ends with exactly the weights of a cold run that never failed.
- A Hydra app in the worker (tests/scripts/hydra_app.py) with Hydra imported by the template:
  every rank and attempt still gets the launch's one output dir (the bootstrap pins `${now:}`
  in a module that was imported before the script ran).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ELASTIC_HYDRA, REPO, WORKERS
from tests.harness import launcher_env, run

pytestmark = pytest.mark.timeout(240)

JOB = "examples/jobs/ddp.yaml"
STEPS, CRASH_AT = 12, 5
DEADLINE = 200.0


def ddp_job(cwd: Path, name: str, *overrides: str) -> subprocess.Popen[str]:
    cmd = [*ELASTIC_HYDRA, JOB, f"hp.steps={STEPS}", f"logs.root=logs_{name}", *overrides]
    return subprocess.Popen(
        cmd, cwd=cwd, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:Failed to initialize NumPy")
def test_ddp_example_warm_with_a_restart_ends_with_the_cold_weights(tmp_path: Path) -> None:
    ignore = shutil.ignore_patterns("__py*")
    shutil.copytree(REPO / "examples", tmp_path / "examples", ignore=ignore)
    jobs = {
        "warm": ddp_job(
            tmp_path, "warm", "warm.imports=[torch]", f"hp.crash_at_step={CRASH_AT}",
            "restart.max_restarts=1",
        ),
        "cold": ddp_job(tmp_path, "cold"),
    }  # fmt: skip
    try:
        for name, job in jobs.items():
            output, _ = job.communicate(timeout=DEADLINE)
            assert job.returncode == 0, f"{name}: {output}"
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
                job.communicate()
    dirs = {}
    for name in jobs:
        (summary,) = (tmp_path / f"logs_{name}").glob("**/summary.json")
        dirs[name] = summary.parent
        data = json.loads(summary.read_text())
        assert data["attempts"] == (2 if name == "warm" else 1), data
    events = (dirs["warm"] / "events.jsonl").read_text()
    assert "warm_fallback" not in events
    assert "resumed from" in (dirs["warm"] / "attempt_1/0/stdout.log").read_text()

    import torch

    warm, cold = (torch.load(dirs[n] / "final.pt") for n in ("warm", "cold"))
    assert warm.keys() == cold.keys() == {"weight", "bias"}
    for key in warm:
        assert torch.equal(warm[key], cold[key]), key


def test_a_hydra_app_forked_warm_shares_one_output_dir(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run(
        f"script={WORKERS / 'hydra_app.py'}", "nproc_per_node=2", "restart.max_restarts=1",
        "logs=files_only", "warm.imports=[hydra.core.utils,hydra.main]",
        cwd=tmp_path, env={"OUT_DIR": str(out)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "warm starts off" not in proc.stderr
    records = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert len(records) == 4
    assert len({r["output_dir"] for r in records.values()}) == 1, records
    assert [records[f"attempt{a}_rank0"]["resumed"] for a in (0, 1)] == [False, True]
