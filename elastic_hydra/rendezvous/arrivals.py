"""The straggler score across nodes, through the job's store: one clock, every node's arrivals.

A node's arrivals are on its own clock. At the start of each round a thread of each agent
measures its offset to node 0's clock through the store: the nodes pass BARRIERS barriers
(`add` on one key, then polled every POLL seconds); every node notes when it saw each barrier
complete, the nodes saw it within a poll and a round trip of each other, and the offset is the
median difference to node 0's notes. Until it is known (or when it cannot be, within
OFFSET_WAIT), the share gives nothing: no node scores a job it sees part of.

Then at each look every node publishes its collectives (`Seen`, corrected to node 0's clock,
the newest KEEP) and reads every node's: the same data on every node, so the same verdict.
What comes from the store is untrusted: size caps, then every item checked (`Seen.from_json`).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from elastic_hydra.errors import STORE_ERRORS
from elastic_hydra.records.stragglers import Key, Seen

BARRIERS = 5
POLL = 0.002  # seconds between looks at a barrier
OFFSET_WAIT = 30.0  # seconds the nodes get to meet at the barriers
KEEP = 200  # collectives per node, the newest (~20 KB)
MAX_BYTES = 256 << 10  # of one node's share
MAX_GROUPS = 64
_KEY = "elastic_hydra/{run_id}/straggler/{round}/{what}"

Store = Any  # torch.distributed.Store (errors: STORE_ERRORS)


class ArrivalShare:
    """One round's share of the straggler score, on one node."""

    def __init__(
        self,
        store: Store,
        *,
        run_id: str,
        round: int,
        node: int,
        nodes: int,
        stopped: Callable[[], bool],
    ) -> None:
        self.store, self.node, self.nodes, self.stopped = store, node, nodes, stopped
        self.round = round
        self.prefix = _KEY.format(run_id=run_id, round=round, what="")
        self.offset: float | None = None
        self.closed = False  # the round is over: the measuring thread ends
        self.measuring = threading.Thread(target=self._measure, name="clock-offset", daemon=True)
        self.measuring.start()

    def share(
        self, seen: Mapping[Key, Seen], members: Mapping[str, set[int]]
    ) -> tuple[dict[Key, Seen], dict[str, set[int]]] | None:
        """Publish this node's collectives; every node's merged, or None while the clock offset
        is not known or a node has published none."""
        if self.offset is None:
            return None
        newest = sorted(seen.items(), key=lambda item: item[1].first)[-KEEP:]
        mine = {
            "members": {g: sorted(r) for g, r in list(members.items())[:MAX_GROUPS]},
            "seen": [s.to_json(g, q, self.offset) for (g, q), s in newest],
        }
        keys = [self._key(f"seen/{n}") for n in range(self.nodes)]
        try:
            self.store.set(keys[self.node], json.dumps(mine))
            if not self.store.check(keys):  # every node's, in one round trip
                return None
            raws = [bytes(v) for v in self.store.multi_get(keys)]
        except STORE_ERRORS:
            return None
        merged: dict[Key, Seen] = {}
        groups: dict[str, set[int]] = {}
        for raw in raws:
            if (read := _read(raw)) is None:
                return None
            for key, one in read[0].items():
                merged[key] = one if key not in merged else merged[key].merge(one)
            for g, ranks in read[1].items():
                groups.setdefault(g, set()).update(ranks)
        return merged, groups

    def _key(self, what: str) -> str:
        return self.prefix + what

    def _measure(self) -> None:
        """This node's clock offset to node 0's (see the module's docstring)."""
        deadline = time.monotonic() + OFFSET_WAIT
        noted = []
        try:
            for i in range(BARRIERS):
                barrier = self._key(f"clock/{i}")
                count = self.store.add(barrier, 1)
                while count < self.nodes:
                    if time.monotonic() > deadline or self.stopped() or self.closed:
                        return
                    time.sleep(POLL)
                    count = self.store.add(barrier, 0)
                noted.append(time.time())
            self.store.set(self._key(f"clock/noted/{self.node}"), json.dumps(noted))
            if self.node == 0:
                self.offset = 0.0
                return
            theirs = self._key("clock/noted/0")
            while not self.store.check([theirs]):
                if time.monotonic() > deadline or self.stopped() or self.closed:
                    return
                time.sleep(0.05)
            raw = bytes(self.store.get(theirs))
        except STORE_ERRORS:
            return
        try:
            zero = json.loads(raw) if len(raw) < 4096 else None
            if isinstance(zero, list) and len(zero) == len(noted):
                offset = statistics.median(a - float(b) for a, b in zip(noted, zero, strict=True))
                self.offset = offset if math.isfinite(offset) else None
        except (ValueError, TypeError, RecursionError, OverflowError):  # not node 0's notes
            return


def _read(raw: bytes) -> tuple[dict[Key, Seen], dict[str, set[int]]] | None:
    """One node's share (untrusted): None when it does not read as one."""
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (ValueError, RecursionError):  # RecursionError: `[` nested deep
        return None
    if not isinstance(data, dict) or not isinstance(data.get("seen"), list):
        return None
    members: dict[str, set[int]] = {}
    raw_members = data.get("members")
    if isinstance(raw_members, dict):
        for g, ranks in list(raw_members.items())[:MAX_GROUPS]:
            if isinstance(ranks, list):
                members[str(g)] = {r for r in ranks[:4096] if type(r) is int and r >= 0}
    seen = {}
    for item in data["seen"][:KEEP]:
        if (read := Seen.from_json(item)) is not None:
            group, seq, one = read
            seen[(group, seq)] = one
    return seen, members
