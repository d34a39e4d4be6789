"""The run's timeline: one typed event per line of `events.jsonl`. Pure: building and reading
JSON objects, not writing or opening files.

Each kind of event is a frozen dataclass; `Event` is their union, so a reader `match`es on
the class and a renamed field fails mypy, not a report at run time. `to_json` gives the line's
object, `event_from_json` reads one back and checks every field.

The format version is a field on every line (`"format": 1`, last), not a header line: the file
is appended and flushed one event at a time, so a run killed mid-write, or a reader tailing a
live run (`elastic-hydra stacks`), still knows each line's format; every line stays one event
for line-wise tools (grep, jq); and a file appended to by another release cannot mix formats
unseen. A line without the field was written before it existed (format 0: today's keys). A new
kind or a new key does not change the format (readers skip kinds and ignore keys they do not
know); renaming or removing a key, or changing what one means, does.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypedDict

from elastic_hydra.agent.outcome import Status
from elastic_hydra.jsonrecord import checked, plain
from elastic_hydra.plan import FailureClass, HangAction, StragglerAction

FORMAT = 1  # the format this release writes, and the newest it reads


class EventKind(enum.Enum):
    JOINING = "joining"  # the agent waits for a rendezvous round to complete
    RENDEZVOUS = "rendezvous"  # a rendezvous round completed
    WORKERS_STARTED = "workers_started"  # pids of the attempt's workers
    WORKER_EXITED = "worker_exited"  # exit code or signal of one worker
    RESTART = "restart"  # the group restarts: reason and delay
    MEMBERSHIP = "membership"  # a node joined, left or ended the job while the workers ran
    EXIT_BARRIER = "exit_barrier"  # after success: how long this node waited for the others
    SIGNAL = "signal"  # the agent received a signal
    STOPPING = "stopping"  # a signal stops the workers: how many, and the grace
    STOP = "stop"  # workers were stopped: why, and pids that would not die
    HANG_WATCH = "hang_watch"  # the hang watch started: when its first verdict can come
    HANG = "hang"  # no rank made progress for hang.timeout: the verdict, then the action
    STRAGGLER = "straggler"  # a rank named a straggler (it arrives last), or no longer one
    PREFLIGHT = "preflight"  # the round's preflight verdict: passed, or the nodes that failed
    FINISH = "finish"  # the run ended: status and exit code
    QUARANTINED = "quarantined"  # this node is in the quarantine ledger: it does not join
    WARM_FALLBACK = "warm_fallback"  # warm starts are off for the rest of the launch: why


class ChangeKind(enum.Enum):
    """A membership change seen while the workers run (`seams.Change`, the `membership` event)."""

    JOINED = "joined"  # a node waits to join: re-rendezvous, no restart spent
    LEFT = "left"  # a node stopped heartbeating: re-rendezvous if enough nodes remain
    CLOSED = "closed"  # another node ended the job


class EventLineError(ValueError):
    """A line of events.jsonl that does not read as an event (names the field at fault)."""


class UnknownEventKindError(EventLineError):
    """An event of a kind this release does not know (written by a newer one)."""


class NewerFormatError(ValueError):
    """events.jsonl written in a newer format than this release reads."""

    def __init__(self, found: int) -> None:
        super().__init__(f"format {found}, newer than format {FORMAT} that this release reads")
        self.found = found


class Stamp(TypedDict):
    """When an event happened: the two clocks every event carries (`**stamp` into one)."""

    wall_time: float
    mono_time: float


_KEYS = {"wall_time": "time", "mono_time": "monotonic"}  # field -> JSON key, where they differ


@dataclass(frozen=True, slots=True, kw_only=True)
class _Event:
    """What every event has: its kind, and when it happened on this host."""

    kind: ClassVar[EventKind]
    wall_time: float  # seconds since the epoch ("time")
    mono_time: float  # time.monotonic(), comparable within one host ("monotonic")

    def to_json(self) -> dict[str, Any]:
        """The object of one line of events.jsonl: `event`, `time`, `monotonic`, the event's
        own fields in order, then `format`."""
        line: dict[str, Any] = {"event": self.kind.value}
        for f in dataclasses.fields(self):
            line[_KEYS.get(f.name, f.name)] = plain(getattr(self, f.name))
        line["format"] = FORMAT
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class Joining(_Event):
    kind: ClassVar[EventKind] = EventKind.JOINING
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RendezvousRound(_Event):
    kind: ClassVar[EventKind] = EventKind.RENDEZVOUS
    attempt: int
    node_rank: int
    nodes: int
    world_size: int
    master: str  # host:port
    base_rank: int | None = None  # global rank of local rank 0 (left out when None)

    def to_json(self) -> dict[str, Any]:
        line = _Event.to_json(self)
        if self.base_rank is None:
            del line["base_rank"]
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersStarted(_Event):
    kind: ClassVar[EventKind] = EventKind.WORKERS_STARTED
    pids: tuple[int, ...]  # by local rank
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerExited(_Event):
    kind: ClassVar[EventKind] = EventKind.WORKER_EXITED
    rank: int
    local_rank: int
    pid: int
    returncode: int
    exit: str  # the return code, told (records.describe_returncode(...).short)
    terminated_by_launcher: bool
    attempt: int
    # A failure's: when (wall clock) the hang watch last saw a rank of the attempt progress;
    # the work lost to it counts from there. None: no watch, or not a failure (left out).
    last_progress: float | None = None

    def to_json(self) -> dict[str, Any]:
        line = _Event.to_json(self)
        if self.last_progress is None:
            del line["last_progress"]
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class Restart(_Event):
    kind: ClassVar[EventKind] = EventKind.RESTART
    reason: str
    delay: float  # seconds before the new attempt
    restart: int  # the restart's number, from 1
    rank: int | None  # the root cause's rank; None: the workers hung
    failure_class: FailureClass = FailureClass.UNKNOWN  # the root cause's (left out: unknown)

    def to_json(self) -> dict[str, Any]:
        line = _Event.to_json(self)
        if self.failure_class is FailureClass.UNKNOWN:
            del line["failure_class"]
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipChange(_Event):
    kind: ClassVar[EventKind] = EventKind.MEMBERSHIP
    change: ChangeKind
    reason: str
    nodes: int  # nodes still in the job (left)
    collateral: tuple[int, ...] = ()  # ranks here that failed with it (left out when none)

    def to_json(self) -> dict[str, Any]:
        line = _Event.to_json(self)
        if not self.collateral:
            del line["collateral"]
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitBarrier(_Event):
    kind: ClassVar[EventKind] = EventKind.EXIT_BARRIER
    waited: float | None  # seconds; None: the barrier did not complete
    completed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalReceived(_Event):
    kind: ClassVar[EventKind] = EventKind.SIGNAL
    signal: str  # its name, SIGTERM


@dataclass(frozen=True, slots=True, kw_only=True)
class Stopping(_Event):
    kind: ClassVar[EventKind] = EventKind.STOPPING
    signal: str
    workers: int  # still running
    grace: float  # seconds they have before SIGKILL (stop_grace, or hang.grace)
    hung: bool = False  # they hung: their stacks are saved, the grace is hang.grace (left out)

    def to_json(self) -> dict[str, Any]:
        line = _Event.to_json(self)
        if not self.hung:
            del line["hung"]
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop(_Event):
    kind: ClassVar[EventKind] = EventKind.STOP
    reason: str
    signal: str
    stopped_ranks: tuple[int, ...]  # local ranks still running when the stop began
    paused_ranks: tuple[int, ...]  # found stopped (SIGSTOP), resumed to exit
    stuck_pids: tuple[int, ...]  # would not die


@dataclass(frozen=True, slots=True, kw_only=True)
class HangWatchStarted(_Event):
    kind: ClassVar[EventKind] = EventKind.HANG_WATCH
    timeout: float  # hang.timeout (learned: the most it waits)
    warmup: float  # hang.warmup
    first_verdict: float  # seconds after an attempt starts: max(timeout, warmup)
    action: HangAction
    learned: bool = False  # hang.timeout=auto

    def to_json(self) -> dict[str, Any]:
        line = _Event.to_json(self)
        if not self.learned:  # as lines read before the key existed
            del line["learned"]
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class Hang(_Event):
    kind: ClassVar[EventKind] = EventKind.HANG
    verdict: str
    action: HangAction
    idle: float  # seconds without progress
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler(_Event):
    """A rank named a straggler (`named`), or cleared: over the last `of` scored collectives of
    its groups it arrived last at `last`, by a median of `behind` seconds."""

    kind: ClassVar[EventKind] = EventKind.STRAGGLER
    rank: int
    named: bool
    last: int
    of: int
    behind: float  # seconds
    op: str  # the op it was last at most often ("" when never)
    threshold: float  # the median lateness it was judged against (seconds)
    action: StragglerAction
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Preflight(_Event):
    kind: ClassVar[EventKind] = EventKind.PREFLIGHT
    passed: bool
    nodes: int  # in the round
    bad_nodes: tuple[int, ...]  # node ranks that leave the job
    seconds: float  # this node's time in the battery
    attempt: int  # the start of the worker group it came before


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish(_Event):
    kind: ClassVar[EventKind] = EventKind.FINISH
    status: Status
    exit_code: int
    reason: str
    attempts: int
    failure_class: FailureClass | None = None  # what the run ended on (left out when None)

    def to_json(self) -> dict[str, Any]:
        line = _Event.to_json(self)
        if self.failure_class is None:
            del line["failure_class"]
        return line


@dataclass(frozen=True, slots=True, kw_only=True)
class Quarantined(_Event):
    kind: ClassVar[EventKind] = EventKind.QUARANTINED
    host: str  # as the ledger names it
    gpus: tuple[int, ...]  # the quarantined GPUs its workers would use; () for the whole node
    evidence: str  # the entry's reason
    until: float  # when the entry expires (seconds since the epoch)
    attempt: int  # the round it did not join


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmFallback(_Event):
    """The workers start cold from now on (`warm/`): the template refused or broke."""

    kind: ClassVar[EventKind] = EventKind.WARM_FALLBACK
    reason: str


Event: TypeAlias = (
    Joining
    | RendezvousRound
    | WorkersStarted
    | WorkerExited
    | Restart
    | MembershipChange
    | ExitBarrier
    | SignalReceived
    | Stopping
    | Stop
    | HangWatchStarted
    | Hang
    | Straggler
    | Preflight
    | Finish
    | Quarantined
    | WarmFallback
)
_BY_KIND: dict[str, type[Event]] = {cls.kind.value: cls for cls in typing.get_args(Event)}
_HINTS: dict[EventKind, dict[str, Any]] = {}


def event_from_json(obj: object) -> Event:
    """One line's object read back as its event, every field checked.

    Raises:
        NewerFormatError: the line's `format` is newer than `FORMAT`.
        UnknownEventKindError: a kind this release does not know.
        EventLineError: anything else that is not an event (names the key at fault).
    """
    if not isinstance(obj, dict):
        raise EventLineError(f"expected a JSON object, got {type(obj).__name__}")
    version = obj.get("format", 0)
    if type(version) is not int or version < 0:
        raise EventLineError(f"format: expected a whole number, got {version!r:.40}")
    if version > FORMAT:
        raise NewerFormatError(version)
    kind = obj.get("event")
    if not isinstance(kind, str):
        raise EventLineError(f"event: expected the event's kind, got {kind!r:.40}")
    if (cls := _BY_KIND.get(kind)) is None:
        raise UnknownEventKindError(f"event: unknown kind {kind!r:.40}")
    if version == 0 and "round" in obj:
        # Before `attempt` meant one start of the worker group, that count was `round` (and
        # `attempt` counted restarts).
        obj = {**obj, "attempt": obj["round"]}
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = _KEYS.get(f.name, f.name)
        if key in obj:
            try:
                values[f.name] = checked(f"{kind}.{key}", obj[key], hints[f.name])
            except ValueError as exc:
                raise EventLineError(str(exc)) from None
        elif f.default is dataclasses.MISSING:
            raise EventLineError(f"{kind}.{key}: missing")
    return cls(**values)


def _hints(cls: type[Event]) -> dict[str, Any]:
    """Each field's type, evaluated once per kind (the annotations are strings until then)."""
    if (hints := _HINTS.get(cls.kind)) is None:
        hints = _HINTS[cls.kind] = typing.get_type_hints(cls)
    return hints
