"""Rendezvous without an external service: standalone (one node) and static (fixed node ranks)."""

from __future__ import annotations

import socket

from elastic_hydra.env import NodeAssignment
from elastic_hydra.outcome import WorkerExit
from elastic_hydra.plan import Endpoint, LaunchPlan, Standalone, Static


def reserve_port(host: str) -> socket.socket:
    """A bound, non-listening socket on a free port.

    Held while workers run: with SO_REUSEADDR the workers' store can still bind the port, but no
    other process's bind(0) is handed it, so concurrent launches never collide.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


class LocalRendezvous:
    """Standalone: this node alone. Static: node ranks and the master address are given."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self._reservation: socket.socket | None = None
        match plan.rdzv:
            case Standalone(host=host):
                self._reservation = reserve_port(host)
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

    def publish_failure(self, exit: WorkerExit) -> None:
        pass  # one node, or static nodes without a shared store: the summary is this node's

    def close(self) -> None:
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None
