"""`rdzv=kubeflow|jobset|skypilot|dstack|auto`: the plan each resolves to, `--plan`'s line about
the detected scheduler, each preset's one-line error, and two agents on this machine that meet
and train through the SkyPilot and dstack variables alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastic_hydra.errors import EXIT_CONFIG
from elastic_hydra.plan import Dynamic, DynamicBackend, NodeRange
from tests.conftest import ELASTIC_HYDRA, REPO, free_port
from tests.harness import plan_of, run
from tests.multinode import FAST, Job
from tests.schedulers.test_readers import DSTACK, JOBSET, PYTORCHJOB, SKYPILOT, TRAINER

SCHEDULER_VARS = ("PET_", "SKYPILOT_", "DSTACK_", "SLURM_", "JOB", "REPLICATED_JOB_NAME",
                  "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
                  "KUBERNETES_SERVICE_HOST")  # fmt: skip


@pytest.fixture
def job_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd with a train.py, in an environment without any scheduler's variables."""

    (tmp_path / "train.py").write_text("print('train')\n")
    for name in list(os.environ):
        if name.startswith(SCHEDULER_VARS):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def planned(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *argv: str) -> Dynamic:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plan = plan_of("script=train.py", *argv)
    assert isinstance(plan.rdzv, Dynamic)
    assert plan.rdzv.backend is DynamicBackend.C10D
    return plan.rdzv


