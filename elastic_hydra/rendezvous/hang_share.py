"""Hangs across nodes, through the rendezvous store: progress, and every node's ranks.

A job is hung when no rank on any node made progress for `hang.timeout`: each node publishes
its own latest progress (wall clock) and reads the others'. When its watch finds the job hung,
each node publishes where its ranks are and reads the other nodes' (they find the same hang
within a look or two), so every node's watch gives the job-wide verdict (`hangs.verdict`, from
every node's ranks). What comes from the store is untrusted: a value that does not read as a
time or a rank is ignored, and no node may claim progress in the future.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from elastic_hydra.errors import STORE_ERRORS
from elastic_hydra.records.hangs import HangRank

SHARE_WAIT = 15.0  # seconds a node waits for the others' ranks after a hang (they find it too)
READ_WAIT = 2.0  # seconds a node that has every node's ranks waits for the others to have them
MAX_RANKS = 4096  # per node, from the store
MAX_BYTES = 4 << 20
_KEY = "elastic_hydra/{run_id}/hang/{what}"

Store = Any  # torch.distributed.Store, as the rendezvous guards it (errors: STORE_ERRORS)


def publish_progress(store: Store, run_id: str, round_: int, node: int, last: float) -> None:
    """This node's latest progress; a store that is gone loses it (the job is ending)."""
    key = _KEY.format(run_id=run_id, what=f"progress/{round_}/{node}")
    try:
        store.set(key, f"{last:.3f}")
    except STORE_ERRORS:
        return


def latest_progress(store: Store, run_id: str, round_: int, nodes: int, now: float) -> float | None:
    """The latest progress any node of the round published (never later than `now`)."""
    latest = None
    for node in range(nodes):
        key = _KEY.format(run_id=run_id, what=f"progress/{round_}/{node}")
        try:
            if not store.check([key]):
                continue
            value = min(float(bytes(store.get(key)).decode()), now)
        except STORE_ERRORS:  # gone, or not a number: no word from that node
            continue
        latest = value if latest is None else max(latest, value)
    return latest


def share_hang(
    store: Store,
    run_id: str,
    *,
    key: str,
    node: int,
    nodes: int,
    ranks: Sequence[HangRank],
    stopped: Callable[[], bool],
) -> tuple[list[HangRank], int]:
    """Publish this node's ranks, wait (SHARE_WAIT at most) for the other nodes'; every node's
    ranks, by rank, and how many nodes said nothing (or nothing that reads as ranks)."""
    mine = json.dumps([r.to_json() for r in ranks])
    keys = [_KEY.format(run_id=run_id, what=f"ranks/{key}/{n}") for n in range(nodes)]
    try:
        store.set(keys[node], mine)
    except STORE_ERRORS:
        return list(ranks), 0
    found: dict[int, list[HangRank]] = {node: list(ranks)}
    deadline = time.monotonic() + SHARE_WAIT
    while len(found) < nodes and time.monotonic() < deadline and not stopped():
        for n, k in enumerate(keys):
            if n not in found and (theirs := _read_ranks(store, k)) is not None:
                found[n] = theirs
        if len(found) < nodes:
            time.sleep(0.1)
    if len(found) == nodes:
        _all_read(store, _KEY.format(run_id=run_id, what=f"read/{key}"), nodes, stopped)
    every = sorted((r for rs in found.values() for r in rs), key=lambda r: r.rank)
    return every, nodes - sum(1 for rs in found.values() if rs)


def _all_read(store: Store, key: str, nodes: int, stopped: Callable[[], bool]) -> None:
    """Say this node read every node's ranks, and wait (READ_WAIT at most) until the others
    have too: the node that finds them all first may host the store, and would take it along
    when its job ends, before a node that looked a moment earlier looks again."""
    deadline = time.monotonic() + READ_WAIT
    try:
        count = store.add(key, 1)
        while count < nodes and time.monotonic() < deadline and not stopped():
            time.sleep(0.05)
            count = store.add(key, 0)
    except STORE_ERRORS:  # the store is gone: nobody is left to read it
        return


def _read_ranks(store: Store, key: str) -> list[HangRank] | None:
    """A node's ranks: None while they are not there (or the store did not answer: asked
    again), [] when what is there does not read as ranks."""
    try:
        if not store.check([key]):
            return None
        raw = bytes(store.get(key))
    except STORE_ERRORS:
        return None
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
        if not isinstance(data, list):
            return []
        return [HangRank.from_json(item) for item in data[:MAX_RANKS]]
    except (ValueError, TypeError, RecursionError):  # RecursionError: `[` nested deep
        return []
