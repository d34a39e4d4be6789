"""The agent loop on fakes: scripted worker groups, an in-memory rendezvous, a fake clock.

No subprocesses and no real sleeping: the fake group's `wait` jumps the fake clock to the next
scripted exit (or to a scripted signal, or by `timeout`), so every test runs in microseconds.
"""

from __future__ import annotations

import dataclasses
import itertools
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from elastic_hydra.agent.events import (
    ChangeKind,
    Event,
    EventKind,
    Finish,
    MembershipChange,
    RendezvousRound,
    Restart,
    SignalReceived,
    Stop,
    WorkerExited,
)
from elastic_hydra.agent.executor import SAVE_ASKED, Executor
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.agent.restart_policy import backoff_delay
from elastic_hydra.agent.seams import (
    Change,
    Exited,
    JobFailures,
    NodeAssignment,
    Observer,
)
from elastic_hydra.agent.worker_env import WorkerFiles, worker_env
from elastic_hydra.errors import EXIT_PREEMPTED_SAVED, RendezvousError
from elastic_hydra.plan import (
    Action,
    Backoff,
    Dynamic,
    DynamicBackend,
    Endpoint,
    FailureClass,
    LaunchPlan,
    NodeRange,
    PythonScript,
    RestartSpec,
    RestartWindow,
    Standalone,
)
from elastic_hydra.records.failures import FailureRecord, PeerChange, PeerFailure, WorkerExit
from elastic_hydra.rundir import RunDir

SIGTERM = int(signal.SIGTERM)
SIGKILL = int(signal.SIGKILL)
FOREVER = None  # a worker with no scripted exit runs until it is stopped
T0 = 1000.0  # the fake monotonic clock starts here
WALL_OFFSET = 1_700_000_000.0
MASTER = Endpoint(host="127.0.0.1", port=29500)

# attempt -> local_rank -> (returncode, seconds after the round's workers started)
Script = Mapping[int, Mapping[int, tuple[int, float]]]


# ------------------------------------------------------------------------------------------- fakes
class FakeStop:
    """The agent's stop flag; `at` schedules a signal to arrive at a fake monotonic time."""

    def __init__(self, signum: int | None = None) -> None:
        self.signum: int | None = signum
        self.pending: tuple[float, int] | None = None

    def at(self, when: float, signum: int) -> None:
        self.pending = (T0 + when, signum)


class FakeClock:
    """Time only moves when a fake waits or sleeps; a scheduled signal fires when it is reached."""

    def __init__(self, stop: FakeStop, u: float = 0.5) -> None:
        self.now = T0
        self.stop = stop
        self.u = u
        self.sleeps: list[float] = []

    def wall(self) -> float:
        return WALL_OFFSET + self.now

    def mono(self) -> float:
        return self.now

    def random(self) -> float:
        return self.u

    def next_signal(self) -> float | None:
        if self.stop.signum is None and self.stop.pending is not None:
            return self.stop.pending[0]
        return None

    def advance_to(self, when: float) -> None:
        self.now = max(self.now, when)
        if self.stop.pending is not None and self.stop.pending[0] <= self.now:
            if self.stop.signum is None:
                self.stop.signum = self.stop.pending[1]
            self.stop.pending = None

    def sleep(self, seconds: float) -> None:
        """Like the real clock: returns early (at the signal's time) when a stop is requested."""
        self.sleeps.append(seconds)
        if self.stop.signum is not None:
            return
        target = self.now + seconds
        arrives = self.next_signal()
        self.advance_to(arrives if arrives is not None and arrives <= target else target)


class FakeGroup:
    """One attempt's workers, exiting per a script; unscripted workers run until stopped."""

    def __init__(
        self,
        clock: FakeClock,
        nproc: int,
        script: Mapping[int, tuple[int, float]],
        pid_base: int,
        stuck: frozenset[int],
    ) -> None:
        self.clock = clock
        self.started = clock.now
        self.exits_at = {lr: (code, self.started + at) for lr, (code, at) in script.items()}
        self.alive = set(range(nproc))
        self.stuck = stuck
        self._pids = [pid_base + lr for lr in range(nproc)]
        self.waits: list[float | None] = []
        self.stops: list[tuple[int, float]] = []
        self.closed = False
        self.paused: list[int] = []

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def running(self) -> list[int]:
        return sorted(self.alive)

    def wait(self, timeout: float | None) -> list[Exited]:
        self.waits.append(timeout)
        if self.clock.stop.signum is not None:
            return []  # the signal left the wake pipe readable: return at once
        due = [t for lr, (_, t) in self.exits_at.items() if lr in self.alive]
        limit = None if timeout is None else self.clock.now + timeout
        wakes = [
            t for t in (min(due, default=None), self.clock.next_signal(), limit) if t is not None
        ]
        if not wakes:
            raise AssertionError("wait(None) with nothing scheduled would block forever")
        self.clock.advance_to(min(wakes))
        done = [
            lr
            for lr in sorted(self.alive)
            if lr in self.exits_at and self.exits_at[lr][1] <= self.clock.now
        ]
        self.alive -= set(done)
        return [self._exited(lr, self.exits_at[lr][0]) for lr in done]

    def stop(self, sig: int, grace: float) -> tuple[list[Exited], list[int]]:
        self.stops.append((sig, grace))
        gone = [lr for lr in sorted(self.alive) if lr not in self.stuck]
        self.alive -= set(gone)
        return [self._exited(lr, -sig) for lr in gone], [
            self._pids[lr] for lr in sorted(self.alive)
        ]

    def close(self) -> None:
        self.closed = True

    def _exited(self, local_rank: int, returncode: int) -> Exited:
        return Exited(
            local_rank=local_rank,
            pid=self._pids[local_rank],
            returncode=returncode,
            wall_time=self.clock.wall(),
            mono_time=self.clock.now,
        )


@dataclass
class Started:
    node: NodeAssignment
    restart_count: int
    attempt: int
    env: dict[str, str]
    group: FakeGroup


