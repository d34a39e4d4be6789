"""The examples the tests run, warm: the same outputs as cold (and as under torchrun).

- The DDP example job (examples/jobs/ddp.yaml) restarted warm: tests/test_ddp_example.py, beside
  the cold restart and the run that never failed (one clean run for both).
- A Hydra app in the worker (tests/scripts/hydra_app.py) with Hydra imported by the template:
  every rank and attempt still gets the launch's one output dir (the bootstrap pins `${now:}`
  in a module that was imported before the script ran).
- minGPT (examples/mingpt/: a Hydra app training a character GPT with DDP), warm with Hydra and
  torch imported by the template and rank 1 failing once, writes the bytes of a cold run and of a
  torchrun run; every rank and the restart use the launch's one Hydra output dir.
- FSDP2 (examples/fsdp2_train.py: `fully_shard`, gloo) warm writes the bytes of a torchrun run,
  and so does a cold run whose rank 1 fails once: it resumes from the sharded snapshots (each
  rank's DTensor shards of the model and of AdamW's state) of the step before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ELASTIC_HYDRA, REPO, WORKERS
from tests.harness import launcher_env, run

pytestmark = pytest.mark.timeout(240)

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
MINGPT_CRASH_AT = 15
DEADLINE = 200.0


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


def start(cmd: list[str], cwd: Path) -> subprocess.Popen[str]:
    cwd.mkdir(exist_ok=True)
    return subprocess.Popen(
        cmd, cwd=cwd, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def finish(jobs: dict[str, subprocess.Popen[str]]) -> dict[str, str]:
    """Each job's output once all have ended with 0; none left running, whatever happens."""
    outputs = {}
    try:
        for name, job in jobs.items():
            outputs[name], _ = job.communicate(timeout=DEADLINE)
            assert job.returncode == 0, f"{name}: {outputs[name]}"
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
                job.communicate()
    return outputs


def run_dir_in(cwd: Path) -> Path:
    (summary,) = cwd.glob("**/summary.json")
    return summary.parent


def copied_examples(tmp_path: Path) -> Path:
    shutil.copytree(
        REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__py*")
    )
    return tmp_path / "examples"


@pytest.mark.filterwarnings("ignore:Failed to initialize NumPy")
def test_mingpt_hydra_app_warm_with_a_restart_writes_the_bytes_of_cold_and_torchrun(
    tmp_path: Path,
) -> None:
    script = copied_examples(tmp_path) / "mingpt" / "train.py"
    cwd = {name: tmp_path / name for name in ("warm", "cold", "torchrun")}
    launch = [*ELASTIC_HYDRA, f"script={script}", "nproc_per_node=2"]
    warm = ["warm.imports=[torch,torch._dynamo,hydra.main]", "restart.max_restarts=1", "--"]
    crash = f"trainer.crash_at_iter={MINGPT_CRASH_AT}"
    here = f"hydra.run.dir={cwd['torchrun']}"
    jobs = {
        "warm": start([*launch, *warm, crash], cwd["warm"]),
        "cold": start(launch, cwd["cold"]),
        "torchrun": start([*TORCHRUN, str(script), here], cwd["torchrun"]),
    }
    finish(jobs)
    finals = {"torchrun": (cwd["torchrun"] / "final.json").read_bytes()}
    for name in ("warm", "cold"):
        # Hydra's default `outputs/${now:...}`: one dir for both ranks and both attempts
        (output_dir,) = (cwd[name] / "outputs").glob("*/*")
        finals[name] = (output_dir / "final.json").read_bytes()
    assert finals["warm"] == finals["cold"] == finals["torchrun"], finals
    result = json.loads(finals["cold"])
    assert result["iters"] == 40 and result["loss"] < 3.0, result  # it learnt (ln(vocab) ~ 3.6)

    (warm_output,) = (cwd["warm"] / "outputs").glob("*/*")
    run_dir = run_dir_in(cwd["warm"])
    assert json.loads((run_dir / "summary.json").read_text())["attempts"] == 2
    assert "warm_fallback" not in (run_dir / "events.jsonl").read_text()
    for rank in (0, 1):  # the restarted ranks found rank 0's checkpoint in the same output dir
        log = (run_dir / f"attempt_1/{rank}/stdout.log").read_text()
        assert f"resumed from {warm_output / 'ckpt.pt'} at iteration" in log, log


@pytest.mark.filterwarnings("ignore:Failed to initialize NumPy")
def test_fsdp2_warm_and_cold_resumed_from_sharded_snapshots_write_the_bytes_of_torchrun(
    tmp_path: Path,
) -> None:
    script = str(copied_examples(tmp_path) / "fsdp2_train.py")
    cwd = {name: tmp_path / name for name in ("warm", "cold", "torchrun")}
    launch = [*ELASTIC_HYDRA, f"script={script}", "nproc_per_node=2"]
    jobs = {
        "warm": start([*launch, "warm.imports=[torch,torch._dynamo]"], cwd["warm"]),
        "cold": start([*launch, "restart=on_failure", "--", "--crash-at-step", "7"], cwd["cold"]),
        "torchrun": start([*TORCHRUN, script, "--out", "final.json"], cwd["torchrun"]),
    }
    outputs = finish(jobs)
    finals = {"torchrun": (cwd["torchrun"] / "final.json").read_bytes()}
    for name in ("warm", "cold"):
        finals[name] = (run_dir_in(cwd[name]) / "final.json").read_bytes()
    assert finals["warm"] == finals["cold"] == finals["torchrun"], finals
    assert json.loads(finals["cold"])["steps"] == 20
    assert "rank 0 holds (32, 16) of (64, 16) blocks.0.up" in outputs["warm"]  # sharded
    assert "rank 1: crashing at step 7" in outputs["cold"]
    for rank in (0, 1):  # from the snapshots, not from scratch
        assert f"rank {rank}: resumed after step 6 (attempt 1)" in outputs["cold"], outputs["cold"]
    assert "warm_fallback" not in (run_dir_in(cwd["warm"]) / "events.jsonl").read_text()
