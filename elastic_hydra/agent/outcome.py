"""How the whole run ended on this node, and the root cause among its exits. Pure.

The facts of one worker (its exit, its failure record) are in `records/failures`.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from elastic_hydra.errors import (
    EXIT_OK,
    EXIT_PREEMPTED_SAVED,
    EXIT_PREFLIGHT_JOB,
    EXIT_PREFLIGHT_NODE,
    EXIT_QUARANTINED,
    EXIT_RENDEZVOUS,
    EXIT_WORKERS_FAILED,
)
from elastic_hydra.plan import FailureClass
from elastic_hydra.records.failures import FailureRecord, PeerFailure, WorkerExit, root_cause_of
from elastic_hydra.records.hangs import HangRecord
from elastic_hydra.records.preflight import PreflightVerdict


def root_cause(exits: Iterable[WorkerExit]) -> WorkerExit | None:
    """The root cause among this node's exits (the rule of `records.root_cause_of`)."""
    return root_cause_of(
        exits,
        failed=lambda e: e.failed,
        group=lambda e: e.attempt,
        time=lambda e: e.mono_time,
        rank=lambda e: e.rank,
    )


class Status(enum.StrEnum):
    """How the agent's loop ended (`records.RunStatus` adds the ends before it ran)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the agent received a signal
    RENDEZVOUS_FAILED = "rendezvous_failed"
    QUARANTINED = "quarantined"  # this node is in the quarantine ledger: it did not join
    PREFLIGHT_FAILED = "preflight_failed"  # this node failed its preflight: it leaves the job
    PREFLIGHT_STOPPED = "preflight_stopped"  # others failed theirs; too few nodes remain
    EXCLUDED = "excluded"  # a hardware fault: this node left the job (restart.on_class)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How a launch ended."""

    status: Status
    attempts: int  # starts of the worker group
    reason: str
    restarts: int = 0  # of which restarts for failures
    exits: tuple[WorkerExit, ...] = ()
    failures: tuple[FailureRecord, ...] = ()  # of every exit with a non-zero code, read once
    signal: int | None = None
    stuck_pids: tuple[int, ...] = ()
    hang: HangRecord | None = None  # the last hang found
    peer_failures: tuple[PeerFailure, ...] = ()  # what torchrun nodes of the job did
    preflight: PreflightVerdict | None = None  # the last round's preflight verdict
    failure_class: FailureClass | None = None  # what the run ended on; None: it did not fail
    saved: int | None = None  # stopped: the step of the snapshot kept then (None: none)

    @property
    def root_cause(self) -> WorkerExit | None:
        return root_cause(self.exits)

    @property
    def exit_code(self) -> int:
        match self.status:
            case Status.SUCCEEDED:
                return EXIT_OK
            case Status.STOPPED if self.saved is not None:
                return EXIT_PREEMPTED_SAVED
            case Status.STOPPED:
                return 128 + (self.signal or signal.SIGTERM)
            case Status.RENDEZVOUS_FAILED:
                return EXIT_RENDEZVOUS
            case Status.QUARANTINED:
                return EXIT_QUARANTINED
            case Status.PREFLIGHT_FAILED | Status.EXCLUDED:
                return EXIT_PREFLIGHT_NODE
            case Status.PREFLIGHT_STOPPED:
                return EXIT_PREFLIGHT_JOB
        return EXIT_WORKERS_FAILED
