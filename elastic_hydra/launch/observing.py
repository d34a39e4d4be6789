"""The agent's watchers wired: its status publisher (run dir, and the rendezvous store of a
multi-node job), and its metrics when `metrics.port` or `metrics.textfile` asks for them.

`Observers` is the executor's Observer: each event goes to the timeline first, then to the
status; a status that fails never costs the timeline.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from elastic_hydra.agent.events import Event
from elastic_hydra.agent.seams import Observer
from elastic_hydra.errors import ConfigError
from elastic_hydra.hangs.watch import LocalHangWatch
from elastic_hydra.observe.publish import PERIOD, Publisher, Sink
from elastic_hydra.observe.status import Tracker
from elastic_hydra.plan import Dynamic, Endpoint, LaunchPlan, PreflightMode, Standalone, Static
from elastic_hydra.records.stragglers import Score
from elastic_hydra.report import notices
from elastic_hydra.rundir import RunDir
from elastic_hydra.stragglers.watch import LocalStragglerWatch

if TYPE_CHECKING:  # prometheus_client loads only for a job that asks for metrics
    from elastic_hydra.observe.metrics import Metrics


# `off`: no status records (what benchmarks/observe_cost.py compares against); metrics on
# turn them on regardless.
STATUS_ENV = "ELASTIC_HYDRA_STATUS"


@dataclass(slots=True)
class Observers:
    """The timeline, then the status publisher (and the metrics that read it)."""

    timeline: Observer
    status: Publisher
    metrics: Metrics | None = None

    def emit(self, event: Event) -> None:
        self.timeline.emit(event)
        with contextlib.suppress(Exception):  # the status is a view; the timeline is the record
            self.status.emit(event)

    def close(self) -> None:
        """The last record and metrics (the agent ended), then the server closed."""
        self.status.close()
        if self.metrics is not None:
            self.metrics.close()


def progress_of(watch: LocalHangWatch) -> Mapping[int, float]:
    """Each local rank's last progress (wall clock), as the hang watch last looked."""
    return {lr: p.last_progress for lr, p in list(watch.ranks.items())}


def progress_how(watch: LocalHangWatch) -> Mapping[int, str]:
    """What each local rank's last progress was (`collective #12`, `output`, ...)."""
    return {lr: p.how for lr, p in list(watch.ranks.items())}


def stragglers_of(watch: LocalStragglerWatch) -> Mapping[int, tuple[Score, bool]]:
    """Each local rank's straggler score, and whether it is named, as the watch last scored."""
    named = watch.tracker.named
    return {lr: (s, s.rank in named) for lr, s in watch.scores().items()}


def start(
    plan: LaunchPlan,
    run: RunDir,
    host: str,
    watch: LocalHangWatch,
    timeline: Observer,
    *,
    stragglers: LocalStragglerWatch | None = None,
) -> Observers:
    """The publisher of this node's status and its metrics, started (close them at the end).

    Raises:
        ConfigError: metrics.port cannot be listened on (taken, or not this machine's).
    """
    tracker = Tracker(
        node=host, nproc=plan.nproc_per_node, agent_pid=os.getpid(), period=PERIOD,
        preflight=plan.preflight.mode is not PreflightMode.OFF,
    )  # fmt: skip
    sinks: list[Sink] = []
    if isinstance(plan.rdzv, Dynamic):
        from elastic_hydra.rendezvous.status_keys import StoreSink

        sinks.append(StoreSink(plan.rdzv.endpoint, plan.torch_run_id, plan.rdzv.backend))
    publisher = Publisher(
        tracker, path=run.status, progress=lambda: progress_of(watch),
        how=lambda: progress_how(watch), sinks=sinks,
        stragglers=(lambda: stragglers_of(stragglers)) if stragglers else dict,
    )  # fmt: skip
    metrics = None
    if plan.metrics.enabled:
        from elastic_hydra.observe.metrics import Metrics

        metrics = Metrics(publisher.state)
        if (textfile := plan.metrics.textfile) is not None:
            publisher.after.append(functools.partial(metrics.write, Path(textfile)))
        if plan.metrics.port is not None:
            address = job_address(plan)
            try:
                port = metrics.serve(address, plan.metrics.port)
            except OSError as exc:
                raise ConfigError(
                    "metrics.port", f"cannot listen on {address} ({exc.strerror or exc})",
                    plan.metrics.port, "a free port, or 0 for any",
                ) from None  # fmt: skip
            notices.say(f"metrics on http://{Endpoint(host=address, port=port)}/metrics")
    if os.environ.get(STATUS_ENV) != "off" or metrics is not None:
        publisher.start()
    return Observers(timeline, publisher, metrics)


def job_address(plan: LaunchPlan) -> str:
    """The address this node uses in the job: loopback on one node, else `local_addr`, else
    the one its packets to the rendezvous (or node 0) leave from. Never every interface."""
    match plan.rdzv:
        case Standalone(host=host):
            return host
        case Static(master=master) | Dynamic(endpoint=master):
            if plan.local_addr:
                return plan.local_addr
            return _source_address(master.host)
    return LOOPBACK


LOOPBACK = "127.0.0.1"


def _source_address(host: str) -> str:
    """The local address of a route to `host` (a UDP connect sends nothing)."""
    try:
        family, _, _, _, where = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(where)
            return str(probe.getsockname()[0])
    except OSError:
        return LOOPBACK
