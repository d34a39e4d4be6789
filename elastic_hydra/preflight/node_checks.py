"""The agent's own checks of its node, in plain Python: the disks the job writes, the GPUs' health
where NVML can be asked, and the rendezvous endpoint. Each returns `NodeProblem`s (none: healthy).

A path is checked the way the job will use it: free space (statvfs) and a small file written,
synced and removed, so that a full disk, a read-only mount, a missing directory and one without
write permission are each named as what they are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Sequence
from typing import Any

from elastic_hydra.preflight.results import GpuThrottle, NodeProblem
from elastic_hydra.records.preflight import Check

PROBE_BYTES = 4096
_BY_ERRNO = {
    errno.EROFS: "is read-only",
    errno.ENOSPC: "is full",
    errno.EDQUOT: "is over its quota",
    errno.ENOENT: "is missing",
    errno.ENOTDIR: "is not a directory",
    errno.EACCES: "is not writable by this user",
    errno.EPERM: "is not writable by this user",
}
# NVML's clock throttle reasons that slow a GPU down (idle and application settings left out).
THROTTLE_REASONS = {
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake",
}


def check_paths(paths: Sequence[tuple[str, str]], min_free: int) -> list[NodeProblem]:
    """Each (key, path): free space and a write probe. `key` names where the path comes from."""
    problems = []
    for key, path in paths:
        what = check_path(path, min_free)
        if what is not None:
            problems.append(NodeProblem(check=Check.PATH, what=f"{key} {path} {what}"))
    return problems


def check_path(path: str, min_free: int) -> str | None:
    """What is wrong with writing into `path`, in words; None when nothing is."""
    try:
        stat = os.statvfs(path)
    except OSError as exc:
        return _BY_ERRNO.get(exc.errno or 0, f"cannot be read ({exc.strerror})")
    if not os.path.isdir(path):
        return _BY_ERRNO[errno.ENOTDIR]
    if stat.f_flag & os.ST_RDONLY:
        return _BY_ERRNO[errno.EROFS]
    free = stat.f_bavail * stat.f_frsize
    if free < min_free:
        return f"is full ({_size(free)} free, preflight.min_free_gb asks {_size(min_free)})"
    probe = os.path.join(path, f".elastic-hydra-preflight-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return _BY_ERRNO.get(exc.errno or 0, f"cannot be written ({exc.strerror})")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def check_endpoint(host: str, port: int, timeout: float = 2.0) -> list[NodeProblem]:
    """The rendezvous endpoint answers a TCP connection from this node."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return []
    except OSError as exc:
        what = f"cannot reach the rendezvous endpoint {host}:{port} ({exc.strerror or exc})"
        return [NodeProblem(check=Check.RENDEZVOUS, what=what)]


def check_gpus(nvml: Any, gpus: Sequence[int]) -> tuple[list[NodeProblem], list[GpuThrottle]]:
    """ECC errors, pending retired pages and throttle reasons of each GPU (indices on the host).
    A query the GPU does not support is skipped, not failed."""
    problems: list[NodeProblem] = []
    throttled: list[GpuThrottle] = []
    for gpu in gpus:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
        except Exception:
            problems.append(
                NodeProblem(check=Check.GPU, what=f"gpu {gpu} not found by NVML", gpu=gpu)
            )
            continue
        ecc = _query(
            lambda h=handle: nvml.nvmlDeviceGetTotalEccErrors(h, 1, 0)
        )  # uncorrected, volatile
        if ecc:
            problems.append(
                NodeProblem(
                    check=Check.GPU, what=f"gpu {gpu} has {ecc} uncorrected ECC error(s)", gpu=gpu
                )
            )
        pending = _query(lambda h=handle: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
        if pending:
            problems.append(
                NodeProblem(
                    check=Check.GPU, what=f"gpu {gpu} has retired pages pending a reset", gpu=gpu
                )
            )
        mask = _query(lambda h=handle: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)) or 0
        reasons = tuple(name for bit, name in THROTTLE_REASONS.items() if int(mask) & bit)
        if reasons:
            throttled.append(GpuThrottle(gpu=gpu, reasons=reasons))
    return problems, throttled


def _query(call: Any) -> Any:
    try:
        return call()
    except Exception:  # not supported on this GPU or driver
        return None
