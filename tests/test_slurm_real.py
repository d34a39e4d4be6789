"""elastic-hydra under a real two-node Slurm cluster (tests/slurm_cluster.py: nodes n1 and n2,
each its own host name and address): `rdzv=slurm` inside srun and sbatch, and Hydra sweeps
submitted through hydra-submitit-launcher.

The agents import torch for the c10d rendezvous; the workers are plain Python except where the
test is about a collective across the two hosts.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ELASTIC_HYDRA, WORKERS, wait_for
from tests.harness import launcher_env
from tests.slurm_cluster import SlurmCluster

NODE_TASK = WORKERS / "node_task.py"
ALLREDUCE = WORKERS / "allreduce.py"
STEP_TIMEOUT = 120.0  # one srun or sbatch --wait of a launch: agents import torch on 2 cores
QUEUE_TIMEOUT = 30.0
# Membership changes in seconds rather than minutes.
FAST = ("rdzv.last_call_timeout=1", "rdzv.keep_alive_interval=1", "rdzv.keep_alive_max_attempt=3")


def launcher(*overrides: str, script: Path = NODE_TASK) -> list[str]:
    return [*ELASTIC_HYDRA, "rdzv=slurm", f"script={script}", *FAST, *overrides]


def slurm_env(
    slurm: SlurmCluster, out: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A launch's environment (tests/launch.py) plus the cluster's, and where workers write."""
    return {**launcher_env(), **slurm.env, "OUT_DIR": str(out), **(extra or {})}


