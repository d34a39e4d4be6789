"""Failure classes on real launches: a script that fails at import spends one restart, not its
budget; the job file's `restart.on_class` and exit-code rules change that; a worker the kernel's
OOM killer ends in a memory-limited cgroup is told as oom_host, and its repeat is not retried."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.harness import ELASTIC_HYDRA, launcher_env, run

pytestmark = pytest.mark.timeout(180)

MEMORY = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller (tests/host_needs.py)


def summary_of(cwd: Path) -> dict[str, object]:
    (path,) = (cwd / "eh_logs").rglob("summary.json")
    loaded: dict[str, object] = json.loads(path.read_text())
    return loaded


def restarts_in(cwd: Path) -> list[dict[str, object]]:
    (path,) = (cwd / "eh_logs").rglob("events.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line["event"] == "restart"]


def test_an_import_error_is_retried_once_then_not_again(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import transformerz  # a typo\n")
    done = run("script=train.py", "restart.max_restarts=5", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    line = (
        "not retried: the same ModuleNotFoundError at train.py:1 as attempt 0 "
        "(user_error; restart.on_class.user_error=once)"
    )
    assert line in done.stderr
    assert "elastic-hydra: failed (user_error)" in done.stderr
    told = [line.split(None, 1) for line in done.stderr.splitlines() if line.startswith("class ")]
    assert told == [
        ["class", "user_error: the same ModuleNotFoundError at train.py:1 as attempt 0"]
    ]
    summary = summary_of(tmp_path)
    assert (summary["attempts"], summary["restarts"], summary["failure_class"]) == (
        2, 1, "user_error",
    )  # fmt: skip
    cause = summary["root_cause"]
    assert isinstance(cause, dict) and cause["repeat_of"] == 0
    (restart,) = restarts_in(tmp_path)
    assert restart["failure_class"] == "user_error"
    assert "(user_error: ModuleNotFoundError at train.py:1)" in str(restart["reason"])


@pytest.mark.parametrize(
    ("rule", "attempts"),
    [("restart.on_class.user_error=retry", 3), ("restart.on_class.user_error=fail", 1),
     ("+restart.on_exit_code.1=retry", 3)],
    ids=["class-retry", "class-fail", "exit-code-rule-wins"],
)  # fmt: skip
def test_the_job_file_decides_what_a_class_does(tmp_path: Path, rule: str, attempts: int) -> None:
    (tmp_path / "train.py").write_text("import transformerz\n")
    done = run("script=train.py", "restart.max_restarts=2", rule, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert summary_of(tmp_path)["attempts"] == attempts, done.stderr


def test_a_bad_class_or_action_is_one_line_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    for word, said in (
        ("restart.on_class.user_eror=fail", "restart.on_class.user_eror: not a failure class"),
        ("restart.on_class.comm=skip", "restart.on_class.comm: unknown action"),
        ("restart.on_class.preempted=fail", "the restart policy never sees this class"),
    ):
        done = run("script=train.py", word, cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and not (tmp_path / "eh_logs").exists()


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A memory cgroup of 256 MiB, removed after the test (its processes are gone by then)."""
    group = MEMORY / f"elastic-hydra-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(256 << 20))
        yield group
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 30, "an empty cgroup")
        group.rmdir()


GROWS = """
import os
blocks = []
while True:  # touched, not only reserved: the cgroup's limit is reached
    blocks.append(b"x" * (16 << 20))
"""


def test_a_host_oom_kill_is_told_by_the_kernel_and_its_repeat_is_not_retried(
    tmp_path: Path, memory_cgroup: Path
) -> None:
    (tmp_path / "grows.py").write_text(GROWS)
    enter = f'echo $$ > {memory_cgroup / "cgroup.procs"} && exec "$@"'
    done = subprocess.run(
        ["sh", "-c", enter, "sh", *ELASTIC_HYDRA, "script=grows.py", "restart.max_restarts=3"],
        cwd=tmp_path, env=launcher_env(), capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    summary = summary_of(tmp_path)
    assert (summary["attempts"], summary["failure_class"]) == (2, "oom_host"), done.stderr
    cause = summary["root_cause"]
    assert isinstance(cause, dict) and cause["returncode"] == -9
    evidence = str(cause["evidence"])
    assert evidence.startswith("the same oom_host as attempt 0: the kernel's OOM killer: ")
    assert f"Killed process {cause['pid']} " in evidence and "anon-rss:" in evidence
    assert "(oom_host; restart.on_class.oom_host=once)" in done.stderr
