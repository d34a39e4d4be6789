"""Topology: how many nodes, and how they meet (the rendezvous backend and its endpoint).

`rdzv=slurm` resolves straight to a c10d rendezvous at the step's first node, with the node count,
the node order, the port and the run id taken from Slurm. `rdzv=kubeflow`, `jobset`, `skypilot`
and `dstack` do the same with their scheduler's variables (read by `schedulers/`), and `rdzv=auto`
picks whichever of these five started the process. Their readers (`schedulers/`) load for those
backends only: a launch on one node, or at an endpoint it names, does not pay for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from elastic_hydra.config.schema import ElasticHydraConf, RdzvConf
from elastic_hydra.errors import TORCH_INSTALL, ConfigError
from elastic_hydra.plan import Dynamic, DynamicBackend, Endpoint, NodeRange, Standalone, Static
from elastic_hydra.resolve.runtime import seconds

if TYPE_CHECKING:
    from elastic_hydra.schedulers.base import SchedulerNode

SCHEDULERS = ("kubeflow", "jobset", "skypilot", "dstack")
BACKENDS = ("standalone", "static", "c10d", "etcd-v2", "etcd", "slurm", *SCHEDULERS, "auto")
DEFAULT_PORTS = {"c10d": 29400, "etcd-v2": 2379, "etcd": 2379}
STATIC_DEFAULT_PORT = 29500
_NNODES_FORM = "expected N or MIN:MAX with 1 <= MIN <= MAX, e.g. nnodes=2 or nnodes=2:4"


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    nnodes: NodeRange
    rdzv: Standalone | Static | Dynamic
    run_id: str | None  # None: the job names none (standalone then makes a fresh one)


def resolve_topology(conf: ElasticHydraConf, environ: Mapping[str, str]) -> Topology:
    """The node range and the rendezvous of a job.

    Raises:
        ConfigError: an unknown backend, a node count the backend cannot do, a bad endpoint, a
            key the backend would ignore, a Slurm environment that is missing or malformed.
    """
    nnodes = parse_nnodes(conf.nnodes)
    r = conf.rdzv
    if r.backend not in BACKENDS:
        raise ConfigError(
            "rdzv.backend", "unknown backend", r.backend, f"expected one of {', '.join(BACKENDS)}"
        )
    if conf.node_rank < 0:
        raise ConfigError("node_rank", "is negative", conf.node_rank, "expected 0 <= node_rank")
    if r.backend != "static":
        _refuse_static_keys(conf)
    if r.backend == "standalone":
        if nnodes.max != 1:
            raise ConfigError(
                "nnodes", "standalone runs exactly one node", str(nnodes),
                "expected nnodes=1 with rdzv=standalone",
                "For several nodes pick rdzv=c10d (or static, etcd-v2, etcd).",
            )  # fmt: skip
        return Topology(nnodes=nnodes, rdzv=Standalone(), run_id=r.id)
    if r.backend == "static":
        return Topology(nnodes=nnodes, rdzv=_static(conf, nnodes), run_id=r.id)
    backend = _detected(environ) if r.backend == "auto" else r.backend
    if backend == "slurm":
        return _slurm(r, nnodes, environ)
    if backend in SCHEDULERS:
        return _scheduled(r, nnodes, scheduler_node(backend, environ))
    if nnodes.max > 1:
        _require_shared_names(r)
    text = r.endpoint.strip() or "127.0.0.1"  # one node: this machine
    endpoint = parse_endpoint(text, DEFAULT_PORTS[r.backend], key="rdzv.endpoint")
    return Topology(
        nnodes=nnodes, rdzv=_dynamic(r, DynamicBackend(r.backend), endpoint), run_id=r.id
    )


def require_packages(
    backend: str, rdzv: Standalone | Static | Dynamic, importable: Callable[[str], bool]
) -> None:
    """torch's backends run torch's rendezvous in this agent: without torch (or, for etcd,
    python-etcd) in this Python the launch cannot start, so resolution says so, before a run
    dir is made (and `--plan` says it too). The import itself waits for the launch.

    Raises:
        ConfigError: a package the backend needs is not installed.
    """
    if not isinstance(rdzv, Dynamic):
        return
    if not importable("torch"):
        raise ConfigError(
            "rdzv.backend", "needs PyTorch, which is not installed in this Python", backend,
            f"install it with `{TORCH_INSTALL}`, or pick rdzv=standalone (one node) or "
            "rdzv=static (fixed nodes), which need no torch",
        )  # fmt: skip
    if rdzv.backend is not DynamicBackend.C10D and not importable("etcd"):
        raise ConfigError(
            "rdzv.backend", "needs the python-etcd client, which is not installed in this Python",
            backend, "install it with `pip install python-etcd`, or pick rdzv=c10d",
        )  # fmt: skip


def _require_shared_names(r: RdzvConf) -> None:
    """Several nodes meet only at an endpoint and a run id they all name: the defaults (this
    machine's 127.0.0.1, the run id `none`) would leave each node alone with a store of its own,
    or put unrelated jobs in one."""
    if not r.endpoint.strip():
        raise ConfigError(
            "rdzv.endpoint", f"is needed for rdzv={r.backend} on several nodes (each node would "
            "host its own store on 127.0.0.1)", "", "give every node the same "
            "rdzv.endpoint=HOST:PORT (the first node's, or an rdzv-server's), or use rdzv=slurm",
        )  # fmt: skip
    if r.id is None:
        raise ConfigError(
            "rdzv.id", "is needed on several nodes: it keeps jobs that share a store apart", "null",
            "give every node the same rdzv.id=NAME, e.g. rdzv.id=pretrain-42",
        )  # fmt: skip


def _refuse_static_keys(conf: ElasticHydraConf) -> None:
    """master_addr, master_port and node_rank mean something to rdzv=static only."""
    backend = conf.rdzv.backend
    given = {"master_addr": conf.master_addr, "master_port": conf.master_port}
    given["node_rank"] = conf.node_rank or None
    for key, value in given.items():
        if value is not None:
            how = "it picks a free port" if backend == "standalone" else "the rendezvous does"
            raise ConfigError(
                key, f"not used by rdzv={backend} ({how})", value,
                f"drop {key}, or pick rdzv=static for a fixed master address, port and node rank",
            )  # fmt: skip


MAX_NNODES = 65536  # far beyond any job; a typo's 10**20 nodes would reach the workers' env


def parse_nnodes(value: object) -> NodeRange:
    """`2` -> 2..2, `"2:4"` -> 2..4 (see `jobfile.check_job_file` for YAML's unquoted 2:4)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError("nnodes", "not a node count", value, _NNODES_FORM)
    parts = str(value).strip().split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError("nnodes", "not N or MIN:MAX", value, _NNODES_FORM)
    lo, hi = int(parts[0]), int(parts[-1])
    if lo < 1:
        raise ConfigError("nnodes", "needs at least 1 node", value, _NNODES_FORM)
    if lo > hi:
        raise ConfigError("nnodes", "MIN is larger than MAX", value, _NNODES_FORM)
    if hi > MAX_NNODES:
        raise ConfigError("nnodes", f"more than {MAX_NNODES} nodes", value, _NNODES_FORM)
    return NodeRange(min=lo, max=hi)


def _dynamic(r: RdzvConf, backend: DynamicBackend, endpoint: Endpoint) -> Dynamic:
    if r.keep_alive_max_attempt < 1:
        raise ConfigError(
            "rdzv.keep_alive_max_attempt", "must be at least 1", r.keep_alive_max_attempt, "e.g. 3"
        )
    return Dynamic(
        backend=backend,
        endpoint=endpoint,
        join_timeout=_whole_seconds("rdzv.join_timeout", r.join_timeout),
        last_call_timeout=_whole_seconds("rdzv.last_call_timeout", r.last_call_timeout),
        close_timeout=_whole_seconds("rdzv.close_timeout", r.close_timeout),
        heartbeat_timeout=_whole_seconds("rdzv.heartbeat_timeout", r.heartbeat_timeout),
        keep_alive_interval=_whole_seconds("rdzv.keep_alive_interval", r.keep_alive_interval),
        keep_alive_max_attempt=r.keep_alive_max_attempt,
        read_timeout=_whole_seconds("rdzv.read_timeout", r.read_timeout),
        exit_barrier_timeout=seconds("rdzv.exit_barrier_timeout", r.exit_barrier_timeout),
        connect_timeout=seconds("rdzv.connect_timeout", r.connect_timeout, allow_zero=True),
        timeout=_whole_seconds("rdzv.timeout", r.timeout),
        is_host=r.is_host,
        await_replacement=bool(r.await_replacement),
    )


def _whole_seconds(key: str, value: float) -> float:
    """torch's rendezvous reads its timeouts as whole seconds (get_as_int)."""
    seconds(key, value)
    if value != int(value):
        whole = max(1, round(value))
        raise ConfigError(
            key, "torch's rendezvous takes whole seconds", value, f"e.g. {key}={whole}"
        )
    return float(value)


def _slurm(r: RdzvConf, nnodes: NodeRange, environ: Mapping[str, str]) -> Topology:
    """c10d at the step's first node, on a port of the job's own; nnodes, the node ranks (Slurm's
    node order) and the run id from Slurm. One launcher per node, inside srun."""
    from elastic_hydra.schedulers import slurm

    try:
        job = slurm.slurm_job(environ)
    except ValueError as exc:
        raise ConfigError(
            "rdzv.backend", f"bad Slurm environment: {exc}", "slurm", "run inside srun/sbatch"
        ) from None
    if job is None:
        raise ConfigError(
            "rdzv.backend", "needs a Slurm allocation (SLURM_JOB_ID is not set)", "slurm",
            "launch with srun, or pick rdzv=c10d with rdzv.endpoint=HOST:PORT",
        )  # fmt: skip
    if job.step_id is None and job.nnodes > 1:
        raise ConfigError(
            "rdzv.backend", f"runs one launcher per node, under srun, but this is job "
            f"{job.job_id}'s batch script or shell, outside any step", "slurm",
            "start it with: srun --ntasks-per-node=1 elastic-hydra ...",
        )  # fmt: skip
    if job.tasks is not None and job.tasks != job.nnodes:
        raise ConfigError(
            "rdzv.backend", f"runs one launcher per node, but step {job.run_id} has "
            f"{job.tasks} task(s) on {job.nnodes} node(s)", "slurm",
            "start it with srun --ntasks-per-node=1 (nproc_per_node= sets the workers per node)",
        )  # fmt: skip
    text = r.endpoint.strip()
    if text and not text.startswith(":"):
        endpoint = parse_endpoint(text, DEFAULT_PORTS["c10d"], key="rdzv.endpoint")
        is_host = r.is_host
    else:
        port = slurm.rdzv_port(job.job_id, job.step_id) if not text else _slurm_port(text)
        endpoint = Endpoint(host=job.nodes[0], port=port)
        is_host = job.node_id == 0 if r.is_host is None else r.is_host
    if nnodes == NodeRange(min=1, max=1):
        nnodes = NodeRange(min=job.nnodes, max=job.nnodes)
    rdzv = replace(
        _dynamic(r, DynamicBackend.C10D, endpoint), is_host=is_host, node_order=job.node_id
    )
    return Topology(nnodes=nnodes, rdzv=rdzv, run_id=r.id or job.run_id)


def _detected(environ: Mapping[str, str]) -> str:
    """`rdzv=auto`: the scheduler whose environment is present."""
    from elastic_hydra.schedulers import detect
    from elastic_hydra.schedulers.base import SchedulerError

    try:
        return detect.detect(environ)
    except SchedulerError as exc:
        raise ConfigError("rdzv.backend", exc.problem, "auto", exc.fix) from None


def scheduler_node(backend: str, environ: Mapping[str, str]) -> SchedulerNode:
    """This node as the scheduler `backend` placed it (`--plan` shows it).

    Raises:
        ConfigError: a variable is missing, malformed or contradicts another: named, with the fix.
    """
    from elastic_hydra.schedulers import detect
    from elastic_hydra.schedulers.base import SchedulerError

    try:
        return detect.read(backend, environ)
    except SchedulerError as exc:
        raise ConfigError(
            "rdzv.backend",
            f"bad {backend} environment: {exc.variable} {exc.problem}",
            backend,
            exc.fix,
        ) from None


def _scheduled(r: RdzvConf, nnodes: NodeRange, node: SchedulerNode) -> Topology:
    """c10d at the scheduler's node 0, which hosts the store; nnodes, the node order and the run
    id from the scheduler. c10d rather than static, although the schedulers describe a static
    master: a restart re-rendezvous at the same address, and nnodes=MIN:MAX works."""
    text = r.endpoint.strip()
    if text and not text.startswith(":"):
        endpoint = parse_endpoint(text, DEFAULT_PORTS["c10d"], key="rdzv.endpoint")
        is_host = r.is_host
    else:
        port = _slurm_port(text) if text else (node.port or DEFAULT_PORTS["c10d"])
        endpoint = Endpoint(host=node.master, port=port)
        is_host = node.node_rank == 0 if r.is_host is None else r.is_host
    if node.nnodes is not None:
        if nnodes == NodeRange(min=1, max=1):
            nnodes = NodeRange(min=node.nnodes, max=node.nnodes)
        elif not nnodes.min <= node.nnodes <= nnodes.max:
            raise ConfigError(
                "nnodes", f"disagrees with {node.nnodes_variable}={node.nnodes}", str(nnodes),
                f"expected nnodes={node.nnodes} (or leave nnodes out: {node.scheduler} says it)",
            )  # fmt: skip
    elif node.node_rank >= nnodes.max:
        raise ConfigError(
            "nnodes", f"leaves this node out: {node.rank_variable}={node.node_rank}",
            str(nnodes), f"expected nnodes=N (or MIN:MAX) with N > {node.node_rank}, the same "
            "in every pod: their count (the Job's parallelism)",
        )  # fmt: skip
    rdzv = replace(
        _dynamic(r, DynamicBackend.C10D, endpoint), is_host=is_host, node_order=node.node_rank
    )
    return Topology(nnodes=nnodes, rdzv=rdzv, run_id=r.id or node.run_id)


def _slurm_port(text: str) -> int:
    """`:PORT`: the port at the step's first node."""
    if not text[1:].isdigit():
        raise ConfigError("rdzv.endpoint", "port is not a number", text, "expected :PORT")
    return _port("rdzv.endpoint", int(text[1:]), text)


def _static(conf: ElasticHydraConf, nnodes: NodeRange) -> Static:
    if nnodes.min != nnodes.max:
        raise ConfigError(
            "nnodes", "static rendezvous cannot be elastic", str(nnodes), "expected a fixed N",
            "Use rdzv=c10d for MIN:MAX.",
        )  # fmt: skip
    if conf.node_rank >= nnodes.max:
        raise ConfigError(
            "node_rank", f"must be below nnodes={nnodes.max}", conf.node_rank,
            f"expected 0 <= node_rank < {nnodes.max}",
        )  # fmt: skip
    if not conf.master_addr and nnodes.max > 1:
        raise ConfigError(
            "master_addr", "required for a static job on several nodes", "<unset>",
            "expected the address of node 0, e.g. master_addr=node0.example.com",
        )  # fmt: skip
    port = STATIC_DEFAULT_PORT if conf.master_port is None else conf.master_port
    _port("master_port", port, port)
    return Static(
        master=Endpoint(host=conf.master_addr or "127.0.0.1", port=port), node_rank=conf.node_rank
    )


def parse_endpoint(text: str, default_port: int, *, key: str) -> Endpoint:
    """`host`, `host:port` or `[v6addr]:port` -> Endpoint."""
    form = "expected host[:port], e.g. node0:29400 or [::1]:29400"
    raw = text.strip()
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(key, "malformed IPv6 endpoint", text, form)
        port_text, colon = rest[1:], rest[:1]
    else:
        host, colon, port_text = raw.partition(":")
        if ":" in port_text:
            raise ConfigError(key, "too many ':'", text, form, "Write an IPv6 host as [addr]:port.")
    if not host:
        raise ConfigError(key, "no host", text, form)
    if not colon:
        return Endpoint(host=host, port=default_port)
    if port_text == "":  # torchrun refuses it too
        raise ConfigError(key, "no port after ':'", text, form)
    if not port_text.isdigit():
        raise ConfigError(key, "port is not a number", text, form)
    return Endpoint(host=host, port=_port(key, int(port_text), text))


def _port(key: str, port: int, shown: object) -> int:
    if not 1 <= port <= 65535:
        raise ConfigError(key, "port out of range", shown, "expected a port in 1..65535")
    return port
