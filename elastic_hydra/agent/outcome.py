"""What happened to workers and to the whole run. Pure data and pure functions.

A `returncode` follows Popen: >= 0 an exit code, < 0 killed by signal -returncode.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from elastic_hydra.errors import EXIT_OK, EXIT_RENDEZVOUS, EXIT_WORKERS_FAILED
from elastic_hydra.records import HangRecord, PeerFailure, root_cause_of
from elastic_hydra.tracebacks import Stack


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerExit:
    """One worker process that ended."""

    local_rank: int
    rank: int
    pid: int
    returncode: int
    wall_time: float
    mono_time: float
    attempt: int  # its group's start: 0, 1, ... (after failures and membership changes alike)
    restart_count: int = 0  # restarts for failures before its start
    terminated_by_launcher: bool = False
    after_node_loss: bool = False  # failed because another node failed or died (broken collective)

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.terminated_by_launcher and not self.after_node_loss


def root_cause(exits: Iterable[WorkerExit]) -> WorkerExit | None:
    """The root cause among this node's exits (the rule of `records.root_cause_of`)."""
    return root_cause_of(
        exits,
        failed=lambda e: e.failed,
        group=lambda e: e.attempt,
        time=lambda e: e.mono_time,
        rank=lambda e: e.rank,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureDetail:
    """What a failed worker left behind, read from its files after it exited."""

    source: str  # "exception" (bootstrap), "error_file" (@record), "crash", "stderr", "none"
    message: str = ""  # e.g. "ValueError: boom"
    stacks: tuple[Stack, ...] = ()
    reported_time: float | None = None  # when the worker recorded the error (wall clock)
    error_file: str | None = None
    stderr_tail: tuple[str, ...] = ()
    stdout_log: str = ""
    stderr_log: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFailure:
    """A worker that ended with a non-zero code, and what it left behind."""

    exit: WorkerExit
    detail: FailureDetail
    host: str

    @property
    def time(self) -> float:
        """When it failed (wall clock): its own record if it wrote one, else when it was seen."""
        reported = self.detail.reported_time
        return self.exit.wall_time if reported is None else min(reported, self.exit.wall_time)


class Status(enum.StrEnum):
    """How the agent's loop ended (`records.RunStatus` adds the ends before it ran)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the agent received a signal
    RENDEZVOUS_FAILED = "rendezvous_failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How a launch ended."""

    status: Status
    attempts: int  # starts of the worker group
    reason: str
    restarts: int = 0  # of which restarts for failures
    exits: tuple[WorkerExit, ...] = ()
    signal: int | None = None
    stuck_pids: tuple[int, ...] = ()
    hang: HangRecord | None = None  # the last hang found
    peer_failures: tuple[PeerFailure, ...] = ()  # what torchrun nodes of the job did

    @property
    def root_cause(self) -> WorkerExit | None:
        return root_cause(self.exits)

    @property
    def exit_code(self) -> int:
        match self.status:
            case Status.SUCCEEDED:
                return EXIT_OK
            case Status.STOPPED:
                return 128 + (self.signal or signal.SIGTERM)
            case Status.RENDEZVOUS_FAILED:
                return EXIT_RENDEZVOUS
        return EXIT_WORKERS_FAILED
