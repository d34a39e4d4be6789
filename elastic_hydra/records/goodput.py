"""The goodput ledger as typed records: where a node's (or a job's) wall time and GPU-seconds
went, phase by phase, and the work each failure lost. Pure; `report.goodput` computes them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic_hydra.jsonrecord import JsonRecord


class Phase(enum.StrEnum):
    """Where a node's wall time went (the goodput ledger's rows, in the order of a run)."""

    STARTUP = "startup"  # agent start to the first rendezvous, and spawning the first workers
    RENDEZVOUS = "rendezvous"  # the first round, and re-rendezvous after a membership change
    PREFLIGHT = "preflight"  # checks before the workers start (0 where none ran)
    RUNNING = "running"  # workers running (less the hung time)
    RESTART = "restart"  # a failure or hang verdict to the next attempt's workers running
    HUNG = "hung"  # the last progress to a hang verdict
    STOPPING = "stopping"  # the end of the last attempt (a final failure, a signal) to the exit
    UNATTRIBUTED = "unattributed"  # no event tells (the timeline stops early)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseTime(JsonRecord):
    """One row of a ledger: seconds of wall time, and GPU-seconds (wall x the GPUs held)."""

    phase: Phase
    wall_s: float
    gpu_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LostWork(JsonRecord):
    """Work lost to one failure: from the last progress seen before it to the failure."""

    attempt: int
    cause: str  # "rank 1 exited with code 1", "hang"
    at_s: float  # seconds after the agent started
    lost_s: float | None  # None: no progress was seen (no hang watch, or no note before it)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ledger(JsonRecord):
    """The goodput ledger: where wall time and GPU-seconds went, on one node or a whole job
    (`nodes` names the nodes it sums; a job's wall is node-seconds)."""

    nodes: tuple[str, ...]
    wall_s: float
    gpus: int  # GPUs held by the workers (0: no GPU; for a job, the sum over its nodes)
    phases: tuple[PhaseTime, ...]
    lost: tuple[LostWork, ...] = ()

    def seconds(self, phase: Phase) -> float:
        return sum(p.wall_s for p in self.phases if p.phase is phase)

    @property
    def lost_s(self) -> float:
        return sum(w.lost_s or 0.0 for w in self.lost)
