"""Shared fixtures: no test may leave a live child process behind."""

from __future__ import annotations

import compileall
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil
import pytest

if TYPE_CHECKING:  # slurm_cluster uses wait_for from here: imported where it is needed
    from tests.slurm_cluster import SlurmCluster

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "scripts"
ELASTIC_HYDRA = [sys.executable, "-m", "elastic_hydra"]


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the package once, as pip does on install: under PYTHONDONTWRITEBYTECODE=1 each
    launcher the tests start would compile its source again (about 0.05 s per launch)."""
    compileall.compile_dir(REPO / "elastic_hydra", quiet=1)


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (for servers the test starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.02,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` until it returns a truthy value; fail the test after `timeout` seconds
    (with `detail()` appended: a log tail, say). `predicate` may raise to give up at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            more = f"; {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{more}")
        time.sleep(interval)


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A small tmpfs mounted at `path` for the test (root: a full disk, a read-only mount)."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` still running and not zombies (one that ends meanwhile is not)."""
    found = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail any test that leaves a descendant of this process alive (and kill it)."""
    me = psutil.Process(os.getpid())
    before = {p.pid for p in me.children(recursive=True)}

    def leftovers() -> list[psutil.Process]:
        return alive([p for p in me.children(recursive=True) if p.pid not in before])

    yield
    try:
        wait_for(lambda: not leftovers(), 5.0, "the test's processes to end", interval=0.05)
        return
    except AssertionError:
        left = leftovers()
    names = [(p.pid, " ".join(p.cmdline()[:4])) for p in left]
    for p in left:
        p.kill()
    pytest.fail(f"test left live processes behind: {names}")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real two-node Slurm cluster (nodes n1, n2) for the whole session, stopped at its end."""
    from tests.slurm_cluster import slurm_cluster

    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
