"""The agent loop: rendezvous -> start workers -> monitor -> restart policy -> finish.

Composed of injected seams (rendezvous, worker-group factory, clock, observer) so that tests can
drive it with fakes. It never prints and never sees a DictConfig.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence

from elastic_hydra.agent import events, restart_policy
from elastic_hydra.agent.collateral import CollateralWait
from elastic_hydra.agent.events import ChangeKind
from elastic_hydra.agent.loop_state import Ended, LoopState
from elastic_hydra.agent.outcome import RunOutcome, Status, root_cause
from elastic_hydra.agent.round_gates import RoundGates
from elastic_hydra.agent.seams import (
    Admission,
    Clock,
    Exited,
    HangWatch,
    NodeAssignment,
    Observer,
    Preflight,
    Rendezvous,
    Saver,
    StopRequest,
    StragglerWatch,
    WorkerGroup,
    WorkerGroupFactory,
)
from elastic_hydra.agent.worker_env import to_workers
from elastic_hydra.errors import LogWriteError, RendezvousError, WorkerStartError
from elastic_hydra.plan import (
    Action,
    Dynamic,
    FailureClass,
    HangAction,
    LaunchPlan,
    Standalone,
    Static,
    StragglerAction,
)
from elastic_hydra.records.failures import FailureRecord, WorkerExit, describe_returncode
from elastic_hydra.records.hangs import HangRecord

# The class of a run that ends this way, where the way tells it (a failure's is decided by
# `failures.classify` and acted on in `_restart`; a lost rendezvous's in `_membership`).
_ENDED_CLASS = {
    Ended.STOPPED: FailureClass.PREEMPTED,
    Ended.LOGS_FAILED: FailureClass.INFRA,
    Ended.HUNG: FailureClass.HANG,
    Ended.HUNG_FAIL: FailureClass.HANG,
}
SAVE_ASKED = "another node of the job was asked to stop and save (a stop signal, `save`)"
STOP_SIGNAL_WINDOW = 0.5  # seconds a worker's death by a stop signal waits for the agent's own
_STOP_SIGNAL_NAMES = {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}


class Executor(CollateralWait, RoundGates):
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
        straggler: StragglerWatch | None = None,
        admission: Admission | None = None,
        preflight: Preflight | None = None,
        saver: Saver | None = None,
    ) -> None:
        self.plan = plan
        self.rdzv = rendezvous
        self.start_workers = workers
        self.clock = clock
        self.observer = observer
        self.stop_request = stop
        self.state = LoopState()
        self.read_failure = read_failure  # a failed worker's record, from its files
        self.admission = admission  # asked before every round (the quarantine ledger)
        self.preflight = preflight
        self.saver = saver  # asked to keep the workers' snapshots when a stop signal comes
        # Only dynamic rendezvous can change membership; otherwise wait for exits alone.
        fixed = isinstance(plan.rdzv, (Standalone, Static))
        self.check_every: float | None = None if fixed else plan.monitor_interval
        self.hang = hang if plan.hang.timeout is not None else None
        self.straggler = None if plan.stragglers_unscored() else straggler
        if self.hang is not None:  # look at the workers' progress as often as they sample it
            self.check_every = min(self.check_every or plan.hang.sample, plan.hang.sample)

    def run(self) -> RunOutcome:
        """Rendezvous, start, monitor and restart until success, final failure or a signal."""
        while True:
            if (stopped := self._stopped()) is not None:
                return stopped
            if (refused := self._refused()) is not None:
                return refused
            try:
                node = self._rendezvous()
            except RendezvousError as exc:
                self.state.failure_class = FailureClass.INFRA  # unreachable, closed, timed out
                return self._stopped() or self._finish(Status.RENDEZVOUS_FAILED, str(exc))
            if (stopped := self._stopped()) is not None:  # a signal during the rendezvous
                return stopped
            self.state.node = node
            if self.preflight is not None:
                judged = self._preflight(node)
                if judged is False:
                    continue  # a new round without the nodes that failed: no restart spent
                if judged is not True:
                    return judged
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
            if self.straggler is not None:
                self.straggler.start(node, self.state.attempts, len(group.pids))
            ended, reason = self._monitor(group, node)
            self._stop_group(group, ended, reason)
            self.state.attempts += 1
            self.state.failure_class = _ENDED_CLASS.get(ended, self.state.failure_class)
            if ended is Ended.SUCCEEDED:
                return self._finish(Status.SUCCEEDED, reason)
            if ended is Ended.STOPPED:
                return self._finish(Status.STOPPED, reason, self.stop_request.signum)
            if ended in (Ended.ENDED_ELSEWHERE, Ended.LOGS_FAILED):
                return self._finish(Status.FAILED, reason)
            if ended is Ended.RENDEZVOUS_LOST:
                return self._finish(Status.RENDEZVOUS_FAILED, reason)
            if ended in (Ended.HUNG_FAIL, Ended.STRAGGLER_FAIL):
                return self._finish(Status.FAILED, reason)
            if ended in (Ended.FAILED, Ended.HUNG) and (out := self._restart(started, ended)):
                return out

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
                base_rank=node.base_rank,
            )
        )
        return node

    def _monitor(self, group: WorkerGroup, node: NodeAssignment) -> tuple[Ended, str]:
        while True:
            try:
                records = [self._record(exited, node) for exited in group.wait(self.check_every)]
            except LogWriteError as exc:  # a full disk: stop, say why (no restart would help)
                return Ended.LOGS_FAILED, str(exc)
            failed = [r for r in records if r.failed]
            if self._stop_signalled(failed) and (signum := self.stop_request.signum) is not None:
                self._signalled(signum)
                if self.saver is not None:  # before the workers stop (those still running)
                    self.state.saved = self.saver.save(
                        node, self.plan.stop_grace, lambda: bool(group.running())
                    )
                return Ended.STOPPED, f"received {signal.Signals(signum).name}"
            # Another node of the job was asked to save and stop (a stop signal reached its
            # agent only: a pod deleted, one node's `scancel --signal`): this node saves the same
            # step and stops too, instead of training on into a round without it.
            if not failed and self.check_every is not None and self.saver and self.saver.asked():
                self.state.saved = self.saver.save(
                    node, self.plan.stop_grace, lambda: bool(group.running())
                )
                return Ended.STOPPED, SAVE_ASKED
            if failed:
                if (collateral := self._collateral(group, node, failed)) is not None:
                    return collateral
                for e in failed:
                    self.rdzv.publish_failure(self._failure(e))
                first = failed[0]
                how = describe_returncode(first.returncode).short
                return Ended.FAILED, f"rank {first.rank} {how}"
            if not group.running():
                return Ended.SUCCEEDED, "all workers exited with code 0"
            if (ended := self._check_hang(group)) is not None:
                return ended
            if (ended := self._check_stragglers()) is not None:
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
                first_verdict=spec.first_verdict, action=spec.action, learned=spec.learned,
            )  # fmt: skip
            self.observer.emit(watch)

    def _check_hang(self, group: WorkerGroup) -> tuple[Ended, str] | None:
        if self.hang is None or (hang := self.hang.check(group.running())) is None:
            return None
        return self._hung(hang)

    def _hung(self, hang: HangRecord) -> tuple[Ended, str] | None:
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
                return Ended.HUNG, hang.verdict
            case HangAction.FAIL:
                return Ended.HUNG_FAIL, hang.verdict
        return None

    def _check_stragglers(self) -> tuple[Ended, str] | None:
        """Say which ranks were named stragglers or cleared; straggler.action=fail ends the job
        at the first named."""
        if self.straggler is None:
            return None
        action = self.plan.straggler.action
        for change in self.straggler.check():
            s = change.score
            self.observer.emit(
                events.Straggler(
                    **self._now(), rank=s.rank, named=change.named, last=s.last, of=s.of,
                    behind=round(s.behind, 4), op=s.op, threshold=round(change.threshold, 4),
                    action=action, attempt=self.state.attempts,
                )
            )  # fmt: skip
            if change.named and action is StragglerAction.FAIL:
                return Ended.STRAGGLER_FAIL, (
                    f"rank {s.rank} arrives last at {s.last} of the last {s.of} collectives, "
                    f"median {s.behind * 1000:.0f} ms behind (straggler.action=fail)"
                )
        return None

    def _membership(self, collateral: Sequence[WorkerExit] = ()) -> tuple[Ended, str] | None:
        try:
            change = self.rdzv.poll()
        except RendezvousError as exc:
            self.state.failure_class = FailureClass.INFRA  # the store is gone
            return Ended.RENDEZVOUS_LOST, str(exc)
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
                return Ended.MEMBERSHIP, change.reason
            case ChangeKind.CLOSED:
                return Ended.ENDED_ELSEWHERE, change.reason
            case ChangeKind.LEFT if change.nodes < self.plan.nnodes.min and not self._replaced:
                self.state.failure_class = FailureClass.NODE_LOST
                return Ended.RENDEZVOUS_LOST, (
                    f"{change.reason}; {change.nodes} node(s) remain, fewer than the "
                    f"nnodes minimum {self.plan.nnodes.min}. Start more nodes, or lower MIN "
                    f"in nnodes={self.plan.nnodes}"
                )
            case ChangeKind.LEFT:
                return Ended.MEMBERSHIP, change.reason

    @property
    def _replaced(self) -> bool:
        """Whether the survivors of a loss below MIN wait for a node to take its place."""
        rdzv = self.plan.rdzv
        return isinstance(rdzv, Dynamic) and rdzv.await_replacement

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
        failed = record.returncode != 0 and not by_launcher
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
                last_progress=self.hang.last_progress() if failed and self.hang else None,
            )
        )
        return record

    def _stop_group(self, group: WorkerGroup, ended: Ended, reason: str) -> None:
        received = self.stop_request.signum if ended is Ended.STOPPED else None
        sig = signal.SIGTERM if received is None else to_workers(received)
        running = group.running()
        hung = ended in (Ended.HUNG, Ended.HUNG_FAIL)
        # Workers whose stacks were just saved as stuck rarely stop on SIGTERM: one stuck in a
        # C call cannot, a framework's handler may log and go on. They get a short grace.
        grace = min(self.plan.stop_grace, self.plan.hang.grace) if hung else self.plan.stop_grace
        if (ended is Ended.STOPPED or hung) and running:
            self.observer.emit(
                events.Stopping(
                    **self._now(),
                    signal=signal.Signals(sig).name,
                    workers=len(running),
                    grace=grace,
                    hung=hung,
                )
            )
        exits, stuck = group.stop(sig, grace)
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
                    signal=signal.Signals(sig).name,
                    stopped_ranks=tuple(running),
                    paused_ranks=tuple(group.paused),  # found stopped (SIGSTOP), resumed to exit
                    stuck_pids=tuple(stuck),
                )
            )

    def _restart(self, started: float, ended: Ended) -> RunOutcome | None:
        """Restart the workers (None), or how the run ends: the policy's decision, one line."""
        if ended is Ended.HUNG:  # a hang counts as a failure (exit 1) found now
            rank: int | None = None
            failure = restart_policy.Failure(
                returncode=1,
                attempt_runtime=self.clock.mono() - started,
                hung=True,
                failure_class=FailureClass.HANG,
            )
        else:
            cause = root_cause(self.state.exits)
            assert cause is not None
            rank = cause.rank
            record = self._failure(cause)
            failure = restart_policy.Failure(
                returncode=cause.returncode,
                attempt_runtime=cause.mono_time - started,
                failure_class=record.failure_class,
                evidence=record.evidence,
                repeat_of=record.repeat_of,
            )
        decision = restart_policy.decide(
            self.plan.restart,
            failure,
            restarts_done=self.state.restarts,
            restart_times=self.state.restart_times,
            now=self.clock.mono(),
            u=self.clock.random(),
        )
        self.state.failure_class = failure.failure_class
        if decision.exclude:
            return self._leave(decision.reason, failure.evidence)
        if decision.action is Action.FAIL:
            return self._finish(Status.FAILED, decision.reason)
        self.observer.emit(
            events.Restart(
                **self._now(),
                reason=decision.reason,
                delay=decision.delay,
                restart=self.state.restarts + 1,
                rank=rank,
                failure_class=failure.failure_class,
            )
        )
        self.clock.sleep(decision.delay)
        if self.stop_request.signum is not None:
            return None  # stopped during the backoff: the loop reports it; no new attempt
        self.state.restarts += 1
        self.state.restart_times.append(self.clock.mono())
        return None

    def _leave(self, reason: str, evidence: str) -> RunOutcome:
        """This node leaves the job for a hardware fault (`restart.on_class`): into the
        quarantine ledger where one is set; the other nodes go on without it where nnodes' MIN
        allows (its leaving is a membership change to them)."""
        kept = self.admission.exclude(evidence) if self.admission is not None else None
        where = kept or "no quarantine ledger keeps it out of later jobs (quarantine.ledger)"
        return self._finish(Status.EXCLUDED, f"{reason}; {where}")

    def _stopped(self) -> RunOutcome | None:
        signum = self.stop_request.signum
        if signum is None:
            return None
        self.state.failure_class = FailureClass.PREEMPTED
        self._signalled(signum)
        if self.saver is not None and self.state.node is not None:  # what earlier attempts left
            self.state.saved = self.saver.save(self.state.node, 0.0, lambda: False)
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
            preflight=self.state.preflight,
            failure_class=None if status is Status.SUCCEEDED else self.state.failure_class,
            saved=self.state.saved if status is Status.STOPPED else None,
        )
        self.observer.emit(
            events.Finish(
                **self._now(),
                status=status,
                exit_code=outcome.exit_code,
                reason=reason,
                attempts=outcome.attempts,
                failure_class=outcome.failure_class,
            )
        )
        return outcome

    def _now(self) -> events.Stamp:
        """An event's time, from the loop's clock (a fake one in tests)."""
        return events.Stamp(wall_time=self.clock.wall(), mono_time=self.clock.mono())

    def _signalled(self, signum: int) -> None:
        """The agent received a stop signal: the timeline says so before the stop."""
        self.observer.emit(events.SignalReceived(**self._now(), signal=signal.Signals(signum).name))
