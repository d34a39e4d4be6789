"""What happened to workers and to the whole run. Pure data and pure functions.

A `returncode` follows Popen: >= 0 an exit code, < 0 killed by signal -returncode.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from elastic_hydra.errors import EXIT_OK, EXIT_RENDEZVOUS, EXIT_WORKERS_FAILED
from elastic_hydra.tracebacks import Stack

T = TypeVar("T")

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


# What a death by signal usually means, for the person reading the summary.
_SIGNAL_HINTS = {
    signal.SIGKILL: "killed (SIGKILL) - often the kernel OOM killer; see `dmesg` or memory limits",
    signal.SIGSEGV: "segmentation fault (SIGSEGV)",
    signal.SIGABRT: "aborted (SIGABRT) - e.g. a failed C/C++ assertion or uncaught C++ exception",
    signal.SIGFPE: "floating-point exception (SIGFPE) - e.g. an integer division by zero in C",
    signal.SIGBUS: "bus error (SIGBUS) - often a full /dev/shm (shared memory)",
    signal.SIGILL: "illegal instruction (SIGILL) - a binary built for another CPU",
    signal.SIGTERM: "terminated (SIGTERM)",
    signal.SIGINT: "interrupted (SIGINT)",
    signal.SIGHUP: "hung up (SIGHUP)",
}


def describe_returncode(returncode: int) -> str:
    """`exit code 3`, `killed by SIGKILL`, or `exit code 137 (SIGKILL from a shell)`."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    sig = signal_of(returncode)
    if sig is not None:
        return f"exit code {returncode} ({signal_name(sig)} from a shell)"
    return f"exit code {returncode}"


def explain_returncode(returncode: int) -> str:
    """The exit for people: `exit code 3`, or the signal's meaning (also for a shell's 128+N)."""
    sig = signal_of(returncode)
    if sig is None:
        return f"exit code {returncode}"
    hint = _SIGNAL_HINTS.get(sig, f"killed by {signal_name(sig)}")  # type: ignore[call-overload]
    return hint if returncode < 0 else f"exit code {returncode}: {hint}"


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

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.terminated_by_launcher


def root_cause(exits: Iterable[WorkerExit]) -> WorkerExit | None:
    """The earliest real failure of the last group that failed; stopped workers are never chosen."""
    return _earliest(exits, lambda e: e, lambda e: e.mono_time)


def _earliest(
    items: Iterable[T], exit_of: Callable[[T], WorkerExit], time_of: Callable[[T], float]
) -> T | None:
    failed = [i for i in items if exit_of(i).failed]
    if not failed:
        return None
    last = max(exit_of(i).attempt for i in failed)
    return min(
        (i for i in failed if exit_of(i).attempt == last),
        key=lambda i: (time_of(i), exit_of(i).rank),
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


def first_failure(failures: Iterable[WorkerFailure]) -> WorkerFailure | None:
    """The root cause among failure records: like `root_cause`, by the workers' own times."""
    return _earliest(failures, lambda f: f.exit, lambda f: f.time)


class Status(enum.Enum):
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
