"""Composed config -> validated, frozen `LaunchPlan`. All configuration checks live here.

Every problem raises `ConfigError` naming the key, the value and the fix; `config_errors` turns
Hydra's and OmegaConf's own composition errors into the same one-line form.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import shlex
import shutil
import signal
import string
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from elastic_hydra import devices, schema, slurm
from elastic_hydra.config_errors import from_omegaconf, unknown_key
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import (
    Action,
    Backoff,
    Command,
    Dynamic,
    DynamicBackend,
    Endpoint,
    Entrypoint,
    LaunchPlan,
    LogSpec,
    NodeRange,
    PythonModule,
    PythonScript,
    RestartSpec,
    RestartWindow,
    Standalone,
    Static,
)
from elastic_hydra.resolve_gpus import Machine, resolve_devices, resolve_nproc
from elastic_hydra.schema import ElasticHydraConf, LogsConf, RestartConf

BACKENDS = ("standalone", "static", "c10d", "etcd-v2", "etcd", "slurm")
DEFAULT_PORTS = {"c10d": 29400, "etcd-v2": 2379, "etcd": 2379}
STATIC_DEFAULT_PORT = 29500
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_ROLE = re.compile(r"[\w.-]{1,64}\Z")
_PREFIX_SPEC = re.compile(r"[<>^]?(1[0-6]|[1-9])?\Z")
MAX_NPROC = 1024  # workers per node; torchrun has no bound and forks until PIDs run out
_NNODES_FORM = "expected N or MIN:MAX with 1 <= MIN <= MAX, e.g. nnodes=2 or nnodes=2:4"


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """What resolution needs from the machine; tests pass their own."""

    cwd: str
    environ: Mapping[str, str]
    machine: Machine
    process_room: Callable[[], int | None] = devices.process_room

    @classmethod
    def current(cls) -> Host:
        environ = dict(os.environ)
        return cls(
            cwd=os.getcwd(),
            environ=environ,
            machine=Machine(
                gpus=functools.cache(lambda: devices.visible_gpus(environ)),
                cpus=devices.allowed_cpus,
                node_cpus=devices.node_cpus,
            ),
        )


def resolve_config(cfg: DictConfig, *, run_dir: str = "", host: Host | None = None) -> LaunchPlan:
    """Validate a composed job config and resolve it into a plan.

    Raises:
        ConfigError: the first problem found, as one line.
    """
    if OmegaConf.get_type(cfg) is not ElasticHydraConf:
        raise ConfigError(
            "defaults", "the job does not include elastic_hydra_base", "<untyped job>",
            "expected a defaults list that starts with elastic_hydra_base",
            "See examples/jobs/hello.yaml.",
        )  # fmt: skip
    _check_known_keys(cfg)
    try:
        conf = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise from_omegaconf(exc) from None
    assert isinstance(conf, ElasticHydraConf)
    return resolve(conf, run_dir=run_dir, host=host or Host.current())


def _check_known_keys(cfg: DictConfig) -> None:
    """Keys forced in with `+key=value` compose, but the schema would drop them silently."""
    known = set(schema.schema_keys())
    prefixes = {k.rsplit(".", 1)[0] for k in known if "." in k}

    def walk(node: DictConfig, prefix: str) -> None:
        for key in node:
            path = f"{prefix}{key!s}"
            if path in ("env", "hp"):
                continue
            if path not in known and path not in prefixes:
                raise unknown_key(path)
            child = node._get_node(key)
            if path in prefixes and isinstance(child, DictConfig):
                walk(child, f"{path}.")

    walk(cfg, "")


def resolve(conf: ElasticHydraConf, *, run_dir: str, host: Host) -> LaunchPlan:
    """Resolve a typed job config (see `resolve_config`)."""
    _check_finite(conf)
    nnodes = parse_nnodes(conf.nnodes)
    nproc, from_gpus = resolve_nproc(conf.nproc_per_node, host.machine)
    _check_process_room(nproc, conf.nproc_per_node, host)
    run_id = conf.rdzv.id
    if conf.rdzv.backend == "slurm":
        conf, nnodes, run_id = _slurm(conf, nnodes, host.environ)
    rdzv = _rendezvous(conf, nnodes)
    workers = resolve_devices(
        nproc=nproc,
        from_gpus=from_gpus,
        gpus=conf.gpus,
        policy=conf.devices,
        sharing=conf.gpu_sharing,
        cpu_bind=conf.cpu_bind,
        machine=host.machine,
        job_visible=conf.env.get("CUDA_VISIBLE_DEVICES"),
    )
    return LaunchPlan(
        entrypoint=_entrypoint(conf, host),
        nnodes=nnodes,
        nproc_per_node=nproc,
        rdzv=rdzv,
        run_id=run_id or (uuid.uuid4().hex if isinstance(rdzv, Standalone) else "none"),
        role=_role(conf.role),
        local_addr=conf.local_addr or None,
        restart=_restart(conf.restart),
        logs=_logs(conf.logs, nproc),
        stop_grace=_seconds("stop_grace", conf.stop_grace, allow_zero=True),
        monitor_interval=_seconds("monitor_interval", conf.monitor_interval),
        env=_env(conf.env),
        devices=workers,
        run_dir=run_dir,
    )


# --------------------------------------------------------------------------------------- topology
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
    return NodeRange(min=lo, max=hi)


# ------------------------------------------------------------------------------------- entrypoint
def _entrypoint(conf: ElasticHydraConf, host: Host) -> Entrypoint:
    given = {k: v for k, v in (("script", conf.script), ("module", conf.module), ("cmd", conf.cmd))}
    chosen = [k for k, v in given.items() if v not in (None, "")]
    form = "expected exactly one of script=train.py, module=pkg.train or cmd=./program"
    if not chosen:
        raise ConfigError("script", "no entrypoint given", "<nothing>", form)
    if len(chosen) > 1:
        shown = ", ".join(f"{k}={given[k]}" for k in chosen)
        raise ConfigError(chosen[1], "more than one entrypoint", f"<{shown}>", form)
    python = host.environ.get("PYTHON_EXEC") or sys.executable
    args = tuple(conf.args)
    if conf.script:
        path = _script_path(conf.script, host)
        return PythonScript(path=path, python=python, args=args, bootstrap=conf.bootstrap)
    if conf.module:
        if not _MODULE_NAME.match(conf.module):
            raise ConfigError("module", "not a module name", conf.module, "expected e.g. pkg.train")
        return PythonModule(name=conf.module, python=python, args=args, bootstrap=conf.bootstrap)
    assert conf.cmd is not None
    return _command(conf.cmd, args, host)


def _script_path(script: str, host: Host) -> str:
    path = os.path.join(host.cwd, os.path.expanduser(script))
    form = "expected the path of a Python file, relative to the current directory"
    if os.path.isdir(path):
        raise ConfigError(
            "script", "is a directory", script, form, "Use module=NAME for a package."
        )
    if not os.path.isfile(path):
        raise ConfigError("script", f"no such file in {host.cwd}", script, form)
    return os.path.abspath(path)


def _command(cmd: str, args: tuple[str, ...], host: Host) -> Command:
    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        raise ConfigError(
            "cmd", f"cannot be split into words ({exc})", cmd, "check its quotes"
        ) from None
    if not words:
        raise ConfigError("cmd", "is empty", cmd, "expected a program, e.g. cmd=./bin/train")
    program = words[0]
    if os.sep in program:
        found = os.path.join(host.cwd, os.path.expanduser(program))
        ok = os.path.isfile(found) and os.access(found, os.X_OK)
    else:
        found = shutil.which(program, path=host.environ.get("PATH")) or ""
        ok = bool(found)
    if not ok:
        raise ConfigError(
            "cmd", "program not found or not executable", program, "expected a program on PATH"
        )
    return Command(program=program, args=(*words[1:], *args))


# ------------------------------------------------------------------------------------- rendezvous
def _rendezvous(conf: ElasticHydraConf, nnodes: NodeRange) -> Standalone | Static | Dynamic:
    r = conf.rdzv
    if r.backend not in BACKENDS:
        raise ConfigError(
            "rdzv.backend", "unknown backend", r.backend, f"expected one of {', '.join(BACKENDS)}"
        )
    if conf.node_rank < 0:
        raise ConfigError("node_rank", "is negative", conf.node_rank, "expected 0 <= node_rank")
    if r.backend == "standalone":
        if nnodes.max != 1:
            raise ConfigError(
                "nnodes",
                "standalone runs exactly one node",
                str(nnodes),
                "expected nnodes=1 with rdzv=standalone",
                "For several nodes pick rdzv=c10d (or static, etcd-v2, etcd).",
            )
        return Standalone()
    if r.backend == "static":
        return _static(conf, nnodes)
    endpoint = parse_endpoint(r.endpoint, DEFAULT_PORTS[r.backend], key="rdzv.endpoint")
    if r.keep_alive_max_attempt < 1:
        raise ConfigError(
            "rdzv.keep_alive_max_attempt", "must be at least 1", r.keep_alive_max_attempt, "e.g. 3"
        )
    return Dynamic(
        backend=DynamicBackend(r.backend),
        endpoint=endpoint,
        join_timeout=_whole_seconds("rdzv.join_timeout", r.join_timeout),
        last_call_timeout=_whole_seconds("rdzv.last_call_timeout", r.last_call_timeout),
        close_timeout=_whole_seconds("rdzv.close_timeout", r.close_timeout),
        heartbeat_timeout=_whole_seconds("rdzv.heartbeat_timeout", r.heartbeat_timeout),
        keep_alive_interval=_whole_seconds("rdzv.keep_alive_interval", r.keep_alive_interval),
        keep_alive_max_attempt=r.keep_alive_max_attempt,
        read_timeout=_whole_seconds("rdzv.read_timeout", r.read_timeout),
        exit_barrier_timeout=_seconds("rdzv.exit_barrier_timeout", r.exit_barrier_timeout),
        timeout=_whole_seconds("rdzv.timeout", r.timeout),
        is_host=r.is_host,
    )


def _whole_seconds(key: str, value: float) -> float:
    """torch's rendezvous reads its timeouts as whole seconds (get_as_int)."""
    _seconds(key, value)
    if value != int(value):
        whole = max(1, round(value))
        raise ConfigError(
            key, "torch's rendezvous takes whole seconds", value, f"e.g. {key}={whole}"
        )
    return float(value)


