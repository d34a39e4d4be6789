"""Process plumbing: start a launcher in its own session, read stamps, leave nothing behind."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

import psutil

RUN_TIMEOUT_S = 120.0

_T = TypeVar("_T")


class BenchError(RuntimeError):
    """A run that produced no measurement (timeout, missing stamp, unexpected exit code)."""


@contextlib.contextmanager
def launched(
    cmd: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdout: int | IO[bytes] = subprocess.DEVNULL,
    stderr: int | IO[bytes] = subprocess.DEVNULL,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `cmd` in a new session; on leaving, kill it and every descendant still running."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True
    )
    try:
        yield proc
    finally:
        kill_tree(proc)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc`, its descendants (each may lead its own process group) and its group."""
    if proc.poll() is None:
        try:
            victims = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
        except psutil.Error:
            victims = []
        for victim in victims:
            with contextlib.suppress(psutil.Error):
                victim.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def sweep(marker: str) -> list[int]:
    """SIGKILL every process (other than this one) whose command line mentions `marker`.

    The marker is the harness's private temp directory, so this only finds our own launchers and
    workers. Returns the pids it killed: a non-empty list means a run left processes behind.
    """
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid != os.getpid() and any(marker in arg for arg in cmdline):
            found.append(proc)
    for proc in found:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(found, timeout=5)
    return [p.pid for p in found]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(value: Callable[[], _T | None], timeout: float, interval: float = 0.002) -> _T | None:
    """Poll `value` until it returns something (that) or `timeout` seconds pass (None)."""
    deadline = time.monotonic() + timeout
    while (result := value()) is None and time.monotonic() < deadline:
        time.sleep(interval)
    return result


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.002) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False)."""
    return wait_for(lambda: True if condition() else None, timeout, interval) is not None


def read_stamp(path: Path) -> tuple[float, int]:
    """A stamp's (time.time() value, pid); BenchError when the worker never wrote it."""
    try:
        when, pid = path.read_text().split()
    except (OSError, ValueError) as exc:
        raise BenchError(f"missing or bad stamp {path.name}") from exc
    return float(when), int(pid)


def count_stamps(stamps: Path, prefix: str) -> int:
    """How many stamps named `prefix*` exist."""
    return sum(name.startswith(prefix) for name in os.listdir(stamps))


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie counts as gone: it has exited)."""
    try:
        status: str = psutil.Process(pid).status()
        return bool(status != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def wait_exact(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """`proc.wait(timeout)`, woken by the exit itself.

    Popen.wait with a timeout polls, sleeping up to 50 ms in between: an exit was seen up to
    50 ms late, and every wall time measured with it came out in 50 ms steps (0.616, 0.667,
    0.716 s ...), for every launcher and the floor alike. A pidfd becomes readable at the exit.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # already reaped, or a kernel before 5.3
        return proc.wait(timeout=timeout)
    try:
        if not select.select([fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


def expect_exit(proc: subprocess.Popen[bytes], codes: tuple[int, ...], what: str) -> int:
    """Wait (bounded) for `proc`; BenchError unless its exit code is one of `codes`."""
    try:
        code = wait_exact(proc, RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{what}: launcher still running after {RUN_TIMEOUT_S:.0f} s") from exc
    if code not in codes:
        raise BenchError(f"{what}: launcher exited {code}, expected {codes}")
    return code
