"""A node's status record, and the Observer that keeps it: what `elastic-hydra top` shows.

Pure: the agent's events go in (`Tracker.emit`, an Observer beside the timeline), the samples the
events cannot tell (CPU, memory, GPU, progress) are passed in, and a `NodeStatus` comes out.

The record is read by other processes, from a file or from the rendezvous store, where anyone who
reaches the store could have written it: `decode` caps its size, checks every field's type and
range, and raises `StatusRecordError` naming what is wrong; a reader skips such a record. The
format is a field (`format`); a reader refuses a newer one rather than guess.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from elastic_hydra.agent import events
from elastic_hydra.agent.outcome import Status
from elastic_hydra.agent.phases import AgentPhase, PhaseMachine
from elastic_hydra.jsonrecord import JsonRecord
from elastic_hydra.records.stragglers import Score

FORMAT = 1
MAX_BYTES = 64 << 10  # a record of 256 workers is about 40 KiB
MAX_WORKERS = 256
MAX_TEXT = 256
STALE_PERIODS = 3  # a record older than this many publish periods is stale


class StatusRecordError(ValueError):
    """A status record that does not read as one (too big, not JSON, a field wrong)."""


class JobPhase(enum.StrEnum):
    """Where this node's agent is in the job: the record's words for the phases of
    `agent.phases` (the goodput ledger's source too)."""

    RENDEZVOUS = "rendezvous"  # starting, or waiting for a round (the first, or after a change)
    PREFLIGHT = "preflight"  # the round's preflight battery runs (preflight=quick|full)
    RUNNING = "running"  # the workers run
    RESTARTING = "restarting"  # a restart was decided: the workers are started again
    STOPPING = "stopping"  # the workers stop or ended: a signal, a failure, the job's end
    DONE = "done"  # the agent ended (the record's `status` says how)

    @classmethod
    def of(cls, phase: AgentPhase) -> JobPhase:
        return _JOB_PHASE[phase]


_JOB_PHASE = {
    AgentPhase.STARTUP: JobPhase.RENDEZVOUS,
    AgentPhase.RENDEZVOUS: JobPhase.RENDEZVOUS,
    AgentPhase.PREFLIGHT: JobPhase.PREFLIGHT,
    AgentPhase.RUNNING: JobPhase.RUNNING,
    AgentPhase.FAILED: JobPhase.STOPPING,  # the group is stopped; a restart may follow
    AgentPhase.RESTART: JobPhase.RESTARTING,
    AgentPhase.STOPPING: JobPhase.STOPPING,
    AgentPhase.DONE: JobPhase.DONE,
}


class WorkerState(enum.StrEnum):
    STARTING = "starting"  # the round is done, the process is being started
    RUNNING = "running"
    RESTARTING = "restarting"  # this attempt ended; the next one is on its way
    HUNG = "hung"  # the hang watch found no progress for hang.timeout
    FAILED = "failed"  # exited with an error (a restart may follow)
    STOPPED = "stopped"  # the launcher stopped it (a signal, a hang, another rank's failure)
    DONE = "done"  # exited with code 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStatus(JsonRecord):
    """One local worker, as its node last saw it."""

    rank: int
    local_rank: int
    pid: int | None  # None: not started yet
    state: WorkerState
    progress_age: float | None = None  # seconds since its last progress (hang watch); None: unknown
    # What that progress was (hang watch): `collective #N`, `output`, `python`, `progress()`,
    # `cpu` or `started`; None: unknown.
    progress_via: str | None = None
    # The straggler score (straggler.*): the share of the last collectives it arrived last at,
    # its median lateness then (seconds), and whether it is named a straggler; None: no score.
    last_at: float | None = None
    behind: float | None = None
    straggler: bool = False
    cpu_percent: float | None = None  # of one core, since the previous sample
    rss_bytes: int | None = None
    gpu_util: float | None = None  # percent, of the GPUs it uses (NVML)
    gpu_mem_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus(JsonRecord):
    """What one node's agent publishes every `period` seconds."""

    format: int = FORMAT
    node: str  # the host name (or the rendezvous's name of this agent)
    node_rank: int | None  # None: before the first round
    nodes: int | None
    phase: JobPhase
    attempt: int  # the current (or last) start of the worker group, from 0
    restarts: int  # restarts for failures and hangs
    rounds: int  # rendezvous rounds completed
    agent_pid: int
    period: float  # seconds between records: a reader marks the node stale after a few
    time: float  # when it was written (seconds since the epoch)
    status: Status | None = None  # how the agent ended (phase done)
    workers: tuple[WorkerStatus, ...] = ()

    def stale(self, now: float) -> bool:
        """Whether the node stopped publishing (an ended agent is never stale)."""
        return self.phase is not JobPhase.DONE and now - self.time > STALE_PERIODS * self.period


def encode(record: NodeStatus) -> bytes:
    """The record as stored (compact JSON)."""
    return json.dumps(record.to_json(), separators=(",", ":")).encode()


def decode(raw: bytes) -> NodeStatus:
    """A stored record read back, every field checked.

    Raises:
        StatusRecordError: oversized, not JSON, a newer format, or a field of the wrong type or
            out of range (the message names it).
    """
    if len(raw) > MAX_BYTES:
        raise StatusRecordError(f"{len(raw)} bytes, more than {MAX_BYTES}")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise StatusRecordError(f"not JSON ({exc})") from None
    if isinstance(data, dict) and type(data.get("format")) is int and data["format"] > FORMAT:
        raise StatusRecordError(f"format {data['format']}, newer than {FORMAT}")
    workers = data.get("workers") if isinstance(data, dict) else None
    if isinstance(workers, list) and len(workers) > MAX_WORKERS:
        raise StatusRecordError(f"more than {MAX_WORKERS} workers")
    try:
        record = NodeStatus.from_json(data)
    except ValueError as exc:
        raise StatusRecordError(str(exc)) from None
    _check_ranges(record)
    return record


def _check_ranges(record: NodeStatus) -> None:
    if not record.node or len(record.node) > MAX_TEXT or not record.node.isprintable():
        raise StatusRecordError(f"node: not a node name ({record.node[:40]!r})")
    numbers: dict[str, float | None] = {
        "attempt": record.attempt, "restarts": record.restarts, "rounds": record.rounds,
        "agent_pid": record.agent_pid, "time": record.time, "node_rank": record.node_rank,
        "nodes": record.nodes,
    }  # fmt: skip
    if not 0 < record.period <= 3600:
        raise StatusRecordError(f"period: out of range ({record.period})")
    for w in record.workers:
        via = w.progress_via
        if via is not None and (len(via) > MAX_TEXT or not via.isprintable()):
            raise StatusRecordError(
                f"workers[{w.local_rank}].progress_via: not a progress ({via[:40]!r})"
            )
        numbers |= {
            f"workers[{w.local_rank}].{name}": value
            for name, value in (
                ("rank", w.rank), ("local_rank", w.local_rank), ("pid", w.pid),
                ("progress_age", w.progress_age), ("cpu_percent", w.cpu_percent),
                ("last_at", w.last_at), ("behind", w.behind),
                ("rss_bytes", w.rss_bytes), ("gpu_util", w.gpu_util),
                ("gpu_mem_bytes", w.gpu_mem_bytes),
            )
        }  # fmt: skip
    for name, value in numbers.items():
        if value is not None and not (math.isfinite(value) and 0 <= value < 1e15):
            raise StatusRecordError(f"{name}: out of range ({value})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """What /proc and NVML say of one worker process."""

    cpu_percent: float | None = None
    rss_bytes: int | None = None
    gpu_util: float | None = None
    gpu_mem_bytes: int | None = None


@dataclass(slots=True, kw_only=True)
class Counts:
    """What happened so far, by kind (the metrics' counters)."""

    restarts: dict[str, int] = field(default_factory=dict)  # by cause: failure, hang
    failures: dict[str, int] = field(default_factory=dict)  # acted on (restart, end), by class
    hangs: dict[str, int] = field(default_factory=dict)  # verdicts, by action
    membership: dict[str, int] = field(default_factory=dict)  # by change: joined, left, closed
    rounds: int = 0
    preflight: dict[str, int] = field(default_factory=dict)  # verdicts: passed, failed
    preflight_failed_nodes: int = 0  # nodes the verdicts this node saw named
    quarantine_refusals: int = 0  # rounds this node did not join: it is in the ledger


class Tracker:
    """The node's state, folded from its events (an Observer; the agent feeds it beside the
    timeline). Not thread-safe by itself: the publisher holds a lock around it."""

    def __init__(
        self, *, node: str, nproc: int, agent_pid: int, period: float, preflight: bool = False
    ) -> None:
        self.node, self.nproc, self.agent_pid, self.period = node, nproc, agent_pid, period
        self.machine = PhaseMachine(preflight=preflight)  # a battery after each round
        self.node_rank: int | None = None
        self.nodes: int | None = None
        self.base_rank = 0
        self.attempt = 0
        self.restarts = 0
        self.status: Status | None = None
        self.hang_timeout: float | None = None
        self.workers: list[WorkerStatus] = []
        self.counts = Counts()

    @property
    def phase(self) -> JobPhase:
        return JobPhase.of(self.machine.phase)

    def emit(self, event: events.Event) -> None:
        """Fold one event into the state."""
        self.machine.see(event)
        match event:
            case events.Joining():
                self.attempt = event.attempt
            case events.RendezvousRound():
                self._round(event)
            case events.WorkersStarted():
                self.attempt = event.attempt
                self.workers = [
                    WorkerStatus(
                        rank=self.base_rank + lr, local_rank=lr, pid=pid,
                        state=WorkerState.RUNNING,
                    )
                    for lr, pid in enumerate(event.pids)
                ]  # fmt: skip
            case events.WorkerExited():
                self._exited(event)
            case events.Restart():
                self.restarts = event.restart
                self._bump(self.counts.restarts, "failure" if event.rank is not None else "hang")
                self._bump(self.counts.failures, event.failure_class.value)
                self._all(WorkerState.RESTARTING)
            case events.MembershipChange():
                self._bump(self.counts.membership, event.change.value)
            case events.Preflight():
                self._bump(self.counts.preflight, "passed" if event.passed else "failed")
                self.counts.preflight_failed_nodes += len(event.bad_nodes)
            case events.Quarantined():
                self.counts.quarantine_refusals += 1
            case events.HangWatchStarted():
                self.hang_timeout = event.timeout
            case events.Hang():
                self._bump(self.counts.hangs, event.action.value)
                self._all(WorkerState.HUNG, only=WorkerState.RUNNING)
            case events.Finish():
                self.status = event.status
                if event.failure_class is not None:
                    self._bump(self.counts.failures, event.failure_class.value)
                self._all(WorkerState.STOPPED, only=WorkerState.RUNNING)
                self._all(WorkerState.STOPPED, only=WorkerState.HUNG)

    def _round(self, event: events.RendezvousRound) -> None:
        self.counts.rounds += 1
        self.node_rank, self.nodes, self.attempt = event.node_rank, event.nodes, event.attempt
        self.base_rank = event.base_rank if event.base_rank is not None else self.base_rank
        self.workers = [
            WorkerStatus(rank=self.base_rank + lr, local_rank=lr, pid=None,
                         state=WorkerState.STARTING)
            for lr in range(self.nproc)
        ]  # fmt: skip

    def _exited(self, event: events.WorkerExited) -> None:
        if event.returncode == 0:
            state = WorkerState.DONE
        elif event.terminated_by_launcher:
            state = WorkerState.STOPPED
        else:
            state = WorkerState.FAILED
        self.workers = [
            replace(w, state=state) if w.local_rank == event.local_rank else w for w in self.workers
        ]

    def _all(self, state: WorkerState, only: WorkerState | None = None) -> None:
        self.workers = [
            replace(w, state=state) if only is None or w.state is only else w for w in self.workers
        ]

    @staticmethod
    def _bump(counts: dict[str, int], key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    def record(
        self,
        *,
        now: float,
        samples: Mapping[int, Sample],
        progress: Mapping[int, float],
        how: Mapping[int, str] | None = None,
        stragglers: Mapping[int, tuple[Score, bool]] | None = None,
    ) -> NodeStatus:
        """The record as of `now`: `samples` by pid, `progress` (the wall time of each local
        rank's last progress) and `how` (what it was) from the hang watch, `stragglers` (each
        local rank's score, and whether it is named) from the straggler watch."""
        workers = []
        for w in self.workers:
            age, via = None, None
            live = w.state in (WorkerState.RUNNING, WorkerState.HUNG, WorkerState.STARTING)
            if (last := progress.get(w.local_rank)) is not None and w.pid is not None and live:
                age = round(max(0.0, now - last), 1)
                via = (how or {}).get(w.local_rank)
            state = w.state
            timeout = self.hang_timeout
            if state is WorkerState.HUNG and age is not None and timeout and age < timeout:
                state = WorkerState.RUNNING  # progress again after a reported hang
            s = samples.get(w.pid, Sample()) if w.pid is not None else Sample()
            score, named = (stragglers or {}).get(w.local_rank, (None, False))
            workers.append(
                replace(
                    w, state=state, progress_age=age, progress_via=via,
                    last_at=round(score.share, 3) if score and live else None,
                    behind=round(score.behind, 4) if score and live else None,
                    straggler=named and live, cpu_percent=s.cpu_percent,
                    rss_bytes=s.rss_bytes, gpu_util=s.gpu_util, gpu_mem_bytes=s.gpu_mem_bytes,
                )
            )  # fmt: skip
        return NodeStatus(
            node=self.node, node_rank=self.node_rank, nodes=self.nodes, phase=self.phase,
            attempt=self.attempt, restarts=self.restarts, rounds=self.counts.rounds,
            agent_pid=self.agent_pid, period=self.period, time=now, status=self.status,
            workers=tuple(workers),
        )  # fmt: skip

    def live_pids(self) -> list[int]:
        """The pids of workers that still run (to sample)."""
        ended = (WorkerState.DONE, WorkerState.FAILED, WorkerState.STOPPED)
        return [w.pid for w in self.workers if w.pid is not None and w.state not in ended]