def srun(
    slurm: SlurmCluster, cwd: Path, *args: str, extra: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`srun ARGS` from `cwd` to its end (srun exits with its tasks' highest exit code)."""
    return subprocess.run(
        ["srun", *args],
        cwd=cwd,
        env=slurm_env(slurm, cwd / "out", extra),
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )


def sbatch(
    slurm: SlurmCluster, cwd: Path, nodes: int, script: str, extra: Mapping[str, str] | None = None
) -> str:
    """`sbatch --wait` of a shell script on `nodes` nodes; its output file's text."""
    path, output = cwd / "job.sh", cwd / "job.out"
    path.write_text("#!/bin/bash\n" + script)
    subprocess.run(
        ["sbatch", "--wait", f"-N{nodes}", f"--output={output}", f"--chdir={cwd}", str(path)],
        env=slurm_env(slurm, cwd / "out", extra),
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    return output.read_text()


def records(out: Path) -> list[dict[str, Any]]:
    """What the workers wrote, by attempt, then rank."""
    found = [json.loads(p.read_text()) for p in out.glob("*.json")]
    return sorted(found, key=lambda r: (r.get("attempt", 0), r["rank"]))


def job_processes(job_id: str) -> list[psutil.Process]:
    """The live processes of Slurm job `job_id` (by the SLURM_JOB_ID in their environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.status() != psutil.STATUS_ZOMBIE
                and proc.environ().get("SLURM_JOB_ID") == job_id
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def step_dirs(cwd: Path) -> dict[str, Path]:
    """The node directories of the one Slurm step that ran from `cwd`, by node name."""
    (job_dir,) = (cwd / "eh_logs" / "slurm").iterdir()
    return {p.name: p for p in job_dir.iterdir()}


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path


@pytest.fixture(autouse=True)
def queue_drains(slurm: SlurmCluster) -> Iterator[None]:
    """Each test's jobs leave the queue, and leave no process behind, before the next starts."""
    yield
    wait_for(lambda: not slurm.job_ids(), QUEUE_TIMEOUT, "the queue to empty", interval=0.1)


# ----------------------------------------------------------------------------------- srun steps
def test_a_job_across_two_hosts(slurm: SlurmCluster, cwd: Path) -> None:
    proc = srun(
        slurm, cwd, "-N2", "--ntasks-per-node=1",
        *launcher("nproc_per_node=2", script=ALLREDUCE),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = records(cwd / "out")
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["sum"] == r["expected"] == 10 for r in ranks)  # gloo across n1 and n2
    # Node ranks in Slurm's node order; the store at the step's first node, on the job's port.
    assert [(r["host"], r["slurm_node_id"], r["group_rank"]) for r in ranks] == [
        ("n1", "0", 0), ("n1", "0", 0), ("n2", "1", 1), ("n2", "1", 1),
    ]  # fmt: skip
    # Console lines say which node printed them.
    assert "[n1:default0]:rank 0/4" in proc.stdout and "[n2:default1]:rank 3/4" in proc.stdout
    # One run dir for the step, one subdir per node, each node's files in its own.
    nodes = step_dirs(cwd)
    assert sorted(nodes) == ["n1", "n2"]
    for name, node in nodes.items():
        summary = json.loads((node / "summary.json").read_text())
        assert (summary["status"], summary["host"]) == ("succeeded", name)
        assert sorted(p.name for p in (node / "attempt_0").iterdir()) == ["0", "1"]


def test_a_failure_on_one_host_is_the_job_wide_root_cause_on_both(
    slurm: SlurmCluster, cwd: Path
) -> None:
    proc = srun(
        slurm, cwd, "-N2", "--ntasks-per-node=1", *launcher("nproc_per_node=2"),
        extra={"FAIL_RANK": "3", "FAIL_ALWAYS": "1", "SLEEP": "1"},  # the others wait
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    causes = [line for line in proc.stderr.splitlines() if line.startswith("root cause")]
    assert len(causes) == 2, proc.stderr  # each node's report leads with the same rank
    assert all("rank 3 (local rank 1) on n2" in line for line in causes), causes
    assert proc.stderr.count("ValueError: boom from rank 3") >= 2, proc.stderr


def test_a_failure_restarts_the_job_on_both_hosts(slurm: SlurmCluster, cwd: Path) -> None:
    proc = srun(
        slurm, cwd, "-N2", "--ntasks-per-node=1",
        *launcher("nproc_per_node=2", "restart.max_restarts=1"),
        extra={"FAIL_RANK": "2", "SLEEP": "1"},  # the others wait in the first run only
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    restarted = [r for r in records(cwd / "out") if r["attempt"] == 1]
    # n2 restarted for its failure (restart count 1); n1 for the membership change (0).
    assert [(r["rank"], r["host"], r["restart_count"]) for r in restarted] == [
        (0, "n1", 0), (1, "n1", 0), (2, "n2", 1), (3, "n2", 1),
    ]  # fmt: skip


@contextlib.contextmanager
def sleeping_step(
    slurm: SlurmCluster, cwd: Path, name: str, *overrides: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`srun -N2` of a 2-worker-per-node job whose workers sleep: yields the srun process and the
    job id once all 4 workers run; kills srun if the test leaves it running."""
    with subprocess.Popen(
        ["srun", "-N2", "--ntasks-per-node=1", f"--job-name={name}",
         *launcher("nproc_per_node=2", *overrides)],
        cwd=cwd, env=slurm_env(slurm, cwd / "out", {"SLEEP": "1"}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as step:  # fmt: skip
        try:
            wait_for(lambda: len(records(cwd / "out")) == 4, STEP_TIMEOUT, "4 workers to start")
            out = slurm.run(["squeue", "-h", "-n", name, "-o", "%i"], timeout=30).stdout.split()
            assert len(out) == 1, out
            yield step, out[0]
        finally:
            if step.poll() is None:
                step.kill()
                step.communicate()


def test_scancel_stops_both_nodes_with_143_and_leaves_nothing(
    slurm: SlurmCluster, cwd: Path
) -> None:
    with sleeping_step(slurm, cwd, "eh-scancel") as (step, job_id):
        slurm.run(["scancel", job_id], timeout=30)
        step.communicate(timeout=STEP_TIMEOUT)
    wait_for(lambda: not job_processes(job_id), QUEUE_TIMEOUT, "the job's processes to end")
    for node in step_dirs(cwd).values():
        result = json.loads((node / "result.json").read_text())
        assert result["exit_code"] == 143, result


def test_kill_9_of_one_nodes_launcher_ends_the_job_and_leaves_nothing(
    slurm: SlurmCluster, cwd: Path
) -> None:
    with sleeping_step(slurm, cwd, "eh-kill9", "rdzv.join_timeout=10") as (step, job_id):
        (agent,) = [
            p for p in job_processes(job_id)
            if p.environ().get("SLURM_NODEID") == "1" and "elastic_hydra" in p.cmdline()
        ]  # fmt: skip
        agent.send_signal(signal.SIGKILL)
        step.communicate(timeout=STEP_TIMEOUT)
    assert step.returncode != 0
    wait_for(lambda: not job_processes(job_id), QUEUE_TIMEOUT, "the job's processes to end")
    survivor = json.loads((step_dirs(cwd)["n1"] / "result.json").read_text())
    assert survivor["exit_code"] != 0, survivor  # n1 saw n2 go and ended; it did not hang


def test_a_step_on_part_of_the_allocation(slurm: SlurmCluster, cwd: Path) -> None:
    command = " ".join(launcher("nproc_per_node=2"))
    text = sbatch(slurm, cwd, 2, f"srun -N1 -w n2 --ntasks-per-node=1 {command}\necho rc=$?\n")
    assert "rc=0" in text, text
    ranks = records(cwd / "out")
    assert [(r["rank"], r["world_size"], r["host"]) for r in ranks] == [(0, 2, "n2"), (1, 2, "n2")]


def test_two_jobs_that_share_a_first_node_never_meet(slurm: SlurmCluster, cwd: Path) -> None:
    # Both jobs' first node is n1: each gets its own store port, and both run at once.
    go = cwd / "go"
    steps = []
    for job in ("a", "b"):
        out = cwd / job
        out.mkdir()
        steps.append(
            subprocess.Popen(
                ["srun", "-N2", "--ntasks-per-node=1", *launcher("nproc_per_node=1")],
                cwd=cwd,
                env=slurm_env(slurm, out, {"WAIT_FOR": str(go)}),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        both = lambda: all(len(records(cwd / job)) == 2 for job in ("a", "b"))  # noqa: E731
        wait_for(both, STEP_TIMEOUT, "both jobs' workers to run at once")
        go.touch()
        outputs = [step.communicate(timeout=STEP_TIMEOUT) for step in steps]
    finally:
        for step in steps:
            if step.poll() is None:
                step.kill()
                step.communicate()
    assert [step.returncode for step in steps] == [0, 0], outputs
    for job in ("a", "b"):
        assert [(r["rank"], r["world_size"]) for r in records(cwd / job)] == [(0, 2), (1, 2)]


def test_outside_srun_it_says_so_within_seconds(slurm: SlurmCluster, cwd: Path) -> None:
    started = time.monotonic()
    text = sbatch(slurm, cwd, 2, " ".join(launcher()) + "\necho rc=$?\n")
    assert "rc=2" in text, text
    assert "start it with: srun --ntasks-per-node=1 elastic-hydra" in text, text
    assert time.monotonic() - started < STEP_TIMEOUT / 2  # not rdzv.join_timeout (600 s)


def test_two_launchers_on_one_node_are_refused(slurm: SlurmCluster, cwd: Path) -> None:
    proc = srun(slurm, cwd, "-N1", "-n2", *launcher())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "2 task(s) on 1 node(s)" in line]
    assert len(lines) == 2 and all("--ntasks-per-node=1" in line for line in lines), proc.stderr
    assert not records(cwd / "out")


# --------------------------------------------------------------------------- sweeps on Slurm
def test_a_submitit_sweep_reports_every_jobs_true_outcome(slurm: SlurmCluster, cwd: Path) -> None:
    # Two 2-node jobs: FAIL_RANK=9 names no rank (it succeeds), FAIL_RANK=1 fails.
    proc = subprocess.run(
        [
            *ELASTIC_HYDRA, "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.nodes=2",
            "hydra.launcher.tasks_per_node=1", "hydra.launcher.timeout_min=5",
            *launcher("nproc_per_node=1", "restart.max_restarts=0")[len(ELASTIC_HYDRA):],
            "env.FAIL_RANK=9,1", "env.FAIL_ALWAYS=1",
        ],
        cwd=cwd, env=slurm_env(slurm, cwd / "out"),
        capture_output=True, text=True, timeout=2 * STEP_TIMEOUT, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "env.FAIL_RANK=" in line]
    (ok,) = [r for r in rows if "env.FAIL_RANK=9" in r]
    (failed,) = [r for r in rows if "env.FAIL_RANK=1" in r]
    assert " ok " in ok and " failed " in failed, proc.stdout
    # Each job's dir holds one dir per node, each with that node's own result.
    (sweep,) = (cwd / "eh_logs" / "multirun").glob("*/*")
    for job in ("0", "1"):
        nodes = {p.name: p for p in (sweep / job).iterdir() if p.is_dir()}
        assert sorted(nodes) == ["n1", "n2"], sorted(nodes)
        codes = {json.loads((n / "result.json").read_text())["exit_code"] for n in nodes.values()}
        assert codes == ({0} if job == "0" else {1}), (job, codes)


@pytest.mark.timeout(420)
def test_a_save_request_saves_both_nodes_at_one_step_and_the_requeued_job_resumes_there(
    slurm: SlurmCluster, cwd: Path
) -> None:
    """`scancel --signal=USR1` (what `--signal=USR1@T` sends before the time limit) to a batch
    job on two hosts: both agents stop after the same step, keep it and exit 75; the script
    requeues on 75, as docs/slurm.md shows, and the requeued job resumes after that step on both
    nodes: every step runs once."""
    command = " ".join(launcher("nproc_per_node=1", script=WORKERS / "snapshots_plain.py"))
    script = (
        f"srun --ntasks-per-node=1 {command}\nrc=$?\necho rc=$rc\n"
        '[ $rc -eq 75 ] && scontrol requeue "$SLURM_JOB_ID"\nexit 0\n'
    )
    (cwd / "job.sh").write_text("#!/bin/bash\n" + script)
    env = slurm_env(slurm, cwd / "out", {"STEPS": "60", "STEP_TIME": "0.1"})
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--requeue", "--open-mode=append", "-N2",
         f"--output={cwd / 'job.out'}", f"--chdir={cwd}", str(cwd / "job.sh")],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    steps = [cwd / "out" / f"steps-{rank}.txt" for rank in (0, 1)]
    wait_for(lambda: all(p.exists() and len(p.read_text().split()) >= 3 for p in steps),
             STEP_TIMEOUT, "three steps on both nodes")  # fmt: skip
    slurm.run(["scancel", "--signal=USR1", job_id], timeout=30)
    output = cwd / "job.out"
    wait_for(lambda: "rc=75" in output.read_text(), STEP_TIMEOUT, "the first run to end",
             detail=lambda: output.read_text()[-3000:])  # fmt: skip

    def queue() -> str:
        return slurm.run(["squeue", "-h", "-j", job_id, "-o", "%T %r %S"], timeout=30).stdout

    # The requeued job starts once its begin time (the cluster's cred_expire) has passed.
    wait_for(lambda: "rc=0" in output.read_text(), STEP_TIMEOUT + QUEUE_TIMEOUT,
             "the requeued job to end",
             detail=lambda: f"squeue: {queue()!r}; {output.read_text()[-3000:]}")  # fmt: skip
    text = output.read_text()
    assert text.index("rc=75") < text.index("rc=0"), text
    saved = text[: text.index("rc=75")]  # the first run's lines
    kept = re.findall(r"checkpoint: step (\d+) of rank (\d) kept in ", saved)
    assert sorted(kept) == [(kept[0][0], "0"), (kept[0][0], "1")], text  # one step, both nodes
    stopped = re.findall(r"stopping after step (\d+)", saved)
    assert stopped == [kept[0][0]] * 2, text
    assert text.count(f"resumed after step {kept[0][0]}") == 2, text
    for path in steps:  # each step once: none lost, none trained again
        assert path.read_text().split() == [str(s) for s in range(60)], path.read_text()
