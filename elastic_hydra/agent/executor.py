"""The agent loop: rendezvous -> start workers -> monitor -> restart policy -> finish.

Composed of injected seams (rendezvous, worker-group factory, clock, observer) so that tests can
drive it with fakes. It never prints and never sees a DictConfig.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from elastic_hydra.agent import events, restart_policy
from elastic_hydra.agent.outcome import RunOutcome, Status, root_cause
from elastic_hydra.agent.seams import (
    ChangeKind,
    Clock,
    Exited,
    HangWatch,
    NodeAssignment,
    Observer,
    Rendezvous,
    StopRequest,
    WorkerGroup,
    WorkerGroupFactory,
)
from elastic_hydra.errors import LogWriteError, RendezvousError, WorkerStartError
from elastic_hydra.plan import Action, Dynamic, HangAction, LaunchPlan, Standalone, Static
from elastic_hydra.records import (
    FailureRecord,
    HangRecord,
    PeerFailure,
    WorkerExit,
    describe_returncode,
    lost_a_peer,
)

STOP_SIGNAL_WINDOW = 0.5  # seconds a worker's death by a stop signal waits for the agent's own
_STOP_SIGNAL_NAMES = {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}


class _Ended(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MEMBERSHIP = "membership"
    ENDED_ELSEWHERE = "ended_elsewhere"
    LOGS_FAILED = "logs_failed"
    RENDEZVOUS_LOST = "rendezvous_lost"
    STOPPED = "stopped"
    HUNG = "hung"  # hang.action=restart: a failure under the restart policy
    HUNG_FAIL = "hung_fail"  # hang.action=fail


@dataclass(slots=True)
class _State:
    restarts: int = 0  # restarts for failures (TORCHELASTIC_RESTART_COUNT)
    restart_times: list[float] = field(default_factory=list)
    attempts: int = 0  # starts of the worker group: after failures and membership changes
    exits: list[WorkerExit] = field(default_factory=list)
    # Each exit's failure record by (attempt, local rank): its files read once, for all uses.
    failures: dict[tuple[int, int], FailureRecord] = field(default_factory=dict)
    stuck: list[int] = field(default_factory=list)
    node: NodeAssignment | None = None
    reason: str = ""
    hang: HangRecord | None = None
    peers: list[PeerFailure] = field(default_factory=list)


class Executor:
    """Runs one plan on this node to its outcome."""

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        rendezvous: Rendezvous,
        workers: WorkerGroupFactory,
        clock: Clock,
        observer: Observer,
        stop: StopRequest,
        read_failure: Callable[[WorkerExit], FailureRecord],
        hang: HangWatch | None = None,
    ) -> None:
        self.plan = plan
        self.rdzv = rendezvous
        self.start_workers = workers
        self.clock = clock
        self.observer = observer
        self.stop_request = stop
        self.state = _State()
        self.read_failure = read_failure  # a failed worker's record, from its files
        # Only dynamic rendezvous can change membership; otherwise wait for exits alone.
        fixed = isinstance(plan.rdzv, (Standalone, Static))
        self.check_every: float | None = None if fixed else plan.monitor_interval
        self.hang = hang if plan.hang.timeout is not None else None
        if self.hang is not None:  # look at the workers' progress as often as they sample it
            self.check_every = min(self.check_every or plan.hang.sample, plan.hang.sample)

    def run(self) -> RunOutcome:
        """Rendezvous, start, monitor and restart until success, final failure or a signal."""
        while True:
            if (stopped := self._stopped()) is not None:
                return stopped
            try:
                node = self._rendezvous()
            except RendezvousError as exc:
                return self._stopped() or self._finish(Status.RENDEZVOUS_FAILED, str(exc))
            if (stopped := self._stopped()) is not None:  # a signal during the rendezvous
                return stopped
            self.state.node = node
            try:
                group = self.start_workers(node, self.state.attempts, self.state.restarts)
            except WorkerStartError as exc:  # retrying would fail the same way
                self.state.attempts += 1
                return self._finish(Status.FAILED, str(exc))
            started = self.clock.mono()
            self.observer.emit(
                events.WorkersStarted(
                    **self._now(), pids=tuple(group.pids), attempt=self.state.attempts
                )
            )
            if self.hang is not None:
                self._watch_hangs(group, node)
            ended, reason = self._monitor(group, node)
            self._stop_group(group, ended, reason)
            self.state.attempts += 1
            if ended is _Ended.SUCCEEDED:
                return self._finish(Status.SUCCEEDED, reason)
            if ended is _Ended.STOPPED:
                return self._finish(Status.STOPPED, reason, self.stop_request.signum)
            if ended in (_Ended.ENDED_ELSEWHERE, _Ended.LOGS_FAILED):
                return self._finish(Status.FAILED, reason)
            if ended is _Ended.RENDEZVOUS_LOST:
                return self._finish(Status.RENDEZVOUS_FAILED, reason)
            if ended is _Ended.HUNG_FAIL:
                return self._finish(Status.FAILED, reason)
            if ended in (_Ended.FAILED, _Ended.HUNG) and not self._restart(started, ended):
                return self._finish(Status.FAILED, self.state.reason)

    def _rendezvous(self) -> NodeAssignment:
        self.observer.emit(events.Joining(**self._now(), attempt=self.state.attempts))
        node = self.rdzv.next_round()
        self.observer.emit(
            events.RendezvousRound(
                **self._now(),
                attempt=self.state.attempts,
                node_rank=node.group_rank,
                nodes=node.group_world_size,
                world_size=node.world_size,
                master=str(node.master),
            )
        )
        return node

    def _monitor(self, group: WorkerGroup, node: NodeAssignment) -> tuple[_Ended, str]:
        while True:
            try:
                records = [self._record(exited, node) for exited in group.wait(self.check_every)]
            except LogWriteError as exc:  # a full disk: stop, say why (no restart would help)
                return _Ended.LOGS_FAILED, str(exc)
            failed = [r for r in records if r.failed]
            if self._stop_signalled(failed) and (signum := self.stop_request.signum) is not None:
                self._signalled(signum)
                return _Ended.STOPPED, f"received {signal.Signals(signum).name}"
            if failed:
                if (collateral := self._collateral(group, node, failed)) is not None:
                    return collateral
                for e in failed:
                    self.rdzv.publish_failure(self._failure(e))
                first = failed[0]
                how = describe_returncode(first.returncode).short
                return _Ended.FAILED, f"rank {first.rank} {how}"
            if not group.running():
                return _Ended.SUCCEEDED, "all workers exited with code 0"
            if (ended := self._check_hang(group)) is not None:
                return ended
            if self.check_every is not None and (ended := self._membership()) is not None:
                return ended

    def _stop_signalled(self, failed: list[WorkerExit]) -> bool:
        """Whether a stop signal reached the agent. Workers killed by a stop signal may have
        got it together with the agent (scancel signals a whole Slurm step, a terminal's Ctrl-C
        the process group), and its own may arrive a moment later: wait that moment."""
        if self.stop_request.signum is None and failed:
            names = {describe_returncode(r.returncode).signal for r in failed}
            if names <= _STOP_SIGNAL_NAMES:
                self.clock.sleep(STOP_SIGNAL_WINDOW)  # returns at once when it comes
        return self.stop_request.signum is not None

    def _watch_hangs(self, group: WorkerGroup, node: NodeAssignment) -> None:
        """Start the watch on this attempt's workers; the first time, say when it can speak."""
        assert self.hang is not None
        self.hang.start(group.pids, node, self.state.attempts)
        spec = self.plan.hang
        if self.state.attempts == 0 and spec.timeout is not None and spec.first_verdict:
            watch = events.HangWatchStarted(
                **self._now(), timeout=spec.timeout, warmup=spec.warmup,
                first_verdict=spec.first_verdict, action=spec.action,
            )  # fmt: skip
            self.observer.emit(watch)

    def _check_hang(self, group: WorkerGroup) -> tuple[_Ended, str] | None:
        if self.hang is None or (hang := self.hang.check(group.running())) is None:
            return None
        return self._hung(hang)

    def _hung(self, hang: HangRecord) -> tuple[_Ended, str] | None:
        """Every rank's stack is saved: say so, then act (report: go on watching)."""
        self.state.hang = hang
        self.observer.emit(
            events.Hang(
                **self._now(),
                verdict=hang.verdict,
                action=HangAction(hang.action),
                idle=hang.idle_s,
                attempt=self.state.attempts,
            )
        )
        match self.plan.hang.action:
            case HangAction.RESTART:
                return _Ended.HUNG, hang.verdict
            case HangAction.FAIL:
                return _Ended.HUNG_FAIL, hang.verdict
        return None

    def _collateral(
        self, group: WorkerGroup, node: NodeAssignment, failed: list[WorkerExit]
    ) -> tuple[_Ended, str] | None:
        """Another node whose workers fail, restart or die breaks this node's collectives: its
        workers fail (gloo's "Connection closed by peer", NCCL's remote errors) before the
        rendezvous tells. When every failure reads as a lost peer and another node is in the
        round, wait that long for it to tell. If it does, the failures were collateral: no
        restart is spent, none is published, none is the root cause. A rank's own fault (any
        other error, seen before or during the wait) is never collateral: it ends the wait and
        counts at once, even if a peer then restarts because of it. A stop signal during the
        wait stops the node."""
        if not isinstance(spec := self.plan.rdzv, Dynamic) or node.group_world_size < 2:
            return None
        if not self._lost_peers(failed):
            return None
        # The bound after the last heartbeat, and two reads of the shared state that confirm it.
        deadline = self.clock.mono() + spec.departure_bound + spec.keep_alive_interval + 2
        while self.stop_request.signum is None and self.clock.mono() < deadline:
            if (ended := self._membership(collateral=failed)) is not None:
                self._after_node_loss(failed)
                ranks = ",".join(str(r.rank) for r in failed)
                return ended[0], f"{ended[1]} (rank(s) {ranks} failed with it)"
            if not group.running():  # nothing to wait on: wait returns at once
                self.clock.sleep(self.plan.monitor_interval)
                continue
            try:
                exits = group.wait(self.plan.monitor_interval)
                more = [r for r in (self._record(e, node) for e in exits) if r.failed]
            except LogWriteError as exc:
                return _Ended.LOGS_FAILED, str(exc)
            failed += more
            if not self._lost_peers(more):
                return None
        if (signum := self.stop_request.signum) is not None:
            self._signalled(signum)
            return _Ended.STOPPED, f"received {signal.Signals(signum).name}"
        return None

    def _lost_peers(self, failed: Sequence[WorkerExit]) -> bool:
        """Whether every one of these failures reads as a lost peer, not a fault of its own."""
        return all(lost_a_peer(self._failure(r).error_text) for r in failed)

    def _after_node_loss(self, failed: Sequence[WorkerExit]) -> None:
        """Mark these failures as collateral of another node's, in the exits and the records."""
        collateral = {id(r) for r in failed}
        self.state.exits = [
            replace(e, after_node_loss=True) if id(e) in collateral else e for e in self.state.exits
        ]
        for r in failed:
            self.state.failures[(r.attempt, r.local_rank)] = replace(
                self._failure(r), after_node_loss=True
            )

    def _failure(self, exit: WorkerExit) -> FailureRecord:
        """The record of an exit with a non-zero code: its files read at the first need only."""
        key = (exit.attempt, exit.local_rank)
        if (record := self.state.failures.get(key)) is None:
            record = self.state.failures[key] = self.read_failure(exit)
        return record

    def _membership(self, collateral: Sequence[WorkerExit] = ()) -> tuple[_Ended, str] | None:
        try:
            change = self.rdzv.poll()
        except RendezvousError as exc:
            return _Ended.RENDEZVOUS_LOST, str(exc)
        if change is None:
            return None
        self.state.peers += change.peers
        self.observer.emit(
            events.MembershipChange(
                **self._now(),
                change=change.kind,
                reason=change.reason,
                nodes=change.nodes,
                collateral=tuple(r.rank for r in collateral),
            )
        )
        match change.kind:
            case ChangeKind.JOINED:
                return _Ended.MEMBERSHIP, change.reason
            case ChangeKind.CLOSED:
                return _Ended.ENDED_ELSEWHERE, change.reason
            case ChangeKind.LEFT if change.nodes < self.plan.nnodes.min:
                return _Ended.RENDEZVOUS_LOST, (
                    f"{change.reason}; {change.nodes} node(s) remain, fewer than the "
                    f"nnodes minimum {self.plan.nnodes.min}. Start more nodes, or lower MIN "
                    f"in nnodes={self.plan.nnodes}"
                )
            case ChangeKind.LEFT:
                return _Ended.MEMBERSHIP, change.reason

    def _record(
        self, exited: Exited, node: NodeAssignment, by_launcher: bool = False
    ) -> WorkerExit:
        record = WorkerExit(
            local_rank=exited.local_rank,
            rank=node.base_rank + exited.local_rank,
            pid=exited.pid,
            returncode=exited.returncode,
            wall_time=exited.wall_time,
            mono_time=exited.mono_time,
            attempt=self.state.attempts,
            restart_count=self.state.restarts,
            terminated_by_launcher=by_launcher,
        )
        self.state.exits.append(record)
        self.observer.emit(
            events.WorkerExited(
                **self._now(),
                rank=record.rank,
                local_rank=record.local_rank,
                pid=record.pid,
                returncode=record.returncode,
                exit=describe_returncode(record.returncode).short,
                terminated_by_launcher=by_launcher,
                attempt=self.state.attempts,
            )
        )
        return record

    def _stop_group(self, group: WorkerGroup, ended: _Ended, reason: str) -> None:
        sig = self.stop_request.signum if ended is _Ended.STOPPED else signal.SIGTERM
        running = group.running()
        hung = ended in (_Ended.HUNG, _Ended.HUNG_FAIL)
        # Workers whose stacks were just saved as stuck rarely stop on SIGTERM: one stuck in a
        # C call cannot, a framework's handler may log and go on. They get a short grace.
        grace = min(self.plan.stop_grace, self.plan.hang.grace) if hung else self.plan.stop_grace
        if (ended is _Ended.STOPPED or hung) and running:
            self.observer.emit(
                events.Stopping(
                    **self._now(),
                    signal=signal.Signals(sig or signal.SIGTERM).name,
                    workers=len(running),
                    grace=grace,
                    hung=hung,
                )
            )
        exits, stuck = group.stop(sig or signal.SIGTERM, grace)
        node = self.state.node
        assert node is not None
        for exited in exits:
            self._record(exited, node, by_launcher=exited.local_rank in running)
        group.close()
        self.state.stuck += stuck
        if running or stuck:
            self.observer.emit(
                events.Stop(
                    **self._now(),
                    reason=reason,
                    signal=signal.Signals(sig or signal.SIGTERM).name,
                    stopped_ranks=tuple(running),
                    paused_ranks=tuple(group.paused),  # found stopped (SIGSTOP), resumed to exit
                    stuck_pids=tuple(stuck),
                )
            )

    def _restart(self, started: float, ended: _Ended) -> bool:
        if ended is _Ended.HUNG:  # a hang counts as a failure (exit 1) found now
            rank: int | None = None
            failure = restart_policy.Failure(
                returncode=1, attempt_runtime=self.clock.mono() - started
            )
        else:
            cause = root_cause(self.state.exits)
            assert cause is not None
            rank = cause.rank
            failure = restart_policy.Failure(
                returncode=cause.returncode, attempt_runtime=cause.mono_time - started
            )
        decision = restart_policy.decide(
            self.plan.restart,
            failure,
            restarts_done=self.state.restarts,
            restart_times=self.state.restart_times,
            now=self.clock.mono(),
            u=self.clock.random(),
        )
        self.state.reason = decision.reason
        if decision.action is Action.FAIL:
            return False
        self.observer.emit(
            events.Restart(
                **self._now(),
                reason=decision.reason,
                delay=decision.delay,
                restart=self.state.restarts + 1,
                rank=rank,
            )
        )
        self.clock.sleep(decision.delay)
        if self.stop_request.signum is not None:
            return True  # stopped during the backoff: the loop reports it; no new attempt
        self.state.restarts += 1
        self.state.restart_times.append(self.clock.mono())
        return True

    def _stopped(self) -> RunOutcome | None:
        signum = self.stop_request.signum
        if signum is None:
            return None
        self._signalled(signum)
        return self._finish(Status.STOPPED, f"received {signal.Signals(signum).name}", signum)

    def _finish(self, status: Status, reason: str, signum: int | None = None) -> RunOutcome:
        outcome = RunOutcome(
            status=status,
            attempts=self.state.attempts,
            restarts=self.state.restarts,
            reason=reason,
            exits=tuple(self.state.exits),
            failures=tuple(self._failure(e) for e in self.state.exits if e.returncode != 0),
            signal=signum,
            stuck_pids=tuple(self.state.stuck),
            hang=self.state.hang,
            peer_failures=tuple(self.state.peers),
        )
        self.observer.emit(
            events.Finish(
                **self._now(),
                status=status,
                exit_code=outcome.exit_code,
                reason=reason,
                attempts=outcome.attempts,
            )
        )
        return outcome

    def _now(self) -> events.Stamp:
        """An event's time, from the loop's clock (a fake one in tests)."""
        return events.Stamp(wall_time=self.clock.wall(), mono_time=self.clock.mono())

    def _signalled(self, signum: int) -> None:
        """The agent received a stop signal: the timeline says so before the stop."""
        self.observer.emit(events.SignalReceived(**self._now(), signal=signal.Signals(signum).name))
