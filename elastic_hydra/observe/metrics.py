"""The agent's state as Prometheus metrics (prometheus_client, a registry of its own).

One collector reads the node's current status record and its counts at each scrape (or each
textfile write): nothing is kept twice, nothing is updated on the agent's loop. The labels are
the node's name, ranks, states and causes: never a value of the job's config or environment.

    elastic_hydra_worker_state{node,rank,local_rank,state}   1 for the worker's state, else 0
    elastic_hydra_worker_last_progress_age_seconds{node,rank}
    elastic_hydra_worker_cpu_percent{node,rank}, elastic_hydra_worker_rss_bytes{node,rank}
    elastic_hydra_worker_last_arrival_share{node,rank}        the straggler score: the share of
    elastic_hydra_worker_behind_seconds{node,rank}            the last collectives it arrived
    elastic_hydra_worker_straggler{node,rank}                 last at, how late; 1 while named
    elastic_hydra_phase{node,phase}                            1 for the node's phase, else 0
    elastic_hydra_attempt{node}
    elastic_hydra_restarts_total{node,cause}                   cause: failure, hang
    elastic_hydra_failures_total{node,class}                   each failure acted on (a restart,
                                                               the end), by its failure class
    elastic_hydra_hang_verdicts_total{node,action}             action: report, restart, fail
    elastic_hydra_membership_changes_total{node,change}        change: joined, left, closed
    elastic_hydra_rendezvous_rounds_total{node}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elastic_hydra.observe.status import Counts, JobPhase, NodeStatus, WorkerState

PREFIX = "elastic_hydra_"


class StatusCollector(Collector):
    """The metrics of `read()`: the node's record and counts, as of the scrape."""

    def __init__(self, read: Callable[[], tuple[NodeStatus, Counts]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        record, counts = self.read()
        node = record.node
        yield from _workers(record)
        phase = GaugeMetricFamily(
            f"{PREFIX}phase", "1 for the node's phase", labels=["node", "phase"]
        )
        for p in JobPhase:
            phase.add_metric([node, p.value], 1.0 if record.phase is p else 0.0)
        yield phase
        yield _gauge(
            "attempt", "the current start of the worker group, from 0", node, record.attempt
        )
        yield _counter("restarts", "restarts by cause", node, "cause", counts.restarts)
        yield _counter(
            "failures", "failures acted on, by failure class", node, "class", counts.failures
        )
        yield _counter("hang_verdicts", "hang verdicts by action", node, "action", counts.hangs)
        yield _counter(
            "membership_changes", "membership changes by kind", node, "change", counts.membership
        )
        rounds = CounterMetricFamily(f"{PREFIX}rendezvous_rounds", "rounds", labels=["node"])
        rounds.add_metric([node], float(counts.rounds))
        yield rounds
        yield _counter(
            "preflight_verdicts", "preflight verdicts by result", node, "result", counts.preflight
        )
        yield _total("preflight_failed_nodes", "nodes the preflight verdicts named", node,
                     counts.preflight_failed_nodes)  # fmt: skip
        yield _total("quarantine_refusals", "rounds not joined: this node is in the ledger", node,
                     counts.quarantine_refusals)  # fmt: skip


def _workers(record: NodeStatus) -> Iterator[Metric]:
    node = record.node
    state = GaugeMetricFamily(
        f"{PREFIX}worker_state", "1 for the worker's state",
        labels=["node", "rank", "local_rank", "state"],
    )  # fmt: skip
    names = {
        "age": ("worker_last_progress_age_seconds", "seconds since its last progress"),
        "cpu": ("worker_cpu_percent", "CPU, percent of one core"),
        "rss": ("worker_rss_bytes", "resident memory"),
        "last": ("worker_last_arrival_share", "share of the last collectives it arrived last at"),
        "behind": ("worker_behind_seconds", "median lateness where it arrived last"),
        "straggler": ("worker_straggler", "1 while it is named a straggler"),
    }
    per_rank = {
        k: GaugeMetricFamily(f"{PREFIX}{name}", text, labels=["node", "rank"])
        for k, (name, text) in names.items()
    }
    for w in record.workers:
        for s in WorkerState:
            state.add_metric([node, str(w.rank), str(w.local_rank), s.value], float(w.state is s))
        straggler = None if w.last_at is None else float(w.straggler)
        for key, value in (("age", w.progress_age), ("cpu", w.cpu_percent),
                           ("rss", w.rss_bytes), ("last", w.last_at), ("behind", w.behind),
                           ("straggler", straggler)):  # fmt: skip
            if value is not None:
                per_rank[key].add_metric([node, str(w.rank)], float(value))
    yield state
    yield from per_rank.values()


def _gauge(name: str, text: str, node: str, value: float) -> Metric:
    gauge = GaugeMetricFamily(f"{PREFIX}{name}", text, labels=["node"])
    gauge.add_metric([node], float(value))
    return gauge


def _total(name: str, text: str, node: str, count: int) -> Metric:
    counter = CounterMetricFamily(f"{PREFIX}{name}", text, labels=["node"])
    counter.add_metric([node], float(count))
    return counter


def _counter(name: str, text: str, node: str, label: str, counts: dict[str, int]) -> Metric:
    counter = CounterMetricFamily(f"{PREFIX}{name}", text, labels=["node", label])
    for key, count in sorted(counts.items()):
        counter.add_metric([node, key], float(count))
    return counter


class Metrics:
    """The registry, its HTTP server (`serve`) and its textfile (`write`)."""

    def __init__(self, read: Callable[[], tuple[NodeStatus, Counts]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(read))
        self.server: Any = None

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: a free port) from a daemon thread; the port."""
        self.server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self.server.server_port)

    def write(self, path: Path) -> None:
        """The metrics to `path` for node_exporter's textfile collector (temp + rename)."""
        write_to_textfile(str(path), self.registry)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
