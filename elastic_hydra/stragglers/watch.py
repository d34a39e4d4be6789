"""The agent's straggler watch for one node (`seams.StragglerWatch`, straggler.*).

At most every EVERY seconds it reads its ranks' arrivals files (the bootstrap keeps each rank's
recent collectives there, from the Flight Recorder, rewritten at each of its reads) and keeps
what it read, the newest KEEP per rank: the ranks' reads are not in step, and a collective is
scored once every rank's arrival at it was read, whichever file still holds it. It sums them
per collective, shares the sum
through the job's store on several nodes (every node then scores the same data) and updates the
score (`score.Tracker`). A file that cannot be read, or does not read as arrivals, counts as
no arrivals.
"""

from __future__ import annotations

import time

from elastic_hydra.agent.seams import JobShare, NodeAssignment
from elastic_hydra.plan import LaunchPlan
from elastic_hydra.records.stragglers import (
    MAX_ARRIVALS,
    MAX_LINE,
    Arrival,
    Change,
    Key,
    Score,
    read_arrivals,
)
from elastic_hydra.rundir import RunDir
from elastic_hydra.stragglers.score import Tracker, summarize

EVERY = 1.0  # seconds between looks at least
KEEP = 1000  # arrivals kept per rank (straggler.window is at most 1000)


class LocalStragglerWatch:
    """The straggler score of this node's workers (and, with `job`, the job's)."""

    def __init__(self, plan: LaunchPlan, run: RunDir, job: JobShare | None = None) -> None:
        self.spec, self.run, self.job = plan.straggler, run, job
        self.attempt, self.base, self.count, self.next_look = 0, 0, 0, 0.0
        self.tracker = Tracker(self.spec.window, self.spec.behind, 1)
        self.kept: dict[int, dict[Key, Arrival]] = {}  # by rank

    def start(self, node: NodeAssignment, attempt: int, count: int) -> None:
        self.attempt, self.base, self.count = attempt, node.base_rank, count
        self.tracker = Tracker(self.spec.window, self.spec.behind, node.world_size)
        self.next_look, self.kept = 0.0, {}

    def check(self) -> list[Change]:
        now = time.monotonic()
        if now < self.next_look:
            return []
        self.next_look = now + EVERY
        for lr in range(self.count):
            kept = self.kept.setdefault(self.base + lr, {})
            kept.update(((a.group, a.seq), a) for a in read_arrivals(self._read(lr)))
            for key in list(kept)[: max(0, len(kept) - KEEP)]:  # the oldest first in
                del kept[key]
        seen, members = summarize({rank: kept.values() for rank, kept in self.kept.items()})
        if self.job is not None:
            if (shared := self.job.share_arrivals(seen, members)) is None:
                return []
            seen, members = shared
        return self.tracker.update(seen, members)

    def scores(self) -> dict[int, Score]:
        """This node's ranks' latest scores, by local rank."""
        latest = self.tracker.latest
        return {lr: s for lr in range(self.count) if (s := latest.get(self.base + lr))}

    def _read(self, local_rank: int) -> bytes:
        try:
            with open(self.run.arrivals_file(self.attempt, local_rank), "rb") as f:
                return f.read(MAX_ARRIVALS * MAX_LINE)
        except OSError:
            return b""
