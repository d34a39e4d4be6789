"""GPUs as data, and which worker gets which GPU and which CPUs. Pure: the facts come in as values.

Discovery (NVML, nvidia-smi, sysfs) lives in `devices`; validation of the user's keys in
`resolve`; this module holds the rules.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One NVIDIA GPU as the driver reports it (index = nvidia-smi's, in PCI bus order)."""

    index: int
    uuid: str
    name: str = ""
    memory_mib: int | None = None
    pci_bus_id: str = ""
    numa_node: int | None = None  # None: unknown (or a single-node machine)

    def __str__(self) -> str:
        numa = f", NUMA {self.numa_node}" if self.numa_node is not None else ""
        return f"GPU {self.index} ({self.name or 'unknown'}, {self.uuid}{numa})"


class DevicePolicy(enum.Enum):
    VISIBLE = "visible"  # every worker sees all selected GPUs; LOCAL_RANK picks one (torchrun)
    ISOLATE = "isolate"  # each worker sees exactly its own GPU, as its cuda:0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerDevices:
    """What one local rank may use."""

    gpus: tuple[Gpu, ...] = ()  # the GPUs it sees, in CUDA order
    own: Gpu | None = None  # the GPU meant for it (LOCAL_RANK's, or its only one)
    cuda_visible_devices: str | None = None  # to set; None leaves the environment's value
    cpus: tuple[int, ...] | None = None  # CPU affinity; None: not bound


def parse_visible(value: str | None, gpus: Sequence[Gpu]) -> tuple[Gpu, ...]:
    """The GPUs a `CUDA_VISIBLE_DEVICES` value leaves visible, in its order.

    Entries are nvidia-smi indices or UUIDs (`GPU-...`, a unique prefix is enough). As in CUDA,
    the list ends at the first entry that names no device (so `-1` hides everything), and an
    empty value hides every GPU. Unset (None): all of them.
    """
    if value is None:
        return tuple(gpus)
    chosen: list[Gpu] = []
    for entry in value.split(","):
        gpu = find_gpu(entry.strip(), gpus)
        if gpu is None:
            break
        if gpu not in chosen:
            chosen.append(gpu)
    return tuple(chosen)


def find_gpu(entry: str | int, gpus: Sequence[Gpu]) -> Gpu | None:
    """The GPU an index or (a unique prefix of) a UUID names, or None."""
    text = str(entry).strip()
    if text.isdigit():
        return next((g for g in gpus if g.index == int(text)), None)
    if not text:
        return None
    prefix = text if text.upper().startswith("GPU-") else f"GPU-{text}"
    found = [g for g in gpus if g.uuid.lower().startswith(prefix.lower())]
    return found[0] if len(found) == 1 else None


def assign_gpus(
    nproc: int, gpus: Sequence[Gpu], policy: DevicePolicy, *, restrict: bool
) -> tuple[WorkerDevices, ...]:
    """Each local rank's GPUs: worker i's own GPU is gpus[i % len(gpus)].

    `restrict`: set CUDA_VISIBLE_DEVICES even for `visible` (the user chose a subset). UUIDs are
    used, so CUDA's own device order (CUDA_DEVICE_ORDER) cannot swap two workers' GPUs.
    """
    everyone = ",".join(g.uuid for g in gpus)
    workers = []
    for local_rank in range(nproc):
        own = gpus[local_rank % len(gpus)]
        if policy is DevicePolicy.ISOLATE:
            workers.append(WorkerDevices(gpus=(own,), own=own, cuda_visible_devices=own.uuid))
        else:
            visible = everyone if restrict else None
            workers.append(WorkerDevices(gpus=tuple(gpus), own=own, cuda_visible_devices=visible))
    return tuple(workers)


def bind_cpus(
    workers: Sequence[WorkerDevices],
    allowed: Iterable[int],
    node_cpus: Callable[[int], Sequence[int]],
) -> tuple[WorkerDevices, ...]:
    """Give each worker a disjoint share of CPUs: those of its GPU's NUMA node when known.

    Workers without a GPU on a known NUMA node (with allowed CPUs) share the allowed CPUs that
    no NUMA group took, evenly.
    `node_cpus(n)` lists NUMA node n's CPUs. Each worker gets at least one CPU; when there are
    fewer CPUs than workers, they wrap around.
    """
    allowed_set = sorted(set(allowed))
    by_node: dict[int, list[int]] = {}  # NUMA node -> its workers
    unplaced: list[int] = []
    for i, w in enumerate(workers):
        node = w.own.numa_node if w.own is not None else None
        if node is not None and any(c in allowed_set for c in node_cpus(node)):
            by_node.setdefault(node, []).append(i)
        else:
            unplaced.append(i)
    shares: dict[int, tuple[int, ...]] = {}
    taken: set[int] = set()
    for node, members in by_node.items():
        pool = [c for c in node_cpus(node) if c in allowed_set]
        taken |= set(pool)
        shares.update(zip(members, split_evenly(pool, len(members)), strict=True))
    if unplaced:
        # The CPUs no NUMA group took; only if there are none, all of them (shares overlap).
        rest = [c for c in allowed_set if c not in taken] or allowed_set
        shares.update(zip(unplaced, split_evenly(rest, len(unplaced)), strict=True))
    return tuple(
        WorkerDevices(
            gpus=w.gpus, own=w.own, cuda_visible_devices=w.cuda_visible_devices, cpus=shares[i]
        )
        for i, w in enumerate(workers)
    )


def split_evenly(cpus: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """`cpus` cut into `parts` contiguous, near-equal shares (wrapping when there are too few)."""
    if len(cpus) < parts:
        return [(cpus[i % len(cpus)],) for i in range(parts)]
    size, extra = divmod(len(cpus), parts)
    shares, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        shares.append(tuple(cpus[start:end]))
        start = end
    return shares


def format_cpus(cpus: Sequence[int]) -> str:
    """`0-3,8,10-11`: the cpulist form of sysfs and taskset."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def parse_cpus(text: str) -> tuple[int, ...]:
    """The inverse of `format_cpus` (sysfs cpulist: `0-3,8`)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return tuple(cpus)
