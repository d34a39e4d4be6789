"""`report`'s attempts table on the timelines the agent loop writes: every start of the worker
group has its row and says how it ended (the loop runs on the fakes of tests/agent)."""

from __future__ import annotations

import signal

from elastic_hydra.agent.events import Event, Hang, Restart, Stamp, WorkersStarted
from elastic_hydra.agent.outcome import Status
from elastic_hydra.plan import HangAction, RestartSpec
from elastic_hydra.report.history import attempts
from tests.agent.test_executor import (
    ALL_SUCCEED,
    T0,
    FakeRendezvous,
    assignment,
    harness,
    make_plan,
)


def rows(events: list[Event]) -> list[tuple[int, str]]:
    return [(row.attempt, row.how) for row in attempts(events)]


def test_an_attempt_a_membership_change_ended_has_its_row() -> None:
    rdzv = FakeRendezvous([assignment(nodes=1), assignment(nodes=2, node_rank=1)], waiting=[0, 1])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=0))
    h = harness({0: {}, 1: ALL_SUCCEED[0]}, plan=plan, rdzv=rdzv)
    assert h.run().status is Status.SUCCEEDED
    assert rows(h.observer.events) == [
        (0, "membership change: 1 node(s) waiting to join"),
        (1, "all workers exited with code 0"),
    ]
    first = attempts(h.observer.events)[0]
    assert first.started is not None and first.ended is not None and first.ended > first.started


def test_an_attempt_a_signal_stopped_and_one_the_timeline_lost_have_rows() -> None:
    plan = make_plan(restart=RestartSpec(max_restarts=1))
    h = harness({0: {1: (3, 5.0)}, 1: {}}, plan=plan)
    h.stop.at(20.0, signal.SIGTERM)
    assert h.run().status is Status.STOPPED
    assert rows(h.observer.events) == [(0, "rank 1 exit code 3"), (1, "stopped by SIGTERM")]
    # The agent killed while its workers ran: the timeline ends with their start.
    killed = WorkersStarted(wall_time=T0, mono_time=T0 + 30, pids=(1,), attempt=2)
    cut = [*h.observer.events, killed]
    assert rows(cut)[-1] == (2, "no end recorded (the agent was killed?)")


def test_an_attempt_that_hung_says_so_not_the_restart_reason() -> None:
    def at(t: float) -> Stamp:
        return Stamp(wall_time=T0 + t, mono_time=T0 + t)

    events: list[Event] = [
        WorkersStarted(**at(0), pids=(1,), attempt=0),
        Hang(**at(5), verdict="hang after 5 s without progress", action=HangAction.RESTART,
             idle=5.0, attempt=0),
        Restart(**at(6), reason="restart 1 of 3 after a hang", delay=0.0, restart=1, rank=None),
        WorkersStarted(**at(7), pids=(2,), attempt=1),
        Hang(**at(9), verdict="hang after 2 s", action=HangAction.REPORT, idle=2.0, attempt=1),
    ]  # fmt: skip
    assert rows(events) == [
        (0, "hung: hang after 5 s without progress"),
        (1, "no end recorded (the agent was killed?)"),  # a reported hang ends nothing
    ]
