"""The results of a launch as typed records, with their JSON: one worker's exit, one worker's
failure, the run's summary (summary.json) and one job's result (result.json). Pure data and pure
functions.

A failed worker is one `FailureRecord` from its exit to the report: built once when its exit is
seen (its files read then), the same in memory, in summary.json and in the rendezvous store.
The root cause is chosen here, by one rule, for this node's exits and for the job-wide records
alike; a return code is described by one function, and the records that tell one derive it
(fields with init=False: written to JSON, recomputed rather than read back). summary.json is read
back by `report`, and failure records also arrive from other nodes through the rendezvous store,
so `from_json` checks every field it reads (ValueError naming the field).
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from elastic_hydra.health import PreflightVerdict
from elastic_hydra.jsonrecord import JsonRecord
from elastic_hydra.plan import HangAction
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
    return _LOST_PEER.search(error) is not None and _DISTRIBUTED.search(error) is not None


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


class RankState(enum.StrEnum):
    """Where a rank of a hung job was found."""

    DUMPED = "dumped"  # its stacks are in HangRank.threads
    STOPPED = "stopped"  # SIGSTOPped: it cannot dump
    EXITED = "exited"
    NO_DUMP = "no_dump"  # not run through the bootstrap (cmd=, bootstrap=false) and no py-spy


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupState(JsonRecord):
    """One process group's collectives on one rank, when its job was found hung: the last it
    issued (torch's sequence number) and, from the Flight Recorder, the last it completed and
    the last collective's op and input sizes ("" and None where the recorder is off)."""

    group: str  # torch.distributed's name of the group ("0": the default group)
    issued: int
    completed: int | None = None
    op: str = ""  # e.g. gloo:all_reduce
    sizes: str = ""  # its input sizes, e.g. [[2, 3]]


@dataclass(frozen=True, slots=True, kw_only=True)
class HangRank(JsonRecord):
    """Where one rank was when its job was found hung."""

    rank: int
    local_rank: int
    pid: int
    host: str = ""
    node_rank: int | None = None
    state: RankState
    file: str = ""  # the innermost frame of the user's code
    line: int = 0
    function: str = ""
    code: str = ""  # that line's source
    call: str = ""  # the library call below it, e.g. torch.distributed...all_reduce
    odd: bool = False  # in the odd group out
    threads: tuple[dict[str, Any], ...] = ()  # {"thread_id", "main", "frames": [...]}
    groups: tuple[GroupState, ...] = ()  # its collectives by process group
    no_groups: str = ""  # why there are none: torch.distributed not in use, no answer, ...


@dataclass(frozen=True, slots=True, kw_only=True)
class HangRecord(JsonRecord):
    """A hang: no rank made progress for `idle_s` seconds; every rank's place, then the action."""

    verdict: str
    idle_s: float
    timeout_s: float
    action: HangAction
    attempt: int
    time: float  # when it was found (wall clock)
    ranks: tuple[HangRank, ...] = ()


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


class RunStatus(enum.StrEnum):
    """How a launch ended on this node: the agent's `Status`, or an end before the agent ran."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the agent received a signal
    RENDEZVOUS_FAILED = "rendezvous_failed"
    QUARANTINED = "quarantined"  # this node is in the quarantine ledger: it did not join
    PREFLIGHT_FAILED = "preflight_failed"  # this node failed its preflight (exit 4)
    PREFLIGHT_STOPPED = "preflight_stopped"  # others failed theirs, too few remain (exit 5)
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