def _slurm(
    conf: ElasticHydraConf, nnodes: NodeRange, environ: Mapping[str, str]
) -> tuple[ElasticHydraConf, NodeRange, str | None]:
    """rdzv=slurm: c10d at the allocation's first node, nnodes and the run id from Slurm."""
    try:
        job = slurm.slurm_job(environ)
    except ValueError as exc:
        raise ConfigError(
            "rdzv.backend", f"bad Slurm environment: {exc}", "slurm", "run inside srun/sbatch"
        ) from None
    if job is None:
        raise ConfigError(
            "rdzv.backend",
            "needs a Slurm allocation (SLURM_JOB_ID is not set)",
            "slurm",
            "launch with srun, or pick rdzv=c10d with rdzv.endpoint=HOST:PORT",
        )
    given = (
        parse_endpoint(conf.rdzv.endpoint, DEFAULT_PORTS["c10d"], key="rdzv.endpoint")
        if (conf.rdzv.endpoint.strip() and not conf.rdzv.endpoint.strip().startswith(":"))
        else None
    )
    port = given.port if given else _slurm_port(conf.rdzv.endpoint)
    host = given.host if given else job.nodes[0]
    rdzv = dataclasses.replace(
        conf.rdzv, backend="c10d", endpoint=str(Endpoint(host=host, port=port))
    )
    if nnodes == NodeRange(min=1, max=1):
        nnodes = NodeRange(min=job.nnodes, max=job.nnodes)
    return dataclasses.replace(conf, rdzv=rdzv), nnodes, conf.rdzv.id or job.job_id


