"""The resolver's device part: `nproc_per_node` keywords, `gpus`, `devices`, `gpu_sharing`,
`cpu_bind` -> each worker's GPUs and CPUs. Raises the user-facing ConfigErrors for those keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_hydra.errors import ConfigError
from elastic_hydra.gpus import (
    DevicePolicy,
    Gpu,
    WorkerDevices,
    assign_gpus,
    bind_cpus,
    find_gpu,
)

_NPROC_FORM = "expected a positive integer, gpu, cpu or auto"


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """What device resolution needs from the machine, read lazily (nvidia-smi costs ~50 ms)."""

    gpus: Callable[[], tuple[Gpu, ...]]  # usable: after CUDA_VISIBLE_DEVICES
    cpus: Callable[[], tuple[int, ...]]  # this process's affinity
    node_cpus: Callable[[int], tuple[int, ...]]


def resolve_nproc(value: object, machine: Machine) -> tuple[int, bool]:
    """(workers per node, whether the count came from the GPUs)."""
    if isinstance(value, str) and value.strip().lower() in ("gpu", "cpu", "auto"):
        kind = value.strip().lower()
        gpus = len(machine.gpus()) if kind != "cpu" else 0
        if kind == "gpu" and gpus == 0:
            raise ConfigError(
                "nproc_per_node",
                "no usable NVIDIA GPU on this machine",
                value,
                "expected a number of workers, or gpu where GPUs are visible",
                "Use nproc_per_node=cpu or a number for CPU workers; check CUDA_VISIBLE_DEVICES.",
            )
        # auto without GPUs: one worker per CPU, as torchrun does (nproc_per_node=1 for one).
        return (gpus, True) if gpus > 0 else (len(machine.cpus()), False)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("nproc_per_node", "not a worker count", value, _NPROC_FORM)
    if value < 1:
        raise ConfigError("nproc_per_node", "needs at least 1 worker", value, _NPROC_FORM)
    return value, False


def resolve_devices(
    *,
    nproc: int,
    from_gpus: bool,
    gpus: Sequence[Any] | None,
    policy: str,
    sharing: bool,
    cpu_bind: bool,
    machine: Machine,
    job_visible: str | None = None,
) -> tuple[WorkerDevices, ...]:
    """Each local rank's devices; () when the job leaves devices alone (torchrun's behaviour).

    GPU handling starts when the user asks for it: `nproc_per_node=gpu` (or `auto` on a GPU
    machine), a `gpus` list, or `devices=isolate`.
    """
    try:
        kind = DevicePolicy(policy)
    except ValueError:
        raise ConfigError(
            "devices", "not a device policy", policy, "expected visible or isolate"
        ) from None
    workers: tuple[WorkerDevices, ...] = ()
    if from_gpus or gpus is not None or kind is DevicePolicy.ISOLATE:
        if job_visible is not None:
            raise ConfigError(
                "env.CUDA_VISIBLE_DEVICES",
                "conflicts with the launcher's own GPU assignment",
                job_visible,
                "expected gpus=[...] to choose GPUs (or CUDA_VISIBLE_DEVICES set before launching)",
                "The launcher sets each worker's CUDA_VISIBLE_DEVICES itself here.",
            )
        chosen = _select(gpus, machine.gpus())
        if nproc > len(chosen) and not sharing:
            raise ConfigError(
                "nproc_per_node",
                f"more workers than the {len(chosen)} selected GPU(s)",
                nproc,
                f"expected at most {len(chosen)}",
                "Set gpu_sharing=true to let workers share GPUs round-robin.",
            )
        workers = assign_gpus(nproc, chosen, kind, restrict=gpus is not None)
    if cpu_bind:
        workers = workers or tuple(WorkerDevices() for _ in range(nproc))
        workers = bind_cpus(workers, machine.cpus(), machine.node_cpus)
    return workers


def _select(wanted: Sequence[Any] | None, usable: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    if not usable:
        raise ConfigError(
            "gpus" if wanted is not None else "devices",
            "no usable NVIDIA GPU on this machine",
            list(wanted) if wanted is not None else "isolate",
            "expected GPUs from nvidia-smi (and CUDA_VISIBLE_DEVICES, if set)",
            "Leave gpus unset and devices=visible for CPU workers.",
        )
    if wanted is None:
        return usable
    if not wanted:
        raise ConfigError("gpus", "is empty", [], "expected e.g. gpus=[0,2] or null for all")
    chosen: list[Gpu] = []
    for entry in wanted:
        gpu = find_gpu(entry, usable)
        if gpu is None:
            names = ", ".join(str(g.index) for g in usable)
            raise ConfigError(
                "gpus",
                "names no usable GPU",
                entry,
                f"expected an index among {names} or a GPU UUID",
                "nvidia-smi -L lists them; CUDA_VISIBLE_DEVICES limits them.",
            )
        if gpu in chosen:
            raise ConfigError("gpus", "lists a GPU twice", entry, "expected each GPU once")
        chosen.append(gpu)
    return tuple(chosen)
