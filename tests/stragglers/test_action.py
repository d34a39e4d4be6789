"""What the agent does with a straggler (on fakes): report says so and goes on; fail ends the job
with the rank named; off, or a job without the hang watch's samples, never asks."""

from __future__ import annotations

import dataclasses

import pytest

from elastic_hydra.agent.events import Straggler
from elastic_hydra.agent.executor import Executor
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.plan import (
    HangSpec,
    LaunchPlan,
    PythonScript,
    StragglerAction,
    StragglerSpec,
)
from elastic_hydra.records.stragglers import Change, Score
from elastic_hydra.report.plan_view import describe_straggler
from tests.agent.test_executor import ALL_SUCCEED, FakeClock, Harness, harness, make_plan
from tests.conftest import WORKERS
from tests.harness import plan_of


class FakeStragglers:
    """Names rank 1 a straggler `after` seconds into the attempt (on the fake clock)."""

    def __init__(self, clock: FakeClock, after: float) -> None:
        self.clock, self.after, self.started, self.said, self.checks = clock, after, 0.0, False, 0

    def start(self, node: NodeAssignment, attempt: int, count: int) -> None:
        self.started = self.clock.now

    def check(self) -> list[Change]:
        self.checks += 1
        if self.said or self.clock.now - self.started < self.after:
            return []
        self.said = True
        return [Change(Score(rank=1, last=46, of=50, behind=0.18, op="gloo:all_reduce"),
                       named=True, threshold=0.02)]  # fmt: skip


def bootstrapped(plan: LaunchPlan) -> LaunchPlan:
    """The plan with its script run through the bootstrap (the score reads what it keeps)."""
    assert isinstance(plan.entrypoint, PythonScript)
    return dataclasses.replace(
        plan, entrypoint=dataclasses.replace(plan.entrypoint, bootstrap="/nowhere/bootstrap.py")
    )


def run_with(hang: HangSpec, action: StragglerAction) -> tuple[Harness, FakeStragglers, RunOutcome]:
    """The executor on fakes (both workers succeed), rank 1 named at the first check."""
    plan = dataclasses.replace(make_plan(), hang=hang, straggler=StragglerSpec(action=action))
    h = harness(ALL_SUCCEED, plan=bootstrapped(plan))
    watch = FakeStragglers(h.clock, 0.0)
    outcome = Executor(
        h.plan, rendezvous=h.rdzv, workers=h.factory, clock=h.clock, observer=h.observer,
        stop=h.stop, read_failure=h.read_failure, straggler=watch,
    ).run()  # fmt: skip
    return h, watch, outcome


@pytest.mark.parametrize("action", [StragglerAction.REPORT, StragglerAction.FAIL])
def test_report_goes_on_and_fail_ends_the_job_naming_the_rank(action: StragglerAction) -> None:
    h, _watch, outcome = run_with(HangSpec(timeout=300.0), action)
    (event,) = h.observer.of(Straggler)
    assert (event.rank, event.named, event.last, event.of, event.action) == (
        1,
        True,
        46,
        50,
        action,
    )
    if action is StragglerAction.FAIL:
        assert (outcome.status, outcome.exit_code) == (Status.FAILED, 1)
        assert outcome.reason == (
            "rank 1 arrives last at 46 of the last 50 collectives, median 180 ms behind"
            " (straggler.action=fail)"
        )
    else:
        assert outcome.status is Status.SUCCEEDED


@pytest.mark.parametrize(
    ("hang", "action"),
    [
        (HangSpec(timeout=300.0), StragglerAction.OFF),
        (HangSpec(timeout=None), StragglerAction.FAIL),
    ],
)
def test_off_or_without_the_hang_watch_the_score_is_never_asked(
    hang: HangSpec, action: StragglerAction
) -> None:
    h, watch, outcome = run_with(hang, action)
    assert (outcome.status, watch.checks, h.observer.of(Straggler)) == (Status.SUCCEEDED, 0, [])


def test_plan_says_the_rule_or_why_nothing_is_scored() -> None:
    script = f"script={WORKERS / 'idle.py'}"
    shown = {
        extra: " ".join(describe_straggler(plan_of(script, *extra)).split())
        for extra in [(), ("straggler.action=off",), ("hang.timeout=null",),
                      ("cmd=/bin/true", "script=null"), ("straggler.window=20",
                                                         "straggler.behind=0.05",
                                                         "straggler.action=fail")]
    }  # fmt: skip
    assert shown[()] == (
        "a rank that arrives last at 80% or more of its last 50 collectives (straggler.window) or"
        " 90% of the last 15, a median of at least 10 ms and 10% of the job's interval between"
        " collectives behind (straggler.behind), is named; cleared under 50% of the last 15;"
        " then report (straggler.action): nothing is stopped"
    )
    assert shown[("straggler.action=off",)] == "not scored: straggler.action=off"
    assert "(hang.timeout=null)" in shown[("hang.timeout=null",)]
    assert "(cmd= or bootstrap=false)" in shown[("cmd=/bin/true", "script=null")]
    fail = shown[("straggler.window=20", "straggler.behind=0.05", "straggler.action=fail")]
    assert "its last 20 collectives" in fail and "at least 50 ms" in fail
    assert fail.endswith("then fail (straggler.action): end the job, exit 1")
