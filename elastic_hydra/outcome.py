"""What happened to workers and to the whole run. Pure data and pure functions.

A `returncode` follows Popen: >= 0 an exit code, < 0 killed by signal -returncode.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from elastic_hydra.errors import EXIT_OK, EXIT_RENDEZVOUS, EXIT_WORKERS_FAILED

# Shells report a child killed by signal N as exit code 128+N.
_SHELL_SIGNAL_BASE = 128


def signal_of(returncode: int) -> int | None:
    """The signal that ended a process: -N from Popen, or 128+N as reported by a shell."""
    if returncode < 0:
        return -returncode
    if _SHELL_SIGNAL_BASE < returncode < _SHELL_SIGNAL_BASE + 65:
        return returncode - _SHELL_SIGNAL_BASE
    return None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """`exit code 3`, `killed by SIGKILL`, or `exit code 137 (SIGKILL from a shell)`."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    sig = signal_of(returncode)
    if sig is not None:
        return f"exit code {returncode} ({signal_name(sig)} from a shell)"
    return f"exit code {returncode}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerExit:
    """One worker process that ended."""

    local_rank: int
    rank: int
    pid: int
    returncode: int
    wall_time: float
    mono_time: float
    attempt: int
    terminated_by_launcher: bool = False

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.terminated_by_launcher


def root_cause(exits: Iterable[WorkerExit]) -> WorkerExit | None:
    """The earliest real failure; workers the launcher stopped are never chosen."""
    failures = [e for e in exits if e.failed]
    return min(failures, key=lambda e: (e.mono_time, e.rank)) if failures else None


class Status(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the agent received a signal
    RENDEZVOUS_FAILED = "rendezvous_failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How a launch ended."""

    status: Status
    attempts: int
    reason: str
    exits: tuple[WorkerExit, ...] = ()
    signal: int | None = None
    stuck_pids: tuple[int, ...] = ()

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
