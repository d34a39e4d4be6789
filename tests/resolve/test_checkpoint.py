"""`checkpoint.*` resolved: the job's home (never a launch's run dir), sizes, a sweep's jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_hydra.plan import CheckpointSpec
from elastic_hydra.resolve.checkpoint import for_sweep_job
from tests.harness import plan_of


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spec(*argv: str) -> CheckpointSpec:
    found = plan_of("script=train.py", *argv).checkpoint
    assert found is not None
    return found


def test_the_default_home_is_the_jobs_under_logs_root_the_same_for_every_launch(cwd: Path) -> None:
    first, again = spec(), spec()
    assert first == again  # two launches of one command: one home
    assert first.home == str(cwd / "eh_logs" / "checkpoints" / "train")
    assert first.job == "train" and (first.keep, first.resume, first.max_memory) == (2, True, 0)
    named = spec("rdzv=c10d", "rdzv.endpoint=127.0.0.1:29400", "rdzv.id=run/7 x", "logs.root=out")
    assert named.home == str(cwd / "out" / "checkpoints" / "train-run-7-x")
    assert spec("checkpoint.home='~/ck'").home == str(Path("~/ck").expanduser())
    assert spec("checkpoint.home=ck").home == str(cwd / "ck")


@pytest.mark.parametrize(
    ("given", "size"),
    [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("2GB", 2_000_000_000), ("1000", 1000),
     ("1.5k", 1500)],
)  # fmt: skip
def test_sizes_in_bytes(cwd: Path, given: str, size: int) -> None:
    assert spec(f"checkpoint.max_memory={given}").max_memory == size


def test_each_job_of_a_sweep_has_its_own_home_named_by_what_differs() -> None:
    base = CheckpointSpec(home="/h/train", job="train")
    one = for_sweep_job(base, ["script=train.py", "logs.root=x", "hp.lr=0.1"])
    two = for_sweep_job(base, ["script=train.py", "logs.root=y", "hp.lr=0.2"])
    assert one.home.startswith("/h/train/hp.lr_0.1-") and one.job.startswith("train/hp.lr_0.1-")
    assert two.home != one.home
    assert for_sweep_job(base, ["logs.root=z", "hp.lr=0.1"]) == one  # a relaunch finds it
