"""The records of a run: a return code told one way, and every record through JSON and back,
nested records included, its derived fields recomputed and a bad field named."""

from __future__ import annotations

import json
import signal

import pytest

from elastic_hydra.plan import HangAction, PreflightMode
from elastic_hydra.records.failures import FailureRecord, WorkerExit, describe_returncode
from elastic_hydra.records.goodput import Ledger, Phase, PhaseTime
from elastic_hydra.records.hangs import HangRank, HangRecord, RankState
from elastic_hydra.records.preflight import Check, Finding, PreflightVerdict
from elastic_hydra.records.summary import JobResult, RunStatus, RunSummary


@pytest.mark.parametrize(
    ("returncode", "short", "sig"),
    [
        (3, "exit code 3", None),
        (-int(signal.SIGKILL), "killed by SIGKILL", "SIGKILL"),
        (128 + int(signal.SIGSEGV), "exit code 139 (SIGSEGV from a shell)", "SIGSEGV"),
        (255, "exit code 255", None),  # past 128+64: no signal
    ],
)
def test_a_return_code_is_told_one_way(returncode: int, short: str, sig: str | None) -> None:
    told = describe_returncode(returncode)
    assert (told.short, told.signal) == (short, sig)
    record = WorkerExit(local_rank=0, rank=0, pid=1, returncode=returncode, wall_time=0.0,
                        mono_time=0.0, attempt=0)  # fmt: skip
    assert (record.signal, record.exit) == (sig, told.explained)  # derived, not passed


def failure(rank: int, attempt: int, returncode: int = 1) -> FailureRecord:
    return FailureRecord(rank=rank, local_rank=rank, host="h", pid=100 + rank, attempt=attempt,
                         returncode=returncode, time=10.0 + rank)  # fmt: skip


def summary() -> RunSummary:
    """A summary that holds a record of every topic."""
    hang = HangRecord(
        verdict="rank 1 is elsewhere",
        idle_s=30.0,
        timeout_s=30.0,
        action=HangAction.RESTART,
        attempt=1,
        time=5.0,
        ranks=(HangRank(rank=1, local_rank=1, pid=101, state=RankState.STOPPED),),
    )
    ledger = Ledger(
        nodes=("h",),
        wall_s=60.0,
        gpus=0,
        phases=(PhaseTime(phase=Phase.RUNNING, wall_s=50.0, gpu_s=0.0),),
    )
    verdict = PreflightVerdict(mode=PreflightMode.QUICK, round=0, nodes=1, findings=(
        Finding(check=Check.PATH, line="preflight: node 0 (h) /tmp is full", fatal=True, node=0),
    ), bad_nodes=(0,), bad_hosts=("h",))  # fmt: skip
    return RunSummary(status=RunStatus.FAILED, exit_code=1, attempts=2, restarts=1,
                      root_cause=failure(0, 1, -int(signal.SIGKILL)),
                      failures=(failure(1, 0), failure(0, 1, -int(signal.SIGKILL))),
                      hang=hang, ledger=ledger, preflight=verdict)  # fmt: skip


def test_a_summary_and_its_records_come_back_from_json_as_they_were() -> None:
    written = summary()
    line = json.loads(json.dumps(written.to_json()))
    assert line["root_cause"]["signal"] == "SIGKILL"  # derived fields are written...
    line["root_cause"]["signal"] = "SIGTERM"  # ... and recomputed rather than read back
    again = RunSummary.from_json(line)
    assert again == written
    assert again.earlier_failures == (failure(1, 0),)  # the restart recovered it
    assert again.preflight is not None and not again.preflight.passed
    result = JobResult(exit_code=1, run_dir="/r", summary=again)
    assert JobResult.from_json(json.loads(json.dumps(result.to_json()))) == result


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("status",), "lost", "RunSummary.status: expected one of"),
        (("hang", "action"), "panic", "RunSummary.hang: expected HangRecord or null"),
        (("ledger", "gpus"), "0", "RunSummary.ledger: expected Ledger or null"),
        (("preflight", "mode"), "fast", "RunSummary.preflight: expected PreflightVerdict or null"),
        (("failures",), [{"rank": 0}], "RunSummary.failures[0]: FailureRecord."),
    ],
)
def test_a_bad_field_is_named_with_the_record_that_holds_it(
    path: tuple[str, ...], value: object, named: str
) -> None:
    line = summary().to_json()
    holder = line
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    with pytest.raises(ValueError, match="^" + named.replace("[", r"\[").replace("]", r"\]")):
        RunSummary.from_json(line)
