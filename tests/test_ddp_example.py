"""The DDP example job: a run that loses a rank and restarts ends with the same weights as one that
does not (checkpoint every step, resume from it, deterministic data and all_reduce).

The examples are copied to a temporary directory and launched from there exactly as documented
(`elastic-hydra examples/jobs/ddp.yaml ...`), so the job file's relative paths are what is tested.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ELASTIC_HYDRA, REPO

pytestmark = [
    pytest.mark.timeout(180),
]

JOB = "examples/jobs/ddp.yaml"
STEPS, CRASH_AT = 20, 7
DEADLINE = 150.0  # both jobs: 6 worker starts, each importing torch (~4 s of CPU apiece)


def start_job(cwd: Path, name: str, *overrides: str, steps: int = STEPS) -> subprocess.Popen[str]:
    """Launch the example job with its run dir under logs_`name`/ (and its outputs there too,
    unless the overrides name an `hp.dir`)."""
    cmd = [*ELASTIC_HYDRA, JOB, f"hp.steps={steps}", f"logs.root=logs_{name}"]
    return subprocess.Popen(
        [*cmd, *overrides], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(
    jobs: dict[str, subprocess.Popen[str]], cwd: Path
) -> dict[str, tuple[dict[str, Any], Path]]:
    """Wait for the jobs against one deadline; returns name -> (summary.json, run dir)."""
    deadline = time.monotonic() + DEADLINE
    done = {}
    try:
        for name, job in jobs.items():
            output, _ = job.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            assert job.returncode == 0, f"{name}: exit {job.returncode}\n{output}"
            (summary,) = (cwd / f"logs_{name}").glob("**/summary.json")
            done[name] = (json.loads(summary.read_text()), summary.parent)
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.terminate()  # the agent stops its workers and exits
                try:
                    job.communicate(timeout=40)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.communicate()
    return done


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(
        REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__py*")
    )
    return tmp_path


@pytest.mark.filterwarnings("ignore:Failed to initialize NumPy")
def test_restarted_run_ends_with_the_same_weights(workdir: Path) -> None:
    # Both jobs at once (independent dirs and ports): the test takes the longer one's time.
    jobs = {
        "crash": start_job(
            workdir,
            "crash",
            f"hp.crash_at_step={CRASH_AT}",
            "restart.max_restarts=1",
            "hp.dir=crash",
        ),
        "clean": start_job(workdir, "clean"),  # outputs in its run dir, the default
    }
    results = finish(jobs, workdir)
    (crashed, crashed_dir), (clean, clean_dir) = results["crash"], results["clean"]
    assert (crashed["status"], crashed["exit_code"], crashed["attempts"]) == ("succeeded", 0, 2)
    failed = [e for e in crashed["exits"] if e["returncode"] and not e["terminated_by_launcher"]]
    # Rank 1's exit comes first; rank 0 is stopped by the launcher or fails in all_reduce itself.
    first = min(failed, key=lambda e: e["mono_time"])
    assert (first["rank"], first["returncode"], first["attempt"]) == (1, 1, 0)
    assert {e["attempt"] for e in failed} == {0}
    assert f"crashing at step {CRASH_AT}" in (crashed_dir / "attempt_0/1/stderr.log").read_text()
    resumed = re.search(
        r"resumed from \S+ at step (\d+)", (crashed_dir / "attempt_1/0/stdout.log").read_text()
    )
    assert resumed is not None, "the restarted rank 0 did not resume from the checkpoint"
    # Rank 0 checkpoints after each step; it may be stopped before or after step CRASH_AT - 1's.
    assert CRASH_AT - 1 <= int(resumed.group(1)) <= CRASH_AT

    assert (clean["status"], clean["attempts"]) == ("succeeded", 1)

    import torch  # here, not at module level: collection stays cheap

    a = torch.load(workdir / "crash/final.pt")
    b = torch.load(clean_dir / "final.pt")
    assert a.keys() == b.keys() == {"weight", "bias"}
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key}: {a[key]} != {b[key]}"
    for where in (workdir / "crash", clean_dir):
        assert torch.load(where / "ckpt.pt")["step"] == STEPS
        assert not list(where.glob(".*.tmp")), "a temporary checkpoint was left behind"


@pytest.mark.filterwarnings("ignore:Failed to initialize NumPy")
def test_each_launch_trains_in_its_own_run_dir(workdir: Path) -> None:
    """The example run twice in a row, as the docs show it: the second launch trains every step
    again (its own run dir, no checkpoint of the first to resume)."""
    runs = []
    for name in ("first", "second"):
        summary, run_dir = finish({name: start_job(workdir, name, steps=3)}, workdir)[name]
        assert (summary["status"], summary["attempts"]) == ("succeeded", 1)
        runs.append(run_dir)
    first, second = runs
    log = (second / "attempt_0/0/stdout.log").read_text()
    assert "resumed" not in log and "step 3/3" in log, log  # it trained, from step 0
    assert (first / "ckpt.pt").is_file() and (second / "final.pt").is_file()
    assert not list(workdir.glob("runs")), "the example wrote outside its run dir"
