"""Stragglers as typed records: one rank's arrival at one collective (`Arrival`, as the
bootstrap notes it), one collective as a node's ranks arrived at it (`Seen`, what the nodes
share), a rank's score over the job's recent collectives (`Score`) and a rank named a straggler
or cleared (`Change`). Pure.

`stragglers/` scores them; the events, `top`, the metrics and the console show them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

Key = tuple[str, int]  # a collective: its process group's name, its sequence number there
MAX_LINE = 512  # bytes of one arrival line read from a rank's file or a node's share
MAX_ARRIVALS = 1000  # read per rank (the bootstrap keeps as many)


@dataclass(frozen=True, slots=True)
class Arrival:
    """When a rank called one collective (before any wait for the others)."""

    group: str  # the process group's name ("0": the default group)
    seq: int  # torch's sequence number of the collective in that group
    op: str  # "gloo:all_reduce"
    time: float  # seconds since the epoch, on node 0's clock once shared

    @classmethod
    def parse(cls, line: bytes | str) -> Arrival | None:
        """One line `[group, seq, op, time]` (untrusted): None when it does not read as one."""
        if len(line) > MAX_LINE:
            return None
        try:
            group, seq, op, time = json.loads(line)
        except (ValueError, TypeError):
            return None
        if not (isinstance(group, str) and isinstance(op, str) and len(group) + len(op) <= 200):
            return None
        if type(seq) is not int or seq < 0 or type(time) not in (int, float):
            return None
        if not math.isfinite(time):
            return None
        return cls(group, seq, op, float(time))


@dataclass(frozen=True, slots=True)
class Seen:
    """One collective as some ranks arrived at it: how many, which came last and when, the
    arrival before it (None: one rank) and the first."""

    op: str
    ranks: int
    last_rank: int
    last: float
    second: float | None
    first: float

    def merge(self, other: Seen) -> Seen:
        """The collective as both sets of ranks (disjoint: two nodes') arrived at it."""
        late, early = (self, other) if self.last >= other.last else (other, self)
        second = max(t for t in (late.second, early.last) if t is not None)
        return Seen(
            op=self.op, ranks=self.ranks + other.ranks, last_rank=late.last_rank, last=late.last,
            second=second, first=min(self.first, other.first),
        )  # fmt: skip

    def to_json(self, group: str, seq: int, offset: float) -> list[object]:
        """The shared form, times less `offset` (this node's clock to node 0's)."""
        second = None if self.second is None else round(self.second - offset, 6)
        return [group, seq, self.op, self.ranks, self.last_rank, round(self.last - offset, 6),
                second, round(self.first - offset, 6)]  # fmt: skip

    @classmethod
    def from_json(cls, item: object) -> tuple[str, int, Seen] | None:
        """The shared form (untrusted): None when it does not read as one."""
        if not isinstance(item, list) or len(item) != 8:
            return None
        group, seq, op, ranks, last_rank, last, second, first = item
        ints, times = (seq, ranks, last_rank), (last, first, *([] if second is None else [second]))
        if not (isinstance(group, str) and isinstance(op, str) and len(group) + len(op) <= 200):
            return None
        if any(type(v) is not int or v < 0 for v in ints) or ranks < 1:
            return None
        if any(type(t) not in (int, float) or not math.isfinite(t) for t in times):
            return None
        if not first <= (last if second is None else second) <= last:
            return None  # the arrivals out of their order: not a collective as ranks saw it
        seen = cls(op, ranks, last_rank, float(last), None if second is None else float(second),
                   float(first))  # fmt: skip
        return group, seq, seen


def read_arrivals(data: bytes) -> list[Arrival]:
    """Arrival lines (a rank's file, a node's share), checked one by one; the newest
    MAX_ARRIVALS."""
    lines = data.splitlines()[-MAX_ARRIVALS:]
    return [a for line in lines if (a := Arrival.parse(line)) is not None]


@dataclass(frozen=True, slots=True)
class Score:
    """One rank's straggler score over its last scored collectives."""

    rank: int
    last: int  # collectives it arrived last at
    of: int  # collectives scored
    behind: float  # median seconds after the arrival before its own, where it was last
    op: str  # the op it was last at most often ("" when never last)

    @property
    def share(self) -> float:
        return self.last / self.of if self.of else 0.0


@dataclass(frozen=True, slots=True)
class Change:
    """A rank named a straggler (`named`), or no longer one."""

    score: Score
    named: bool
    threshold: float  # seconds of median lateness it was judged against
