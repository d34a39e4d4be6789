"""The job as `elastic-hydra top` sees it: every node's status record, read back and checked.

Records come from a run dir (the node's own `status.json`, or each node's inside a multi-node
job's directory) or from the rendezvous store (read by `rendezvous.status_keys`); either way they
are untrusted bytes. One that does not read as a record is counted and its reason kept, never
fatal. A node whose record is older than a few of its publish periods is stale: its agent stopped
publishing (killed, or its host is gone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_hydra.observe.status import (
    MAX_BYTES,
    JobPhase,
    NodeStatus,
    StatusRecordError,
    decode,
)
from elastic_hydra.rundir import RunDir

# The job's phase is its busiest node's: one node restarting means the job is restarting.
_ORDER = (
    JobPhase.STOPPING,
    JobPhase.RESTARTING,
    JobPhase.RENDEZVOUS,
    JobPhase.PREFLIGHT,
    JobPhase.RUNNING,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    record: NodeStatus
    age: float  # seconds since the record was written
    stale: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Every node's latest record, by node rank, and the records that were ignored."""

    nodes: tuple[NodeView, ...]
    time: float
    ignored: int = 0
    why: str = ""  # the first ignored record's fault

    @property
    def phase(self) -> JobPhase | None:
        """The job's phase (None: no record yet, or every node stale)."""
        live = [n.record.phase for n in self.nodes if not n.stale]
        for phase in _ORDER:
            if phase in live:
                return phase
        return JobPhase.DONE if live else None

    def to_json(self) -> dict[str, Any]:
        phase = self.phase
        return {
            "time": self.time,
            "phase": None if phase is None else phase.value,
            "nodes": [
                {**n.record.to_json(), "age": round(n.age, 1), "stale": n.stale} for n in self.nodes
            ],
            "ignored": self.ignored,
        }


def snapshot(raws: Iterable[bytes], now: float) -> Snapshot:
    """The records of `raws` checked, ordered by node rank then name."""
    views, ignored, why = [], 0, ""
    for raw in raws:
        try:
            record = decode(raw)
        except StatusRecordError as exc:
            ignored += 1
            why = why or str(exc)
            continue
        age = max(0.0, now - record.time)
        views.append(NodeView(record=record, age=age, stale=record.stale(now)))
    views.sort(key=lambda v: (v.record.node_rank is None, v.record.node_rank or 0, v.record.node))
    return Snapshot(nodes=tuple(views), time=now, ignored=ignored, why=why)


def run_dir_records(root: Path) -> list[bytes]:
    """The raw records of a run dir: its own, or each node's in a multi-node job's directory."""
    run = RunDir(root)
    runs = [run] if run.status.is_file() else run.nodes()
    raws = []
    for each in runs:
        with contextlib.suppress(OSError), open(each.status, "rb") as f:
            raws.append(f.read(MAX_BYTES + 1))
    return raws
