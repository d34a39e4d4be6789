"""The DDP example job: a run that loses a rank and restarts, cold or warm, ends with the same
weights as one that does not (checkpoint every step, resume from it, deterministic data and
all_reduce); a new launch trains again in its own run dir.

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
    pytest.mark.timeout(240),
]

JOB = "examples/jobs/ddp.yaml"
STEPS, CRASH_AT = 20, 7
DEADLINE = 150.0  # the three jobs at once: 8 cold worker starts, each importing torch (~4 s of CPU)


def start_job(cwd: Path, name: str, *overrides: str, steps: int = STEPS) -> subprocess.Popen[str]:
    """Launch the example job with its run dir under logs_`name`/ (and its outputs there too,
    unless the overrides name an `hp.dir`)."""
    cmd = [*ELASTIC_HYDRA, JOB, f"hp.steps={steps}", f"logs.root=logs_{name}"]
    return subprocess.Popen(
        [*cmd, *overrides], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(
    jobs: dict[str, subprocess.Popen[str]], cwd: Path, *, seen: frozenset[Path] = frozenset()
) -> dict[str, tuple[dict[str, Any], Path]]:
    """Wait for the jobs against one deadline; returns name -> (summary.json, run dir), the run
    dir being the one under logs_`name`/ that is not in `seen` (an earlier launch's)."""
    deadline = time.monotonic() + DEADLINE
    done = {}
    try:
        for name, job in jobs.items():
            output, _ = job.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            assert job.returncode == 0, f"{name}: exit {job.returncode}\n{output}"
            (summary,) = set((cwd / f"logs_{name}").glob("**/summary.json")) - seen
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
def test_a_restarted_run_cold_or_warm_ends_with_the_weights_of_one_that_never_failed(
    workdir: Path,
) -> None:
    """Rank 1 fails at step CRASH_AT; the restart resumes from rank 0's checkpoint, started cold
    (a fresh interpreter) or warm (forked from a template that imported torch). Then the job
    again in the clean run's logs.root, as the docs show it: a new launch trains every step in
    its own run dir (no checkpoint of the first to resume)."""
    crash = (f"hp.crash_at_step={CRASH_AT}", "restart.max_restarts=1")
    # The jobs at once (independent dirs and ports): the test takes the longest one's time.
    jobs = {
        "crash": start_job(workdir, "crash", *crash, "hp.dir=crash"),
        "warm": start_job(workdir, "warm", *crash, "hp.dir=warm", "warm.imports=[torch]"),
        "clean": start_job(workdir, "clean"),  # outputs in its run dir, the default
    }
    results = finish(jobs, workdir)
    (clean, clean_dir) = results["clean"]
    assert (clean["status"], clean["attempts"]) == ("succeeded", 1)

    import torch  # here, not at module level: collection stays cheap

    b = torch.load(clean_dir / "final.pt")
    for name in ("crash", "warm"):
        crashed, crashed_dir = results[name]
        assert (crashed["status"], crashed["exit_code"], crashed["attempts"]) == (
            "succeeded", 0, 2,
        ), name  # fmt: skip
        failed = [
            e for e in crashed["exits"] if e["returncode"] and not e["terminated_by_launcher"]
        ]
        # Rank 1's exit comes first; rank 0 is stopped by the launcher or fails in all_reduce.
        first = min(failed, key=lambda e: e["mono_time"])
        assert (first["rank"], first["returncode"], first["attempt"]) == (1, 1, 0), name
        assert {e["attempt"] for e in failed} == {0}, name
        stderr = (crashed_dir / "attempt_0/1/stderr.log").read_text()
        assert f"crashing at step {CRASH_AT}" in stderr, name
        resumed = re.search(
            r"resumed from \S+ at step (\d+)", (crashed_dir / "attempt_1/0/stdout.log").read_text()
        )
        assert resumed is not None, f"{name}: the restarted rank 0 did not resume"
        # Rank 0 checkpoints after each step; it may be stopped before or after step
        # CRASH_AT - 1's.
        assert CRASH_AT - 1 <= int(resumed.group(1)) <= CRASH_AT, name
        a = torch.load(workdir / name / "final.pt")
        assert a.keys() == b.keys() == {"weight", "bias"}
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name} {key}: {a[key]} != {b[key]}"
        assert torch.load(workdir / name / "ckpt.pt")["step"] == STEPS
        assert not list((workdir / name).glob(".*.tmp")), "a temporary checkpoint was left behind"
    events = (results["warm"][1] / "events.jsonl").read_text()
    assert "warm_fallback" not in events  # the restart was warm, not a cold fallback
    assert torch.load(clean_dir / "ckpt.pt")["step"] == STEPS

    seen = frozenset({clean_dir / "summary.json"})
    rerun = finish({"clean": start_job(workdir, "clean", steps=3)}, workdir, seen=seen)
    again, again_dir = rerun["clean"]
    assert (again["status"], again["attempts"]) == ("succeeded", 1)
    assert again_dir != clean_dir
    log = (again_dir / "attempt_0/0/stdout.log").read_text()
    assert "resumed" not in log and "step 3/3" in log, log  # it trained, from step 0
    assert (again_dir / "final.pt").is_file()
    assert not list(workdir.glob("runs")), "the example wrote outside its run dir"
