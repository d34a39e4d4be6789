"""The phase a node's agent is in: one state machine, folded from its events in order.

`top`'s live record (`observe.status`) and the goodput ledger (`report.goodput`) both read their
phases off this machine, so what a node said it was doing and where its time is counted to have
gone cannot disagree. The ledger adds only what hindsight knows: how much of a stretch was hung
(a hang verdict's `idle`), the preflight battery's own seconds, and whether a failure was followed
by a restart or ended the run.
"""

from __future__ import annotations

import enum

from elastic_hydra.agent import events
from elastic_hydra.plan import HangAction


class AgentPhase(enum.StrEnum):
    STARTUP = "startup"  # agent start to its first `joining`; the first round to its workers
    RENDEZVOUS = "rendezvous"  # waiting for a round: the first, or after a membership change
    PREFLIGHT = "preflight"  # the round's preflight battery (only where the machine expects one)
    RUNNING = "running"  # the workers run
    FAILED = "failed"  # a failure or a hang verdict ended the attempt: what follows is not known
    RESTART = "restart"  # a restart was decided: stop, backoff, re-rendezvous, spawn
    STOPPING = "stopping"  # the last attempt ended (success, a stop signal): the agent winds up
    DONE = "done"  # the agent told how it ended (`finish`)


_ENDED = (AgentPhase.STOPPING, AgentPhase.DONE)


class PhaseMachine:
    """Where one agent is, from its events fed in order (`see`).

    Args:
        preflight: a preflight battery runs right after each round (preflight=quick|full): the
            machine enters `preflight` at the round and leaves it at the verdict. Without it, a
            verdict changes no phase (the ledger carves the battery out by its `seconds`).
    """

    def __init__(self, *, preflight: bool = False) -> None:
        self.preflight = preflight
        self.phase = AgentPhase.STARTUP
        self.attempt: int | None = None  # the attempt running (or last started); None: none yet
        self._workers = 0
        self._exited = 0
        self._after_preflight = AgentPhase.STARTUP

    def see(self, ev: events.Event) -> bool:
        """Fold one event in; whether the phase changed."""
        before = self.phase
        self.phase = self._next(ev)
        return self.phase is not before

    def _next(self, ev: events.Event) -> AgentPhase:
        phase = self.phase
        match ev:
            case events.Joining() if phase is not AgentPhase.RESTART:  # a restart goes on
                return AgentPhase.RENDEZVOUS
            case events.RendezvousRound():
                after = AgentPhase.STARTUP if self.attempt is None else phase
                if self.preflight:
                    self._after_preflight = after
                    return AgentPhase.PREFLIGHT
                return after
            case events.Preflight() if phase is AgentPhase.PREFLIGHT:
                return self._after_preflight
            case events.WorkersStarted():
                self.attempt, self._workers, self._exited = ev.attempt, len(ev.pids), 0
                return AgentPhase.RUNNING
            case events.WorkerExited() if phase is AgentPhase.RUNNING:
                self._exited += 1
                if ev.returncode != 0 and not ev.terminated_by_launcher:
                    return AgentPhase.FAILED
                if self._exited >= self._workers:
                    return AgentPhase.STOPPING
            case events.Hang(action=action) if phase is AgentPhase.RUNNING:
                if action is not HangAction.REPORT:
                    return AgentPhase.FAILED
            case events.Restart():
                return AgentPhase.RESTART
            case events.MembershipChange() if phase not in _ENDED:
                return AgentPhase.RENDEZVOUS
            case events.SignalReceived() | events.Stopping() if phase not in (
                AgentPhase.FAILED,
                *_ENDED,
            ):
                return AgentPhase.STOPPING
            case events.Finish():
                return AgentPhase.DONE
        return phase
