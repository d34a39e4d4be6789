"""The resolved, frozen description of one launch: `resolve` makes it, everything else reads it.

Pure data: no I/O, no clock, no environment. Variants are tagged unions (one dataclass per kind).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from elastic_hydra.gpus import WorkerDevices


# --------------------------------------------------------------------------------------- entrypoint
@dataclass(frozen=True, slots=True, kw_only=True)
class PythonScript:
    """`python -u <path> args...`; `path` is absolute."""

    path: str
    python: str
    args: tuple[str, ...] = ()
    bootstrap: str | None = None  # the traceback-recording bootstrap it runs through, if any


@dataclass(frozen=True, slots=True, kw_only=True)
class PythonModule:
    """`python -u -m <name> args...`."""

    name: str
    python: str
    args: tuple[str, ...] = ()
    bootstrap: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """A non-Python program, executed directly."""

    program: str
    args: tuple[str, ...] = ()


Entrypoint = PythonScript | PythonModule | Command


def worker_argv(entry: Entrypoint) -> tuple[str, ...]:
    """The exact argv of a worker (torchrun's form: unbuffered Python, no --local-rank)."""
    match entry:
        case PythonScript(path=path, python=python, args=args, bootstrap=boot):
            return (python, "-u", *([boot] if boot else []), path, *args)
        case PythonModule(name=name, python=python, args=args, bootstrap=boot):
            return (python, "-u", *([boot] if boot else []), "-m", name, *args)
        case Command(program=program, args=args):
            return (program, *args)


# --------------------------------------------------------------------------------------- rendezvous
@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Standalone:
    """One node, no external service: the agent allocates the master port itself."""

    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Static:
    """Fixed node ranks; node 0's workers host the store at master_addr:master_port."""

    master: Endpoint
    node_rank: int


class DynamicBackend(enum.Enum):
    C10D = "c10d"
    ETCD_V2 = "etcd-v2"
    ETCD = "etcd"


# torch's default heartbeats (keep_alive_interval 5 s x keep_alive_max_attempt 3): the bound
# after which an elastic-hydra agent drops a torchrun agent of the same job.
TORCH_DEPARTURE_BOUND = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Dynamic:
    """A torch.distributed.elastic rendezvous handler (c10d, etcd-v2 or legacy etcd)."""

    backend: DynamicBackend
    endpoint: Endpoint
    join_timeout: float
    last_call_timeout: float
    close_timeout: float
    heartbeat_timeout: float
    keep_alive_interval: float
    keep_alive_max_attempt: int
    read_timeout: float
    exit_barrier_timeout: float = 300.0
    connect_timeout: float = 10.0  # c10d, not hosting: retry a refused store this long
    timeout: float = 900.0  # legacy etcd: the whole rendezvous
    is_host: bool | None = None
    node_order: int | None = None  # this node's place among the nodes (Slurm's); None: torch's
    await_replacement: bool = False  # below MIN after a loss: wait for a node to take its place

    @property
    def departure_bound(self) -> float:
        """An elastic-hydra agent without a heartbeat for this long has left (torch's rule)."""
        return self.keep_alive_interval * self.keep_alive_max_attempt

    @property
    def torchrun_departure_bound(self) -> float:
        """... and a torchrun agent in the same job: judged at torch's default bound at least,
        the heartbeats its own defaults send (`rendezvous.torch_handler.judge_heartbeats`)."""
        return max(self.departure_bound, TORCH_DEPARTURE_BOUND)


Rendezvous = Standalone | Static | Dynamic


# ------------------------------------------------------------------------------------------ restart
class Action(enum.Enum):
    RETRY = "retry"
    FAIL = "fail"


class FailureClass(enum.StrEnum):
    """What kind of failure it was, as far as the agent can tell (`failures.classify`); the
    restart policy acts on it (`restart.on_class`)."""

    USER_ERROR = "user_error"  # deterministic: an import or syntax error, a bad path, a repeat
    OOM_HOST = "oom_host"  # the kernel's OOM killer (or MemoryError)
    OOM_GPU = "oom_gpu"  # CUDA out of memory
    COMM = "comm"  # a lost peer, an NCCL or gloo error
    HARDWARE = "hardware"  # a GPU Xid, an ECC error
    HANG = "hang"  # the hang watch's verdict
    PREEMPTED = "preempted"  # the agent was told to stop (SIGTERM, SIGINT, scancel, a pod's end)
    NODE_LOST = "node_lost"  # a node of the job left or died
    INFRA = "infra"  # a full disk, the rendezvous store lost
    UNKNOWN = "unknown"  # nothing tells: the restart policy alone decides


class ClassAction(enum.Enum):
    """What the restart policy does with a class of failure (`restart.on_class`)."""

    RETRY = "retry"  # the restart policy's budget, window and backoff decide
    ONCE = "once"  # retried; the same failure again (class, exception, frame) is not
    FAIL = "fail"  # never retried
    EXCLUDE = "exclude"  # this node leaves the job (into the quarantine ledger, where one is set)


# What each class does unless restart.on_class says otherwise.
DEFAULT_ON_CLASS: dict[FailureClass, ClassAction] = {
    FailureClass.USER_ERROR: ClassAction.ONCE,
    FailureClass.OOM_HOST: ClassAction.ONCE,
    FailureClass.OOM_GPU: ClassAction.ONCE,
    FailureClass.COMM: ClassAction.RETRY,
    FailureClass.HARDWARE: ClassAction.EXCLUDE,
    FailureClass.HANG: ClassAction.RETRY,
    FailureClass.INFRA: ClassAction.ONCE,
    FailureClass.UNKNOWN: ClassAction.RETRY,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Delay before restart k >= 1: min(initial * multiplier**(k-1), maximum), then +- jitter."""

    initial: float = 0.0
    maximum: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.0  # fraction of the delay, 0.1 = +-10 %


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartWindow:
    """At most `max_restarts` restarts within any `seconds`-long window."""

    max_restarts: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartSpec:
    max_restarts: int = 0
    backoff: Backoff = Backoff()
    window: RestartWindow | None = None
    on_exit_code: tuple[tuple[int, Action], ...] = ()
    on_signal: tuple[tuple[int, Action], ...] = ()
    fail_fast_seconds: float = 0.0
    # Every class the policy acts on, with its action (DEFAULT_ON_CLASS, then restart.on_class).
    on_class: tuple[tuple[FailureClass, ClassAction], ...] = tuple(DEFAULT_ON_CLASS.items())

    def class_action(self, found: FailureClass) -> ClassAction:
        return dict(self.on_class).get(found, ClassAction.RETRY)


# --------------------------------------------------------------------------------------------- logs
DEFAULT_PREFIX = "[{role}{local_rank}]:"  # torchrun's
MULTINODE_PREFIX = "[{host}:{role}{local_rank}]:"  # the default on several nodes


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSpec:
    tee: bool = True
    quiet: bool = False
    console_ranks: frozenset[int] | None = None  # local ranks that reach the console; None = all
    prefix: str = DEFAULT_PREFIX
    tail_lines: int = 20
    merge: float = 1.0  # seconds a console line waits for the same line from other ranks; 0: off


# ------------------------------------------------------------------------------------- quarantine
@dataclass(frozen=True, slots=True, kw_only=True)
class QuarantineSpec:
    """The quarantine ledger the agent reads before every rendezvous round (see quarantine/)."""

    ledger: str  # absolute path of the ledger file
    cooldown: float  # seconds an entry this job adds keeps its host or GPU out


class PreflightMode(enum.StrEnum):
    OFF = "off"  # no battery: the workers start right after the rendezvous
    QUICK = "quick"  # GEMM per worker, allreduce in and across nodes, node checks
    FULL = "full"  # quick, then node pairs to name a slow link


@dataclass(frozen=True, slots=True, kw_only=True)
class PreflightSpec:
    """The preflight battery between a round and the workers (`preflight=off|quick|full`)."""

    mode: PreflightMode = PreflightMode.OFF
    min_ratio: float = 0.8  # of the job's median (GEMM rate, bus bandwidth) below which it fails
    gemm_size: int = 512  # n of the n x n matrix multiply
    gemm_seconds: float = 0.5  # how long each worker multiplies (several CPU quota periods)
    allreduce_bytes: int = 4 << 20
    allreduce_reps: int = 5
    timeout: float = 60.0  # the whole battery on a node, the exchange of results included
    paths: tuple[str, ...] = ()  # besides the run dir: free space and a write probe
    min_free_bytes: int = 1 << 30


# --------------------------------------------------------------------------------------------- plan
TORCHRUN_RUN_ID = "none"  # torchrun's --rdzv-id default: the run id of a job that names none


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRange:
    min: int
    max: int

    def __str__(self) -> str:
        return str(self.min) if self.min == self.max else f"{self.min}:{self.max}"


# hang.timeout=auto: the rule the watch learns the job's rhythm by (see HangSpec).
LEARN_FLOOR = 60.0  # seconds: a learned timeout is never shorter
LEARN_MULTIPLE = 5.0  # times the longest gap between progress events seen
LEARN_GAPS = 20  # gaps seen before the learned timeout applies (the cap until then)


class HangAction(enum.StrEnum):
    REPORT = "report"  # dump every rank's stack, give the verdict, keep running
    RESTART = "restart"  # ... then stop the workers: a failure under the restart policy
    FAIL = "fail"  # ... then stop the workers and end the job (exit 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class HangSpec:
    """When a job counts as hung: no rank made progress for `timeout` seconds (None: never),
    and not within the first `warmup` seconds of an attempt; how long its workers get to stop.

    `learned` (hang.timeout=auto, the default): `timeout` is the most the watch waits; once it
    has seen LEARN_GAPS gaps between the job's progress events, it calls a hang after
    LEARN_MULTIPLE times the longest of them, and never before LEARN_FLOOR seconds."""

    timeout: float | None = 300.0
    learned: bool = False
    warmup: float = 0.0
    action: HangAction = HangAction.REPORT
    grace: float = 5.0  # SIGTERM to SIGKILL for the workers of a hang (at most stop_grace)

    @property
    def first_verdict(self) -> float | None:
        """The earliest a hang can be declared after an attempt starts (None: never). Idle time
        counts from the start, so a warm-up shorter than the timeout changes nothing."""
        if self.timeout is None:
            return None
        return max(min(LEARN_FLOOR, self.timeout) if self.learned else self.timeout, self.warmup)

    @property
    def sample(self) -> float:
        """How often each worker looks at its own stack (and the agent at the workers)."""
        return 1.0 if self.timeout is None else max(0.05, min(1.0, self.timeout / 5))


LEARNED = HangSpec(learned=True)  # the default: hang.timeout=auto


# The straggler rule (see StragglerSpec and stragglers.score).
NAME_SHARE = 0.8  # of the last straggler.window collectives a rank arrives last at, to be named
QUICK_SHARE = 0.9  # ... or of the last MIN_SCORED (14 of 15)
CLEAR_SHARE = 0.5  # of the last MIN_SCORED, under which a named rank is cleared
MIN_SCORED = 15  # collectives scored before anyone is named
RELATIVE = 0.1  # of the job's median interval between collectives: the least lateness named


class StragglerAction(enum.StrEnum):
    OFF = "off"  # no score
    REPORT = "report"  # a console line, an event, top's column and a metric; nothing stopped
    FAIL = "fail"  # ... then stop the workers and end the job (exit 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerSpec:
    """The straggler score (see `stragglers.score`): over each rank's last `window` collectives,
    a rank last at most of them by a median of at least `behind` seconds (and a tenth of the
    job's interval between collectives) is named. It needs the hang watch's sampler."""

    action: StragglerAction = StragglerAction.REPORT
    window: int = 50
    behind: float = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSpec:
    """Prometheus metrics of the agent: served on `port` (0: any free one; None: not served)
    of the job's address, and/or written to `textfile` (an absolute path; None: not written)."""

    port: int | None = None
    textfile: str | None = None

    @property
    def enabled(self) -> bool:
        return self.port is not None or self.textfile is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmSpec:
    """Warm starts: the modules a template process imports once per node, from which every
    Python worker is forked (`warm/`); () starts every worker cold."""

    imports: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSpec:
    """`checkpoint.*`: the snapshots the agent keeps for its workers (`checkpoint/`), and the
    job's durable copies of them."""

    home: str  # absolute: the same for every node and every relaunch of the job
    job: str  # the job as its copies name it (the entrypoint, the run id): others are refused
    resume: bool = True  # a launch resumes from the newest complete copy in the home
    keep: int = 2  # complete copies kept in the home
    max_memory: int = 0  # bytes one rank's snapshot may take; 0: no limit
    memory: str = "/dev/shm"  # where the snapshot areas go
    buddy: bool = True  # on several nodes, a copy of each node's snapshots on the next node


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchPlan:
    """Everything the executor needs for one launch, validated."""

    entrypoint: Entrypoint
    nnodes: NodeRange
    nproc_per_node: int
    rdzv: Rendezvous
    run_id: str | None  # None: the job names none (a standalone launch always has a fresh one)
    role: str = "default"
    local_addr: str | None = None
    restart: RestartSpec = RestartSpec()
    logs: LogSpec = LogSpec()
    hang: HangSpec = LEARNED
    straggler: StragglerSpec = StragglerSpec()
    metrics: MetricsSpec = MetricsSpec()
    stop_grace: float = 30.0
    monitor_interval: float = 0.1
    env: tuple[tuple[str, str], ...] = ()
    devices: tuple[WorkerDevices, ...] = ()  # by local rank; () leaves devices alone
    run_dir: str = ""  # on several nodes, this node's directory inside the job's
    config_hash: str = ""  # of the job's resolved config: every node must have the same
    quarantine: QuarantineSpec | None = None  # None: no ledger (quarantine.ledger=null)
    collective_timeout: float | None = None  # timeouts.collective; None: torch's default
    warm: WarmSpec = WarmSpec()  # () for cmd= and bootstrap=false: they start cold
    preflight: PreflightSpec = PreflightSpec()
    checkpoint: CheckpointSpec | None = None  # None: no snapshots kept (a plan made by hand)
    # When the launch began (epoch seconds: the instant its run dir is named after); the workers
    # get it (a Hydra app's `${now:}` in them). None: the agent's own start (a sweep's job).
    launch_time: float | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        return worker_argv(self.entrypoint)

    @property
    def torch_run_id(self) -> str:
        """The run id as torchrun gives it: the job's, else torchrun's default `none`. It names
        the rendezvous and its store keys, it is the workers' TORCHELASTIC_RUN_ID, and the run id
        summary.json, plan.json and the plan table show."""
        return TORCHRUN_RUN_ID if self.run_id is None else self.run_id

    def stragglers_unscored(self) -> str:
        """Why the straggler score is off ("" when it is on)."""
        if self.straggler.action is StragglerAction.OFF:
            return "straggler.action=off"
        if self.hang.timeout is None:
            return "the score reads the hang watch's samples (hang.timeout=null)"
        if not self.entrypoint_bootstrapped:
            return "the workers do not run through the bootstrap (cmd= or bootstrap=false)"
        if isinstance(self.rdzv, Static) and self.nnodes.max > 1:
            return "rdzv=static on several nodes: the nodes share no store of ours"
        return ""

    @property
    def entrypoint_bootstrapped(self) -> bool:
        """Python workers run through the bootstrap (tracebacks, stacks on demand, progress)."""
        return not isinstance(self.entrypoint, Command) and self.entrypoint.bootstrap is not None


def to_dict(value: Any) -> Any:
    """A JSON-ready view of a plan (or any part of it); tagged unions carry their `kind`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        if isinstance(value, (PythonScript, PythonModule, Command, Standalone, Static, Dynamic)):
            out["kind"] = type(value).__name__.lower()
        for f in dataclasses.fields(value):
            out[f.name] = to_dict(getattr(value, f.name))
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, (tuple, list)):
        return [to_dict(v) for v in value]
    return value