def test_kubeflow_trainer_v2(job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rdzv = planned(monkeypatch, TRAINER, "rdzv=kubeflow")
    assert str(rdzv.endpoint) == "tj-node-0-0.tj:29400"
    assert (rdzv.is_host, rdzv.node_order) == (False, 1)
    plan = plan_of("script=train.py", "rdzv=kubeflow")
    assert (plan.nnodes, plan.run_id) == (NodeRange(min=2, max=2), "tj-node-0-0")
    # Elastic through the preset: a range that holds PET_NNODES stays a range (c10d).
    elastic = plan_of("script=train.py", "rdzv=kubeflow", "nnodes=1:4", "rdzv.id=mine")
    assert (elastic.nnodes, elastic.run_id) == (NodeRange(min=1, max=4), "mine")


def test_kubeflow_pytorchjob(job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rdzv = planned(monkeypatch, PYTORCHJOB, "rdzv=kubeflow")
    assert (str(rdzv.endpoint), rdzv.node_order, rdzv.is_host) == ("pj-master-0:23456", 1, False)


def test_jobset_elastic(job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = JOBSET | {"JOB_COMPLETION_INDEX": "0"}
    rdzv = planned(monkeypatch, env, "rdzv=jobset", "nnodes=2:4", "rdzv.endpoint=:29500")
    assert str(rdzv.endpoint) == "js-node-0-0.js:29500"
    assert (rdzv.is_host, rdzv.node_order) == (True, 0)  # pod 0 hosts the store
    plan = plan_of("script=train.py", "rdzv=jobset", "nnodes=2:4")
    assert (plan.nnodes, plan.run_id) == (NodeRange(min=2, max=4), "js-1")


@pytest.mark.parametrize(
    ("env", "endpoint", "run_id"),
    [
        (SKYPILOT, "10.0.0.5:29400", SKYPILOT["SKYPILOT_TASK_ID"]),
        (DSTACK, "10.1.0.1:29400", "train-run"),
    ],
)
def test_skypilot_and_dstack_through_auto(
    job_dir: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], endpoint: str, run_id: str
) -> None:
    rdzv = planned(monkeypatch, env, "rdzv=auto")
    assert str(rdzv.endpoint) == endpoint
    plan = plan_of("script=train.py", "rdzv=auto")
    assert (plan.nnodes, plan.run_id) == (NodeRange(min=2, max=2), run_id)


def scheduler_env(env: dict[str, str]) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", **env}


def test_plan_names_the_detected_scheduler_and_its_variables(job_dir: Path) -> None:
    proc = run("script=train.py", "rdzv=auto", "--plan", cwd=job_dir, env=DSTACK)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("scheduler: ")]
    assert line == (
        "scheduler: dstack (dstack task, node 0) from DSTACK_NODE_RANK=0, DSTACK_NODES_NUM=2, "
        "DSTACK_MASTER_NODE_IP=10.1.0.1, DSTACK_NODES_IPS='10.1.0.1\\n10.1.0.2', "
        "DSTACK_GPUS_PER_NODE=4, DSTACK_RUN_NAME=train-run; detected by rdzv=auto"
    )
    assert "c10d at 10.1.0.1:29400" in proc.stdout
    plain = run("script=train.py", "--plan", cwd=job_dir, env=DSTACK)
    assert "scheduler:" not in plain.stdout  # the variables mean nothing to rdzv=standalone


def drop(env: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != name}


@pytest.mark.parametrize(
    ("preset", "env", "fragments"),
    [
        ("kubeflow", drop(TRAINER, "PET_MASTER_ADDR"),
         ["bad kubeflow environment: PET_MASTER_ADDR is not set", "run inside a Kubeflow"]),
        ("kubeflow", TRAINER | {"PET_NODE_RANK": "5"},
         ["PET_NODE_RANK is 5, not below PET_NNODES=2"]),
        ("jobset", drop(JOBSET, "JOB_COMPLETION_INDEX"),
         ["bad jobset environment: JOB_COMPLETION_INDEX is not set", "--plan=jobset"]),
        ("skypilot", SKYPILOT | {"SKYPILOT_NUM_NODES": "4"},
         ["SKYPILOT_NODE_IPS names 2 address(es) but SKYPILOT_NUM_NODES=4"]),
        ("dstack", drop(DSTACK, "DSTACK_NODE_RANK"),
         ["bad dstack environment: DSTACK_NODE_RANK is not set", "dstack task with nodes: N"]),
        ("auto", {}, ["found no scheduler's environment", "pick rdzv=c10d"]),
        ("auto", SKYPILOT | DSTACK, ["is ambiguous", "rdzv=skypilot or rdzv=dstack"]),
    ],
)  # fmt: skip
def test_a_bad_environment_is_one_line_and_exit_2(
    job_dir: Path, preset: str, env: dict[str, str], fragments: list[str]
) -> None:
    proc = run("script=train.py", f"rdzv={preset}", "--plan", cwd=job_dir, env=env)
    assert proc.returncode == EXIT_CONFIG, proc.stdout
    (line,) = proc.stderr.splitlines()
    assert line.startswith("elastic-hydra: error: rdzv.backend: ")
    for fragment in fragments:
        assert fragment in line, line


@pytest.mark.parametrize(
    ("env", "argv", "fragment"),
    [
        (DSTACK, ["nnodes=3"], "nnodes: disagrees with DSTACK_NODES_NUM=2 (got '3')"),
        (JOBSET, [], "nnodes: leaves this node out: JOB_COMPLETION_INDEX=2 (got '1')"),
    ],
)
def test_nnodes_that_contradicts_the_scheduler_is_named(
    job_dir: Path, env: dict[str, str], argv: list[str], fragment: str
) -> None:
    preset = "dstack" if "DSTACK_NODE_RANK" in env else "jobset"
    proc = run("script=train.py", f"rdzv={preset}", *argv, "--plan", cwd=job_dir, env=env)
    assert proc.returncode == EXIT_CONFIG
    (line,) = proc.stderr.splitlines()
    assert fragment in line, line


def node_env(preset: str, rank: int, tmp: Path) -> dict[str, str]:
    """Node `rank` of two on this machine, as SkyPilot or dstack would describe it."""
    if preset == "skypilot":
        return {
            "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n",
            "SKYPILOT_TASK_ID": f"sky-{tmp.name}",
        }
    return {
        "DSTACK_NODE_RANK": str(rank),
        "DSTACK_NODES_NUM": "2",
        "DSTACK_MASTER_NODE_IP": "127.0.0.1",
        "DSTACK_NODES_IPS": "127.0.0.1\n127.0.0.1",
        "DSTACK_RUN_NAME": f"run-{tmp.name}",
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize("preset", ["skypilot", "dstack"])
def test_two_nodes_train_from_the_schedulers_variables_alone(tmp_path: Path, preset: str) -> None:
    """Two agents given nothing but the scheduler's variables (no endpoint, no node rank, no
    run id, no nnodes) meet in one c10d rendezvous and train the DDP example to its end."""
    out = tmp_path / "weights"
    port = free_port()
    job = Job(tmp=tmp_path, backend=preset, endpoint="")
    try:
        for rank in (0, 1):
            argv = [
                *ELASTIC_HYDRA,
                str(REPO / "examples/jobs/ddp.yaml"), f"rdzv={preset}", f"rdzv.endpoint=:{port}",
                f"script={REPO / 'examples/ddp_train.py'}", "nproc_per_node=1", "hp.steps=5",
                f"hp.dir={out}", "local_addr=127.0.0.1",
                f"logs.root={tmp_path / f'agent{rank}'}", *FAST,
            ]  # fmt: skip
            job.start(env=node_env(preset, rank, tmp_path), argv=argv)
        codes = job.finish(200)
        assert codes == [0, 0], job.explain()
    finally:
        job.stop()
    assert (out / "final.pt").exists(), job.explain()
    texts = [a.text() for a in job.agents]
    summaries = [a.summary() for a in job.agents]
    assert all(s["run_id"] == summaries[0]["run_id"] for s in summaries), texts