class FakeFactory:
    """Starts a FakeGroup per round from the script; records what each start was given."""

    def __init__(
        self,
        plan: LaunchPlan,
        clock: FakeClock,
        script: Script,
        stuck: Mapping[int, frozenset[int]] | None = None,
    ) -> None:
        self.plan = plan
        self.clock = clock
        self.script = script
        self.stuck = stuck or {}
        self.calls: list[Started] = []

    def __call__(self, node: NodeAssignment, attempt: int, restart_count: int) -> FakeGroup:
        index = len(self.calls)
        group = FakeGroup(
            self.clock,
            self.plan.nproc_per_node,
            self.script.get(index, {}),
            pid_base=1000 * (index + 1),
            stuck=self.stuck.get(index, frozenset()),
        )
        files = WorkerFiles(
            run_dir="/r",
            plan_path="/r/p",
            config_path="/r/c",
            error_file=str(RunDir(Path("/r")).error_file(attempt, 0)),
            fault_file="/r/f",
        )
        env = worker_env(
            self.plan, {}, node, local_rank=0, attempt=attempt, restart_count=restart_count,
            files=files,
        )  # fmt: skip
        self.calls.append(Started(node, restart_count, attempt, env, group))
        return group

    @property
    def groups(self) -> list[FakeGroup]:
        return [c.group for c in self.calls]


def assignment(*, nodes: int = 1, node_rank: int = 0, nproc: int = 2) -> NodeAssignment:
    return NodeAssignment(
        group_rank=node_rank,
        group_world_size=nodes,
        base_rank=node_rank * nproc,
        world_size=nodes * nproc,
        role_base_rank=node_rank * nproc,
        role_world_size=nodes * nproc,
        master=MASTER,
    )


class FakeRendezvous:
    """Hands out `rounds` in turn (the last one repeats); an exception in the list is raised."""

    def __init__(
        self,
        rounds: list[NodeAssignment | RendezvousError],
        waiting: list[int] | None = None,
        on_join: Any = None,
        changes: Sequence[Change | RendezvousError | None] | None = None,
    ) -> None:
        self.rounds = rounds
        joined: list[Change | RendezvousError | None] = [
            Change(kind=ChangeKind.JOINED, reason=f"{n} node(s) waiting to join") if n else None
            for n in waiting or []
        ]
        self.changes = joined + list(changes or [])
        self.on_join = on_join
        self.calls: list[str] = []
        self.published: list[FailureRecord] = []
        self.joins = 0

    def next_round(self) -> NodeAssignment:
        self.calls.append("next_round")
        result = self.rounds[min(self.joins, len(self.rounds) - 1)]
        self.joins += 1
        if self.on_join is not None:
            self.on_join()
        if isinstance(result, RendezvousError):
            raise result
        return result

    def poll(self) -> Change | None:
        self.calls.append("poll")
        change = self.changes.pop(0) if self.changes else None
        if isinstance(change, RendezvousError):
            raise change
        return change

    def publish_failure(self, record: FailureRecord) -> None:
        self.published.append(record)

    def end(self, status: Status, observer: Observer) -> JobFailures:
        self.calls.append("end")
        return JobFailures()

    def job_share(self) -> None:
        return None  # the executor never asks: the agent hands it to the hang watch

    def close(self) -> None:
        self.calls.append("close")


E = TypeVar("E", bound=Event)


@dataclass
class ListObserver:
    events: list[Event] = field(default_factory=list)

    def emit(self, event: Event) -> None:
        self.events.append(event)

    @property
    def kinds(self) -> list[EventKind]:
        return [e.kind for e in self.events]

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


# --------------------------------------------------------------------------------------- harness
def make_plan(
    *,
    nproc: int = 2,
    restart: RestartSpec | None = None,
    dynamic: bool = False,
    stop_grace: float = 7.5,
    monitor_interval: float = 0.5,
) -> LaunchPlan:
    rdzv: Standalone | Dynamic = Standalone()
    if dynamic:
        rdzv = Dynamic(
            backend=DynamicBackend.C10D,
            endpoint=Endpoint(host="node0", port=29400),
            join_timeout=600.0,
            last_call_timeout=30.0,
            close_timeout=30.0,
            heartbeat_timeout=30.0,
            keep_alive_interval=5.0,
            keep_alive_max_attempt=3,
            read_timeout=60.0,
        )
    return LaunchPlan(
        entrypoint=PythonScript(path="/nowhere/train.py", python="/usr/bin/python3"),
        nnodes=NodeRange(min=1, max=2 if dynamic else 1),
        nproc_per_node=nproc,
        rdzv=rdzv,
        run_id="test-run",
        restart=restart or RestartSpec(),
        stop_grace=stop_grace,
        monitor_interval=monitor_interval,
    )


@dataclass
class Harness:
    plan: LaunchPlan
    stop: FakeStop
    clock: FakeClock
    rdzv: FakeRendezvous
    factory: FakeFactory
    observer: ListObserver
    errors: dict[int, str] = field(default_factory=dict)  # a failed rank's error text
    reads: list[WorkerExit] = field(default_factory=list)  # each read of a failed worker's files
    saver: FakeSaver | None = None

    def read_failure(self, exit: WorkerExit) -> FailureRecord:
        self.reads.append(exit)
        record = FailureRecord.of(exit, host="node")
        return dataclasses.replace(record, message=self.errors.get(exit.rank, ""))

    def run(self) -> RunOutcome:
        executor = Executor(
            self.plan,
            rendezvous=self.rdzv,
            workers=self.factory,
            clock=self.clock,
            observer=self.observer,
            stop=self.stop,
            read_failure=self.read_failure,
            saver=self.saver,
        )
        return executor.run()


def harness(
    script: Script,
    *,
    plan: LaunchPlan | None = None,
    rdzv: FakeRendezvous | None = None,
    stuck: Mapping[int, frozenset[int]] | None = None,
    u: float = 0.5,
) -> Harness:
    plan = plan or make_plan()
    stop = FakeStop()
    clock = FakeClock(stop, u=u)
    rdzv = rdzv or FakeRendezvous([assignment(nproc=plan.nproc_per_node)])
    factory = FakeFactory(plan, clock, script, stuck)
    return Harness(plan, stop, clock, rdzv, factory, ListObserver())


def fail_every_round(rounds: int, code: int = 1, at: float = 60.0) -> Script:
    """Rank 1 exits with `code` `at` seconds into each round; rank 0 runs until stopped."""
    return {r: {1: (code, at)} for r in range(rounds)}


ALL_SUCCEED = {0: {0: (0, 1.0), 1: (0, 2.0)}}


