"""The Slurm test cluster is real: two nodes that look like two hosts, jobs, batch, cancel."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests import slurm_cluster as cluster_module
from tests.conftest import alive, wait_for
from tests.slurm_cluster import SlurmCluster, find_binaries

STEP_TIMEOUT = 60.0
QUEUE_TIMEOUT = 20.0


@pytest.fixture(autouse=True)
def queue_drains(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the cluster, its jobs have left the queue."""
    yield
    if "slurm" in request.fixturenames:
        cluster: SlurmCluster = request.getfixturevalue("slurm")
        wait_for(lambda: not cluster.job_ids(), QUEUE_TIMEOUT, "the queue to empty", interval=0.1)


def job_processes(job_id: str) -> list[psutil.Process]:
    """The live processes of Slurm job `job_id` (by the SLURM_JOB_ID in their environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("SLURM_JOB_ID") == job_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_both_nodes_are_idle(slurm: SlurmCluster) -> None:
    assert slurm.nodes == ("n1", "n2")
    assert slurm.node_states() == {"n1": "idle", "n2": "idle"}


def test_srun_runs_one_task_on_each_node(slurm: SlurmCluster) -> None:
    out = slurm.run(["srun", "-N2", "hostname"], timeout=STEP_TIMEOUT).stdout
    assert sorted(out.split()) == ["n1", "n2"]


def test_nodes_look_like_two_hosts_inside_a_step(slurm: SlurmCluster) -> None:
    script = (
        'echo "$SLURM_NODEID $(hostname) $(getent hosts "$(hostname)" | cut -d" " -f1) '
        '$SLURM_STEP_NUM_NODES $SLURM_JOB_NODELIST"'
    )
    out = slurm.run(["srun", "-N2", "sh", "-c", script], timeout=STEP_TIMEOUT).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [
        ["0", "n1", "127.0.77.1", "2", "n[1-2]"],
        ["1", "n2", "127.0.77.2", "2", "n[1-2]"],
    ]


def test_sbatch_wait_runs_a_step_on_both_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsrun hostname\n")
    out_file = tmp_path / "job.out"
    slurm.run(
        ["sbatch", "--wait", "-N2", f"--output={out_file}", f"--chdir={tmp_path}", str(script)],
        timeout=STEP_TIMEOUT,
    )
    assert sorted(out_file.read_text().split()) == ["n1", "n2"]


def test_scancel_ends_a_running_step(slurm: SlurmCluster) -> None:
    srun = slurm.popen(
        ["srun", "-N2", "--job-name=eh-cancel-me", "sleep", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def running_job() -> str | None:
            out = slurm.run(
                ["squeue", "-h", "-n", "eh-cancel-me", "-t", "RUNNING", "-o", "%i"],
                timeout=STEP_TIMEOUT,
            ).stdout.split()
            return out[0] if out else None

        job_id = wait_for(running_job, STEP_TIMEOUT, "the job to run", interval=0.1)
        assert job_id is not None

        def two_sleeps() -> list[psutil.Process]:
            found = [p for p in job_processes(job_id) if p.name() == "sleep"]
            return found if len(found) == 2 else []

        tasks = wait_for(two_sleeps, STEP_TIMEOUT, "a sleep task on each node")
        slurm.run(["scancel", job_id], timeout=STEP_TIMEOUT)
        _, err = srun.communicate(timeout=STEP_TIMEOUT)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.communicate()
    assert srun.returncode != 0, err
    wait_for(lambda: not job_processes(job_id), QUEUE_TIMEOUT, "the job's processes to end")
    assert not alive(tasks)


def test_queue_is_empty(slurm: SlurmCluster) -> None:
    wait_for(lambda: not slurm.job_ids(), QUEUE_TIMEOUT, "the queue to empty", interval=0.1)
    assert slurm.run(["squeue", "-h"], timeout=STEP_TIMEOUT).stdout == ""


def test_missing_binaries_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(cluster_module, "_SBIN_DIRS", ())
    with pytest.raises(RuntimeError, match=r"needs slurmctld, slurmd, srun.*install_slurm\.sh"):
        find_binaries()
