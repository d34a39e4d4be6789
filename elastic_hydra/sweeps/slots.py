"""A sweep's slots: what each job running at once owns of this machine.

A slot is disjoint GPUs (by UUID, so device order cannot swap) and, where there are enough,
disjoint CPUs taken from its GPUs' NUMA node first. Planned once, before the first job starts;
a count that does not fit this machine is a `ConfigError` naming its `hydra.launcher` key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastic_hydra.errors import ConfigError
from elastic_hydra.gpus import Gpu, WorkerDevices, bind_cpus, format_cpus, split_evenly


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """What one running job owns: its GPUs (by UUID) and its CPUs (None: not bound)."""

    index: int
    gpus: tuple[Gpu, ...] = ()
    cpus: tuple[int, ...] | None = None
    hide_gpus: bool = False  # CPU jobs on a GPU machine see no GPU

    def env(self) -> dict[str, str]:
        """The job's environment: CUDA_VISIBLE_DEVICES by UUID, so device order cannot swap."""
        if self.gpus:
            return {"CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in self.gpus)}
        return {"CUDA_VISIBLE_DEVICES": ""} if self.hide_gpus else {}

    def describe(self) -> str:
        parts = []
        if self.gpus:
            parts.append(f"GPU {','.join(str(g.index) for g in self.gpus)}")
        if self.cpus is not None:
            parts.append(f"CPU {format_cpus(self.cpus)}")
        return " · ".join(parts) or f"slot {self.index}"


def plan_slots(
    *,
    gpus: Sequence[Gpu],
    cpus: Sequence[int],
    node_cpus: Callable[[int], Sequence[int]],
    slots: int | None,
    gpus_per_job: int | None,
    cpus_per_job: int | None,
) -> tuple[Slot, ...]:
    """The pool's slots: disjoint GPUs and, where there are enough, disjoint CPUs.

    Args:
        gpus: the usable GPUs (after CUDA_VISIBLE_DEVICES).
        cpus: this process's CPUs.
        node_cpus: NUMA node n's CPUs (a slot's CPUs come from its GPUs' node when known).
        slots: jobs at once; None: as many as fit.
        gpus_per_job: None: 1 where GPUs are visible, else 0.
        cpus_per_job: None: an even share of the CPUs; 0: no CPU binding.

    Raises:
        ConfigError: a count that is negative or does not fit this machine.
    """
    per_gpu = (1 if gpus else 0) if gpus_per_job is None else gpus_per_job
    _check_count("hydra.launcher.gpus_per_job", per_gpu, len(gpus), "GPU", minimum=0)
    if cpus_per_job is not None:
        _check_count("hydra.launcher.cpus_per_job", cpus_per_job, len(cpus), "CPU", minimum=0)
    fits = [len(gpus) // per_gpu] if per_gpu else []
    if cpus_per_job:
        fits.append(len(cpus) // cpus_per_job)
    room = min(fits) if fits else None  # None: nothing bounds it (no GPUs, no CPU shares)
    count = (room or len(cpus)) if slots is None else slots
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= (room or count):
        need = ", ".join(
            f"{count * n} {what}s"
            for n, what in ((per_gpu, "GPU"), (cpus_per_job or 0, "CPU"))
            if n
        )
        raise ConfigError(
            "hydra.launcher.slots",
            "not a number of jobs this machine can run at once"
            + (f" ({need} needed, {len(gpus)} GPUs and {len(cpus)} CPUs here)" if need else ""),
            slots,
            f"expected 1 to {room}, or null for as many as fit" if room else "expected 1 or more",
        )
    gpu_shares = [tuple(gpus[i * per_gpu : (i + 1) * per_gpu]) for i in range(count)]
    cpu_shares = _cpu_shares(gpu_shares, cpus, node_cpus, count, cpus_per_job)
    return tuple(
        Slot(index=i, gpus=gpu_shares[i], cpus=cpu_shares[i], hide_gpus=not per_gpu and bool(gpus))
        for i in range(count)
    )


def _check_count(key: str, value: int, have: int, what: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(key, f"not a number of {what}s", value, f"expected {minimum} or more")
    if value > have:
        raise ConfigError(
            key, f"more {what}s than this machine has ({have})", value, f"expected at most {have}"
        )


def _cpu_shares(
    gpu_shares: Sequence[tuple[Gpu, ...]],
    cpus: Sequence[int],
    node_cpus: Callable[[int], Sequence[int]],
    count: int,
    cpus_per_job: int | None,
) -> list[tuple[int, ...] | None]:
    """Each slot's CPUs: its GPUs' NUMA node first; None (not bound) when shares would overlap."""
    if cpus_per_job == 0 or len(cpus) < count:
        return [None] * count
    workers = [WorkerDevices(own=share[0] if share else None) for share in gpu_shares]
    shares = [w.cpus or () for w in bind_cpus(workers, cpus, node_cpus)]
    if cpus_per_job is None:
        return list(shares)
    if all(len(s) >= cpus_per_job for s in shares):
        return [s[:cpus_per_job] for s in shares]
    return [c[:cpus_per_job] for c in split_evenly(cpus, count)]
