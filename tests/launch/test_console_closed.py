"""A console that stops reading (`elastic-hydra ... 2>&1 | head -2`) never changes a job's
outcome: the job recovers and ends with its own exit code and summary."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.harness import ELASTIC_HYDRA, launcher_env

pytestmark = pytest.mark.timeout(120)

FAILS_ONCE = """
import os, sys
for i in range(5):
    print("step", i, "rank", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
"""


@pytest.mark.parametrize(("restarts", "code", "status"), [(1, 0, "succeeded"), (0, 1, "failed")])
def test_a_console_closed_mid_run_leaves_the_jobs_own_outcome(
    tmp_path: Path, restarts: int, code: int, status: str
) -> None:
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    proc = subprocess.Popen(
        [*ELASTIC_HYDRA, f"script={script}", "nproc_per_node=2",
         f"restart.max_restarts={restarts}"],
        cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = [proc.stdout.readline() for _ in range(2)]  # `| head -2`
        proc.stdout.close()
        assert proc.wait(timeout=60) == code, first
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (summary,) = (tmp_path / "eh_logs").rglob("summary.json")
    saved = json.loads(summary.read_text())
    assert (saved["status"], saved["exit_code"]) == (status, code), saved["message"]
    assert (summary.parent / f"attempt_{restarts}/1/stdout.log").read_text().count("step") == 5
