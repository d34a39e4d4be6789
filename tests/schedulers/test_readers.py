"""Each scheduler's variables, read from an environment passed in: pure, no process state.

The environments are the ones the schedulers' own sources set (cited in each module): Trainer
v2's Torch plugin, the PyTorchJob operator, the Job and JobSet controllers, SkyPilot, dstack.
"""

from __future__ import annotations

import dataclasses

import pytest

from elastic_hydra.schedulers import detect, dstack, jobset, kubeflow, skypilot
from elastic_hydra.schedulers.base import SchedulerError, SchedulerNode

TRAINER = {  # node 1 of TrainJob "tj": what Trainer's Torch plugin sets (port: its 29400)
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "tj-node-0-0.tj",
    "PET_MASTER_PORT": "29400",
}
PYTORCHJOB = {  # worker 0 of PyTorchJob "pj": RANK is 1 (the master is 0)
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "MASTER_ADDR": "pj-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "1",
}
JOBSET = {  # pod 2 of JobSet "js", replicated job "node", as our manifest maps the annotations
    "JOBSET_NAME": "js",
    "REPLICATED_JOB_NAME": "node",
    "JOB_INDEX": "0",
    "JOB_COMPLETION_INDEX": "2",
    "JOBSET_RESTART_ATTEMPT": "1",
}
SKYPILOT = {
    "SKYPILOT_NODE_RANK": "1",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n",
    "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    "SKYPILOT_TASK_ID": "sky-2026-11-25-21-00-00-000000_mycluster_3",
}
DSTACK = {
    "DSTACK_NODE_RANK": "0",
    "DSTACK_NODES_NUM": "2",
    "DSTACK_MASTER_NODE_IP": "10.1.0.1",
    "DSTACK_NODES_IPS": "10.1.0.1\n10.1.0.2",
    "DSTACK_GPUS_PER_NODE": "4",
    "DSTACK_RUN_NAME": "train-run",
}


def test_trainer_v2() -> None:
    node = kubeflow.read(TRAINER)
    assert (node.flavour, node.node_rank, node.nnodes) == ("Trainer v2", 1, 2)
    assert (node.master, node.port, node.run_id) == ("tj-node-0-0.tj", 29400, "tj-node-0-0")
    assert node.gpus_per_node == 4
    assert [k for k, _ in node.variables] == list(TRAINER)
    assert node.describe().startswith("kubeflow (Trainer v2, node 1) from PET_NNODES=2, ")


def test_pytorchjob() -> None:
    node = kubeflow.read(PYTORCHJOB)
    assert (node.flavour, node.node_rank, node.nnodes) == ("PyTorchJob", 1, 3)
    assert (node.master, node.port, node.run_id) == ("pj-master-0", 23456, "pj-master-0")
    assert (node.nnodes_variable, node.rank_variable) == ("WORLD_SIZE", "RANK")


def test_jobset_node_zero_is_the_first_pod_of_the_first_job() -> None:
    node = jobset.read(JOBSET)
    assert (node.node_rank, node.nnodes, node.port) == (2, None, None)
    # <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>; the subdomain is the JobSet's
    # name unless the manifest says otherwise.
    assert node.master == "js-node-0-0.js"
    assert node.run_id == "js-1"  # a JobSet restart is a new store: a new run id
    other = jobset.read(JOBSET | {"JOBSET_SUBDOMAIN": "rdzv"})
    assert other.master == "js-node-0-0.rdzv"


def test_skypilot() -> None:
    node = skypilot.read(SKYPILOT)
    assert (node.node_rank, node.nnodes, node.master, node.gpus_per_node) == (1, 2, "10.0.0.5", 8)
    assert node.run_id == "sky-2026-11-25-21-00-00-000000_mycluster_3"
    assert "SKYPILOT_NODE_IPS='10.0.0.5\\n10.0.0.6'" in node.describe()


def test_dstack() -> None:
    node = dstack.read(DSTACK)
    assert (node.node_rank, node.nnodes, node.master, node.gpus_per_node) == (0, 2, "10.1.0.1", 4)
    assert node.run_id == "train-run"
    bare = {k: DSTACK[k] for k in ("DSTACK_NODE_RANK", "DSTACK_NODES_NUM", "DSTACK_MASTER_NODE_IP")}
    assert dstack.read(bare).run_id == "dstack-10.1.0.1"


def test_node_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        dstack.read(DSTACK).node_rank = 1  # type: ignore[misc]


def without(env: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != name}