def _slurm_port(endpoint: str) -> int:
    """`:PORT` picks the port at the first node; empty gives c10d's default."""
    text = endpoint.strip()
    if not text:
        return DEFAULT_PORTS["c10d"]
    if not text[1:].isdigit():
        raise ConfigError("rdzv.endpoint", "port is not a number", endpoint, "expected :PORT")
    return _port("rdzv.endpoint", int(text[1:]), endpoint)


def _static(conf: ElasticHydraConf, nnodes: NodeRange) -> Static:
    if nnodes.min != nnodes.max:
        raise ConfigError(
            "nnodes",
            "static rendezvous cannot be elastic",
            str(nnodes),
            "expected a fixed N",
            "Use rdzv=c10d for MIN:MAX.",
        )
    if conf.node_rank >= nnodes.max:
        raise ConfigError(
            "node_rank",
            f"must be below nnodes={nnodes.max}",
            conf.node_rank,
            f"expected 0 <= node_rank < {nnodes.max}",
        )
    if not conf.master_addr and nnodes.max > 1:
        raise ConfigError(
            "master_addr",
            "required for a static job on several nodes",
            "<unset>",
            "expected the address of node 0, e.g. master_addr=node0.example.com",
        )
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
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = raw.partition(":")
        if ":" in port_text:
            raise ConfigError(key, "too many ':'", text, form, "Write an IPv6 host as [addr]:port.")
    if not host:
        raise ConfigError(key, "no host", text, form)
    if port_text == "":
        return Endpoint(host=host, port=default_port)
    if not port_text.isdigit():
        raise ConfigError(key, "port is not a number", text, form)
    return Endpoint(host=host, port=_port(key, int(port_text), text))


