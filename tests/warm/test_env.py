"""The template's environment (pure): what every worker shares goes in, the rest after the fork."""

from __future__ import annotations

import dataclasses

from elastic_hydra.agent.worker_env import RUN_DIR
from elastic_hydra.gpus import WorkerDevices
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
    assert env["LOCAL_WORLD_SIZE"] == "4"
    assert not set(PER_WORKER) & set(env), sorted(set(PER_WORKER) & set(env))


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