# ------------------------------------------------------------------------------------- success
def test_success_in_one_attempt() -> None:
    h = harness(ALL_SUCCEED)
    outcome = h.run()

    assert outcome.status is Status.SUCCEEDED
    assert outcome.exit_code == 0
    assert outcome.attempts == 1
    assert outcome.root_cause is None
    assert [(e.rank, e.returncode, e.terminated_by_launcher) for e in outcome.exits] == [
        (0, 0, False),
        (1, 0, False),
    ]
    assert [e.mono_time for e in outcome.exits] == [T0 + 1.0, T0 + 2.0]
    assert len(h.factory.calls) == 1
    assert h.clock.sleeps == []
    (group,) = h.factory.groups
    assert group.closed
    # Standalone membership is fixed: event-driven waits with no timeout, no membership polling.
    assert group.waits and all(w is None for w in group.waits)
    assert "poll" not in h.rdzv.calls


def test_a_worker_exiting_0_early_does_not_end_the_attempt() -> None:
    h = harness({0: {0: (0, 1.0), 1: (5, 50.0)}})
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.root_cause is not None
    assert (outcome.root_cause.rank, outcome.root_cause.returncode) == (1, 5)
    assert outcome.exits[0].returncode == 0


# ------------------------------------------------------------------------------------- failure
def test_failure_without_restarts_blames_the_failing_rank_not_the_stopped_peers() -> None:
    plan = make_plan(nproc=3, restart=RestartSpec(max_restarts=0), stop_grace=4.0)
    h = harness({0: {2: (7, 3.0)}}, plan=plan)
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.exit_code == 1
    assert outcome.attempts == 1
    cause = outcome.root_cause
    assert cause is not None
    assert (cause.rank, cause.local_rank, cause.returncode) == (2, 2, 7)
    assert not cause.terminated_by_launcher
    peers = [e for e in outcome.exits if e is not cause]
    assert sorted(e.rank for e in peers) == [0, 1]
    assert all(e.terminated_by_launcher and e.returncode == -SIGTERM for e in peers)
    assert all(not e.failed for e in peers)
    (group,) = h.factory.groups
    assert group.stops == [(SIGTERM, 4.0)]
    assert group.closed
    assert "restart.max_restarts=0" in outcome.reason
    assert h.clock.sleeps == []
    assert EventKind.RESTART not in h.observer.kinds


def test_failure_then_success_restarts_once_with_a_higher_restart_count() -> None:
    plan = make_plan(restart=RestartSpec(max_restarts=1))
    h = harness({0: {1: (1, 5.0)}, 1: ALL_SUCCEED[0]}, plan=plan)
    outcome = h.run()

    assert outcome.status is Status.SUCCEEDED
    assert outcome.exit_code == 0
    assert outcome.attempts == 2
    assert [c.restart_count for c in h.factory.calls] == [0, 1]
    assert [c.attempt for c in h.factory.calls] == [0, 1]
    assert [c.env["TORCHELASTIC_RESTART_COUNT"] for c in h.factory.calls] == ["0", "1"]
    assert [c.env["TORCHELASTIC_MAX_RESTARTS"] for c in h.factory.calls] == ["1", "1"]
    assert h.rdzv.calls.count("next_round") == 2
    assert [e.attempt for e in outcome.exits] == [0, 0, 1, 1]
    # The failure of the first attempt is history; the run succeeded.
    assert outcome.root_cause is not None and outcome.root_cause.attempt == 0
    assert all(g.closed for g in h.factory.groups)


@pytest.mark.parametrize("max_restarts", [1, 2, 3])
def test_restart_budget_runs_out_after_max_restarts(max_restarts: int) -> None:
    plan = make_plan(restart=RestartSpec(max_restarts=max_restarts))
    h = harness(fail_every_round(max_restarts + 5), plan=plan)
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.exit_code == 1
    assert outcome.attempts == max_restarts + 1
    assert [c.restart_count for c in h.factory.calls] == list(range(max_restarts + 1))
    assert len(h.observer.of(Restart)) == max_restarts
    assert f"{max_restarts} of restart.max_restarts={max_restarts}" in outcome.reason
    assert h.observer.of(Finish)[-1].reason == outcome.reason
    # Root cause: the real failure that ended the job (the last attempt's), never a worker the
    # launcher stopped; the earlier attempts' failures stay in outcome.exits.
    assert outcome.root_cause is not None
    assert (outcome.root_cause.rank, outcome.root_cause.attempt) == (1, max_restarts)
    assert [e.attempt for e in outcome.exits if e.failed] == list(range(max_restarts + 1))


@pytest.mark.parametrize(
    ("jitter", "u"),
    [(0.0, 0.5), (0.0, 0.9), (0.5, 0.25), (0.2, 0.75)],
    ids=["no-jitter", "no-jitter-u-ignored", "jitter-low", "jitter-high"],
)
def test_backoff_delays_reach_clock_sleep(jitter: float, u: float) -> None:
    backoff = Backoff(initial=1.5, multiplier=3.0, maximum=100.0, jitter=jitter)
    plan = make_plan(restart=RestartSpec(max_restarts=3, backoff=backoff))
    h = harness(fail_every_round(4), plan=plan, u=u)
    outcome = h.run()

    expected = [backoff_delay(backoff, k, u) for k in (1, 2, 3)]
    assert h.clock.sleeps == pytest.approx(expected)
    assert [e.delay for e in h.observer.of(Restart)] == pytest.approx(expected)
    assert [e.restart for e in h.observer.of(Restart)] == [1, 2, 3]
    if jitter == 0.0:
        assert h.clock.sleeps == pytest.approx([1.5, 4.5, 13.5])
    assert outcome.attempts == 4
    # Each new attempt starts after its backoff: the clock shows the sleeps in the start times.
    starts = [g.started for g in h.factory.groups]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([60.0 + d for d in expected])


def test_restart_window_refuses_a_restart_after_the_window_filled() -> None:
    spec = RestartSpec(max_restarts=10, window=RestartWindow(max_restarts=2, seconds=100.0))
    h = harness(fail_every_round(10, at=10.0), plan=make_plan(restart=spec))
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.attempts == 3
    assert "restart.window_restarts=2" in outcome.reason


@pytest.mark.parametrize(
    ("returncode", "spec", "key"),
    [
        (3, RestartSpec(max_restarts=5, on_exit_code=((3, Action.FAIL),)), "restart.on_exit_code"),
        (
            -SIGKILL,
            RestartSpec(max_restarts=5, on_signal=((SIGKILL, Action.FAIL),)),
            "restart.on_signal",
        ),
    ],
    ids=["exit-code-rule", "signal-rule"],
)
def test_fail_rule_stops_without_restarting(returncode: int, spec: RestartSpec, key: str) -> None:
    h = harness({0: {0: (returncode, 2.0)}}, plan=make_plan(restart=spec))
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.exit_code == 1
    assert outcome.attempts == 1
    assert len(h.factory.calls) == 1
    assert h.clock.sleeps == []
    assert EventKind.RESTART not in h.observer.kinds
    finish = h.observer.of(Finish)[-1]
    assert key in finish.reason
    assert "set to fail" in finish.reason
    assert outcome.root_cause is not None and outcome.root_cause.returncode == returncode


