"""The agent's node checks on real file systems: a full tmpfs, a read-only bind mount, a missing
directory (each made by the test and removed), a closed port, and NVML through a fake module."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra import nvml
from elastic_hydra.preflight import node_checks
from elastic_hydra.preflight.results import GpuThrottle, NodeProblem
from elastic_hydra.records.preflight import Check


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def mounted(target: Path, *options: str) -> Iterator[Path]:
    target.mkdir(exist_ok=True)
    run("mount", *options, str(target))
    try:
        yield target
    finally:
        run("umount", "-l", str(target))


def test_a_healthy_directory_passes_and_the_probe_file_is_gone(tmp_path: Path) -> None:
    assert node_checks.check_path(str(tmp_path), min_free=1) is None
    assert list(tmp_path.iterdir()) == []


def test_a_full_tmpfs_is_named_full(tmp_path: Path) -> None:
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=256k", "tmpfs") as small:
        with contextlib.suppress(OSError), (small / "filler").open("ab") as f:
            f.write(b"\0" * (1 << 20))  # ENOSPC once the tmpfs is full
        assert os.statvfs(small).f_bavail == 0
        problems = node_checks.check_paths([("preflight.paths", str(small))], min_free=0)
        assert problems == [NodeProblem(check=Check.PATH, what=f"preflight.paths {small} is full")]


def test_too_little_free_space_is_named_with_the_figures(tmp_path: Path) -> None:
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as small:
        what = node_checks.check_path(str(small), min_free=1 << 30)
        assert what is not None and what.startswith("is full (")
        assert "preflight.min_free_gb asks 1.00 GiB" in what


def test_a_read_only_bind_mount_is_named_read_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with mounted(data, "--bind", str(data)):
        run("mount", "-o", "remount,bind,ro", str(data))
        assert node_checks.check_path(str(data), min_free=0) == "is read-only"
    assert node_checks.check_path(str(data), min_free=0) is None  # the mount is gone


def test_a_missing_path_and_a_file_are_named(tmp_path: Path) -> None:
    assert node_checks.check_path(str(tmp_path / "nope"), min_free=0) == "is missing"
    (tmp_path / "file").write_text("x")
    assert node_checks.check_path(str(tmp_path / "file"), min_free=0) == "is not a directory"


def test_an_endpoint_that_refuses_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        (problem,) = node_checks.check_endpoint("127.0.0.1", port, timeout=2)
    assert problem.check is Check.RENDEZVOUS
    assert f"cannot reach the rendezvous endpoint 127.0.0.1:{port}" in problem.what
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert node_checks.check_endpoint("127.0.0.1", server.getsockname()[1]) == []


class FakeNvml:
    """pynvml's calls the check makes, for GPUs 0 (healthy), 1 (ECC, pending pages, power cap)."""

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        if i > 1:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return i

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:  # noqa: N802
        return 3 * h

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:  # noqa: N802
        return h

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> Any:  # noqa: N802
        if h == 0:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # skipped, not failed
        return 0x4 | 0x1  # power cap, and idle (not a slowdown)


def test_nvml_names_ecc_errors_retired_pages_and_throttling_per_gpu() -> None:
    problems, throttled = node_checks.check_gpus(FakeNvml(), [0, 1, 7])
    assert [(p.gpu, p.what) for p in problems] == [
        (1, "gpu 1 has 3 uncorrected ECC error(s)"),
        (1, "gpu 1 has retired pages pending a reset"),
        (7, "gpu 7 not found by NVML"),
    ]
    assert throttled == [GpuThrottle(gpu=1, reasons=("power cap",))]


def test_without_pynvml_the_gpu_check_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails
    assert nvml.load() is None  # the battery then skips the GPU check
