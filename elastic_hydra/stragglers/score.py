"""The straggler score: which rank arrives last at the job's collectives, how often, how late.

Each rank's arrival at a collective is the Flight Recorder's creation time of the call (before
any wait for the others). A node sums its ranks' arrivals per collective (`summarize`: how many,
the last and the one before it, the first), on node 0's clock once corrected by its offset, and
the nodes' sums merge into the job's. A collective is scored once every rank of its group
arrived at it (the default group: the world; another group: every rank seen in it).

A rank is named a straggler when it arrived last at NAME_SHARE or more of the last `window`
scored collectives of the groups it is in, or at QUICK_SHARE or more of the last MIN_SCORED (a
slowdown is named within about MIN_SCORED steps of its onset), by a median margin over the
arrival before its own of at least the threshold: `behind` seconds and RELATIVE times the job's
median interval between collectives (a rank 15 ms late at 10 s steps is noise, not a
straggler). It is cleared, with hysteresis, when it is last at fewer than CLEAR_SHARE of the
last MIN_SCORED or its margin there falls under half the threshold, and is never named while
that holds (the long window may still hold the stretch it was cleared of). Nothing is said
before MIN_SCORED collectives. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

from elastic_hydra.plan import CLEAR_SHARE, MIN_SCORED, NAME_SHARE, QUICK_SHARE, RELATIVE
from elastic_hydra.records.stragglers import Arrival, Change, Key, Score, Seen

DEFAULT_GROUP = "0"  # torch's name of the default process group: every rank is in it


def summarize(
    arrivals: Mapping[int, Iterable[Arrival]],
) -> tuple[dict[Key, Seen], dict[str, set[int]]]:
    """Ranks' arrivals as one `Seen` per collective, and each group's ranks among them."""
    seen: dict[Key, Seen] = {}
    members: dict[str, set[int]] = {}
    for rank, items in sorted(arrivals.items()):
        for a in items:
            members.setdefault(a.group, set()).add(rank)
            one = Seen(op=a.op, ranks=1, last_rank=rank, last=a.time, second=None, first=a.time)
            key = (a.group, a.seq)
            seen[key] = one if key not in seen else seen[key].merge(one)
    return seen, members


def scores(
    seen: Mapping[Key, Seen], members: Mapping[str, set[int]], window: int, world: int
) -> tuple[dict[int, Score], float]:
    """Every rank's score over its groups' last `window` scored collectives, and the job's
    median interval between consecutive collectives of a group (0 when none). Ranks outside
    the world (what another node's share may claim) are left out."""
    groups = {g: {r for r in ranks if 0 <= r < world} for g, ranks in members.items()}
    size = {g: world if g == DEFAULT_GROUP else len(ranks) for g, ranks in groups.items()}
    done = sorted(
        ((s.first, key, s) for key, s in seen.items()
         if s.ranks >= max(2, size.get(key[0], 0)) and 0 <= s.last_rank < world),
        key=lambda item: item[0],
    )  # fmt: skip
    gaps: list[float] = []
    previous: dict[str, tuple[int, float]] = {}
    for first, (group, seq), _ in done:
        if previous.get(group, (-2, 0.0))[0] == seq - 1 and first >= previous[group][1]:
            gaps.append(first - previous[group][1])
        previous[group] = (seq, first)
    # Ranks in the same groups share their collectives: each such set is walked once.
    by_groups: dict[frozenset[str], list[int]] = {}
    for rank in range(world):
        mine = frozenset(g for g, ranks in groups.items() if rank in ranks) | {DEFAULT_GROUP}
        by_groups.setdefault(mine, []).append(rank)
    result = {}
    for mine, ranks in by_groups.items():
        recent = [s for _, (g, _), s in done if g in mine][-window:]
        lasts: dict[int, list[Seen]] = {}
        for s in recent:
            if s.second is not None:
                lasts.setdefault(s.last_rank, []).append(s)
        for rank in ranks:
            own = lasts.get(rank, [])
            result[rank] = Score(
                rank=rank,
                last=len(own),
                of=len(recent),
                behind=statistics.median(s.last - (s.second or s.last) for s in own)
                if own
                else 0.0,
                op=statistics.mode(s.op for s in own) if own else "",
            )
    return result, statistics.median(gaps) if gaps else 0.0


class Tracker:
    """The ranks named stragglers, with hysteresis: a rank is named once, and cleared once."""

    def __init__(self, window: int, behind: float, world: int) -> None:
        self.window, self.behind, self.world = window, behind, world
        self.named: set[int] = set()
        self.latest: dict[int, Score] = {}

    def update(self, seen: Mapping[Key, Seen], members: Mapping[str, set[int]]) -> list[Change]:
        found, interval = scores(seen, members, self.window, self.world)
        recent, _ = scores(seen, members, min(MIN_SCORED, self.window), self.world)
        self.latest = found
        threshold = max(self.behind, RELATIVE * interval)
        changes = []
        for rank, s in found.items():
            short = recent[rank]
            if short.of < min(MIN_SCORED, self.window):
                continue
            clear = short.share < CLEAR_SHARE or short.behind < threshold / 2
            if rank not in self.named:
                # Never named where it would be cleared: the long window still holds a stretch
                # the rank was cleared of, and would name it again at every other update.
                named = next(
                    (x for x, share in ((s, NAME_SHARE), (short, QUICK_SHARE))
                     if x.share >= share and x.behind >= threshold and not clear),
                    None,
                )  # fmt: skip
                if named is not None:
                    self.named.add(rank)
                    changes.append(Change(named, named=True, threshold=threshold))
            elif clear:
                self.named.discard(rank)
                changes.append(Change(short, named=False, threshold=threshold))
        return changes
