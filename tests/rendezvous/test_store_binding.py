"""Every store we start listens on the job's address, never on every interface: rank 0's store in
a one-node job, the c10d store an agent hosts, the worker store node 0 serves, `rdzv-server`."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.conftest import ELASTIC_HYDRA, WORKERS, free_port, wait_for
from tests.multinode import FAST

pytestmark = pytest.mark.timeout(180)
WILDCARDS = {"0.0.0.0", "::", "::ffff:0.0.0.0"}


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


@contextmanager
def held_job(tmp_path: Path, *overrides: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A 2-rank gloo job whose workers hold their process group open until `<out>/go` exists."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [*ELASTIC_HYDRA, f"script={WORKERS / 'store_wait.py'}", "nproc_per_node=2",
         f"logs.root={tmp_path / 'logs'}", *overrides, "--", str(out)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(lambda: len(list(out.glob("ready_*"))) == 2, 90, "both ranks to join the group")
        yield proc, out
        (out / "go").touch()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
    finally:
        proc.kill()
        proc.wait()


def test_a_one_node_jobs_store_listens_on_loopback_only(tmp_path: Path) -> None:
    with held_job(tmp_path) as (_, out):
        rank0 = int((out / "ready_0").read_text())
        sockets = listening(rank0)
        assert sockets, "rank 0 hosts the store: it must listen somewhere"
        assert {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets


def test_an_agent_hosted_c10d_store_and_the_worker_store_listen_on_the_endpoint_only(
    tmp_path: Path,
) -> None:
    port = free_port()
    overrides = ("rdzv=c10d", f"rdzv.endpoint=127.0.0.1:{port}", "rdzv.is_host=true", *FAST)
    with held_job(tmp_path, *overrides) as (proc, _):
        sockets = listening(proc.pid)
        assert ("127.0.0.1", port) in sockets, sockets
        assert not {ip for ip, _ in sockets} & WILDCARDS, sockets


def test_rdzv_server_listens_on_its_host_only(tmp_path: Path) -> None:
    log = tmp_path / "server.out"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*ELASTIC_HYDRA, "rdzv-server", "--port", "0", "--host", "127.0.0.2"],
            stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "listening on 127.0.0.2:" in log.read_text(), 60, "the server")
        sockets = listening(proc.pid)
        assert {ip for ip, _ in sockets} == {"127.0.0.2"}, sockets
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_rdzv_server_refuses_an_address_it_cannot_listen_on(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*ELASTIC_HYDRA, "rdzv-server", "--port", "0", "--host", "no-such-host.invalid"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert "cannot listen on no-such-host.invalid:0" in line
