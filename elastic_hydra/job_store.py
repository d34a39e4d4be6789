"""What the nodes of one job share in the rendezvous store besides the rendezvous itself: the rank
assignment and the exit barrier (torchrun's keys, so torchrun agents can share the job), and every
node's failure records (for the job-wide root cause).

It works on any torch `Store`, passed in: it imports no torch itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import Any

from elastic_hydra import store_records
from elastic_hydra.seams import StopRequest

Store = Any
FAILURES = "elastic_hydra/{run_id}/failures"
MAX_RECORDS = 1000  # read at most this many: a forged count must not stall the end of the job
# torchrun's keys (torch/distributed/elastic/agent/server/api.py).
ROLE_INFO = "torchelastic/role_info/"
ASSIGNED_RANKS = "torchelastic/assigned_ranks/"
EXIT_BARRIER = "torchelastic/agent/terminal_state"
NODE_ORDER = "elastic_hydra/node_order/"


def ordered_rank(store: Store, rank: int, nodes: int, order: int) -> int:
    """This node's rank when the round's nodes are ranked by `order` (Slurm's node id) rather
    than by torch's rank (host name, then pid). Every node of the round calls it.

    Raises:
        ValueError: a node published something that is not a node id (the store is untrusted).
    """
    store.set(f"{NODE_ORDER}{rank}", str(order))
    raws = store.multi_get([f"{NODE_ORDER}{i}" for i in range(nodes)])
    orders = []
    for i, raw in enumerate(raws):
        text = bytes(raw).decode(errors="replace")
        if not text.isdigit() or len(text) > 9:
            raise ValueError(f"node {i} published {text[:40]!r} as its node order")
        orders.append((int(text), i))
    return sorted(orders).index((order, rank))


def assign_ranks(
    role: str, nproc: int, store: Store, group_rank: int, nodes: int
) -> dict[str, int]:
    """torchrun's rank assignment: node 0 sums every node's workers, in node rank order."""
    info = {"role": role, "rank": group_rank, "local_world_size": nproc}
    store.set(f"{ROLE_INFO}{group_rank}", json.dumps(info))
    if group_rank == 0:
        keys = [f"{ROLE_INFO}{i}" for i in range(nodes)]
        infos = [json.loads(raw) for raw in store.multi_get(keys)]
        store.multi_set(
            [f"{ASSIGNED_RANKS}{i}" for i in range(nodes)],
            [json.dumps(ranks) for ranks in rank_table(infos)],
        )
    base, world, role_base, role_world = json.loads(store.get(f"{ASSIGNED_RANKS}{group_rank}"))
    return {
        "base_rank": base,
        "world_size": world,
        "role_base_rank": role_base,
        "role_world_size": role_world,
    }


def rank_table(infos: list[Mapping[str, Any]]) -> list[list[int]]:
    """[base rank, world size, base role rank, role world size] per node, in node rank order."""
    world = sum(int(i["local_world_size"]) for i in infos)
    role_sizes: dict[str, int] = {}
    for info in infos:
        role_sizes[info["role"]] = role_sizes.get(info["role"], 0) + int(info["local_world_size"])
    out, base, role_base = [], 0, dict.fromkeys(role_sizes, 0)
    for info in infos:
        role = info["role"]
        out.append([base, world, role_base[role], role_sizes[role]])
        base += int(info["local_world_size"])
        role_base[role] += int(info["local_world_size"])
    return out


def publish_failure(
    store: Store, run_id: str, record: dict[str, Any], secret: bytes | None
) -> None:
    """Add this node's failure record; a store that is gone loses it (the summary keeps it)."""
    key = FAILURES.format(run_id=run_id)
    try:
        index = store.add(f"{key}/count", 1)
        store.set(f"{key}/{index}", store_records.seal(record, secret))
    except Exception:
        return


def read_failures(
    store: Store,
    run_id: str,
    *,
    secret: bytes | None,
    nodes: Collection[str] | None,
    last_round: int,
) -> store_records.Checked:
    """Every node's published failure records that pass `store_records.check_all`, and how many
    did not. A store that is gone, or holds nonsense, yields what could be read."""
    key = FAILURES.format(run_id=run_id)
    raws: list[bytes] = []
    try:
        count = min(int(store.add(f"{key}/count", 0)), MAX_RECORDS)
        for index in range(1, count + 1):
            if store.check([f"{key}/{index}"]):
                raws.append(bytes(store.get(f"{key}/{index}")))
    except Exception:
        pass
    return store_records.check_all(raws, secret=secret, nodes=nodes, last_round=last_round)


def exit_barrier(
    store: Store,
    nodes: int,
    *,
    timeout: float,
    stop: StopRequest,
    job_changed: Callable[[], bool],
) -> float | None:
    """After success, wait for the other nodes to finish (torchrun's barrier, same keys).

    Returns the seconds waited, or None when it gave up: timeout, a signal, or the job changed
    (`job_changed`: a node left or the job closed) before the last node arrived.
    """
    started = time.monotonic()
    last = f"{EXIT_BARRIER}/last_member"

    def done(wait: float = 0.0) -> bool:
        """Whether the last node arrived; a blocking wait wakes the moment it does."""
        try:
            if wait:
                store.wait([last], timedelta(seconds=wait))
                return True
            return bool(store.check([last]))
        except Exception:  # not yet (the wait timed out), or the store is gone
            return False

    try:
        if store.add(f"{EXIT_BARRIER}/num_members", 1) == nodes:
            store.set(last, "<val_ignored>")
    except Exception:
        return None
    while time.monotonic() - started < timeout:
        if done(wait=0.2):
            return time.monotonic() - started
        if stop.signum is not None:
            return None
        if job_changed():
            # The last node may have passed the barrier and closed the job meanwhile.
            return time.monotonic() - started if done() else None
    return None
