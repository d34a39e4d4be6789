"""What a node passes between the rendezvous and its workers: the quarantine ledger's admission
before each round, and the round's preflight verdict after it.

A mixin of the executor: it decides with the loop's state and ends the run through the loop's
`_finish`; the verdict's consequences themselves are `preflight_rule`'s pure decision.
"""

from __future__ import annotations

from elastic_hydra.agent import events, preflight_rule
from elastic_hydra.agent.loop_state import LoopState
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.agent.seams import Admission, NodeAssignment, Observer, Preflight
from elastic_hydra.errors import RendezvousError
from elastic_hydra.plan import FailureClass, LaunchPlan


class RoundGates:
    """The executor's gates around a round (a mixin: `Executor` provides the loop's parts)."""

    plan: LaunchPlan
    observer: Observer
    state: LoopState
    admission: Admission | None
    preflight: Preflight | None

    def _now(self) -> events.Stamp:
        raise NotImplementedError

    def _stopped(self) -> RunOutcome | None:
        raise NotImplementedError

    def _finish(self, status: Status, reason: str, signum: int | None = None) -> RunOutcome:
        raise NotImplementedError

    def _refused(self) -> RunOutcome | None:
        """This node is quarantined: it leaves before the round, with the admission's line."""
        found = self.admission.refusal() if self.admission is not None else None
        if found is None:
            return None
        self.observer.emit(
            events.Quarantined(
                **self._now(),
                host=found.host,
                gpus=found.gpus,
                evidence=found.evidence,
                until=found.until,
                attempt=self.state.attempts,
            )
        )
        return self._finish(Status.QUARANTINED, found.line)

    def _preflight(self, node: NodeAssignment) -> RunOutcome | bool:
        """The round's preflight verdict acted on: True to start the workers, False to join a
        new round without the nodes that failed (enough remain), else how the run ended here."""
        assert self.preflight is not None
        try:
            verdict = self.preflight.check(node, self.state.attempts, self.state.restarts)
        except RendezvousError as exc:
            return self._stopped() or self._finish(Status.RENDEZVOUS_FAILED, str(exc))
        self.state.preflight = verdict
        self.observer.emit(
            events.Preflight(
                **self._now(), passed=verdict.passed, nodes=verdict.nodes,
                bad_nodes=verdict.bad_nodes, seconds=verdict.seconds, attempt=self.state.attempts,
            )
        )  # fmt: skip
        if (stopped := self._stopped()) is not None:
            return stopped
        rule = preflight_rule.decide(
            verdict, node.group_rank, node.group_world_size, self.plan.nnodes
        )
        if rule.next is not preflight_rule.Next.END:
            return rule.next is preflight_rule.Next.START
        assert rule.status is not None
        self.state.failure_class = FailureClass.HARDWARE  # a node's GPU, link or disk
        return self._finish(rule.status, rule.reason)