def test_a_non_matching_exit_code_rule_still_restarts() -> None:
    spec = RestartSpec(max_restarts=1, on_exit_code=((3, Action.FAIL),))
    h = harness({0: {0: (4, 2.0)}, 1: ALL_SUCCEED[0]}, plan=make_plan(restart=spec))
    assert h.run().status is Status.SUCCEEDED
    assert len(h.factory.calls) == 2


@pytest.mark.parametrize(
    ("fails_at", "restarts"), [(1.0, False), (10.0, True)], ids=["within", "after"]
)
def test_fail_fast_measures_the_runtime_from_the_attempts_start(
    fails_at: float, restarts: bool
) -> None:
    spec = RestartSpec(max_restarts=2, fail_fast_seconds=5.0)
    # The second attempt starts ~50 s into the run: a runtime measured from the run's start
    # (instead of the attempt's) would never look fast.
    script = {0: {1: (1, 50.0)}, 1: {1: (1, fails_at)}, 2: ALL_SUCCEED[0]}
    h = harness(script, plan=make_plan(restart=spec))
    outcome = h.run()

    if restarts:
        assert outcome.status is Status.SUCCEEDED
        assert len(h.factory.calls) == 3
    else:
        assert outcome.status is Status.FAILED
        assert len(h.factory.calls) == 2
        assert "within restart.fail_fast_seconds=5" in outcome.reason


# ------------------------------------------------------------------------------------- signals
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name
)
def test_signal_while_workers_run_stops_them_with_that_signal(sig: signal.Signals) -> None:
    plan = make_plan(restart=RestartSpec(max_restarts=3), stop_grace=12.0)
    h = harness({0: {}}, plan=plan)
    h.stop.at(5.0, int(sig))
    outcome = h.run()

    assert outcome.status is Status.STOPPED
    assert outcome.exit_code == 128 + int(sig)
    assert outcome.signal == int(sig)
    assert outcome.attempts == 1
    (group,) = h.factory.groups
    assert group.stops == [(int(sig), 12.0)]
    assert group.closed
    assert h.clock.now == T0 + 5.0
    assert all(e.terminated_by_launcher and e.returncode == -int(sig) for e in outcome.exits)
    assert len(outcome.exits) == 2
    assert outcome.root_cause is None
    assert h.clock.sleeps == []
    kinds = h.observer.kinds
    assert kinds.index(EventKind.SIGNAL) < kinds.index(EventKind.STOP)  # cause, then effect
    assert kinds[-2:] == [EventKind.STOP, EventKind.FINISH]
    assert h.observer.of(Stop)[0].signal == sig.name
    assert h.observer.of(SignalReceived)[0].signal == sig.name
    finish = h.observer.of(Finish)[0]
    assert (finish.status, finish.exit_code) == (Status.STOPPED, 128 + int(sig))
    assert finish.failure_class is FailureClass.PREEMPTED


@dataclass
class FakeSaver:
    """The workers' snapshots: `kept` is what a save keeps (None: nothing to keep)."""

    kept: int | None
    asked_after: int | None = None  # looks at the store before another node's request is there
    calls: list[tuple[int, float, bool]] = field(default_factory=list)
    polls: int = 0

    def save(self, node: NodeAssignment, grace: float, running: Callable[[], bool]) -> int | None:
        self.calls.append((node.group_rank, grace, running()))
        return self.kept

    def asked(self) -> bool:
        self.polls += 1
        return self.asked_after is not None and self.polls > self.asked_after


@pytest.mark.parametrize("kept", [17, None])
def test_a_stop_signal_saves_the_snapshots_before_the_workers_stop(kept: int | None) -> None:
    plan = make_plan(stop_grace=12.0)
    h = harness({0: {}}, plan=plan)
    h.saver = FakeSaver(kept)
    h.stop.at(5.0, SIGTERM)
    outcome = h.run()

    assert h.saver.calls == [(0, 12.0, True)]  # asked while the workers still ran
    assert (outcome.status, outcome.saved) == (Status.STOPPED, kept)
    # "preempted, saved": run it again; nothing kept: the signal's code, as without snapshots
    assert outcome.exit_code == (EXIT_PREEMPTED_SAVED if kept is not None else 128 + SIGTERM)
    assert h.observer.of(Finish)[0].exit_code == outcome.exit_code
    (group,) = h.factory.groups
    assert group.stops == [(SIGTERM, 12.0)]  # then the workers stop as always


@pytest.mark.parametrize("kept", [17, None])
def test_a_save_another_node_was_asked_for_saves_here_too_and_stops(kept: int | None) -> None:
    plan = make_plan(dynamic=True, monitor_interval=0.5, stop_grace=12.0)
    h = harness({0: {}}, plan=plan)
    h.saver = FakeSaver(kept, asked_after=2)
    outcome = h.run()

    assert h.saver.calls == [(0, 12.0, True)]  # at the third look, while the workers ran
    assert (outcome.status, outcome.saved, outcome.reason) == (Status.STOPPED, kept, SAVE_ASKED)
    assert outcome.exit_code == (EXIT_PREEMPTED_SAVED if kept is not None else 128 + SIGTERM)
    (group,) = h.factory.groups
    assert group.waits == [0.5, 0.5, 0.5]
    assert group.stops == [(SIGTERM, 12.0)]
    assert outcome.root_cause is None  # no rank failed: nothing to blame


def test_a_single_node_never_asks_the_store_for_a_save_request() -> None:
    h = harness(ALL_SUCCEED)  # standalone: fixed membership, no store to look at
    h.saver = FakeSaver(3, asked_after=0)
    outcome = h.run()
    assert (outcome.status, h.saver.polls, h.saver.calls) == (Status.SUCCEEDED, 0, [])


def test_a_signal_during_a_backoff_keeps_what_the_earlier_attempts_left() -> None:
    plan = make_plan(restart=RestartSpec(max_restarts=3, backoff=Backoff(initial=30.0)))
    h = harness(fail_every_round(4, at=10.0), plan=plan)
    h.saver = FakeSaver(3)
    h.stop.at(13.0, SIGTERM)
    outcome = h.run()
    assert h.saver.calls == [(0, 0.0, False)]  # no worker to wait for
    assert outcome.exit_code == EXIT_PREEMPTED_SAVED


