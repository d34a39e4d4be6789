"""The agent loop's bookkeeping: how an attempt ended, and what the loop counted so far."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.plan import FailureClass
from elastic_hydra.records.failures import FailureRecord, PeerFailure, WorkerExit
from elastic_hydra.records.hangs import HangRecord
from elastic_hydra.records.preflight import PreflightVerdict


class Ended(enum.Enum):
    """How one attempt of the worker group ended (the loop's own word; `Status` is the run's)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MEMBERSHIP = "membership"
    ENDED_ELSEWHERE = "ended_elsewhere"
    LOGS_FAILED = "logs_failed"
    RENDEZVOUS_LOST = "rendezvous_lost"
    STOPPED = "stopped"
    HUNG = "hung"  # hang.action=restart: a failure under the restart policy
    HUNG_FAIL = "hung_fail"  # hang.action=fail
    STRAGGLER_FAIL = "straggler_fail"  # straggler.action=fail


@dataclass(slots=True)
class LoopState:
    """What the loop has counted and seen so far (mutable: the loop's own bookkeeping)."""

    restarts: int = 0  # restarts for failures (TORCHELASTIC_RESTART_COUNT)
    restart_times: list[float] = field(default_factory=list)
    attempts: int = 0  # starts of the worker group: after failures and membership changes
    exits: list[WorkerExit] = field(default_factory=list)
    # Each exit's failure record by (attempt, local rank): its files read once, for all uses.
    failures: dict[tuple[int, int], FailureRecord] = field(default_factory=dict)
    stuck: list[int] = field(default_factory=list)
    node: NodeAssignment | None = None
    failure_class: FailureClass | None = None  # of the failure the run ends on, once known
    hang: HangRecord | None = None
    peers: list[PeerFailure] = field(default_factory=list)
    preflight: PreflightVerdict | None = None
    saved: int | None = None  # the step of the snapshot kept when a stop signal came
