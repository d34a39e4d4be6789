"""The seams of the agent loop: what the executor asks of the world, as protocols and plain data.

The executor depends on these and nothing else of the runtime; `rendezvous`, `rendezvous_torch`
and `supervise` implement them, the agent wires them, and tests drive the executor with fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from elastic_hydra.agent.events import ChangeKind, Event
from elastic_hydra.agent.outcome import Status
from elastic_hydra.plan import Endpoint
from elastic_hydra.records.failures import FailureRecord, PeerFailure
from elastic_hydra.records.hangs import HangRank, HangRecord
from elastic_hydra.records.preflight import PreflightVerdict
from elastic_hydra.records.stragglers import Change as StragglerChange
from elastic_hydra.records.stragglers import Seen


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAssignment:
    """This node's place in the job, from the rendezvous."""

    group_rank: int  # node rank
    group_world_size: int  # number of nodes
    base_rank: int  # global rank of local rank 0
    world_size: int
    role_base_rank: int
    role_world_size: int
    master: Endpoint
    use_agent_store: bool = False
    # Seconds after its last heartbeat that a peer of this round counts as gone (the longest
    # of the round's: a torchrun agent's is torch's default); 0 without heartbeats.
    departure_bound: float = 0.0
    # The round's nodes by node rank, as the rendezvous names them (address and agent pid: an
    # agent started again is another node); () where the backend cannot tell.
    members: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """A membership change seen while the workers run."""

    kind: ChangeKind
    reason: str
    nodes: int = 0  # nodes still in the job (LEFT)
    peers: tuple[PeerFailure, ...] = ()  # torchrun nodes that restarted their workers or left


@dataclass(frozen=True, slots=True, kw_only=True)
class Exited:
    """A worker process that ended, as the worker group saw it."""

    local_rank: int
    pid: int
    returncode: int
    wall_time: float
    mono_time: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFailures:
    """Every node's failure records the rendezvous holds that passed the checks, and how many
    did not (malformed, unsigned, or from no node of this job)."""

    records: tuple[FailureRecord, ...] = ()
    ignored: int = 0
    last_round: int | None = None  # the round this node ended in; None: no rounds (one node)


class StopRequest(Protocol):
    """Whether a signal asked the agent to stop (set by the agent's signal handlers)."""

    @property
    def signum(self) -> int | None:
        """The signal that asked the agent to stop, or None."""


class Observer(Protocol):
    """Where the loop tells what happens (the run's timeline, the console's progress lines)."""

    def emit(self, event: Event) -> None:
        """One event, as it happens (it carries the time it happened)."""


class JobShare(Protocol):
    """The other nodes' side of a hang and of the straggler score (a torch rendezvous's store;
    see rendezvous.hang_share, rendezvous.arrivals)."""

    def share_progress(self, last: float) -> float:
        """Publish this node's latest progress; the job's latest, every node's counted."""

    def share_hang(self, ranks: Sequence[HangRank]) -> tuple[list[HangRank], int]:
        """Publish this node's ranks of a hang; every node's, and how many nodes said nothing."""

    def share_arrivals(
        self, seen: Mapping[tuple[str, int], Seen], members: Mapping[str, set[int]]
    ) -> tuple[dict[tuple[str, int], Seen], dict[str, set[int]]] | None:
        """Publish this node's collectives (`Seen` by group and sequence number) and its ranks
        by group; every node's merged, on one clock, or None while that is not known."""


class Rendezvous(Protocol):
    def next_round(self) -> NodeAssignment:
        """Join the next round; blocks until it completes. Raises RendezvousError."""

    def poll(self) -> Change | None:
        """A membership change since the round completed, or None. Raises RendezvousError."""

    def publish_failure(self, record: FailureRecord) -> None:
        """Tell the other nodes about a real worker failure on this one (job-wide root cause);
        the rendezvous adds where it happened (node, node rank, round)."""

    def end(self, status: Status, observer: Observer) -> JobFailures:
        """The job ended here with `status`: after success wait for the other nodes, after a
        failure close the job (a node stopped by a signal leaves it running); then every
        node's failure records."""

    def job_share(self) -> JobShare | None:
        """Where the hang watch meets the other nodes; None where it is alone (one node, or
        static nodes without a shared store)."""

    def close(self) -> None: ...