def test_signal_during_backoff_stops_without_another_attempt() -> None:
    backoff = Backoff(initial=30.0, maximum=30.0)
    plan = make_plan(restart=RestartSpec(max_restarts=3, backoff=backoff))
    h = harness(fail_every_round(4, at=10.0), plan=plan)
    h.stop.at(10.0 + 3.0, SIGTERM)  # 3 s into the 30 s backoff
    outcome = h.run()

    assert outcome.status is Status.STOPPED
    assert outcome.exit_code == 128 + SIGTERM
    assert len(h.factory.calls) == 1
    assert h.rdzv.calls.count("next_round") == 1
    assert h.clock.sleeps == [30.0]
    assert h.clock.now == T0 + 13.0  # the sleep returned when the signal came
    assert h.observer.kinds[-2:] == [EventKind.SIGNAL, EventKind.FINISH]
    assert outcome.root_cause is not None and outcome.root_cause.rank == 1


def test_signal_during_backoff_counts_only_the_attempts_that_ran() -> None:
    plan = make_plan(restart=RestartSpec(max_restarts=3, backoff=Backoff(initial=30.0)))
    h = harness(fail_every_round(4, at=10.0), plan=plan)
    h.stop.at(13.0, SIGTERM)
    outcome = h.run()

    assert len(h.factory.calls) == 1
    assert outcome.attempts == 1
    assert h.observer.of(Finish)[0].attempts == 1


def test_a_signal_before_the_start_starts_nothing() -> None:
    h = harness({0: {}})
    h.stop.signum = int(signal.SIGINT)
    outcome = h.run()

    assert outcome.status is Status.STOPPED
    assert outcome.exit_code == 130
    assert h.rdzv.calls == []
    assert h.factory.calls == []
    assert h.observer.kinds == [EventKind.SIGNAL, EventKind.FINISH]


def test_a_signal_during_rendezvous_starts_no_workers() -> None:
    h = harness({0: {}})
    h.rdzv.on_join = lambda: setattr(h.stop, "signum", SIGTERM)
    outcome = h.run()

    assert outcome.status is Status.STOPPED
    assert outcome.exit_code == 128 + SIGTERM
    assert h.factory.calls == []


# ---------------------------------------------------------------------------------- rendezvous
def test_rendezvous_error_fails_with_exit_code_3_and_starts_no_workers() -> None:
    error = RendezvousError("rdzv.endpoint: node0:29400 is unreachable")
    h = harness({0: {}}, rdzv=FakeRendezvous([error]))
    outcome = h.run()

    assert outcome.status is Status.RENDEZVOUS_FAILED
    assert outcome.exit_code == 3
    assert outcome.reason == str(error)
    assert h.factory.calls == []
    assert outcome.exits == ()
    assert h.observer.kinds == [EventKind.JOINING, EventKind.FINISH]
    assert h.observer.of(Finish)[0].exit_code == 3
    assert outcome.failure_class is FailureClass.INFRA


def test_rendezvous_error_on_the_rejoin_after_a_restart() -> None:
    rdzv = FakeRendezvous([assignment(), RendezvousError("closed")])
    plan = make_plan(restart=RestartSpec(max_restarts=3))
    h = harness(fail_every_round(4), plan=plan, rdzv=rdzv)
    outcome = h.run()

    assert outcome.status is Status.RENDEZVOUS_FAILED
    assert outcome.exit_code == 3
    assert len(h.factory.calls) == 1
    assert outcome.root_cause is not None and outcome.root_cause.rank == 1


def test_membership_change_rerendezvous_without_spending_the_restart_budget() -> None:
    first = assignment(nodes=1, node_rank=0)
    second = assignment(nodes=2, node_rank=1)  # a node joined and sorted before us
    rdzv = FakeRendezvous([first, second], waiting=[0, 0, 1])
    plan = make_plan(dynamic=True, monitor_interval=0.5, restart=RestartSpec(max_restarts=0))
    h = harness({0: {}, 1: ALL_SUCCEED[0]}, plan=plan, rdzv=rdzv)
    outcome = h.run()

    assert outcome.status is Status.SUCCEEDED
    # Two starts of the worker group, no restart: max_restarts=0, and no budget was spent.
    assert (outcome.attempts, outcome.restarts) == (2, 0)
    assert [c.restart_count for c in h.factory.calls] == [0, 0]
    assert [c.attempt for c in h.factory.calls] == [0, 1]
    assert [c.env["TORCHELASTIC_RESTART_COUNT"] for c in h.factory.calls] == ["0", "0"]
    assert [c.env["WORLD_SIZE"] for c in h.factory.calls] == ["2", "4"]
    assert [c.env["RANK"] for c in h.factory.calls] == ["0", "2"]
    assert h.clock.sleeps == []
    assert EventKind.RESTART not in h.observer.kinds
    old, new = h.factory.groups
    # Dynamic membership: poll with the monitor interval; the third poll saw a waiting node.
    assert old.waits == [0.5, 0.5, 0.5]
    assert old.stops == [(SIGTERM, plan.stop_grace)]
    assert old.closed and new.closed
    assert [d.attempt for d in h.observer.of(RendezvousRound)] == [0, 1]
    assert [d.nodes for d in h.observer.of(RendezvousRound)] == [1, 2]
    stopped = [e for e in outcome.exits if e.terminated_by_launcher]
    assert sorted(e.rank for e in stopped) == [0, 1]
    assert sorted(e.rank for e in outcome.exits if not e.terminated_by_launcher) == [2, 3]
    assert outcome.root_cause is None


