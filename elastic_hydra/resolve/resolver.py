"""Typed config -> validated, frozen `LaunchPlan`. All checks of values live in resolve_*:

    resolve            the plan from its parts (`resolve_config`: of a composed job, with its hash)
    resolve_entry      the entrypoint (script, module or cmd) and its arguments
    resolve_topology   nodes and rendezvous (slurm resolves straight to c10d), and the
                       packages torch's backends need in this Python (`require_packages`)
    resolve_runtime    restart policy, logs, environment, role, durations
    resolve_gpus       workers per node and each worker's devices
    resolve_quarantine the quarantine ledger's path and cooldown
    timeouts           the timeout layers in order: a layer that breaks the job is refused

Every problem raises `ConfigError` naming the key, the value and the fix. The checks against the
schema (types, unknown keys) are composition's, in `config.composed`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastic_hydra.config.composed import ComposedJob
from elastic_hydra.config.schema import ElasticHydraConf
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import LaunchPlan, Standalone
from elastic_hydra.resolve import machine as probe
from elastic_hydra.resolve.checkpoint import for_sweep_job, resolve_checkpoint
from elastic_hydra.resolve.entry import HostFacts, resolve_entrypoint, resolve_warm
from elastic_hydra.resolve.gpus import Machine, resolve_devices, resolve_nproc
from elastic_hydra.resolve.preflight import resolve_preflight
from elastic_hydra.resolve.quarantine import resolve_quarantine
from elastic_hydra.resolve.runtime import (
    resolve_env,
    resolve_hang,
    resolve_logs,
    resolve_metrics,
    resolve_restart,
    resolve_role,
    resolve_straggler,
    seconds,
)
from elastic_hydra.resolve.timeouts import check as check_timeouts
from elastic_hydra.resolve.topology import require_packages, resolve_topology

_NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_NPROC = 1024  # workers per node; torchrun has no bound and forks until PIDs run out


@dataclass(frozen=True, slots=True, kw_only=True)
class Host(HostFacts):
    """What resolution needs from the machine (files, programs, GPUs, CPUs, process room, the
    packages this Python can import); tests pass their own."""

    machine: Machine
    process_room: Callable[[], int | None] = probe.process_room
    importable: Callable[[str], bool] = probe.importable
    hostname: str = dataclasses.field(default_factory=socket.gethostname)

    @classmethod
    def current(cls) -> Host:
        environ = dict(os.environ)
        return cls(
            cwd=os.getcwd(),
            environ=environ,
            machine=Machine(
                gpus=functools.cache(lambda: probe.visible_gpus(environ)),
                cpus=probe.allowed_cpus,
                node_cpus=probe.node_cpus,
            ),
        )


def resolve_config(
    job: ComposedJob,
    *,
    run_dir: str = "",
    host: Host | None = None,
    launch_time: float | None = None,
    sweep_job: Sequence[str] | None = None,
) -> LaunchPlan:
    """Resolve a composed job (checked and typed by `Composed.job`) into a plan; `sweep_job`:
    the overrides of a sweep's job (each job of a sweep has its own checkpoint home).

    Raises:
        ConfigError: the first problem found, as one line.
    """
    plan = resolve(job.conf, run_dir=run_dir, host=host or Host.current())
    if sweep_job is not None and plan.checkpoint is not None and job.conf.checkpoint.home is None:
        plan = dataclasses.replace(plan, checkpoint=for_sweep_job(plan.checkpoint, sweep_job))
    return dataclasses.replace(plan, config_hash=job.config_hash, launch_time=launch_time)


def node_dir(run_dir: str, host: Host) -> str:
    """A node's own directory inside a multi-node job's run dir (shared filesystems, and sweeps
    where every node gets the same job dir): Slurm's node name, else the short host name."""
    name = host.environ.get("SLURMD_NODENAME") or host.hostname.split(".")[0]
    if not _NODE_NAME.fullmatch(name) or name in (".", ".."):
        name = "node"
    return os.path.join(run_dir, name) if run_dir else run_dir


def resolve(conf: ElasticHydraConf, *, run_dir: str, host: Host) -> LaunchPlan:
    """Resolve a typed job config (see `resolve_config`)."""
    _check_finite(conf)
    topology = resolve_topology(conf, host.environ)
    require_packages(conf.rdzv.backend, topology.rdzv, host.importable)
    nproc, from_gpus = resolve_nproc(conf.nproc_per_node, host.machine)
    _check_process_room(nproc, conf.nproc_per_node, host)
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
    fresh = isinstance(topology.rdzv, Standalone)
    entrypoint = resolve_entrypoint(conf, host)
    plan = LaunchPlan(
        entrypoint=entrypoint,
        nnodes=topology.nnodes,
        nproc_per_node=nproc,
        rdzv=topology.rdzv,
        run_id=topology.run_id or (uuid.uuid4().hex if fresh else None),
        role=resolve_role(conf.role),
        local_addr=conf.local_addr or None,
        restart=resolve_restart(conf.restart),
        hang=resolve_hang(conf.hang),
        straggler=resolve_straggler(conf.straggler),
        metrics=resolve_metrics(conf.metrics),
        logs=resolve_logs(conf.logs, nproc, several_nodes=topology.nnodes.max > 1),
        stop_grace=seconds("stop_grace", conf.stop_grace, allow_zero=True),
        monitor_interval=seconds("monitor_interval", conf.monitor_interval),
        env=resolve_env(conf.env),
        devices=workers,
        run_dir=node_dir(run_dir, host) if topology.nnodes.max > 1 else run_dir,
        quarantine=resolve_quarantine(conf.quarantine, host.cwd),
        collective_timeout=_collective_timeout(conf.timeouts.collective),
        warm=resolve_warm(conf.warm.imports, entrypoint),
        preflight=resolve_preflight(conf.preflight, nnodes=topology.nnodes, rdzv=topology.rdzv),
        checkpoint=resolve_checkpoint(
            conf.checkpoint,
            logs_root=conf.logs.root,
            entrypoint=entrypoint,
            run_id=topology.run_id,
            cwd=host.cwd,
        ),
    )
    check_timeouts(plan)  # a layer that breaks the job is refused; warnings: `timeouts.derive`
    return plan


def _collective_timeout(value: float | None) -> float | None:
    return None if value is None else seconds("timeouts.collective", value)


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
