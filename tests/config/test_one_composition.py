"""The dry run is the launch: for the same command, `--plan=json` prints the plan a real launch
saves as plan.json. Every example job, every preset and a job with its own `hydra.searchpath`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port
from tests.harness import run
from tests.servers import etcd_server

TIMEOUT = 120
JOB = "defaults: [elastic_hydra_base, _self_]\nscript: ok.py\n"
# One node of a Slurm allocation on this host, as srun would describe it.
SLURM_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "localhost",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
}


@pytest.fixture(scope="module")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with etcd_server(tmp_path_factory.mktemp("etcd") / "data") as server:
        yield server.endpoint


def comparable(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan without what differs between two launches of one command: the time in the run dir
    (the launch's time, which names it to the microsecond), and the fresh run id of a job that
    names none."""
    plan = dict(plan)
    launched = datetime.fromtimestamp(plan.pop("launch_time")).strftime("%Y-%m-%d/%H-%M-%S-%f")
    assert f"/{launched}_" in plan["run_dir"], (launched, plan["run_dir"])
    plan["run_dir"] = str(Path(plan["run_dir"]).parent)
    if plan["rdzv"]["kind"] == "standalone":
        plan["run_id"] = "<fresh>"
    return plan


def assert_same_plan(
    tmp: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> None:
    tmp.mkdir(exist_ok=True)
    logs = tmp / "eh_logs"
    full = [*args, f"logs.root={logs}"]
    env = env or {}
    dry = run(*full, "--plan=json", cwd=cwd or tmp, env=env)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    launch = run(*full, cwd=cwd or tmp, env=env)
    assert launch.returncode == 0, launch.stderr + launch.stdout
    (plan_json,) = logs.rglob("plan.json")
    assert comparable(json.loads(plan_json.read_text())) == comparable(planned)
    assert planned["run_dir"].startswith(str(logs))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "ok.py").write_text("")
    (tmp_path / "job.yaml").write_text(JOB)
    return tmp_path


@pytest.mark.parametrize(
    "job", sorted((REPO / "examples" / "jobs").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_example_job(job: Path, tmp_path: Path) -> None:
    extra = ["hp.steps=1", f"hp.dir={tmp_path}/ddp"] if job.stem == "ddp" else []
    assert_same_plan(tmp_path, str(job.relative_to(REPO)), *extra, cwd=REPO)


@pytest.mark.parametrize("preset", ["restart=backoff", "restart=on_failure", "restart=never",
                                    "logs=tee", "logs=quiet", "logs=files_only"])  # fmt: skip
def test_every_restart_and_logs_preset(preset: str, workdir: Path) -> None:
    assert_same_plan(workdir, "job.yaml", preset)


def test_rendezvous_presets_without_a_service(workdir: Path) -> None:
    port = str(free_port())
    assert_same_plan(workdir / "a", "rdzv=standalone", f"script={workdir}/ok.py")
    static = ["rdzv=static", f"master_port={port}", f"script={workdir}/ok.py"]
    assert_same_plan(workdir / "b", *static)
    c10d = ["rdzv=c10d", f"rdzv.endpoint=127.0.0.1:{port}", f"script={workdir}/ok.py"]
    assert_same_plan(workdir / "c", *c10d)
    assert_same_plan(workdir / "d", "rdzv=slurm", f"script={workdir}/ok.py", env=SLURM_ENV)


@pytest.mark.parametrize("preset", ["etcd", "etcd-v2"])
def test_etcd_presets(preset: str, workdir: Path, etcd_endpoint: str) -> None:
    args = [f"rdzv={preset}", f"rdzv.endpoint={etcd_endpoint}", f"rdzv.id=parity-{preset}"]
    assert_same_plan(workdir, "job.yaml", *args)


def test_a_job_with_its_own_search_path(workdir: Path) -> None:
    presets = workdir / "presets" / "restart"
    presets.mkdir(parents=True)
    (presets / "seven.yaml").write_text("max_restarts: 7\n")
    (workdir / "own.yaml").write_text(
        "defaults: [elastic_hydra_base, {override restart: seven}, _self_]\n"
        f"script: ok.py\nhydra:\n  searchpath: ['file://{workdir}/presets']\n"
    )
    assert_same_plan(workdir, "own.yaml")
    planned = json.loads(run("own.yaml", "--plan=json", cwd=workdir).stdout)
    assert planned["restart"]["max_restarts"] == 7


def test_plan_of_a_job_that_sweeps_plans_its_jobs(workdir: Path) -> None:
    """A job that sets hydra.mode: MULTIRUN is a sweep without -m: `--plan` lists the jobs its
    sweeper's params make, and creates nothing."""
    (workdir / "sweep.yaml").write_text(
        JOB + "hydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      env.X: 1,2\n"
    )
    proc = run("sweep.yaml", "--plan", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    jobs = [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("  #")]
    assert jobs == ["  #0 env.X=1", "  #1 env.X=2"]
    assert not (workdir / "eh_logs").exists()
