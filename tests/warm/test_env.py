"""The template's environment (pure): what every worker shares goes in, the rest after the fork."""

from __future__ import annotations

import dataclasses

from elastic_hydra.agent.inherit import CONTRACT
from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.agent.worker_env import RUN_DIR, WorkerFiles, inherited, worker_env
from elastic_hydra.gpus import WorkerDevices
from elastic_hydra.plan import Endpoint
from elastic_hydra.warm.env import template_env
from tests.conftest import WORKERS
from tests.harness import plan_of

PER_WORKER = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "ELASTIC_HYDRA_ATTEMPT",
    "ELASTIC_HYDRA_FAULT_FILE", "ELASTIC_HYDRA_LAUNCH_TIME", RUN_DIR,
)  # fmt: skip


def test_common_values_go_to_the_template_per_worker_ones_do_not() -> None:
    plan = plan_of(f"script={WORKERS / 'idle.py'}", "nproc_per_node=4", "env.MKL_NUM_THREADS=2")
    env = template_env(plan, {"PATH": "/bin", "PYTHONPATH": "/src", "HOME": "/root"})
    assert env["OMP_NUM_THREADS"] == "1"  # torchrun's rule for several workers: common
    assert env["MKL_NUM_THREADS"] == "2"
    assert env["PYTHONPATH"] == "/src" and env["PATH"] == "/bin"
    assert not set(PER_WORKER) & set(env), sorted(set(PER_WORKER) & set(env))
    # Common to every worker, but the launcher's: set after the fork like the rest of it.
    assert "LOCAL_WORLD_SIZE" not in env and "TORCHELASTIC_RUN_ID" not in env


def test_a_contract_variable_in_the_agents_environment_never_reaches_the_template() -> None:
    plan = plan_of(f"script={WORKERS / 'idle.py'}", "nproc_per_node=2")
    env = template_env(plan, {"PATH": "/bin", "RANK": "7", "LOCAL_WORLD_SIZE": "9"})
    assert "RANK" not in env and "LOCAL_WORLD_SIZE" not in env
    assert env["PATH"] == "/bin"


def test_the_contract_names_every_variable_the_launcher_sets() -> None:
    """`inherit.CONTRACT` is the list the template leaves out: it must hold every variable that
    `worker_env` adds beyond the inherited half, with every optional file and setting on."""
    plan = plan_of(
        f"script={WORKERS / 'idle.py'}", "nproc_per_node=2", "hang.timeout=30",
        "checkpoint.max_memory=1GiB",
    )  # fmt: skip
    node = NodeAssignment(
        group_rank=0, group_world_size=1, base_rank=0, world_size=2, role_base_rank=0,
        role_world_size=2, master=Endpoint(host="127.0.0.1", port=1), use_agent_store=False,
    )  # fmt: skip
    files = WorkerFiles(
        run_dir="/r", plan_path="/p", config_path="/c", error_file="/e", fault_file="/f",
        stacks_file="/s", progress_file="/g", collectives_file="/k", arrivals_file="/a",
        snapshots="/m", launch_time=1.0,
    )  # fmt: skip
    env = worker_env(plan, {}, node, local_rank=1, attempt=0, restart_count=0, files=files)
    added = set(env) - set(inherited(plan, {}, 1))
    assert added == CONTRACT, sorted(added ^ CONTRACT)


def test_a_per_rank_device_or_thread_count_is_set_after_the_fork() -> None:
    plan = plan_of(f"script={WORKERS / 'idle.py'}", "nproc_per_node=2")
    devices = (
        WorkerDevices(cuda_visible_devices="0", cpus=(0, 1)),
        WorkerDevices(cuda_visible_devices="1", cpus=(2, 3)),
    )
    env = template_env(dataclasses.replace(plan, devices=devices), {})
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert env["OMP_NUM_THREADS"] == "2"  # two CPUs each: the same count for both
    same = (WorkerDevices(cuda_visible_devices="0,1"), WorkerDevices(cuda_visible_devices="0,1"))
    env = template_env(dataclasses.replace(plan, devices=same), {})
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
