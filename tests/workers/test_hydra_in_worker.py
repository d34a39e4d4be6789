"""A Hydra app inside the worker: every rank and every attempt of a launch gets one output dir.

Hydra resolves `${now:...}` in each process when it reaches `@hydra.main`, so ranks that get
there in different seconds, and every restarted rank, would each make a directory of their own
(facebookresearch/hydra#2070) and a resumed job would not find its checkpoint. The bootstrap pins
`${now:}` to the launch's time (ELASTIC_HYDRA_LAUNCH_TIME).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from tests.conftest import WORKERS
from tests.harness import run

HYDRA_APP = WORKERS / "hydra_app.py"


def test_every_rank_and_attempt_of_a_hydra_app_shares_one_output_dir(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run(
        f"script={HYDRA_APP}", "nproc_per_node=2", "restart.max_restarts=1", "logs=files_only",
        cwd=tmp_path, env={"OUT_DIR": str(out)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    assert sorted(records) == [
        "attempt0_rank0", "attempt0_rank1", "attempt1_rank0", "attempt1_rank1",
    ]  # fmt: skip
    dirs = {r["output_dir"] for r in records.values()}
    assert len(dirs) == 1, records  # both ranks, both attempts
    (output,) = dirs
    # Hydra's default run dir, at the launch's time; the restarted job found its checkpoint.
    (launched,) = {r["launch_time"] for r in records.values()}
    when = datetime.fromtimestamp(float(launched)).strftime("%Y-%m-%d/%H-%M-%S")
    assert Path(output) == tmp_path / "outputs" / when
    assert [records[f"attempt{a}_rank0"]["resumed"] for a in (0, 1)] == [False, True]
    assert sorted(p.name for p in (tmp_path / "outputs").glob("*/*")) == [when.split("/")[1]]
    # ... which is the instant the run dir is named after, to the microsecond: both dirs read the
    # same second, though the agent took it before its composition ended and the workers started.
    (summary,) = (tmp_path / "eh_logs").rglob("summary.json")
    named = datetime.fromtimestamp(float(launched)).strftime("%Y-%m-%d/%H-%M-%S-%f")
    assert summary.parent.relative_to(tmp_path / "eh_logs").as_posix().startswith(f"{named}_")


def test_a_hydra_app_can_put_its_output_dir_in_the_run_dir(tmp_path: Path) -> None:
    """The documented form for sweeps and shared filesystems: one dir per launch and node."""
    out = tmp_path / "out"
    out.mkdir()
    proc = run(
        f"script={HYDRA_APP}", "nproc_per_node=2", "restart.max_restarts=1", "logs=files_only",
        "--", "hydra.run.dir=${oc.env:ELASTIC_HYDRA_RUN_DIR}/hydra",
        cwd=tmp_path, env={"OUT_DIR": str(out)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (summary,) = (tmp_path / "eh_logs").rglob("summary.json")
    records = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert len(records) == 4
    assert {r["output_dir"] for r in records} == {str(summary.parent / "hydra")}
    assert not (tmp_path / "outputs").exists()
