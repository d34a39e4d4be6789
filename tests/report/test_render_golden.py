"""The failure report, rendered at a fixed width and compared with files in tests/report/golden/.

Synthetic summaries (built through `summarize`) cover each kind of failure in both forms, rich
(terminal) and plain (CI logs); one real run checks the whole pipeline. Pids, times and paths are
normalized. ELASTIC_HYDRA_UPDATE_GOLDEN=1 rewrites the files after a deliberate change.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.plan import LaunchPlan, NodeRange, PythonScript, Standalone
from elastic_hydra.records.failures import FailureRecord, FailureSource, WorkerExit
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.report import render
from elastic_hydra.report.summary import summarize
from elastic_hydra.tracebacks import Frame, Stack
from tests.conftest import ELASTIC_HYDRA, REPO, WORKERS

GOLDEN = Path(__file__).parent / "golden"
SOURCE = "train_fixture.py"  # relative to GOLDEN, the tests' cwd: no machine path in the output
RUN_DIR = "/runs/2026-11-22/10-00-00-000000_node0"
T0 = 1_795_300_000.0
UPDATE = os.environ.get("ELASTIC_HYDRA_UPDATE_GOLDEN") == "1"


def plan() -> LaunchPlan:
    return LaunchPlan(
        entrypoint=PythonScript(path=SOURCE, python="python"),
        nnodes=NodeRange(min=1, max=1),
        nproc_per_node=3,
        rdzv=Standalone(),
        run_id="golden",
        run_dir=RUN_DIR,
    )


def exit_(rank: int, returncode: int, *, by_launcher: bool = False, at: float = 0.0) -> WorkerExit:
    return WorkerExit(
        local_rank=rank,
        rank=rank,
        pid=1000 + rank,
        returncode=returncode,
        wall_time=T0 + at,
        mono_time=at,
        attempt=0,
        terminated_by_launcher=by_launcher,
    )


def failure(exit: WorkerExit, **found: Any) -> FailureRecord:
    """The record of a failed exit, with what its files told (`found`)."""
    base = f"{RUN_DIR}/attempt_0/{exit.rank}"
    record = FailureRecord.of(exit, host="node0")
    return replace(
        record, stdout_log=f"{base}/stdout.log", stderr_log=f"{base}/stderr.log", **found
    )


CHAIN = (
    Stack(
        exc_type="ZeroDivisionError",
        exc_value="division by zero",
        link="cause",
        frames=(Frame(filename=SOURCE, lineno=10, name="main", line="step(0)"),
                Frame(filename=SOURCE, lineno=5, name="step", line="return 1 / batch")),
    ),
    Stack(
        exc_type="ValueError",
        exc_value="bad batch",
        frames=(Frame(filename=SOURCE, lineno=12, name="main",
                      line='raise ValueError("bad batch") from exc'),),
    ),
)  # fmt: skip
CRASH = Stack(
    exc_type="Fatal Python error",
    exc_value="Segmentation fault",
    frames=(Frame(filename=SOURCE, lineno=16, name="<module>", line="main()"),
            Frame(filename=SOURCE, lineno=5, name="step", line="return 1 / batch")),
)  # fmt: skip
COLLATERAL = [(0, -15), (2, -15)]


def failed_summary(cause: WorkerExit, reason: str, **found: Any) -> RunSummary:
    others = [exit_(r, rc, by_launcher=True, at=0.01) for r, rc in COLLATERAL]
    outcome = RunOutcome(
        status=Status.FAILED,
        attempts=1,
        reason=reason,
        exits=(cause, *others),
        failures=(failure(cause, **found), *(failure(e) for e in others)),
    )
    return summarize(plan(), outcome, host="node0", started=T0 - 1, duration=1.25)


CASES: dict[str, RunSummary] = {
    "exception": failed_summary(
        exit_(1, 1),
        "exit code 1 and restarts are off (restart.max_restarts=0)",
        source=FailureSource.EXCEPTION,
        message="ValueError: bad batch",
        traceback=CHAIN,
    ),
    "crash": failed_summary(
        exit_(1, -signal.SIGSEGV),
        "signal SIGSEGV (11) and restarts are off (restart.max_restarts=0)",
        source=FailureSource.CRASH,
        message="Fatal Python error: Segmentation fault",
        traceback=(CRASH,),
        stderr_tail=("loading shard 3",),
    ),
    "killed": failed_summary(
        exit_(1, -signal.SIGKILL),
        "signal SIGKILL (9) and restarts are off (restart.max_restarts=0)",
        stderr_tail=("epoch 1", "allocating 80 GiB"),
    ),
    "shell_exit": failed_summary(
        exit_(1, 137), "exit code 137 and restarts are off (restart.max_restarts=0)"
    ),
}


@pytest.fixture(autouse=True)
def fixed_place_and_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(GOLDEN)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def rendered(summary: RunSummary, *, plain: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, width=100, color_system=None, force_terminal=not plain)
    console.print(render.outcome_report(summary, plain=plain, width=100))
    return normalize(out.getvalue())


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"missing {path}: run with ELASTIC_HYDRA_UPDATE_GOLDEN=1 once"
    assert text == path.read_text()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("form", ["rich", "plain"])
def test_report_matches_golden(case: str, form: str) -> None:
    text = rendered(CASES[case], plain=form == "plain")
    check_golden(f"{case}.{form}", text)
    if form == "plain":
        assert "\x1b[" not in text


def test_the_summary_survives_json_unchanged_in_rendering() -> None:
    # `elastic-hydra report` renders the saved JSON: it must read exactly as the live report.
    summary = CASES["exception"]
    again = RunSummary.from_json(json.loads(json.dumps(summary.to_json())))
    assert again == summary
    assert rendered(again, plain=True) == rendered(summary, plain=True)


def test_every_end_of_the_agent_is_a_summary_status_with_the_same_word() -> None:
    # summary.json's status is the agent's word for its end (RunStatus adds the ends before it).
    for status in Status:
        outcome = RunOutcome(status=status, attempts=1, reason="", signal=signal.SIGTERM)
        summary = summarize(plan(), outcome, host="node0", started=T0, duration=1.0)
        word = summary.to_json()["status"]
        assert (type(word), word) == (str, status.value)  # plain JSON, not an enum
        assert summary.status is RunStatus(status.value)


def test_real_run_report_matches_golden(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*ELASTIC_HYDRA, f"script={WORKERS / 'fail.py'}", "nproc_per_node=3", "logs=quiet",
         f"logs.root={tmp_path}", "stop_grace=5", "--", "raise", "--rank", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    text = normalize(proc.stderr.replace(str(tmp_path), "<logs>").replace(str(REPO), "<repo>"))
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", "<time>", text)
    text = re.sub(r"\(\d+\.\d\d s, ", "(<duration> s, ", text)
    text = re.sub(r"pid \d+", "pid <pid>", text)
    text = re.sub(r"^(\d +\d +)\d+ ", r"\1<pid> ", text, flags=re.M)
    text = re.sub(r"<logs>/\d{4}-\d\d-\d\d/[^/\s]+", "<run_dir>", text)
    text = text.replace(f" on {os.uname().nodename},", " on <host>,")
    text = re.sub(r" {2,}", "  ", text)  # table columns follow the widths of the pids
    check_golden("real_raise.plain", text)


def test_a_rank_that_exited_0_as_the_launcher_stopped_the_others_is_not_called_terminated() -> None:
    # Rank 0 returned at once while rank 1 raised: the stop that followed found it done (or it
    # heard SIGTERM and ended well); either way it exited 0, which the table says as such.
    cause = exit_(1, 1)
    done = exit_(0, 0, by_launcher=True, at=0.01)
    outcome = RunOutcome(
        status=Status.FAILED,
        attempts=1,
        reason="r",
        exits=(cause, done),
        failures=(failure(cause),),
    )
    summary = summarize(plan(), outcome, host="node0", started=T0 - 1, duration=1.0)
    (row,) = [ln for ln in rendered(summary, plain=True).splitlines() if ln.startswith("0 ")]
    assert row.split()[-2:] == ["exited", "0"], row
