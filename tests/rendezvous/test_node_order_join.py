"""A node joining a running job whose rounds have a node order (rdzv=slurm and the scheduler
presets: here rdzv=dstack, its variables set by hand): the regression test of a deadlock.

In the round it joins, a new agent's torch handler waits, inside the rendezvous, for the round's
MASTER_ADDR, which node 0 (an agent already in the job, whose handler published its own only in
its first round) publishes; and with a node order every node reads every node's facts before it
knows its rank. Node 0 must publish the master before it waits for the facts, or the new node
never gets out of torch's handler to publish its own: both wait until their stores time out.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import free_port
from tests.multinode import FAST, job

# The good path took 15 s here. Reverted, both agents wait until their stores time out (60 s)
# and leave with exit 3: agent 0 on the new node's facts, the new node on MASTER_ADDR.
DEADLINE = 120.0


def dstack_node(rank: int) -> dict[str, str]:
    return {
        "DSTACK_NODE_RANK": str(rank), "DSTACK_NODES_NUM": "2",
        "DSTACK_MASTER_NODE_IP": "127.0.0.1", "EXIT_AT_WORLD": "2",
    }  # fmt: skip


def test_a_node_joins_a_running_node_ordered_job(tmp_path: Path) -> None:
    with job(tmp_path, "dstack", f":{free_port()}") as j:
        overrides = ("nnodes=1:2", "nproc_per_node=1", *FAST)
        first = j.start(*overrides, env=dstack_node(0))
        j.wait_world(1, DEADLINE)  # node 0 trains alone: its handler's first round is over
        j.start(*overrides, env=dstack_node(1))
        assert j.finish(DEADLINE) == [0, 0], j.explain()
    records = j.world(2)
    assert [(r["rank"], r["sum"]) for r in records] == [(0, 3), (1, 3)], j.records()
    assert "node 0 of 2" in first.text(), first.text()  # the first node kept rank 0: its order
