"""The agent's watchers wired: its status publisher (run dir, and the c10d store of a multi-node
job), and its metrics when `metrics.port` or `metrics.textfile` asks for them.

`Observers` is the executor's Observer: each event goes to the timeline first, then to the
status; a status that fails never costs the timeline.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

from elastic_hydra.agent.events import Event
from elastic_hydra.agent.seams import Observer
from elastic_hydra.hangs.watch import LocalHangWatch
from elastic_hydra.observe.publish import PERIOD, Publisher, Sink
from elastic_hydra.observe.status import Tracker
from elastic_hydra.plan import Dynamic, DynamicBackend, LaunchPlan
from elastic_hydra.rundir import RunDir


@dataclass(slots=True)
class Observers:
    """The timeline, then the status publisher."""

    timeline: Observer
    status: Publisher

    def emit(self, event: Event) -> None:
        self.timeline.emit(event)
        with contextlib.suppress(Exception):  # the status is a view; the timeline is the record
            self.status.emit(event)


def progress_of(watch: LocalHangWatch) -> Mapping[int, float]:
    """Each local rank's last progress (wall clock), as the hang watch last looked."""
    return {lr: p.last_progress for lr, p in list(watch.ranks.items())}


def start(plan: LaunchPlan, run: RunDir, host: str, watch: LocalHangWatch) -> Publisher:
    """The publisher of this node's status, started (close it at the agent's end)."""
    tracker = Tracker(node=host, nproc=plan.nproc_per_node, agent_pid=os.getpid(), period=PERIOD)
    sinks: list[Sink] = []
    if isinstance(plan.rdzv, Dynamic) and plan.rdzv.backend is DynamicBackend.C10D:
        from elastic_hydra.rendezvous.status_keys import StoreSink

        sinks.append(StoreSink(plan.rdzv.endpoint, plan.torch_run_id))
    publisher = Publisher(
        tracker, path=run.status, progress=lambda: progress_of(watch), sinks=sinks
    )
    publisher.start()
    return publisher