def test_failure_after_a_membership_change_spends_the_first_restart() -> None:
    rdzv = FakeRendezvous([assignment()], waiting=[1])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=1))
    script = {0: {}, 1: {0: (9, 4.0)}, 2: ALL_SUCCEED[0]}
    h = harness(script, plan=plan, rdzv=rdzv)
    outcome = h.run()

    assert outcome.status is Status.SUCCEEDED
    assert (outcome.attempts, outcome.restarts) == (3, 1)
    assert [c.restart_count for c in h.factory.calls] == [0, 0, 1]
    assert [c.attempt for c in h.factory.calls] == [0, 1, 2]
    # "attempt" is one thing: a worker of the n-th start reads n and logs to attempt_<n>/ (it
    # read the restart count before: 0 in attempt_1/ after the membership change).
    envs = [c.env for c in h.factory.calls]
    assert [e["ELASTIC_HYDRA_ATTEMPT"] for e in envs] == ["0", "1", "2"]
    assert [e["TORCHELASTIC_RESTART_COUNT"] for e in envs] == ["0", "0", "1"]
    assert [Path(e["TORCHELASTIC_ERROR_FILE"]).parent.parent.name for e in envs] == [
        "attempt_0", "attempt_1", "attempt_2",
    ]  # fmt: skip
    # The launcher-stopped workers of round 0 are never the root cause of round 1's failure.
    assert outcome.root_cause is not None
    assert (outcome.root_cause.rank, outcome.root_cause.returncode) == (0, 9)


def test_a_departed_node_rerendezvous_without_spending_a_restart() -> None:
    left = Change(kind=ChangeKind.LEFT, reason="node b left the job", nodes=1)
    rdzv = FakeRendezvous([assignment(nodes=2), assignment(nodes=1)], changes=[None, left])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=0))
    h = harness({0: {}, 1: ALL_SUCCEED[0]}, plan=plan, rdzv=rdzv)
    outcome = h.run()

    assert outcome.status is Status.SUCCEEDED
    assert [c.restart_count for c in h.factory.calls] == [0, 0]
    assert [c.env["WORLD_SIZE"] for c in h.factory.calls] == ["4", "2"]
    (event,) = h.observer.of(MembershipChange)
    assert (event.change, event.reason, event.nodes) == (ChangeKind.LEFT, "node b left the job", 1)
    assert event.collateral == () and "collateral" not in event.to_json()


LOST_PEER = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1961."
TORCHRUN_NODE = PeerFailure(
    node="10.0.0.1, pid 42", node_rank=0, ranks="0-1", what=PeerChange.RESTARTED,
    rdzv_round=0, time=5.0,
)  # fmt: skip


def test_workers_that_fail_because_a_node_died_are_its_collateral_in_an_elastic_job() -> None:
    # Rank 0's collective broke at 1.2 s when node b died; the heartbeats tell 3 polls later.
    left = Change(kind=ChangeKind.LEFT, reason="node b left the job", nodes=1)
    rdzv = FakeRendezvous([assignment(nodes=2), assignment(nodes=1)], changes=[None] * 5 + [left])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=0))  # nnodes=1:2
    h = harness({0: {0: (1, 1.2)}, 1: ALL_SUCCEED[0]}, plan=plan, rdzv=rdzv)
    h.errors[0] = LOST_PEER
    outcome = h.run()

    assert outcome.status is Status.SUCCEEDED  # restarts are off, and none was needed
    assert (outcome.attempts, outcome.restarts) == (2, 0)
    (broken,) = [e for e in outcome.exits if e.returncode == 1]
    assert broken.after_node_loss and not broken.failed
    (record,) = [r for r in outcome.failures if r.returncode == 1]
    assert record.after_node_loss and not record.failed  # its record says the same
    assert rdzv.published == []  # no node is told of a failure that was not one
    (event,) = h.observer.of(MembershipChange)
    assert event.change is ChangeKind.LEFT
    assert EventKind.RESTART not in h.observer.kinds


def test_a_real_failure_in_an_elastic_job_counts_at_once() -> None:
    rdzv = FakeRendezvous([assignment(nodes=2)])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=0))
    h = harness({0: {0: (1, 1.2)}}, plan=plan, rdzv=rdzv)
    h.errors[0] = "ValueError: boom"
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.root_cause is not None and outcome.root_cause.rank == 0
    assert [e.rank for e in rdzv.published] == [0]
    assert h.clock.now - T0 < 1.2 + 2.0 + 1  # no wait for the departure bound


def test_a_failed_workers_files_are_read_once_for_the_check_the_store_and_the_summary() -> None:
    rdzv = FakeRendezvous([assignment(nodes=2)])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=0))
    h = harness({0: {0: (1, 1.2)}}, plan=plan, rdzv=rdzv)
    h.errors[0] = "ValueError: boom"
    outcome = h.run()

    # Rank 0 failed (checked for a lost peer, then published); rank 1 was stopped.
    assert sorted((r.rank, r.terminated_by_launcher) for r in outcome.failures) == [
        (0, False),
        (1, True),
    ]
    assert sorted(e.rank for e in h.reads) == [0, 1]
    (published,) = rdzv.published
    (cause,) = [r for r in outcome.failures if r.failed]
    assert published is cause and cause.message == "ValueError: boom"


def test_a_ranks_own_fault_is_not_collateral_of_the_restart_it_caused() -> None:
    # Our rank 0 raised at 1.2 s; the other node's ranks broke with it and its agent restarted
    # them at once (the poll after the fault sees it). That restart must not turn our fault into
    # its collateral: it is the root cause, published, and (restarts off) ends the job.
    restarted = Change(
        kind=ChangeKind.JOINED, reason="node 0 (torchrun agent) restarted its workers", nodes=1,
        peers=(TORCHRUN_NODE,),
    )  # fmt: skip
    rdzv = FakeRendezvous([assignment(nodes=2)] * 2, changes=[None, None, restarted])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=0))  # nnodes=1:2
    h = harness({0: {0: (1, 1.2)}, 1: ALL_SUCCEED[0]}, plan=plan, rdzv=rdzv)
    h.errors[0] = "ValueError: boom"
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.root_cause is not None and outcome.root_cause.rank == 0
    assert not outcome.root_cause.after_node_loss
    assert [e.rank for e in rdzv.published] == [0]
    assert h.observer.of(MembershipChange) == []


def test_an_elastic_job_alone_in_its_round_never_waits_for_another_node() -> None:
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=1))  # nnodes=1:2, one node
    rdzv = FakeRendezvous([assignment(nodes=1)] * 2)
    h = harness({0: {0: (1, 1.2)}, 1: ALL_SUCCEED[0]}, plan=plan, rdzv=rdzv)
    h.errors[0] = LOST_PEER  # e.g. a store of its own it lost
    outcome = h.run()

    assert (outcome.status, outcome.restarts) == (Status.SUCCEEDED, 1)
    assert h.clock.now - T0 < 1.2 + 2.0 + 1


def fixed_two_nodes(max_restarts: int) -> LaunchPlan:
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=max_restarts))
    return dataclasses.replace(plan, nnodes=NodeRange(min=2, max=2))


