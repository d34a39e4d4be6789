"""Rendezvous without an external service: standalone (one node) and static (fixed node ranks)."""

from __future__ import annotations

import ipaddress
import socket

from elastic_hydra.agent.outcome import Status
from elastic_hydra.agent.seams import JobFailures, NodeAssignment, Observer
from elastic_hydra.plan import Endpoint, LaunchPlan, PythonModule, PythonScript, Standalone, Static
from elastic_hydra.records.failures import FailureRecord


def reserve_port(host: str) -> socket.socket:
    """A bound, non-listening socket on a free port.

    Held while workers run: with SO_REUSEADDR the workers' store can still bind the port, but no
    other process's bind(0) is handed it, so concurrent launches never collide.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket listening on `host` alone (torch's TCPStore, given none, listens on every
    interface): hand its descriptor to `TCPStore(..., master_listen_fd=...)`.

    Raises:
        OSError: the host does not resolve, or the address is taken.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    if ipaddress.ip_address(address[0]).is_loopback and not _names_loopback(host):
        # This machine resolves its own name to a loopback address (Debian's `127.0.1.1 host`
        # line) while the other machines reach it by another: listen where torch would.
        address = ("::" if family == socket.AF_INET6 else "0.0.0.0", port)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def _names_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class LocalRendezvous:
    """Standalone: this node alone. Static: node ranks and the master address are given."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self._reservation: socket.socket | None = None
        self.store_fd: int | None = None  # a listening socket for rank 0's store (standalone)
        match plan.rdzv:
            case Standalone(host=host):
                # Rank 0's bootstrap makes torch's store listen on this very socket (loopback
                # only). Other workers bind the port themselves: a listening socket would take it.
                bootstrapped = isinstance(plan.entrypoint, (PythonScript, PythonModule)) and bool(
                    plan.entrypoint.bootstrap
                )
                self._reservation = listen_socket(host, 0) if bootstrapped else reserve_port(host)
                self.store_fd = self._reservation.fileno() if bootstrapped else None
                self.master = Endpoint(host=host, port=self._reservation.getsockname()[1])
                self.node_rank, self.nnodes = 0, 1
            case Static(master=master, node_rank=node_rank):
                self.master = master
                self.node_rank, self.nnodes = node_rank, plan.nnodes.max
            case _:
                raise TypeError(f"not a local rendezvous: {plan.rdzv!r}")

    def next_round(self) -> NodeAssignment:
        nproc = self.plan.nproc_per_node
        return NodeAssignment(
            group_rank=self.node_rank,
            group_world_size=self.nnodes,
            base_rank=self.node_rank * nproc,
            world_size=self.nnodes * nproc,
            role_base_rank=self.node_rank * nproc,
            role_world_size=self.nnodes * nproc,
            master=self.master,
        )

    def poll(self) -> None:
        return None  # membership is fixed

    def publish_failure(self, record: FailureRecord) -> None:
        pass  # one node, or static nodes without a shared store: the summary is this node's

    def end(self, status: Status, observer: Observer) -> JobFailures:
        return JobFailures()  # nothing to wait for or close; no other node's records

    @property
    def round(self) -> int:
        return 0  # seams.NodeExchange: one round

    def gather(self, topic: str, value: bytes, *, limit: int, timeout: float) -> list[bytes | None]:
        """seams.NodeExchange: this node alone (preflight refuses static nodes: no store)."""
        return [value[: limit + 1]]

    def first(self, topic: str, value: bytes, *, limit: int, timeout: float) -> bytes:
        """seams.NodeExchange: this node alone."""
        return value[: limit + 1]

    def offered(self, topic: str, *, limit: int) -> bytes | None:
        """seams.NodeExchange: no other node offers anything."""
        return None

    def job_share(self) -> None:
        return None  # no store the nodes share: each node watches its own ranks

    def close(self) -> None:
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None
