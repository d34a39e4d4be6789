"""A worker's end as typed records: its exit (`WorkerExit`), its failure (`FailureRecord`), the
root cause among failures, and what the store tells of a torchrun peer (`PeerFailure`). Pure.

A failed worker is one `FailureRecord` from its exit to the report: built once when its exit is
seen (its files read then), the same in memory, in summary.json and in the rendezvous store.
The root cause is chosen here, by one rule, for this node's exits and for the job-wide records
alike; a return code is described by one function, and the records that tell one derive it
(fields with init=False: written to JSON, recomputed rather than read back). Failure records
also arrive from other nodes through the rendezvous store, so `from_json` checks every field it
reads (ValueError naming the field).
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from elastic_hydra.jsonrecord import JsonRecord
from elastic_hydra.plan import FailureClass
from elastic_hydra.tracebacks import Stack

T = TypeVar("T")

# Shells report a child killed by signal N as exit code 128+N.
_SHELL_SIGNAL_BASE = 128
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


# What a rank raises when a peer of its collectives went away (died, or was stopped by its own
# agent for a restart): gloo's and the c10d store's broken connections, NCCL's remote errors...
# Not a timeout (gloo's "Application timeout caused pair closure", NCCL's watchdog aborting its
# communicator): every rank of a hang or a desync raises those, and they come long after the
# rendezvous has told of a node that really went away.
_LOST_PEER = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|failed to recv, got 0 bytes|"
    r"remote process exited|ncclRemoteError",
    re.IGNORECASE,
)
# ... in torch.distributed's words (not a download's ConnectionResetError, not a closed pipe).
_DISTRIBUTED = re.compile(r"gloo|pair\.cc|NCCL|DistNetworkError|DistBackendError|DistStoreError")


def lost_a_peer(error: str) -> bool:
    """Whether a failed rank's error reads as a lost peer rather than a fault of its own."""
    return lost_peer_at(error) is not None


def lost_peer_at(error: str) -> int | None:
    """Where in `error` it says a peer went away, in torch.distributed's words; None if not."""
    found = _LOST_PEER.search(error)
    return found.start() if found is not None and _DISTRIBUTED.search(error) else None


# ---------------------------------------------------------------------------------- return codes
@dataclass(frozen=True, slots=True, kw_only=True)
class ReturnCode:
    """A process's return code (Popen's: >= 0 an exit code, < 0 killed by signal -code), told.

    Attributes:
        short: `exit code 3`, `killed by SIGKILL`, `exit code 137 (SIGKILL from a shell)`.
        explained: for people: `exit code 3`, or what the signal usually means.
        signal: the signal's name when a signal ended it (also a shell's 128+N), else None.
    """

    short: str
    explained: str
    signal: str | None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> ReturnCode:
    """The one description of a return code (see `ReturnCode`)."""
    if returncode < 0:
        sig: int | None = -returncode
    elif _SHELL_SIGNAL_BASE < returncode < _SHELL_SIGNAL_BASE + 65:
        sig = returncode - _SHELL_SIGNAL_BASE
    else:
        sig = None
    if sig is None:
        text = f"exit code {returncode}"
        return ReturnCode(short=text, explained=text, signal=None)
    name = signal_name(sig)
    hint = _SIGNAL_HINTS.get(sig, f"killed by {name}")  # type: ignore[call-overload]
    if returncode < 0:
        return ReturnCode(short=f"killed by {name}", explained=hint, signal=name)
    return ReturnCode(
        short=f"exit code {returncode} ({name} from a shell)",
        explained=f"exit code {returncode}: {hint}",
        signal=name,
    )


# ------------------------------------------------------------------------------------ root cause
def root_cause_of(
    items: Iterable[T],
    *,
    failed: Callable[[T], bool],
    group: Callable[[T], int],
    time: Callable[[T], float],
    rank: Callable[[T], int],
) -> T | None:
    """The root cause: among real failures (workers the launcher stopped never count), those of
    the latest group that failed, the earliest; at the same time, the lowest rank."""
    real = [i for i in items if failed(i)]
    if not real:
        return None
    last = max(group(i) for i in real)
    return min((i for i in real if group(i) == last), key=lambda i: (time(i), rank(i)))


def _told(record: WorkerExit | FailureRecord) -> None:
    """Set a record's derived `signal` and `exit` from its return code (see `ReturnCode`)."""
    told = describe_returncode(record.returncode)
    object.__setattr__(record, "signal", told.signal)
    object.__setattr__(record, "exit", told.explained)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerExit(JsonRecord):
    """One worker process that ended, failed or not, as the supervisor saw it."""

    local_rank: int
    rank: int
    pid: int
    returncode: int  # Popen's: >= 0 an exit code, < 0 killed by signal -returncode
    wall_time: float
    mono_time: float
    attempt: int  # its group's start: 0, 1, ... (after failures and membership changes alike)
    restart_count: int = 0  # restarts for failures before its start
    terminated_by_launcher: bool = False
    after_node_loss: bool = False  # failed because another node failed or died (broken collective)
    signal: str | None = field(init=False, default=None)  # derived from returncode
    exit: str = field(init=False, default="")  # derived: the return code, explained

    def __post_init__(self) -> None:
        _told(self)

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.terminated_by_launcher and not self.after_node_loss


