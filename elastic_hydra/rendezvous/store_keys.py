"""What the nodes of one job share in the rendezvous store besides the rendezvous itself: the rank
assignment and the exit barrier (torchrun's keys, so torchrun agents can share the job), and every
node's failure records (for the job-wide root cause).

It works on any torch `Store`, passed in (`torch_handler.guarded`: its failures are within
`errors.STORE_ERRORS`): it imports no torch itself.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from elastic_hydra.agent.seams import StopRequest
from elastic_hydra.errors import STORE_ERRORS
from elastic_hydra.records.failures import FailureRecord
from elastic_hydra.rendezvous import sealed_records

Store = Any
FAILURES = "elastic_hydra/{run_id}/failures"
# Per round: a node that saw a membership change first and re-joins to follow it (see
# `follower_key`).
FOLLOWERS = "elastic_hydra/{run_id}/followers/{round}/"
MAX_RECORDS = 1000  # read at most this many: a forged count must not stall the end of the job
# torchrun's keys (torch/distributed/elastic/agent/server/api.py).
ROLE_INFO = "torchelastic/role_info/"
ASSIGNED_RANKS = "torchelastic/assigned_ranks/"
EXIT_BARRIER = "torchelastic/agent/terminal_state"
NODE_FACTS = "elastic_hydra/node/"  # per round: each node's config hash and Slurm node id
# A store's failures, and what other nodes' values raise when they are not what they claim to be
# (the store is untrusted: a list where a dict was, a string where a number was).
STORE_READ_ERRORS: tuple[type[Exception], ...] = (*STORE_ERRORS, TypeError)
_HASH = re.compile(r"[0-9a-f]{0,64}")  # empty: a plan made without a config


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a node tells the others of a round before ranks are assigned."""

    config: str  # `LaunchPlan.config_hash`
    order: int | None  # Slurm's node id; None: rank by torch's order

    def to_json(self) -> str:
        return json.dumps({"config": self.config, "order": self.order})

    @classmethod
    def from_json(cls, raw: bytes, node: int) -> NodeFacts:
        """Raises ValueError naming the node: the store is untrusted."""
        try:
            data = json.loads(bytes(raw)[:512])
            config, order = data["config"], data["order"]
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"node {node} published unreadable facts") from None
        if not isinstance(config, str) or not _HASH.fullmatch(config):
            raise ValueError(f"node {node} published {str(config)[:40]!r} as its config hash")
        if order is not None and (type(order) is not int or not 0 <= order < 10**9):
            raise ValueError(f"node {node} published {str(order)[:40]!r} as its node order")
        return cls(config, order)


def publish_facts(store: Store, rank: int, facts: NodeFacts) -> None:
    store.set(f"{NODE_FACTS}{rank}", facts.to_json())


def read_facts(store: Store, nodes: int, *, wait: bool) -> dict[int, NodeFacts]:
    """The facts the round's nodes published, by torch rank. `wait`: block until every node
    has; else only those there now (a torchrun agent in the job publishes none)."""
    keys = [f"{NODE_FACTS}{i}" for i in range(nodes)]
    present = range(nodes) if wait else [i for i in range(nodes) if store.check([keys[i]])]
    raws = store.multi_get([keys[i] for i in present]) if present else []
    return {i: NodeFacts.from_json(raw, i) for i, raw in zip(present, raws, strict=True)}


def ranked(facts: Mapping[int, NodeFacts]) -> list[int]:
    """The round's torch ranks in node-rank order when the nodes are ranked by their Slurm node
    id rather than by torch's rank (host name, then pid); ties keep torch's order."""

    def place(node: int) -> tuple[int, int]:
        order = facts[node].order
        return (-1 if order is None else order, node)

    return sorted(facts, key=place)


def config_mismatch(facts: Mapping[int, NodeFacts], rank: int) -> int | None:
    """The first node whose config differs from this node's, or None (nodes without a config
    hash are not compared)."""
    mine = facts[rank].config
    return next(
        (i for i, f in sorted(facts.items()) if mine and f.config and f.config != mine), None
    )


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


def node_ranks(store: Store, nodes: Collection[int]) -> dict[int, str]:
    """The global ranks ("2-3") of these nodes' workers in the round, from torchrun's rank
    assignment; a node whose keys are missing or do not read as such (the store is untrusted)
    is left out."""
    out: dict[int, str] = {}
    for node in nodes:
        keys = [f"{ROLE_INFO}{node}", f"{ASSIGNED_RANKS}{node}"]
        try:
            if not store.check(keys):
                continue
            info, assigned = (json.loads(raw) for raw in store.multi_get(keys))
            base, size = assigned[0], info["local_world_size"]
        except STORE_READ_ERRORS:  # not JSON, not a list, no such key: nothing said of it
            continue
        if type(base) is int and type(size) is int and base >= 0 and size > 0:
            out[node] = str(base) if size == 1 else f"{base}-{base + size - 1}"
    return out


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


def follower_key(run_id: str, rdzv_round: int, node: str) -> str:
    """The key a node sets before it re-joins to follow a change it saw: a node seen waiting
    for the next round without it restarted its workers."""
    return f"{FOLLOWERS.format(run_id=run_id, round=rdzv_round)}{node}"


def publish_failure(store: Store, run_id: str, record: FailureRecord, secret: bytes | None) -> None:
    """Add this node's failure record; a store that is gone loses it (the summary keeps it)."""
    key = FAILURES.format(run_id=run_id)
    try:
        index = store.add(f"{key}/count", 1)
        store.set(f"{key}/{index}", sealed_records.seal(record, secret))
    except STORE_ERRORS:
        return


def read_failures(
    store: Store,
    run_id: str,
    *,
    secret: bytes | None,
    nodes: Collection[str] | None,
    last_round: int,
) -> sealed_records.Checked:
    """Every node's published failure records that pass `sealed_records.check_all`, and how many
    did not. A store that is gone, or holds nonsense, yields what could be read."""
    key = FAILURES.format(run_id=run_id)
    raws: list[bytes] = []
    try:
        count = min(int(store.add(f"{key}/count", 0)), MAX_RECORDS)
        for index in range(1, count + 1):
            if store.check([f"{key}/{index}"]):
                raws.append(bytes(store.get(f"{key}/{index}")))
    except STORE_ERRORS:
        pass
    return sealed_records.check_all(raws, secret=secret, nodes=nodes, last_round=last_round)


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
        except STORE_ERRORS:  # not yet (the wait timed out), or the store is gone
            return False

    try:
        if store.add(f"{EXIT_BARRIER}/num_members", 1) == nodes:
            store.set(last, "<val_ignored>")
    except STORE_ERRORS:
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