def _port(key: str, port: int, shown: object) -> int:
    if not 1 <= port <= 65535:
        raise ConfigError(key, "port out of range", shown, "expected a port in 1..65535")
    return port


# ---------------------------------------------------------------------------------- restart, logs
def _restart(r: RestartConf) -> RestartSpec:
    if r.max_restarts < 0:
        raise ConfigError(
            "restart.max_restarts", "is negative", r.max_restarts, "expected 0 (never) or more"
        )
    b = r.backoff
    _seconds("restart.backoff.initial", b.initial, allow_zero=True)
    _seconds("restart.backoff.max", b.max, allow_zero=True)
    if b.multiplier < 1:
        raise ConfigError("restart.backoff.multiplier", "below 1", b.multiplier, "expected >= 1")
    if not 0 <= b.jitter < 1:
        raise ConfigError(
            "restart.backoff.jitter", "out of range", b.jitter, "expected a fraction in [0, 1)"
        )
    window = None
    if (r.window_restarts is None) != (r.window_seconds is None):
        raise ConfigError(
            "restart.window_seconds" if r.window_restarts is None else "restart.window_restarts",
            "set without its pair",
            r.window_seconds if r.window_restarts is None else r.window_restarts,
            "expected both restart.window_restarts and restart.window_seconds, or neither",
        )
    if r.window_restarts is not None and r.window_seconds is not None:
        if r.window_restarts < 1:
            raise ConfigError(
                "restart.window_restarts", "must be at least 1", r.window_restarts, "e.g. 5"
            )
        window = RestartWindow(
            max_restarts=r.window_restarts,
            seconds=_seconds("restart.window_seconds", r.window_seconds),
        )
    on_exit_code = _rules("restart.on_exit_code", r.on_exit_code, _exit_code)
    on_signal = _rules("restart.on_signal", r.on_signal, _signal_number)
    return RestartSpec(
        max_restarts=r.max_restarts,
        backoff=Backoff(initial=b.initial, maximum=b.max, multiplier=b.multiplier, jitter=b.jitter),
        window=window,
        on_exit_code=on_exit_code,
        on_signal=on_signal,
        fail_fast_seconds=_seconds("restart.fail_fast_seconds", r.fail_fast_seconds, True),
    )


def _rules(
    key: str, rules: Mapping[Any, str], parse: Callable[[object], int]
) -> tuple[tuple[int, Action], ...]:
    out: dict[int, Action] = {}
    for name, action in rules.items():
        number = parse(name)
        if number in out:
            raise ConfigError(f"{key}.{name}", "a second rule for the same code", name, "keep one")
        out[number] = _action(f"{key}.{name}", action)
    return tuple(out.items())


def _exit_code(key: object) -> int:
    text = str(key).strip()
    if not text.isdigit() or not 0 < int(text) < 256:
        raise ConfigError(
            f"restart.on_exit_code.{key}",
            "not an exit code",
            key,
            "expected 1..255, e.g. {3: fail}",
        )
    return int(text)