class Refusal(Protocol):
    """Why this node may not join (a quarantine entry): who, which GPUs, the evidence, until
    when, and the one line for the user."""

    @property
    def host(self) -> str: ...

    @property
    def gpus(self) -> tuple[int, ...]: ...  # () for the whole node

    @property
    def evidence(self) -> str: ...

    @property
    def until(self) -> float: ...

    @property
    def line(self) -> str: ...


class Admission(Protocol):
    """Asked before every rendezvous round (the quarantine ledger, see quarantine.gate)."""

    def refusal(self) -> Refusal | None:
        """Why this node may not join the next round, or None to join."""

    def exclude(self, evidence: str) -> str:
        """Keep this node out of later rounds and jobs for a fault of its own (`evidence`); one
        line that says where, or why it could not."""


class NodeExchange(Protocol):
    """The round's nodes swap one value each (the preflight's results) through the round's store."""

    @property
    def round(self) -> int:
        """The round's number, the same on every node of it."""

    def gather(self, topic: str, value: bytes, *, limit: int, timeout: float) -> list[bytes | None]:
        """Publish this node's `value` under `topic`; every node's by node rank, each cut at
        `limit` bytes, None for a node that published nothing within `timeout` seconds.
        Raises RendezvousError when the store is gone."""

    def first(self, topic: str, value: bytes, *, limit: int, timeout: float) -> bytes:
        """The first value any node of the round offered under `topic` (this node's `value`
        when it is the first, or when the first one's is not there within `timeout` seconds),
        cut at `limit` bytes: every node that asks gets the same one.
        Raises RendezvousError when the store is gone."""

    def offered(self, topic: str, *, limit: int) -> bytes | None:
        """The value `first` holds under `topic` now (cut at `limit` bytes), None when no node
        has offered one: a look that neither offers nor waits.
        Raises RendezvousError when the store is gone."""


class Saver(Protocol):
    """The workers' snapshots (`checkpoint.*`), saved when a stop signal comes."""

    def save(self, node: NodeAssignment, grace: float, running: Callable[[], bool]) -> int | None:
        """Ask every rank to snapshot one agreed step, wait for it (at most `grace` seconds,
        while `running` says workers run), and keep it in the job's checkpoint home; the step
        kept (an older one where the agreed one did not come), None when there was none."""

    def asked(self) -> bool:
        """Whether another node of the round was asked to save (a stop signal reached its
        agent): this node then saves the same step and stops too. A look at the round's store,
        made while the workers run."""


class Preflight(Protocol):
    """The battery between a completed round and the workers (`preflight.*`)."""

    def check(self, node: NodeAssignment, attempt: int, restart_count: int) -> PreflightVerdict:
        """Run this node's share of the round's battery; the round's verdict, the same on every
        node (the lines are on the console already)."""


class WorkerGroup(Protocol):
    paused: list[int]  # local ranks found stopped (SIGSTOP) when the group was stopped

    @property
    def pids(self) -> list[int]: ...

    def running(self) -> list[int]: ...

    def wait(self, timeout: float | None) -> list[Exited]: ...

    def stop(self, sig: int, grace: float) -> tuple[list[Exited], list[int]]: ...

    def close(self) -> None: ...


class HangWatch(Protocol):
    """Watches an attempt's workers for progress (hang.timeout)."""

    def start(self, pids: list[int], node: NodeAssignment, attempt: int) -> None:
        """Watch a new attempt's workers (pids by local rank)."""

    def check(self, running: list[int]) -> HangRecord | None:
        """The hang found now, every rank's stack saved first; None while a rank progresses,
        and after a hang until progress resumes."""

    def last_progress(self) -> float | None:
        """When (wall clock) a rank of this attempt last made progress, as of the last look
        (the attempt's start before any); None before the first attempt. The goodput ledger's
        work lost to a failure starts there."""


class StragglerWatch(Protocol):
    """Scores the ranks' arrivals at the job's collectives (straggler.*)."""

    def start(self, node: NodeAssignment, attempt: int, count: int) -> None:
        """Score a new attempt's `count` workers on this node."""

    def check(self) -> list[StragglerChange]:
        """The ranks named stragglers, or cleared, since the last check."""


class WorkerGroupFactory(Protocol):
    def __call__(self, node: NodeAssignment, attempt: int, restart_count: int) -> WorkerGroup:
        """Start the workers of one attempt (the n-th start of the group, from 0), after
        `restart_count` restarts for failures."""


class Clock(Protocol):
    def wall(self) -> float: ...

    def mono(self) -> float: ...

    def random(self) -> float: ...

    def sleep(self, seconds: float) -> None:
        """Sleep, returning early when a stop is requested."""