def test_ranks_that_lost_a_peer_which_then_restarted_are_its_collateral_in_a_fixed_job() -> None:
    # A torchrun node's worker failed; ours broke in its collective at 1.2 s and 1.3 s; its agent
    # re-joins the rendezvous at the second poll after the first break (polls: 0.5, 1.0, 1.2...)
    restarted = Change(
        kind=ChangeKind.JOINED, reason="node 0 (torchrun agent) restarted its workers", nodes=1,
        peers=(TORCHRUN_NODE,),
    )  # fmt: skip
    rdzv = FakeRendezvous(
        [assignment(nodes=2, node_rank=1), assignment(nodes=2, node_rank=1)],
        changes=[None, None, None, restarted],
    )
    h = harness({0: {0: (1, 1.2), 1: (1, 1.3)}, 1: ALL_SUCCEED[0]}, plan=fixed_two_nodes(0),
                rdzv=rdzv)  # fmt: skip
    h.errors.update({2: LOST_PEER, 3: LOST_PEER})
    outcome = h.run()

    assert outcome.status is Status.SUCCEEDED  # restarts are off, and none was needed
    assert (outcome.attempts, outcome.restarts) == (2, 0)
    broken = [e for e in outcome.exits if e.returncode == 1]
    assert [e.rank for e in broken] == [2, 3] and all(e.after_node_loss for e in broken)
    assert rdzv.published == [] and outcome.root_cause is None
    assert outcome.peer_failures == (TORCHRUN_NODE,)
    (event,) = h.observer.of(MembershipChange)
    assert event.collateral == (2, 3)


def test_a_ranks_own_fault_in_a_fixed_job_restarts_at_once() -> None:
    rdzv = FakeRendezvous([assignment(nodes=2, node_rank=1)] * 2)
    h = harness({0: {0: (1, 1.2)}, 1: ALL_SUCCEED[0]}, plan=fixed_two_nodes(1), rdzv=rdzv)
    h.errors[2] = "ValueError: boom"
    outcome = h.run()

    assert (outcome.status, outcome.restarts) == (Status.SUCCEEDED, 1)
    assert [e.rank for e in rdzv.published] == [2]
    (restart,) = h.observer.of(Restart)
    assert restart.rank == 2 and h.clock.sleeps == [0.0]
    assert h.clock.now - T0 < 1.2 + 2.0 + 1  # no wait for the rendezvous: 3.2 s in all


def test_a_one_node_dynamic_job_never_waits_for_another_node() -> None:
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=1))
    plan = dataclasses.replace(plan, nnodes=NodeRange(min=1, max=1))  # torchrun --nnodes=1 c10d
    h = harness({0: {0: (1, 1.2)}, 1: ALL_SUCCEED[0]}, plan=plan)
    h.errors[0] = LOST_PEER  # e.g. a store of its own it lost
    outcome = h.run()

    assert (outcome.status, outcome.restarts) == (Status.SUCCEEDED, 1)
    assert h.clock.now - T0 < 1.2 + 2.0 + 1


def test_a_stop_signal_during_the_wait_stops_the_node_and_blames_nobody() -> None:
    rdzv = FakeRendezvous([assignment(nodes=2, node_rank=1)])
    h = harness({0: {0: (1, 1.2)}}, plan=fixed_two_nodes(2), rdzv=rdzv)
    h.errors[2] = LOST_PEER
    h.stop.at(5.0, SIGTERM)
    outcome = h.run()

    assert outcome.status is Status.STOPPED and outcome.exit_code == 128 + SIGTERM
    assert rdzv.published == [] and outcome.restarts == 0
    assert h.clock.now - T0 < 5.0 + 1


def test_a_peer_loss_that_no_node_explains_is_a_failure_after_the_bound() -> None:
    rdzv = FakeRendezvous([assignment(nodes=2, node_rank=1)])
    h = harness({0: {0: (1, 1.2)}}, plan=fixed_two_nodes(0), rdzv=rdzv)
    h.errors[2] = LOST_PEER
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert outcome.root_cause is not None and outcome.root_cause.rank == 2
    assert [e.rank for e in rdzv.published] == [2]
    assert 1.2 + 22 <= h.clock.now - T0 < 1.2 + 22 + 1  # departure bound, a heartbeat, 2 s


def test_a_fault_of_this_nodes_own_during_the_wait_ends_it() -> None:
    # Rank 2 lost its peer: rank 3 of this node died of its own fault at 2 s.
    rdzv = FakeRendezvous([assignment(nodes=2, node_rank=1)])
    h = harness({0: {0: (1, 1.2), 1: (1, 2.0)}}, plan=fixed_two_nodes(0), rdzv=rdzv)
    h.errors.update({2: LOST_PEER, 3: "ValueError: boom"})
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert sorted(e.rank for e in rdzv.published) == [2, 3]
    assert h.clock.now - T0 < 2.5  # no wait for the departure bound


def test_a_node_loss_below_the_minimum_ends_an_elastic_job_at_once_without_blame() -> None:
    left = Change(kind=ChangeKind.LEFT, reason="node b left the job", nodes=1)
    rdzv = FakeRendezvous([assignment(nodes=2)], changes=[None, None, left])
    plan = dataclasses.replace(
        make_plan(dynamic=True, restart=RestartSpec(max_restarts=3)), nnodes=NodeRange(min=2, max=3)
    )
    h = harness({0: {0: (1, 1.2)}}, plan=plan, rdzv=rdzv)
    h.errors[0] = LOST_PEER
    outcome = h.run()

    assert outcome.status is Status.RENDEZVOUS_FAILED and outcome.exit_code == 3
    assert "fewer than the nnodes minimum 2" in outcome.reason
    assert outcome.failure_class is FailureClass.NODE_LOST
    assert outcome.reason.endswith("(rank(s) 0 failed with it)")
    assert outcome.restarts == 0 and outcome.root_cause is None
    assert len(h.factory.calls) == 1  # no restart, no wait for join_timeout


def test_fewer_nodes_than_the_minimum_stop_the_job_with_the_rendezvous_exit_code() -> None:
    left = Change(kind=ChangeKind.LEFT, reason="node b left the job", nodes=1)
    rdzv = FakeRendezvous([assignment(nodes=2)], changes=[left])
    plan = dataclasses.replace(make_plan(dynamic=True), nnodes=NodeRange(min=2, max=3))
    h = harness({0: {}}, plan=plan, rdzv=rdzv)
    outcome = h.run()

    assert outcome.status is Status.RENDEZVOUS_FAILED
    assert outcome.exit_code == 3
    assert outcome.reason.startswith("node b left the job; 1 node(s) remain, fewer than the")
    assert "nnodes=2:3" in outcome.reason
    assert all(e.terminated_by_launcher for e in outcome.exits)  # nobody failed: none blamed
    assert len(h.factory.calls) == 1


