"""How a launch ended, as typed records: this node's summary.json (`RunSummary`, with its
failures, hang, ledger and preflight verdict) and one job's result.json (`JobResult`). Pure.

summary.json is read back by `report` and a sweep reads result.json, so `from_json` checks
every field it reads (ValueError naming the field).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic_hydra.jsonrecord import JsonRecord
from elastic_hydra.plan import FailureClass
from elastic_hydra.records.failures import FailureRecord, PeerFailure, WorkerExit
from elastic_hydra.records.goodput import Ledger
from elastic_hydra.records.hangs import HangRecord
from elastic_hydra.records.preflight import PreflightVerdict


class RunStatus(enum.StrEnum):
    """How a launch ended on this node: the agent's `Status`, or an end before the agent ran."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the agent received a signal
    RENDEZVOUS_FAILED = "rendezvous_failed"
    QUARANTINED = "quarantined"  # this node is in the quarantine ledger: it did not join
    PREFLIGHT_FAILED = "preflight_failed"  # this node failed its preflight (exit 4)
    PREFLIGHT_STOPPED = "preflight_stopped"  # others failed theirs, too few remain (exit 5)
    EXCLUDED = "excluded"  # a hardware fault: this node left the job (exit 4)
    CONFIG_ERROR = "config_error"  # bad input found only at the launch (e.g. torch missing)
    ERROR = "error"  # a bug in the launcher (EXIT_BUG)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary(JsonRecord):
    """summary.json: how a launch ended on this node. A launch that ended before its workers
    (bad input found late, a launcher bug) has only status, exit code and message."""

    status: RunStatus
    exit_code: int
    message: str = ""
    entrypoint: str = ""
    attempts: int = 0  # starts of the worker group
    restarts: int = 0  # of which restarts for failures
    started: float = 0.0
    duration_s: float = 0.0
    host: str = ""
    run_id: str = ""
    run_dir: str = ""
    signal: str | None = None
    stuck_pids: tuple[int, ...] = ()
    root_cause: FailureRecord | None = None
    failures: tuple[FailureRecord, ...] = ()
    job_failures: tuple[FailureRecord, ...] = ()
    exits: tuple[WorkerExit, ...] = ()
    hang: HangRecord | None = None  # the last hang found (hang.timeout)
    peer_failures: tuple[PeerFailure, ...] = ()  # what torchrun nodes of the job did
    ledger: Ledger | None = None  # where this node's time went (the goodput ledger)
    preflight: PreflightVerdict | None = None  # the last round's preflight verdict
    # What the run ended on (the root cause's class where one failed; None: it did not fail).
    failure_class: FailureClass | None = None

    @property
    def earlier_failures(self) -> tuple[FailureRecord, ...]:
        """This node's real failures in attempts before its last: each was followed by a new
        start of the worker group. In a run that succeeded, the failures restarts recovered;
        their tracebacks are worth as much as the root cause's (the next run may not recover)."""
        last = self.attempts - 1
        return tuple(f for f in self.failures if f.failed and f.attempt < last)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult(JsonRecord):
    """result.json: what one job of a command (a run, or one point of a sweep) ended with."""

    overrides: tuple[str, ...] = ()
    exit_code: int
    run_dir: str
    message: str = ""
    summary: RunSummary | None = None
    swept: bool = False  # one job of a sweep (-m, or a job that sets hydra.mode: MULTIRUN)
