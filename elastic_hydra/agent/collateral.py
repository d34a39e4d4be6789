"""A node's failures that another node caused: wait for the rendezvous to say so.

Another node whose workers fail, restart or die breaks this node's collectives: its workers fail
(gloo's "Connection closed by peer", NCCL's remote errors) before the rendezvous tells. The
executor waits a bounded time for the rendezvous to name the node that left or restarted; if it
does, this node's failures were collateral: no restart is spent, none is published, none is the
root cause. Each failure's record is read once (`_failure`) and shared with the rest of the loop.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import replace

from elastic_hydra.agent.loop_state import Ended, LoopState
from elastic_hydra.agent.seams import Clock, Exited, NodeAssignment, StopRequest, WorkerGroup
from elastic_hydra.errors import LogWriteError
from elastic_hydra.plan import Dynamic, LaunchPlan
from elastic_hydra.records.failures import FailureRecord, WorkerExit, lost_a_peer


class CollateralWait:
    """The executor's collateral rule (a mixin: `Executor` provides the loop's parts)."""

    plan: LaunchPlan
    clock: Clock
    stop_request: StopRequest
    state: LoopState
    read_failure: Callable[[WorkerExit], FailureRecord]

    def _membership(self, collateral: Sequence[WorkerExit] = ()) -> tuple[Ended, str] | None:
        raise NotImplementedError

    def _record(
        self, exited: Exited, node: NodeAssignment, by_launcher: bool = False
    ) -> WorkerExit:
        raise NotImplementedError

    def _signalled(self, signum: int) -> None:
        raise NotImplementedError

    def _collateral(
        self, group: WorkerGroup, node: NodeAssignment, failed: list[WorkerExit]
    ) -> tuple[Ended, str] | None:
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
        bound = node.departure_bound or spec.departure_bound
        deadline = self.clock.mono() + bound + spec.keep_alive_interval + 2
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
                return Ended.LOGS_FAILED, str(exc)
            failed += more
            if not self._lost_peers(more):
                return None
        if (signum := self.stop_request.signum) is not None:
            self._signalled(signum)
            return Ended.STOPPED, f"received {signal.Signals(signum).name}"
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
