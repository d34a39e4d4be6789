"""Where snapshots live: the node's snapshot area in memory and the job's checkpoint home on
disk. The one place that spells their names (as `rundir` does a run's).

    <area>/                     the agent's, in /dev/shm (private): ELASTIC_HYDRA_SNAPSHOTS
        restore.json            what this attempt's workers resume from (the agent writes it)
        save.json               the step every rank is asked to save at (a stop signal came)
        floor.json              the oldest step every node's copies reach: kept while they lag
        rank-<r>/step-<S>.snap  rank r's snapshot of step S (the newest two are kept)
        buddy/rank-<r>/step-<S>.snap  the ring's previous node's copy of it (checkpoint.buddy)
    <home>/                     checkpoint.home: the same for every node and relaunch of a job
        step-<S>/rank-<r>.snap  a durable copy of rank r's snapshot of step S
        step-<S>/node-<n>.json  node n's manifest of its ranks' parts, written last
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

AREA_PREFIX = "elastic-hydra-snapshots-"  # + the agent's pid and start: one area per agent
_RESTORE = "restore.json"
_SAVE = "save.json"
_FLOOR = "floor.json"
_STEP = re.compile(r"step-(\d{1,18})\.snap")
_RANK = re.compile(r"rank-(\d{1,9})")
_COPY = re.compile(r"step-(\d{1,18})")
_MANIFEST = re.compile(r"node-(\d{1,9})\.json")


@dataclass(frozen=True, slots=True)
class Area:
    """A node's snapshot area."""

    root: Path

    @property
    def restore(self) -> Path:
        return self.root / _RESTORE

    @property
    def save_request(self) -> Path:
        return self.root / _SAVE

    @property
    def floor(self) -> Path:
        return self.root / _FLOOR

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank-{rank}"

    def snapshot(self, rank: int, step: int) -> Path:
        return self.rank_dir(rank) / f"step-{step}.snap"

    def partial(self, rank: int, step: int, pid: int) -> Path:
        """Where a snapshot is written before it is complete (never read)."""
        return self.rank_dir(rank) / f".step-{step}.{pid}.part"

    def steps(self, rank: int) -> list[int]:
        """The steps of rank's complete snapshots, oldest first."""
        return _numbered(self.rank_dir(rank), _STEP)

    def ranks(self) -> list[int]:
        """The ranks that have a snapshot directory here (this node's, now or before)."""
        return _numbered(self.root, _RANK)

    @property
    def buddy(self) -> Area:
        """The copies of the ring's previous node's snapshots, laid out as an area's."""
        return Area(self.root / "buddy")


def _numbered(folder: Path, pattern: re.Pattern[str]) -> list[int]:
    """The numbers of the names in `folder` that match `pattern`, smallest first."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := pattern.fullmatch(n)))


@dataclass(frozen=True, slots=True)
class Home:
    """The job's checkpoint home."""

    root: Path

    def copy_dir(self, step: int) -> Path:
        return self.root / f"step-{step}"

    def part(self, step: int, rank: int) -> Path:
        return self.copy_dir(step) / f"rank-{rank}.snap"

    def partial(self, step: int, rank: int) -> Path:
        return self.copy_dir(step) / f".rank-{rank}.snap.part"

    def manifest(self, step: int, node_rank: int) -> Path:
        return self.copy_dir(step) / f"node-{node_rank}.json"

    def copies(self) -> list[int]:
        """The steps that have a copy directory (complete or not), oldest first."""
        return _numbered(self.root, _COPY)

    def manifests(self, step: int) -> list[Path]:
        try:
            return sorted(p for p in self.copy_dir(step).iterdir() if _MANIFEST.fullmatch(p.name))
        except OSError:
            return []
