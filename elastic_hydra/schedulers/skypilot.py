"""SkyPilot: a node of a multi-node task.

SkyPilot gives each node of a task's `run` section `SKYPILOT_NODE_RANK`, `SKYPILOT_NODE_IPS`
(one address per line, node 0 first), `SKYPILOT_NUM_NODES`, `SKYPILOT_NUM_GPUS_PER_NODE` and
`SKYPILOT_TASK_ID` (the same on every node of one run); its docs tell users to build a torchrun
line from them (`--master_addr=$(echo "$SKYPILOT_NODE_IPS" | head -n1)`).
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_hydra.schedulers.base import (
    SchedulerError,
    SchedulerNode,
    below,
    count,
    node_ips,
)

NAME = "skypilot"
_FIX = "run inside a SkyPilot task's run section (num_nodes: N), or pick rdzv=c10d"
NAMES = ("SKYPILOT_NODE_RANK", "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_IPS",
         "SKYPILOT_NUM_GPUS_PER_NODE", "SKYPILOT_TASK_ID")  # fmt: skip


def present(environ: Mapping[str, str]) -> bool:
    return "SKYPILOT_NODE_RANK" in environ or "SKYPILOT_NODE_IPS" in environ


def read(environ: Mapping[str, str]) -> SchedulerNode:
    """This node of a SkyPilot task.

    Raises:
        SchedulerError: a variable is missing, malformed or contradicts another.
    """
    rank = count(environ, "SKYPILOT_NODE_RANK", _FIX)
    nnodes = count(environ, "SKYPILOT_NUM_NODES", _FIX, least=1)
    ips = node_ips(environ, "SKYPILOT_NODE_IPS", _FIX)
    if len(ips) != nnodes:
        raise SchedulerError(
            "SKYPILOT_NODE_IPS", f"names {len(ips)} address(es) but SKYPILOT_NUM_NODES={nnodes}",
            "give one address per line, one line per node",
        )  # fmt: skip
    below("SKYPILOT_NODE_RANK", rank, "SKYPILOT_NUM_NODES", nnodes, _FIX)
    gpus = environ.get("SKYPILOT_NUM_GPUS_PER_NODE", "").strip()
    task = environ.get("SKYPILOT_TASK_ID", "").strip()
    return SchedulerNode(
        scheduler=NAME,
        flavour="SkyPilot task",
        node_rank=rank,
        rank_variable="SKYPILOT_NODE_RANK",
        nnodes=nnodes,
        nnodes_variable="SKYPILOT_NUM_NODES",
        master=ips[0],
        port=None,
        run_id=_run_id(task) if task else f"skypilot-{ips[0]}",
        gpus_per_node=int(gpus) if gpus.isdigit() else None,
        variables=tuple((n, environ[n].strip()) for n in NAMES if n in environ),
    )


def _run_id(task: str) -> str:
    """SKYPILOT_TASK_ID (`sky-2024-...-<user>_<cluster>_<n>`) as a run id."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in task)[:100]
