"""What this machine offers workers: GPUs and CPUs, read from the driver and sysfs, never torch.

GPUs come from NVML when `nvidia-ml-py` is installed, else from `nvidia-smi`, else there are none.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import resource
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastic_hydra import nvml
from elastic_hydra.gpus import Gpu, parse_cpus, parse_visible

SYSFS = Path("/sys")
_SMI_FIELDS = "index,uuid,name,memory.total,pci.bus_id"


def importable(name: str) -> bool:
    """Whether this Python would find the module `name` (asked of the import system, not
    imported: torch costs seconds to load and may print as it does)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that fails, a finder that refuses
        return False


def allowed_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def process_room() -> int | None:
    """How many more tasks (processes and threads) may start here, where a limit says so.

    The smallest room under the kernel's task limits, this cgroup's pids.max and, for users
    other than root, RLIMIT_NPROC. None when nothing could be read.
    """
    rooms = [r for r in (_kernel_room(), _cgroup_room(), _rlimit_room()) if r is not None]
    return min(rooms) if rooms else None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _kernel_room() -> int | None:
    limits = [_read_int(Path(f"/proc/sys/kernel/{n}")) for n in ("threads-max", "pid_max")]
    known = [n for n in limits if n is not None]
    try:  # "1.0 0.9 0.8 2/345 6789": 345 tasks exist
        tasks = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return None
    return min(known) - tasks if known else None


def _cgroup_room() -> int | None:
    for group in _pids_cgroups():
        limit, current = _read_int(group / "pids.max"), _read_int(group / "pids.current")
        if limit is not None and current is not None:
            return limit - current
    return None


def _pids_cgroups() -> list[Path]:
    """Where this process's pids limit may be: cgroup v1's pids hierarchy, or cgroup v2."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    groups = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if "pids" in controllers.split(","):
            groups.append(SYSFS / "fs/cgroup/pids" / rel)
        elif controllers == "":
            groups += [SYSFS / "fs/cgroup" / rel, SYSFS / "fs/cgroup/unified" / rel]
    return groups


def _rlimit_room() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY or os.geteuid() == 0:  # root is not held to it
        return None
    uid, tasks = os.geteuid(), 0
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                tasks += len(os.listdir(f"/proc/{entry.name}/task"))
    return soft - tasks


def node_cpus(node: int) -> tuple[int, ...]:
    """The CPUs of NUMA node `node` (none if sysfs does not say)."""
    try:
        return parse_cpus((SYSFS / f"devices/system/node/node{node}/cpulist").read_text())
    except (OSError, ValueError):
        return ()


def visible_gpus(environ: Mapping[str, str]) -> tuple[Gpu, ...]:
    """The GPUs workers may use: every GPU of the machine, limited by CUDA_VISIBLE_DEVICES."""
    return parse_visible(environ.get("CUDA_VISIBLE_DEVICES"), all_gpus(environ))


def all_gpus(environ: Mapping[str, str]) -> tuple[Gpu, ...]:
    gpus = _from_nvml()
    if gpus is None:
        gpus = _from_nvidia_smi(environ)
    return gpus


def _from_nvml() -> tuple[Gpu, ...] | None:
    pynvml = nvml.load()
    if pynvml is None:
        return None
    try:
        return tuple(_nvml_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount()))
    except Exception:
        return None
    finally:
        nvml.shutdown(pynvml)


def _nvml_gpu(nvml: Any, index: int) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    numa: int | None = None
    with contextlib.suppress(Exception):  # older drivers lack it: sysfs knows too
        numa = int(nvml.nvmlDeviceGetNumaNodeId(handle))
    return Gpu(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20),
        pci_bus_id=bus_id,
        numa_node=numa if numa is not None and numa >= 0 else _numa_of(bus_id),
    )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _from_nvidia_smi(environ: Mapping[str, str]) -> tuple[Gpu, ...]:
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return ()
    cmd = [smi, f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ()
    if proc.returncode != 0:
        return ()
    return tuple(gpu for line in proc.stdout.splitlines() if (gpu := _smi_gpu(line)))


def _smi_gpu(line: str) -> Gpu | None:
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 5 or not fields[0].isdigit():
        return None
    index, uuid, name, memory, bus_id = fields
    return Gpu(
        index=int(index),
        uuid=uuid,
        name=name,
        memory_mib=int(memory) if memory.isdigit() else None,
        pci_bus_id=bus_id,
        numa_node=_numa_of(bus_id),
    )


def _numa_of(bus_id: str) -> int | None:
    """NUMA node of a PCI device: NVIDIA's `00000000:3B:00.0` is sysfs's `0000:3b:00.0`."""
    if not bus_id:
        return None
    name = bus_id.lower()[-12:] if len(bus_id) > 12 else bus_id.lower()
    try:
        node = int((SYSFS / "bus/pci/devices" / name / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