class FailureSource(enum.StrEnum):
    """Where a failure record's message and traceback come from."""

    EXCEPTION = "exception"  # the bootstrap's record of the exception that ended the worker
    ERROR_FILE = "error_file"  # torch's @record (TORCHELASTIC_ERROR_FILE)
    CRASH = "crash"  # a faulthandler dump (its fault file, or its stderr)
    STDERR = "stderr"  # a traceback at the end of its stderr
    NONE = "none"  # nothing: its exit code and the tail of its stderr tell all there is


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRecord(JsonRecord):
    """One worker that ended with a non-zero code: how, and what it left behind. The same in
    memory, in summary.json and in the rendezvous store (where its node adds the last three)."""

    rank: int
    local_rank: int
    host: str
    pid: int
    attempt: int  # its group's start (0, 1, ...), the n of its logs' attempt_<n>/
    restart_count: int = 0
    returncode: int
    signal: str | None = field(init=False, default=None)  # derived from returncode
    exit: str = field(init=False, default="")  # derived: the return code, explained
    time: float  # when it failed (wall clock): its own record's time if it wrote one, else seen
    terminated_by_launcher: bool = False
    after_node_loss: bool = False  # collateral of another node's failure or loss: never a cause
    source: FailureSource = FailureSource.NONE
    message: str = ""  # e.g. "ValueError: boom"
    traceback: tuple[Stack, ...] = ()
    error_file: str | None = None
    stderr_tail: tuple[str, ...] = ()
    stdout_log: str = ""
    stderr_log: str = ""
    failure_class: FailureClass = FailureClass.UNKNOWN
    evidence: str = ""  # what decided the class, one line
    repeat_of: int | None = None  # the earlier attempt that ended the same way (class, frame)
    # Published to the rendezvous store by a node of a multi-node job:
    node_rank: int | None = None
    rdzv_round: int | None = None
    node: str | None = None

    def __post_init__(self) -> None:
        _told(self)

    @classmethod
    def of(cls, exit: WorkerExit, *, host: str) -> FailureRecord:
        """The record of `exit` before its files are read: what the supervisor saw."""
        return cls(
            rank=exit.rank,
            local_rank=exit.local_rank,
            host=host,
            pid=exit.pid,
            attempt=exit.attempt,
            restart_count=exit.restart_count,
            returncode=exit.returncode,
            time=exit.wall_time,
            terminated_by_launcher=exit.terminated_by_launcher,
            after_node_loss=exit.after_node_loss,
        )

    @property
    def failed(self) -> bool:
        return not self.terminated_by_launcher and not self.after_node_loss

    @property
    def error_text(self) -> str:
        """Its error, else its last lines of stderr (a C++ abort leaves no error file)."""
        return self.message or "\n".join(self.stderr_tail[-3:])

    @property
    def signature(self) -> str:
        """`ImportError at train.py:3`: the exception and the innermost frame it was raised at,
        the same for the same failure in another attempt; "" without a traceback."""
        if not self.traceback:
            return ""
        last = self.traceback[-1]
        if not last.frames:
            return f"{last.exc_type}: {last.exc_value[:120]}"
        frame = last.frames[-1]
        return f"{last.exc_type} at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


def job_root_cause(records: Iterable[FailureRecord]) -> FailureRecord | None:
    """The root cause among failure records; records from the rendezvous store are grouped by
    the rendezvous round (nodes count their own attempts), this node's by attempt."""
    return root_cause_of(
        records,
        failed=lambda r: r.failed,
        group=lambda r: r.attempt if r.rdzv_round is None else r.rdzv_round,
        time=lambda r: r.time,
        rank=lambda r: r.rank,
    )


class PeerChange(enum.StrEnum):
    """What the rendezvous store tells of a node that publishes no failure records: the words
    follow the node's name in `PeerFailure.line`."""

    RESTARTED = "restarted its workers"
    LEFT = "left the job"


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerFailure(JsonRecord):
    """What the rendezvous store tells of a node that publishes no failure records of its own (a
    torchrun agent): it restarted its workers, or it left the job. Why is in that node's logs."""

    node: str  # its address and agent pid
    node_rank: int | None = None
    ranks: str = ""  # its workers' global ranks in that round ("2-3"); "": the store did not say
    what: PeerChange
    rdzv_round: int
    time: float  # when this node saw it (wall clock)
    launcher: str = "torchrun"

    def line(self) -> str:
        return f"{peer_name(self.node_rank, self.node, self.ranks, self.launcher)} {self.what}"


def peer_name(node_rank: int | None, node: str, ranks: str, launcher: str = "torchrun") -> str:
    """`node 0 (torchrun agent on 10.0.0.1, pid 42; ranks 0-7)`."""
    which = "a node" if node_rank is None else f"node {node_rank}"
    return f"{which} ({launcher} agent on {node}{f'; ranks {ranks}' if ranks else ''})"