def test_a_job_ended_on_another_node_fails_here_without_a_restart() -> None:
    closed = Change(kind=ChangeKind.CLOSED, reason="another node ended the job")
    rdzv = FakeRendezvous([assignment(nodes=2)], changes=[closed])
    plan = make_plan(dynamic=True, restart=RestartSpec(max_restarts=3))
    h = harness({0: {}}, plan=plan, rdzv=rdzv)
    outcome = h.run()

    assert (outcome.status, outcome.exit_code) == (Status.FAILED, 1)
    assert outcome.reason == "another node ended the job"
    assert len(h.factory.calls) == 1
    assert EventKind.RESTART not in h.observer.kinds


def test_a_lost_store_while_running_stops_the_workers_with_the_rendezvous_exit_code() -> None:
    rdzv = FakeRendezvous([assignment(nodes=2)], changes=[RendezvousError("lost the store")])
    h = harness({0: {}}, plan=make_plan(dynamic=True), rdzv=rdzv)
    outcome = h.run()

    assert (outcome.status, outcome.exit_code, outcome.reason) == (
        Status.RENDEZVOUS_FAILED,
        3,
        "lost the store",
    )
    (group,) = h.factory.groups
    assert group.stops and group.closed


def test_real_failures_are_published_to_the_other_nodes_and_stopped_ranks_are_not() -> None:
    rdzv = FakeRendezvous([assignment(nodes=2)])
    plan = make_plan(dynamic=True)
    h = harness(fail_every_round(1), plan=plan, rdzv=rdzv)
    outcome = h.run()

    assert outcome.status is Status.FAILED
    assert [(e.rank, e.returncode) for e in rdzv.published] == [(1, 1)]


# -------------------------------------------------------------------------------------- events
def test_events_tell_the_story_in_order() -> None:
    backoff = Backoff(initial=2.0)
    plan = make_plan(restart=RestartSpec(max_restarts=1, backoff=backoff))
    h = harness({0: {1: (1, 3.0)}, 1: ALL_SUCCEED[0]}, plan=plan)
    outcome = h.run()

    first, second = h.factory.groups
    expected: list[tuple[EventKind, dict[str, Any]]] = [
        (EventKind.JOINING, {"attempt": 0}),
        (EventKind.RENDEZVOUS, {"attempt": 0, "node_rank": 0, "nodes": 1, "world_size": 2}),
        (EventKind.WORKERS_STARTED, {"pids": first.pids, "attempt": 0}),
        (EventKind.WORKER_EXITED, {"rank": 1, "pid": first.pids[1], "returncode": 1,
                                   "terminated_by_launcher": False, "attempt": 0}),
        (EventKind.WORKER_EXITED, {"rank": 0, "pid": first.pids[0], "returncode": -SIGTERM,
                                   "terminated_by_launcher": True, "attempt": 0}),
        (EventKind.STOP, {"signal": "SIGTERM", "stopped_ranks": [0], "stuck_pids": []}),
        (EventKind.RESTART, {"delay": 2.0, "restart": 1}),
        (EventKind.JOINING, {"attempt": 1}),
        (EventKind.RENDEZVOUS, {"attempt": 1}),
        (EventKind.WORKERS_STARTED, {"pids": second.pids, "attempt": 1}),
        (EventKind.WORKER_EXITED, {"rank": 0, "returncode": 0, "attempt": 1}),
        (EventKind.WORKER_EXITED, {"rank": 1, "returncode": 0, "attempt": 1}),
        (EventKind.FINISH, {"status": "succeeded", "exit_code": 0, "attempts": 2}),
    ]  # fmt: skip
    assert h.observer.kinds == [kind for kind, _ in expected]
    for event, (want_kind, want) in zip(h.observer.events, expected, strict=True):
        assert event.kind is want_kind
        line = event.to_json()  # as events.jsonl has it
        assert {k: line[k] for k in want} == want, want_kind
    assert h.observer.of(RendezvousRound)[0].master == "127.0.0.1:29500"
    assert first.pids != second.pids
    assert "restart 1 of 1 after exit code 1" in h.observer.of(Restart)[0].reason
    assert h.observer.of(WorkerExited)[0].exit == "exit code 1"
    assert outcome.reason == h.observer.of(Finish)[0].reason


# ------------------------------------------------------------------------------------- stuck
def test_pids_that_would_not_die_are_reported() -> None:
    plan = make_plan(nproc=3, restart=RestartSpec(max_restarts=0))
    h = harness({0: {0: (1, 2.0)}}, plan=plan, stuck={0: frozenset({2})})
    outcome = h.run()

    (group,) = h.factory.groups
    assert outcome.status is Status.FAILED
    assert outcome.stuck_pids == (group.pids[2],)
    assert h.observer.of(Stop)[0].stuck_pids == (group.pids[2],)
    assert [e.rank for e in outcome.exits] == [0, 1]  # the stuck one never exited
    assert group.closed


def test_stuck_pids_accumulate_across_attempts_and_signals() -> None:
    plan = make_plan(restart=RestartSpec(max_restarts=2))
    h = harness({0: {1: (1, 2.0)}, 1: {}}, plan=plan, stuck={0: frozenset({0}), 1: frozenset({1})})
    h.stop.at(100.0, SIGTERM)
    outcome = h.run()

    first, second = h.factory.groups
    assert outcome.status is Status.STOPPED
    assert outcome.stuck_pids == (first.pids[0], second.pids[1])


# ------------------------------------------------------------------------------ lost exits
def test_every_exit_of_one_wait_batch_is_recorded() -> None:
    plan = make_plan(nproc=3, restart=RestartSpec(max_restarts=0))
    # Ranks 0 and 1 die at the same instant: one wait() returns both.
    h = harness({0: {0: (1, 2.0), 1: (2, 2.0)}}, plan=plan)
    outcome = h.run()

    assert sorted((e.rank, e.returncode) for e in outcome.exits) == [(0, 1), (1, 2), (2, -SIGTERM)]
    assert len(h.observer.of(WorkerExited)) == 3
