"""The admission check before every rendezvous round (the quarantine ledger's gate), on the
executor's fakes: a refused node joins nothing, starts nothing and says why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from elastic_hydra.agent.events import EventKind, Finish, Quarantined, event_from_json
from elastic_hydra.agent.executor import Executor
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.plan import FailureClass, RestartSpec
from elastic_hydra.records.failures import FailureRecord, WorkerExit
from tests.agent.test_executor import (
    ALL_SUCCEED,
    T0,
    WALL_OFFSET,
    FakeRendezvous,
    Harness,
    assignment,
    fail_every_round,
    harness,
    make_plan,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    host: str = "node-3"
    gpus: tuple[int, ...] = ()
    evidence: str = "preflight: node-3 at 41 % of the median GEMM rate"
    until: float = 2_000_000_000.0
    line: str = "this node (node-3) is in the quarantine ledger until ..."


@dataclass
class ScriptedAdmission:
    """Lets the node join `joins` times, then refuses; counts the questions."""

    joins: int
    asked: int = 0
    refused: list[Refused] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    def refusal(self) -> Refused | None:
        self.asked += 1
        if self.asked <= self.joins:
            return None
        self.refused.append(Refused())
        return self.refused[-1]

    def exclude(self, evidence: str) -> str:
        self.excluded.append(evidence)
        return "node-3 is in the quarantine ledger /shared/ledger.json until ..."


def run(
    h: Harness,
    admission: ScriptedAdmission | None,
    read_failure: Callable[[WorkerExit], FailureRecord] | None = None,
) -> RunOutcome:
    return Executor(
        h.plan,
        rendezvous=h.rdzv,
        workers=h.factory,
        clock=h.clock,
        observer=h.observer,
        stop=h.stop,
        read_failure=read_failure or h.read_failure,
        admission=admission,
    ).run()


def test_a_quarantined_node_leaves_before_the_first_round_with_exit_code_5() -> None:
    h = harness(ALL_SUCCEED)
    admission = ScriptedAdmission(joins=0)
    outcome = run(h, admission)

    assert outcome.status is Status.QUARANTINED and outcome.exit_code == 6
    assert outcome.reason == Refused().line
    assert h.rdzv.calls == [] and h.factory.calls == []  # no round joined, nothing started
    assert h.observer.kinds == [EventKind.QUARANTINED, EventKind.FINISH]
    (event,) = h.observer.of(Quarantined)
    assert (event.host, event.gpus, event.until, event.attempt) == ("node-3", (), 2e9, 0)
    assert event.wall_time == WALL_OFFSET + T0
    assert event_from_json(event.to_json()) == event  # the timeline reads it back
    assert h.observer.of(Finish)[0].exit_code == 6


def test_the_ledger_is_asked_again_before_the_round_of_each_restart() -> None:
    rdzv = FakeRendezvous([assignment(), assignment(), assignment()])
    plan = make_plan(restart=RestartSpec(max_restarts=3))
    h = harness(fail_every_round(4), plan=plan, rdzv=rdzv)
    admission = ScriptedAdmission(joins=2)  # quarantined while its second attempt ran
    outcome = run(h, admission)

    assert outcome.status is Status.QUARANTINED and outcome.exit_code == 6
    assert admission.asked == 3
    assert len(h.factory.calls) == 2  # two attempts ran, the third never joined
    assert outcome.attempts == 2 and outcome.restarts == 2


def test_a_node_that_is_not_quarantined_runs_as_before() -> None:
    h = harness(ALL_SUCCEED)
    admission = ScriptedAdmission(joins=99)
    assert run(h, admission).status is Status.SUCCEEDED
    assert admission.asked == 1 and EventKind.QUARANTINED not in h.observer.kinds


XID = "the kernel log: NVRM: Xid (PCI:0000:3b:00): 79, pid=42, GPU has fallen off the bus."


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
def test_a_hardware_fault_takes_the_node_out_of_the_job_and_into_the_ledger(ledger: bool) -> None:
    h = harness(fail_every_round(3), plan=make_plan(restart=RestartSpec(max_restarts=3)))
    admission = ScriptedAdmission(joins=9) if ledger else None

    def hardware(exit: WorkerExit) -> FailureRecord:
        record = h.read_failure(exit)
        return replace(record, failure_class=FailureClass.HARDWARE, evidence=XID)

    outcome = run(h, admission, hardware)

    assert outcome.status is Status.EXCLUDED and outcome.exit_code == 4
    assert outcome.restarts == 0 and outcome.failure_class is FailureClass.HARDWARE
    assert outcome.reason.startswith(
        f"this node leaves the job: {XID} (hardware; restart.on_class.hardware=exclude); "
    )
    assert outcome.reason.endswith(
        "node-3 is in the quarantine ledger /shared/ledger.json until ..." if ledger
        else "no quarantine ledger keeps it out of later jobs (quarantine.ledger)"
    )  # fmt: skip
    assert admission is None or admission.excluded == [XID]
    (finish,) = h.observer.of(Finish)
    assert (finish.status, finish.failure_class) == (Status.EXCLUDED, FailureClass.HARDWARE)
