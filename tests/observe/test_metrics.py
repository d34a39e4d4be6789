"""Prometheus metrics of a real job with one restart and one hang: scraped from the agent's
port (bound to the job's address only) and read from its textfile."""

from __future__ import annotations

import os
import re
import signal
import socket
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import psutil
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from elastic_hydra.launch.observing import job_address
from elastic_hydra.observe.metrics import Metrics
from elastic_hydra.observe.status import Counts, JobPhase, NodeStatus, WorkerState, WorkerStatus
from tests.conftest import WORKERS, wait_for
from tests.harness import plan_of, run, started

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return samples(reply.read().decode())


def listening(pid: int, port: int) -> list[str]:
    return [
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]


def test_metrics_of_a_job_with_a_restart_and_a_hang(tmp_path: Path) -> None:
    logs, out, textfile = tmp_path / "logs", tmp_path / "out", tmp_path / "eh.prom"
    out.mkdir()
    args = (
        f"script={WORKERS / 'fail_then_hang.py'}", "nproc_per_node=2", f"logs.root={logs}",
        f"env.OUT_DIR={out}", "restart.max_restarts=1", "hang.timeout=1", "hang.action=report",
        "metrics.port=0", f"metrics.textfile={textfile}",
    )  # fmt: skip
    with started(*args, cwd=tmp_path) as agent:
        assert agent.stderr is not None
        line = agent.stderr.readline().decode()  # the first line the agent says
        found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        assert found, line
        port = int(found.group(1))
        assert listening(agent.pid, port) == ["127.0.0.1"]  # not 0.0.0.0, not ::

        def after_the_hang() -> Samples | None:
            got = scrape(port)
            hung = value(got, "elastic_hydra_hang_verdicts_total", action="report")
            return got if hung == 1.0 else None

        got = wait_for(after_the_hang, 90, "a hang verdict in the metrics")
        assert got is not None
        assert value(got, "elastic_hydra_restarts_total", cause="failure") == 1.0
        assert value(got, "elastic_hydra_failures_total", **{"class": "unknown"}) == 1.0  # exit 3
        assert value(got, "elastic_hydra_attempt") == 1.0
        assert value(got, "elastic_hydra_rendezvous_rounds_total") == 2.0
        assert value(got, "elastic_hydra_phase", phase="running") == 1.0
        for rank in ("0", "1"):
            assert value(got, "elastic_hydra_worker_state", rank=rank, local_rank=rank,
                         state="hung") == 1.0  # fmt: skip
            age = value(got, "elastic_hydra_worker_last_progress_age_seconds", rank=rank)
            assert age is not None and age >= 1.0
            rss = value(got, "elastic_hydra_worker_rss_bytes", rank=rank)
            assert rss is not None and rss > 1 << 20

        def in_the_file() -> Samples | None:  # rewritten with each record, every 2 s
            got = samples(textfile.read_text()) if textfile.exists() else {}
            hung = value(got, "elastic_hydra_hang_verdicts_total", action="report")
            return got if hung == 1.0 else None

        from_file = wait_for(in_the_file, 30, "the hang in the textfile")
        assert from_file is not None
        assert value(from_file, "elastic_hydra_restarts_total", cause="failure") == 1.0
        assert textfile.stat().st_size
        os.kill(agent.pid, signal.SIGTERM)
        agent.wait(timeout=60)
    assert not list(tmp_path.glob("*.prom.*"))  # every write was renamed into place
    final = samples(textfile.read_text())
    assert value(final, "elastic_hydra_phase", phase="done") == 1.0


def test_no_secret_reaches_a_label() -> None:
    record = NodeStatus(
        node="n1", node_rank=0, nodes=1, phase=JobPhase.RUNNING, attempt=0, restarts=0,
        rounds=1, agent_pid=1, period=2.0, time=1.0,
        workers=(WorkerStatus(rank=0, local_rank=0, pid=5, state=WorkerState.RUNNING),),
    )  # fmt: skip
    metrics = Metrics(lambda: (record, Counts(restarts={"failure": 2})))
    labels: Iterable[str] = {
        v for family in metrics.registry.collect() for s in family.samples
        for v in s.labels.values()
    }  # fmt: skip
    allowed = {"n1", "0"} | {s.value for s in WorkerState} | {p.value for p in JobPhase}
    assert set(labels) <= allowed | {"failure"}


def test_preflight_verdicts_failed_nodes_and_quarantine_refusals_are_counted() -> None:
    record = NodeStatus(
        node="n1", node_rank=0, nodes=3, phase=JobPhase.PREFLIGHT, attempt=0, restarts=0,
        rounds=2, agent_pid=1, period=2.0, time=1.0,
    )  # fmt: skip
    counts = Counts(preflight={"passed": 1, "failed": 2}, preflight_failed_nodes=3,
                    quarantine_refusals=1)  # fmt: skip
    found = samples(generate_latest(Metrics(lambda: (record, counts)).registry).decode())
    assert value(found, "elastic_hydra_phase", phase="preflight") == 1.0
    assert value(found, "elastic_hydra_preflight_verdicts_total", result="passed") == 1.0
    assert value(found, "elastic_hydra_preflight_verdicts_total", result="failed") == 2.0
    assert value(found, "elastic_hydra_preflight_failed_nodes_total") == 3.0
    assert value(found, "elastic_hydra_quarantine_refusals_total") == 1.0


def test_metrics_keys_are_checked(tmp_path: Path) -> None:
    script = f"script={WORKERS / 'idle.py'}"
    assert plan_of(script, "metrics.port=0").metrics.port == 0
    assert plan_of(script).metrics.enabled is False
    for bad in ("metrics.port=70000", "metrics.port=-1", "metrics.textfile=dir/"):
        shown = run(script, bad, "--plan", cwd=tmp_path, timeout=60)
        assert shown.returncode == 2 and shown.stderr.count("\n") == 1, shown.stderr
        assert bad.split("=")[0] in shown.stderr


def test_a_taken_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        shown = run(f"script={WORKERS / 'idle.py'}", f"metrics.port={port}",
                    f"logs.root={tmp_path}", cwd=tmp_path, timeout=60)  # fmt: skip
    assert shown.returncode == 2, shown.stderr
    assert "metrics.port: cannot listen on 127.0.0.1" in shown.stderr


def test_the_metrics_address_is_the_jobs() -> None:
    script = f"script={WORKERS / 'idle.py'}"
    assert job_address(plan_of(script)) == "127.0.0.1"
    c10d = ("rdzv=c10d", "rdzv.endpoint=127.0.0.1:29400", "nnodes=2", "rdzv.id=j")
    assert job_address(plan_of(script, *c10d)) == "127.0.0.1"
    assert job_address(plan_of(script, *c10d, "local_addr=127.0.0.5")) == "127.0.0.5"
