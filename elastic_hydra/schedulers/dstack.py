"""dstack: a node of a multi-node task (`nodes: N`).

dstack gives each node `DSTACK_NODE_RANK`, `DSTACK_NODES_NUM`, `DSTACK_MASTER_NODE_IP`,
`DSTACK_NODES_IPS` (one address per line), `DSTACK_GPUS_PER_NODE` and `DSTACK_RUN_NAME`; its
examples build `torchrun --nnodes=$DSTACK_NODES_NUM --node-rank=$DSTACK_NODE_RANK
--master-addr=$DSTACK_MASTER_NODE_IP` from them by hand.
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_hydra.schedulers.base import (
    SchedulerError,
    SchedulerNode,
    below,
    count,
    host,
    node_ips,
)

NAME = "dstack"
_FIX = "run inside a dstack task with nodes: N, or pick rdzv=c10d"
NAMES = ("DSTACK_NODE_RANK", "DSTACK_NODES_NUM", "DSTACK_MASTER_NODE_IP", "DSTACK_NODES_IPS",
         "DSTACK_GPUS_PER_NODE", "DSTACK_RUN_NAME")  # fmt: skip


def present(environ: Mapping[str, str]) -> bool:
    return "DSTACK_NODE_RANK" in environ or "DSTACK_MASTER_NODE_IP" in environ


def read(environ: Mapping[str, str]) -> SchedulerNode:
    """This node of a dstack task.

    Raises:
        SchedulerError: a variable is missing, malformed or contradicts another.
    """
    rank = count(environ, "DSTACK_NODE_RANK", _FIX)
    nnodes = count(environ, "DSTACK_NODES_NUM", _FIX, least=1)
    below("DSTACK_NODE_RANK", rank, "DSTACK_NODES_NUM", nnodes, _FIX)
    master = host(environ, "DSTACK_MASTER_NODE_IP", _FIX)
    if "DSTACK_NODES_IPS" in environ:
        ips = node_ips(environ, "DSTACK_NODES_IPS", _FIX)
        if len(ips) != nnodes:
            raise SchedulerError(
                "DSTACK_NODES_IPS", f"names {len(ips)} address(es) but DSTACK_NODES_NUM={nnodes}",
                "give one address per line, one line per node",
            )  # fmt: skip
        if ips[0] != master:
            raise SchedulerError(
                "DSTACK_MASTER_NODE_IP", f"={master} is not the first of DSTACK_NODES_IPS "
                f"({ips[0]})", "node 0 hosts the rendezvous: list it first",
            )  # fmt: skip
    gpus = environ.get("DSTACK_GPUS_PER_NODE", "").strip()
    run = environ.get("DSTACK_RUN_NAME", "").strip()
    return SchedulerNode(
        scheduler=NAME,
        flavour="dstack task",
        node_rank=rank,
        rank_variable="DSTACK_NODE_RANK",
        nnodes=nnodes,
        nnodes_variable="DSTACK_NODES_NUM",
        master=master,
        port=None,
        run_id="".join(c if c.isalnum() or c in "._-" else "-" for c in run)[:100]
        or f"dstack-{master}",
        gpus_per_node=int(gpus) if gpus.isdigit() else None,
        variables=tuple((n, environ[n].strip()) for n in NAMES if n in environ),
    )
