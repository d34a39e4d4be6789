"""The typed Hydra schema of a job (mutable `*Conf` dataclasses registered in Hydra's ConfigStore).

Composition checks key names and types against it; `resolve` checks everything else. Defaults equal
torchrun's where torchrun has one.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

SCHEMA_NAME = "elastic_hydra_schema"
CONF_MODULE = "elastic_hydra.conf"  # the presets (conf/ in the repository), as a package


@dataclass
class RdzvConf:
    # standalone (one node, nothing external), static (fixed node ranks), or a torch rendezvous
    # handler: c10d, etcd-v2, etcd.
    backend: str = "standalone"
    # host[:port] of the c10d store or etcd server (c10d default port 29400, etcd 2379).
    endpoint: str = ""
    # Job id shared by all nodes (TORCHELASTIC_RUN_ID); default: a fresh uuid for standalone,
    # "none" otherwise, as torchrun.
    id: str | None = None
    # torch rendezvous settings (torchrun's --rdzv-conf keys and defaults), in seconds.
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    heartbeat_timeout: float = 5.0
    # A node whose heartbeat is older than keep_alive_interval x keep_alive_max_attempt has left:
    # the others re-rendezvous without it.
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3
    read_timeout: float = 60.0
    # After its workers succeed, how long a node waits for the others to finish too.
    exit_barrier_timeout: float = 300.0
    # c10d: host the store in this agent (default: when the endpoint is this machine).
    is_host: bool | None = None
    # Legacy etcd: how long to wait for the other nodes.
    timeout: float = 900.0


@dataclass
class BackoffConf:
    # Delay before restart k: min(initial * multiplier**(k-1), max), then +-jitter (a fraction).
    initial: float = 0.0
    max: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.0


@dataclass
class RestartConf:
    # Restarts of the worker group after a failure (torchrun --max-restarts). 0 = never.
    max_restarts: int = 0
    backoff: BackoffConf = field(default_factory=BackoffConf)
    # At most window_restarts restarts in any window_seconds (both set, or neither).
    window_restarts: int | None = None
    window_seconds: float | None = None
    # Per exit code / per signal: "retry" or "fail", e.g. {3: fail} and {SIGKILL: fail}.
    on_exit_code: dict[Any, str] = field(default_factory=dict)
    on_signal: dict[Any, str] = field(default_factory=dict)
    # A failure within this many seconds of an attempt's start stops the job (0 = off).
    fail_fast_seconds: float = 0.0


@dataclass
class LogsConf:
    # Where run directories go (relative to the current directory).
    root: str = "eh_logs"
    # Copy worker output to the console (files are always written).
    tee: bool = True
    # Nothing on the console but the final summary.
    quiet: bool = False
    # Local ranks whose output reaches the console; null = all.
    ranks: list[int] | None = None
    # Console prefix of each line; fields {role} {rank} {local_rank} (torchrun's default form).
    prefix: str = "[{role}{local_rank}]:"
    # Lines of a failed worker's stderr shown in the summary.
    tail_lines: int = 20


@dataclass
class ElasticHydraConf:
    # Exactly one entrypoint: a Python script, a module (python -m), or a program (cmd).
    script: str | None = None
    module: str | None = None
    cmd: str | None = None
    # Run Python workers through elastic-hydra's bootstrap: tracebacks and crash stacks in the
    # summary without @record. false runs `python -u SCRIPT` exactly as torchrun does.
    bootstrap: bool = True
    # Arguments of the entrypoint; `elastic-hydra ... -- ARGS` fills this byte for byte.
    args: list[str] = field(default_factory=list)
    # "N" or "MIN:MAX" (quote it in YAML: unquoted 2:4 is the integer 124).
    nnodes: Any = 1
    # Workers per node: an integer, gpu, cpu or auto (the GPUs if any, else one per CPU).
    nproc_per_node: Any = 1
    # GPUs to use: null (all usable ones), or nvidia-smi indices / UUIDs, e.g. [0, 2, 5].
    gpus: list[Any] | None = None
    # visible: every worker sees all selected GPUs, LOCAL_RANK picks one (torchrun's way);
    # isolate: each worker sees only its own GPU (CUDA_VISIBLE_DEVICES), as cuda:0.
    devices: str = "visible"
    # Allow more workers than selected GPUs (worker i gets GPU i % count).
    gpu_sharing: bool = False
    # Pin each worker to a disjoint set of CPUs: its GPU's NUMA node, else an even split; sets
    # OMP_NUM_THREADS to the share's size unless you set it.
    cpu_bind: bool = False
    # This node's rank (static rendezvous).
    node_rank: int = 0
    # Static rendezvous: where node 0 hosts the store (one node: 127.0.0.1 and 29500, as torchrun;
    # several nodes: master_addr is required).
    master_addr: str | None = None
    master_port: int | None = None
    # This node's address as the others see it (default: its hostname).
    local_addr: str | None = None
    # ROLE_NAME of the workers.
    role: str = "default"
    rdzv: RdzvConf = field(default_factory=RdzvConf)
    restart: RestartConf = field(default_factory=RestartConf)
    logs: LogsConf = field(default_factory=LogsConf)
    # Seconds between SIGTERM and SIGKILL when workers are stopped (torchrun: 30).
    stop_grace: float = 30.0
    # Seconds between membership checks while workers run (torchrun --monitor-interval).
    monitor_interval: float = 0.1
    # Extra environment for the workers.
    env: dict[str, str] = field(default_factory=dict)
    # Free-form values to interpolate into args, e.g. args: [--lr, "${hp.lr}"]; sweep them with -m.
    hp: dict[str, Any] = field(default_factory=dict)


def register() -> None:
    """Register the schema; `elastic_hydra_base.yaml` pulls it in through its defaults list."""
    node = OmegaConf.structured(ElasticHydraConf)
    # Open the free-form mappings so `env.NCCL_DEBUG=INFO`, `hp.lr=0.1` and
    # `restart.on_signal.SIGKILL=fail` need no `+`.
    for mapping in (node.env, node.hp, node.restart.on_exit_code, node.restart.on_signal):
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