def _signal_number(key: object) -> int:
    name = str(key).strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ConfigError(
            f"restart.on_signal.{key}", "unknown signal", key, "expected a name, e.g. SIGKILL"
        ) from None


def _action(key: str, value: str) -> Action:
    try:
        return Action(value.strip().lower())
    except ValueError:
        raise ConfigError(key, "unknown action", value, "expected retry or fail") from None


def _logs(logs: LogsConf, nproc: int) -> LogSpec:
    ranks = None
    if logs.ranks is not None:
        bad = [r for r in logs.ranks if not 0 <= r < nproc]
        if bad:
            raise ConfigError(
                "logs.ranks",
                f"no such local rank with nproc_per_node={nproc}",
                bad[0],
                f"expected local ranks in 0..{nproc - 1}",
            )
        ranks = frozenset(logs.ranks)
    _prefix(logs.prefix)
    if logs.tail_lines < 0:
        raise ConfigError("logs.tail_lines", "is negative", logs.tail_lines, "expected 0 or more")
    return LogSpec(
        tee=logs.tee and not logs.quiet,
        quiet=logs.quiet,
        console_ranks=ranks,
        prefix=logs.prefix,
        tail_lines=logs.tail_lines,
    )


def _env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigError(
                f"env.{name}",
                "not a valid variable name",
                name,
                "expected letters, digits and _ (no leading digit), e.g. env.NCCL_DEBUG=INFO",
            )
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"env.{name}",
                "not a plain value",
                "<a mapping>",
                "expected text, e.g. env.NAME=value",
            )
        if "\0" in str(value):
            raise ConfigError(f"env.{name}", "contains a NUL byte", value, "expected plain text")
    return tuple((str(k), str(v)) for k, v in env.items())


def _seconds(key: str, value: float, allow_zero: bool = False) -> float:
    if value < 0 or (value == 0 and not allow_zero):
        if allow_zero:
            raise ConfigError(key, "is negative", value, "expected seconds >= 0")
        raise ConfigError(key, "must be positive", value, "expected seconds > 0")
    return float(value)


def _check_finite(conf: object, prefix: str = "") -> None:
    """NaN passes every range check and infinity most: neither is a number of seconds."""
    for f in dataclasses.fields(conf):  # type: ignore[arg-type]
        value = getattr(conf, f.name)
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{prefix}{f.name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"{prefix}{f.name}", "is not a finite number", value, "expected a number, e.g. 30"
            )


def _check_process_room(nproc: int, given: object, host: Host) -> None:
    if nproc > MAX_NPROC:
        raise ConfigError(
            "nproc_per_node", f"more than {MAX_NPROC} workers on one node", given,
            f"expected 1..{MAX_NPROC}",
        )  # fmt: skip
    room = host.process_room()
    if room is not None and nproc > room:
        raise ConfigError(
            "nproc_per_node", f"this machine can start only {max(room, 0)} more processes",
            given, f"expected at most {max(room, 1)}",
            "Raise the limit (ulimit -u, the cgroup's pids.max) or start fewer workers.",
        )  # fmt: skip


def _role(value: str) -> str:
    """ROLE_NAME and the console prefix: a name, not text that moves the cursor."""
    if not _ROLE.match(value):
        raise ConfigError(
            "role", "not a role name", value,
            "expected 1-64 letters, digits, '_', '-' or '.', e.g. role=trainer",
        )  # fmt: skip
    return value


def _prefix(value: str) -> str:
    """The console prefix: only {role} {rank} {local_rank}, a bounded width, no control bytes."""
    form = "expected text with {role}, {rank} or {local_rank}, e.g. '[{role}{local_rank}]:'"
    if len(value) > 64 or any(not ch.isprintable() for ch in value):
        raise ConfigError("logs.prefix", "too long or holds control characters", value, form)
    try:
        fields = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise ConfigError("logs.prefix", f"bad format ({exc})", value, form) from None
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in ("role", "rank", "local_rank") or conversion or "{" in (spec or ""):
            raise ConfigError("logs.prefix", f"bad format field {{{name}}}", value, form)
        if spec and not _PREFIX_SPEC.match(spec):
            raise ConfigError(
                "logs.prefix", f"bad width {spec!r}", value, "expected e.g. {rank:>3} (width <= 16)"
            )
    return value