@pytest.mark.parametrize(
    ("reader", "env", "variable", "problem"),
    [
        (kubeflow.read, without(TRAINER, "PET_NODE_RANK"), "PET_NODE_RANK", "is not set"),
        (kubeflow.read, without(TRAINER, "PET_MASTER_ADDR"), "PET_MASTER_ADDR", "is not set"),
        (kubeflow.read, without(TRAINER, "PET_MASTER_PORT"), "PET_MASTER_PORT", "is not set"),
        (kubeflow.read, TRAINER | {"PET_NODE_RANK": "2"}, "PET_NODE_RANK", "not below PET_NNODES"),
        (kubeflow.read, TRAINER | {"PET_NNODES": "0"}, "PET_NNODES", "not a positive integer"),
        (kubeflow.read, TRAINER | {"PET_NNODES": "1:2"}, "PET_NNODES", "(got '1:2')"),
        (kubeflow.read, TRAINER | {"PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT", "1..65535"),
        (kubeflow.read, TRAINER | {"PET_MASTER_ADDR": "a b"}, "PET_MASTER_ADDR", "not a host"),
        (kubeflow.read, without(PYTORCHJOB, "RANK"), "RANK", "is not set"),
        (kubeflow.read, PYTORCHJOB | {"RANK": "3"}, "RANK", "not below WORLD_SIZE=3"),
        (kubeflow.read, {}, "PET_NNODES", "is not set"),
        (jobset.read, without(JOBSET, "JOBSET_NAME"), "JOBSET_NAME", "is not set"),
        (jobset.read, without(JOBSET, "REPLICATED_JOB_NAME"), "REPLICATED_JOB_NAME", "not set"),
        (jobset.read, without(JOBSET, "JOB_COMPLETION_INDEX"), "JOB_COMPLETION_INDEX", "not set"),
        (jobset.read, JOBSET | {"JOB_INDEX": "1"}, "JOB_INDEX", "one Job of N pods"),
        (jobset.read, JOBSET | {"JOB_COMPLETION_INDEX": "-1"}, "JOB_COMPLETION_INDEX", "(got"),
        (skypilot.read, without(SKYPILOT, "SKYPILOT_NODE_IPS"), "SKYPILOT_NODE_IPS", "not set"),
        (skypilot.read, without(SKYPILOT, "SKYPILOT_NUM_NODES"), "SKYPILOT_NUM_NODES", "not set"),
        (skypilot.read, SKYPILOT | {"SKYPILOT_NUM_NODES": "3"}, "SKYPILOT_NODE_IPS",
         "names 2 address(es) but SKYPILOT_NUM_NODES=3"),
        (skypilot.read, SKYPILOT | {"SKYPILOT_NODE_RANK": "2"}, "SKYPILOT_NODE_RANK", "not below"),
        (skypilot.read, SKYPILOT | {"SKYPILOT_NODE_IPS": "\n"}, "SKYPILOT_NODE_IPS", "is empty"),
        (dstack.read, without(DSTACK, "DSTACK_MASTER_NODE_IP"), "DSTACK_MASTER_NODE_IP", "not set"),
        (dstack.read, without(DSTACK, "DSTACK_NODES_NUM"), "DSTACK_NODES_NUM", "is not set"),
        (dstack.read, DSTACK | {"DSTACK_NODES_IPS": "10.1.0.2\n10.1.0.1"},
         "DSTACK_MASTER_NODE_IP", "is not the first of DSTACK_NODES_IPS"),
        (dstack.read, DSTACK | {"DSTACK_NODES_NUM": "3"}, "DSTACK_NODES_IPS", "names 2"),
        (dstack.read, DSTACK | {"DSTACK_NODE_RANK": "x"}, "DSTACK_NODE_RANK", "(got 'x')"),
    ],
)  # fmt: skip
def test_a_wrong_variable_is_named_with_the_fix(
    reader: detect.Reader, env: dict[str, str], variable: str, problem: str
) -> None:
    with pytest.raises(SchedulerError) as caught:
        reader(env)
    err = caught.value
    assert err.variable == variable and problem in str(err), str(err)
    assert "\n" not in str(err)
    assert err.fix  # every error says what to do


@pytest.mark.parametrize(
    ("env", "found"),
    [
        ({"SLURM_JOB_ID": "7"}, "slurm"),
        (TRAINER, "kubeflow"),
        (PYTORCHJOB, "kubeflow"),
        (JOBSET, "jobset"),
        # Trainer v2 runs its nodes as JobSet pods: only PET_* are there, so it is kubeflow.
        (TRAINER | {"JOB_COMPLETION_INDEX": "1"}, "kubeflow"),
        (SKYPILOT, "skypilot"),
        (DSTACK, "dstack"),
    ],
)
def test_auto_finds_the_one_present(env: dict[str, str], found: str) -> None:
    assert detect.detect(env) == found


def test_torch_worker_names_outside_a_pod_are_not_a_pytorchjob() -> None:
    # A worker of a launch has MASTER_ADDR/WORLD_SIZE/RANK too: not a scheduler's.
    worker = without(PYTORCHJOB, "KUBERNETES_SERVICE_HOST")
    with pytest.raises(SchedulerError, match="found no scheduler's environment"):
        detect.detect(worker)
    nested = PYTORCHJOB | {"TORCHELASTIC_RUN_ID": "x"}  # a worker inside a pod
    with pytest.raises(SchedulerError, match="found no scheduler's environment"):
        detect.detect(nested)


def test_auto_with_two_schedulers_is_one_clear_line() -> None:
    with pytest.raises(SchedulerError) as caught:
        detect.detect(SKYPILOT | {"SLURM_JOB_ID": "7"})
    text = str(caught.value)
    assert "is ambiguous: found slurm (SLURM_JOB_ID) and skypilot (SKYPILOT_NODE_RANK)" in text
    assert "rdzv=slurm or rdzv=skypilot" in text and "\n" not in text


def test_describe_names_the_detected_scheduler_and_its_variables() -> None:
    assert detect.describe("c10d", SKYPILOT) is None
    line = detect.describe("auto", DSTACK)
    assert line is not None
    assert line.startswith("dstack (dstack task, node 0) from DSTACK_NODE_RANK=0, ")
    assert line.endswith("; detected by rdzv=auto")
    slurm_line = detect.describe("auto", {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0"})
    assert slurm_line == "slurm (detected by rdzv=auto) from SLURM_JOB_ID=7, SLURM_NODEID=0"


def test_every_reader_returns_a_node() -> None:
    envs = {"kubeflow": TRAINER, "jobset": JOBSET, "skypilot": SKYPILOT, "dstack": DSTACK}
    assert set(detect.READERS) == set(envs)
    for name, env in envs.items():
        node = detect.read(name, env)
        assert isinstance(node, SchedulerNode) and node.scheduler == name
