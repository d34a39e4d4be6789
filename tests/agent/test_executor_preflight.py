"""The executor acting on a preflight verdict (fake battery, fake rendezvous and groups)."""

from __future__ import annotations

import dataclasses

from elastic_hydra.agent.events import Preflight
from elastic_hydra.agent.executor import Executor
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.plan import FailureClass, NodeRange, PreflightMode
from elastic_hydra.records.preflight import Check, Finding, PreflightVerdict
from tests.agent.test_executor import (
    ALL_SUCCEED,
    FakeRendezvous,
    Harness,
    assignment,
    harness,
    make_plan,
)


class FakeBattery:
    """Hands out a verdict per check, in turn (the last one repeats)."""

    def __init__(self, *verdicts: PreflightVerdict) -> None:
        self.verdicts = verdicts
        self.checked: list[tuple[int, int]] = []  # (node rank, attempt)

    def check(self, node: NodeAssignment, attempt: int, restart_count: int) -> PreflightVerdict:
        self.checked.append((node.group_rank, attempt))
        return self.verdicts[min(len(self.checked), len(self.verdicts)) - 1]


def verdict(*bad: int, nodes: int = 4) -> PreflightVerdict:
    found = tuple(
        Finding(check=Check.GEMM, line=f"preflight: node {n} (h{n}) rank {n} at 20 %", fatal=True,
                node=n, host=f"h{n}")
        for n in bad
    )  # fmt: skip
    return PreflightVerdict(
        mode=PreflightMode.QUICK, round=0, nodes=nodes, findings=found, bad_nodes=bad,
        bad_hosts=tuple(f"h{n}" for n in bad),
    )  # fmt: skip


def run(h: Harness, battery: FakeBattery) -> RunOutcome:
    return Executor(
        h.plan,
        rendezvous=h.rdzv,
        workers=h.factory,
        clock=h.clock,
        observer=h.observer,
        stop=h.stop,
        read_failure=h.read_failure,
        preflight=battery,
    ).run()


def four_nodes(node_rank: int, nnodes: NodeRange) -> Harness:
    plan = dataclasses.replace(make_plan(dynamic=True), nnodes=nnodes)
    rounds = [assignment(nodes=4, node_rank=node_rank), assignment(nodes=3, node_rank=node_rank)]
    return harness(ALL_SUCCEED, plan=plan, rdzv=FakeRendezvous(list(rounds)))


def test_a_passed_preflight_starts_the_workers_and_the_outcome_keeps_the_verdict() -> None:
    h, battery = four_nodes(0, NodeRange(min=4, max=4)), FakeBattery(verdict())
    outcome = run(h, battery)
    assert outcome.status is Status.SUCCEEDED and outcome.preflight == verdict()
    assert battery.checked == [(0, 0)] and len(h.factory.calls) == 1


def test_the_failed_node_leaves_with_exit_4_before_any_worker_starts() -> None:
    h = four_nodes(2, NodeRange(min=4, max=4))
    outcome = run(h, FakeBattery(verdict(2)))
    assert outcome.status is Status.PREFLIGHT_FAILED and outcome.exit_code == 4
    assert outcome.failure_class is FailureClass.HARDWARE
    assert outcome.reason == "this node failed its preflight: node 2 (h2) rank 2 at 20 %"
    (event,) = h.observer.of(Preflight)  # the timeline says when, and who failed
    assert (event.passed, event.nodes, event.bad_nodes, event.attempt) == (False, 4, (2,), 0)
    assert h.factory.calls == [] and outcome.attempts == 0


def test_a_fixed_size_job_stops_on_every_other_node_with_exit_5() -> None:
    h = four_nodes(0, NodeRange(min=4, max=4))
    outcome = run(h, FakeBattery(verdict(2)))
    assert outcome.status is Status.PREFLIGHT_STOPPED and outcome.exit_code == 5
    assert "node(s) 2 failed their preflight; 3 node(s) remain, fewer than the nnodes " \
        "minimum 4 (nnodes=4)" in outcome.reason  # fmt: skip
    assert h.factory.calls == []


def test_an_elastic_job_rejoins_without_the_failed_node_and_spends_no_restart() -> None:
    h = four_nodes(0, NodeRange(min=2, max=4))
    battery = FakeBattery(verdict(2), verdict(nodes=3))
    outcome = run(h, battery)
    assert outcome.status is Status.SUCCEEDED and outcome.restarts == 0
    assert h.rdzv.calls.count("next_round") == 2 and battery.checked == [(0, 0), (0, 0)]
    assert [c.node.group_world_size for c in h.factory.calls] == [3]
    assert outcome.preflight == verdict(nodes=3)


def test_too_few_left_in_an_elastic_job_stops_it() -> None:
    h = four_nodes(0, NodeRange(min=3, max=4))
    outcome = run(h, FakeBattery(verdict(1, 2)))
    assert outcome.status is Status.PREFLIGHT_STOPPED and "2 node(s) remain" in outcome.reason
