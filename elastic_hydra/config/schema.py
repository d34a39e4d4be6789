"""The typed Hydra schema of a job (mutable `*Conf` dataclasses registered in Hydra's ConfigStore).

Composition checks key names and types against it; `resolve` checks everything else. It is the one
source of every key's default and help: `--help` and the keys table of docs/job-files.md are
generated from it.
Defaults equal torchrun's where torchrun has one.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from elastic_hydra.rundir import LOGS_ROOT

SCHEMA_NAME = "elastic_hydra_schema"
CONF_MODULE = "elastic_hydra.conf"  # the presets (conf/ in the repository), as a package


def key(default: Any, help: str) -> Any:
    """A schema field: its default and its one line of help (--help and the docs' keys table)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def group(conf: type[Any], help: str) -> Any:
    return field(default_factory=conf, metadata={"help": help})


@dataclass
class RdzvConf:
    backend: str = key(
        "standalone",
        "standalone (one node, nothing external), static (fixed node ranks), c10d, etcd-v2, "
        "etcd (torch's rendezvous handlers), slurm (c10d at the Slurm step's first node), "
        "kubeflow, jobset, skypilot, dstack (c10d at the node 0 their variables name) or auto "
        "(whichever of these started the process)",
    )
    endpoint: str = key(
        "", "host[:port] of the c10d store or etcd server (ports 29400, 2379); needed on 2+ nodes"
    )
    id: str | None = key(
        None, "job id shared by all nodes (needed on 2+ nodes); null: a fresh uuid (standalone)"
    )
    join_timeout: float = key(600.0, "seconds to wait for the minimum number of nodes")
    last_call_timeout: float = key(
        2.0, "seconds to wait for more nodes once MIN joined (torchrun's: 30); enough for the "
        "nodes of a running round to re-join after a change",
    )  # fmt: skip
    close_timeout: float = key(30.0, "seconds to wait for the rendezvous to close")
    heartbeat_timeout: float = key(5.0, "c10d: heartbeat timeout, seconds")
    keep_alive_interval: float = key(
        1.0, "seconds between a node's heartbeats (torchrun's: 5; its agents in the job are "
        "judged at its bound)",
    )  # fmt: skip
    keep_alive_max_attempt: int = key(
        3, "heartbeats missed before a node counts as gone (the others re-rendezvous)"
    )
    read_timeout: float = key(60.0, "seconds a store read may take")
    connect_timeout: float = key(
        10.0,
        "c10d, a node that does not host the store: seconds it retries a store that refuses "
        "connections (not started yet, or a wrong endpoint) before it stops",
    )
    exit_barrier_timeout: float = key(
        300.0, "after its workers succeed, seconds a node waits for the others to finish"
    )
    is_host: bool | None = key(
        None, "c10d: host the store in this agent; null: when the endpoint is this machine"
    )
    timeout: float = key(900.0, "legacy etcd: seconds for the whole rendezvous")
    await_replacement: bool = key(
        False, "when a lost node leaves fewer than nnodes' MIN, the survivors wait (rdzv."
        "join_timeout) for a node to take its place; false: they stop (exit 3)",
    )  # fmt: skip


@dataclass
class BackoffConf:
    initial: float = key(0.0, "seconds before the first restart")
    max: float = key(60.0, "longest delay, seconds")
    multiplier: float = key(2.0, "delay before restart k: min(initial*multiplier^(k-1), max)")
    jitter: float = key(0.0, "+- this fraction of the delay, e.g. 0.1")


@dataclass
class RestartConf:
    max_restarts: int = key(0, "restarts of the worker group after a failure; 0 = never")
    backoff: BackoffConf = group(BackoffConf, "the delay before each restart")
    window_restarts: int | None = key(None, "at most this many restarts in window_seconds")
    window_seconds: float | None = key(None, "the window of window_restarts (set both or neither)")
    on_exit_code: dict[Any, str] = key({}, "retry or fail per exit code, e.g. {3: fail}")
    on_signal: dict[Any, str] = key({}, "retry or fail per signal, e.g. {SIGKILL: fail}")
    on_class: dict[str, str] = key(
        {}, "retry, once, fail or exclude per failure class, e.g. {user_error: fail}"
    )
    fail_fast_seconds: float = key(
        0.0, "a failure this soon after an attempt starts stops the job; 0 = off"
    )


@dataclass
class LogsConf:
    root: str = key(LOGS_ROOT, "where run directories go (relative to the current directory)")
    tee: bool = key(True, "copy worker output to the console (the files are always written)")
    quiet: bool = key(False, "nothing on the console but the final summary")
    ranks: list[int] | None = key(None, "local ranks whose output reaches the console; null: all")
    prefix: str = key(
        "[{role}{local_rank}]:",
        "console prefix of each line; fields {role} {rank} {local_rank} {host} {node_rank}; on"
        " several nodes the default is [{host}:{role}{local_rank}]:",
    )
    tail_lines: int = key(20, "lines of a failed worker's stderr shown in the summary")
    merge: float = key(
        1.0,
        "seconds a console line waits for the same line from the node's other ranks, to be"
        " shown once as [default0-7]:; 0: off (every rank's line with its own prefix)",
    )


@dataclass
class HangConf:
    timeout: Any = key(
        "auto",
        "seconds with no progress on any rank before the job counts as hung; auto: learned from"
        " the job's rhythm, 5x the longest gap between progress events, 60 to 300 s; null: off",
    )
    warmup: float = key(
        0.0,
        "seconds at the start of each attempt when no hang is declared: the first verdict comes"
        " max(warmup, timeout) s after the start at the earliest",
    )
    action: str = key(
        "report",
        "on a hang, after every rank's stack is saved: report (keep running), restart (a "
        "failure under the restart policy) or fail (end the job, exit 1)",
    )
    grace: float = key(
        5.0,
        "seconds a hung job's workers get between SIGTERM and SIGKILL (restart or fail; at most"
        " stop_grace): their stacks are saved already",
    )


@dataclass
class StragglerConf:
    action: str = key(
        "report",
        "a rank that arrives last at most of the job's recent collectives: report (a console"
        " line, an event, top's column and a metric), fail (end the job, exit 1) or off",
    )
    window: int = key(50, "the collectives each rank's straggler score counts (the last ones)")
    behind: float = key(
        0.01,
        "seconds a rank must arrive after the others, at the median, to be named (and a tenth"
        " of the job's median interval between collectives)",
    )


@dataclass
class MetricsConf:
    port: int | None = key(
        None,
        "serve Prometheus metrics from each agent on this port of the job's address (loopback "
        "on one node); 0: a free port, printed; null: off",
    )
    textfile: str | None = key(
        None, "write the same metrics to this file for node_exporter's textfile collector"
    )


@dataclass
class QuarantineConf:
    ledger: str | None = key(
        None,
        "the quarantine ledger file (e.g. on a shared file system): a host or GPU in it does not"
        " join before its cooldown ends; null: no quarantine",
    )
    cooldown: str = key(
        "24h", "how long an entry this job adds keeps its host or GPU out: seconds, 30m, 24h, 7d"
    )


@dataclass
class TimeoutsConf:
    collective: float | None = key(
        None,
        "seconds the workers' collectives wait (init_process_group(timeout=...) in your script);"
        " null: torch's default (600 nccl on GPUs, 1800 gloo); checked against the other layers",
    )


@dataclass
class WarmConf:
    imports: list[str] = key(
        [],
        "modules a template process imports once per node; Python workers are then forked from"
        " it (restarts too), e.g. [torch]; []: every worker starts cold",
    )


@dataclass
class PreflightConf:
    mode: str = key(
        "off", "off, quick or full (see docs/preflight.md); pick a preset: preflight=quick"
    )
    min_ratio: float = key(
        0.8,
        "a worker's GEMM rate (or a node's bus bandwidth) under this share of the median fails,"
        " if its best sample is too",
    )
    gemm_size: int = key(512, "n of the n x n float32 matrix multiply each worker times")
    gemm_seconds: float = key(0.5, "seconds each worker multiplies (longer: steadier rates)")
    allreduce_mb: float = key(4.0, "MiB each allreduce sums (inside each node and across nodes)")
    allreduce_reps: int = key(5, "timed allreduces of each kind")
    timeout: float = key(60.0, "seconds the battery may take on a node, the exchange included")
    paths: list[str] = key([], "directories to check (free space, a write probe) besides logs.root")
    min_free_gb: float = key(1.0, "GiB a checked directory must have free")


@dataclass
class CheckpointConf:
    home: str | None = key(
        None,
        "where the job's durable copies of the snapshots go (the same for every node and "
        "relaunch); null: <logs.root>/checkpoints/<entrypoint>-<rdzv.id>",
    )
    resume: bool = key(True, "a launch resumes from the newest complete copy in the home")
    keep: int = key(2, "complete copies kept in the home (older ones are removed)")
    max_memory: str | None = key(
        None, "the most one rank's snapshot may take in memory, e.g. 4GiB; null: no limit"
    )
    memory: str = key("/dev/shm", "where the agent keeps the snapshots (a memory file system)")
    buddy: bool = key(
        True, "on several nodes, a copy of each node's snapshots in the next node's memory"
    )


@dataclass
class K8sConf:
    image: str = key("", "--plan=jobset/trainjob: the pods' image (elastic-hydra, torch, the code)")
    name: str = key("", "name of the JobSet/TrainJob; '': elastic-hydra-<job file name>")
    namespace: str = key("default", "namespace of the manifests")
    service_account: str | None = key(None, "the pods' service account; null: the namespace's")
    job_file: str = key(
        "", "absolute path of the job file in the image; '': shipped in a ConfigMap"
    )
    workdir: str = key("", "the pods' working directory (script paths start there); '': image's")
    gpus_per_node: int = key(0, "nvidia.com/gpu limit of each pod; 0: none")
    cpu: str | None = key(None, "CPU request and limit of each pod, e.g. 8 or 7500m; null: none")
    memory: str | None = key(None, "memory request and limit of each pod, e.g. 64Gi; null: none")
    shm: str | None = key(
        "auto", "size of each pod's memory-backed /dev/shm (DataLoader workers, NCCL); auto: "
        "half of k8s.memory, else 1Gi per worker; null: the runtime's (64 MiB)",
    )  # fmt: skip
    pod_replacements: int = key(
        3, "pods the Job replaces after a failure the agent does not own (agent OOM-killed, "
        "node gone) before the Job fails; evictions and preemptions never count",
    )  # fmt: skip
    jobset_restarts: int = key(0, "restarts of the whole JobSet after its Job failed that way")


@dataclass
class ElasticHydraConf:
    script: str | None = key(None, "the entrypoint: a Python script (exactly one of three)")
    module: str | None = key(None, "... or a module, run as python -m")
    cmd: str | None = key(None, "... or a program, split like a shell word list")
    bootstrap: bool = key(
        True,
        "run Python workers through the bootstrap that records tracebacks; false: exactly "
        "python -u SCRIPT, as torchrun",
    )
    args: list[str] = key([], "the entrypoint's arguments; words after -- are appended")
    nnodes: Any = key(1, "N or MIN:MAX (quote it in YAML: unquoted 2:4 is the integer 124)")
    nproc_per_node: Any = key(1, "workers per node: N, gpu, cpu or auto (GPUs if any, else CPUs)")
    gpus: list[Any] | None = key(None, "GPUs to use: null (all), or indices / UUIDs, e.g. [0, 2]")
    devices: str = key(
        "visible",
        "visible: each worker sees every selected GPU (torchrun's way); isolate: only its own",
    )
    gpu_sharing: bool = key(False, "allow more workers than GPUs (worker i gets GPU i % count)")
    cpu_bind: bool = key(False, "pin each worker to its own CPUs (its GPU's NUMA node if any)")
    node_rank: int = key(0, "this node's rank (rdzv=static only)")
    master_addr: str | None = key(
        None, "rdzv=static: node 0's address (null: 127.0.0.1 on one node)"
    )
    master_port: int | None = key(None, "rdzv=static: the port of node 0's store (null: 29500)")
    local_addr: str | None = key(None, "this node's address as the others see it (null: hostname)")
    role: str = key("default", "ROLE_NAME of the workers")
    rdzv: RdzvConf = group(RdzvConf, "how the nodes meet")
    restart: RestartConf = group(RestartConf, "the restart policy")
    logs: LogsConf = group(LogsConf, "console and log files")
    hang: HangConf = group(HangConf, "when a job that makes no progress counts as hung")
    straggler: StragglerConf = group(StragglerConf, "the rank that arrives last, named")
    metrics: MetricsConf = group(MetricsConf, "Prometheus metrics of each agent")
    quarantine: QuarantineConf = group(QuarantineConf, "bad hosts and GPUs kept out of later jobs")
    timeouts: TimeoutsConf = group(TimeoutsConf, "the timeouts of the workers' own layers")
    preflight: PreflightConf = group(PreflightConf, "checks of the nodes before the workers start")
    stop_grace: float = key(30.0, "seconds between SIGTERM and SIGKILL when workers are stopped")
    monitor_interval: float = key(0.1, "seconds between membership checks (multi-node)")
    env: dict[str, str] = key({}, "extra environment for the workers: env.NAME=value")
    hp: dict[str, Any] = key({}, "free values to interpolate into args: hp.NAME=value")
    warm: WarmConf = group(WarmConf, "warm starts: Python workers forked from an imported template")
    checkpoint: CheckpointConf = group(
        CheckpointConf, "snapshots the agent keeps for its workers, and the job's durable copies"
    )
    k8s: K8sConf = group(K8sConf, "Kubernetes manifests (--plan=jobset, --plan=trainjob)")


def register() -> None:
    """Register the schema; `elastic_hydra_base.yaml` pulls it in through its defaults list."""
    node = OmegaConf.structured(ElasticHydraConf)
    # Open the free-form mappings so `env.NCCL_DEBUG=INFO`, `hp.lr=0.1` and
    # `restart.on_signal.SIGKILL=fail` need no `+`.
    for mapping in (
        node.env, node.hp, node.restart.on_exit_code, node.restart.on_signal,
        node.restart.on_class,
    ):  # fmt: skip
        OmegaConf.set_struct(mapping, False)
    ConfigStore.instance().store(name=SCHEMA_NAME, node=node)


# ----------------------------------------------------------------- introspection, for messages
def schema_keys(cls: type = ElasticHydraConf, prefix: str = "") -> list[str]:
    """Every key of the schema, dotted (env.* and hp.* are free-form)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys += schema_keys(typing.cast(type, kind), f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def top_level_keys() -> frozenset[str]:
    """The first words of every key (`env`, `rdzv`, `nproc_per_node`, ...)."""
    return frozenset(f.name for f in dataclasses.fields(ElasticHydraConf))


def field_type(key: str) -> object:
    """The annotated type of a dotted key (Any below free-form mappings)."""
    kind: object = ElasticHydraConf
    for part in key.split("."):
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            return kind
        kind = typing.get_type_hints(kind).get(part, Any)
    return kind


def describe(kind: object) -> str:
    """A type as the fix of an error message says it: "an integer", "a list of integers"."""
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if isinstance(kind, type) and kind in names:
        return names[kind]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return f"{describe(args[0])} or null"
    if origin is list and args:
        return f"a list of {describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict or dataclasses.is_dataclass(kind):
        return "a mapping"
    return "a valid value"


# ------------------------------------------------------------ the keys, for --help and the docs
def keys_help(cls: type = ElasticHydraConf, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML writes it, help) for every key of the schema, in order."""
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            rows += keys_help(typing.cast(type, hints[f.name]), f"{prefix}{f.name}.")
            continue
        if f.name in ("env", "hp") and not prefix:  # free-form mappings: a key per name
            rows.append((f"{f.name}.NAME", "-", f.metadata["help"]))
            continue
        default = f.default
        if default is dataclasses.MISSING:
            default = typing.cast(Callable[[], object], f.default_factory)()
        rows.append((f"{prefix}{f.name}", _yaml(default), f.metadata["help"]))
    return rows


def _yaml(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if value == "":
        return '""'
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return str(value)


def keys_text() -> str:
    """The keys as `--help` prints them: key, default, help."""
    rows = keys_help()
    width = max(len(k) for k, _, _ in rows)
    shown = max(len(d) for _, d, _ in rows)
    return "\n".join(f"  {k:<{width}}  {d:<{shown}}  {h}" for k, d, h in rows)


def keys_markdown() -> str:
    """The keys as docs/job-files.md's table shows them (a test keeps that copy equal to this)."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for k, d, h in keys_help():
        lines.append(f"| `{k}` | `{d}` | {h.replace('|', '/')} |")
    return "\n".join(lines)
