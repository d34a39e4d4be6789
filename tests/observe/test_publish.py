"""The publisher: a record on disk, private, whatever its sinks do; nothing left running."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from elastic_hydra.agent import events
from elastic_hydra.observe.publish import Publisher
from elastic_hydra.observe.sample import Sampler
from elastic_hydra.observe.status import JobPhase, Tracker, WorkerState, decode
from elastic_hydra.workers import procfs
from tests.conftest import wait_for

T = {"wall_time": 1.0, "mono_time": 1.0}


def test_records_reach_the_run_dir_and_the_sinks_and_a_failing_sink_costs_nothing(
    tmp_path: Path,
) -> None:
    tracker = Tracker(node="n", nproc=1, agent_pid=os.getpid(), period=0.05)
    got: list[bytes] = []

    def broken(raw: bytes) -> None:
        raise RuntimeError("store gone")

    path = tmp_path / "status.json"
    publisher = Publisher(tracker, path=path, sinks=[broken, got.append])
    publisher.emit(events.Joining(**T, attempt=0))
    publisher.emit(events.WorkersStarted(**T, pids=(os.getpid(),), attempt=0))
    publisher.start()
    while len(got) < 3:  # the thread goes on publishing despite the broken sink
        threading.Event().wait(0.01)
    publisher.close()
    assert publisher.thread is not None and not publisher.thread.is_alive()
    record = decode(path.read_bytes())
    assert record.phase is JobPhase.RUNNING and record.workers[0].state is WorkerState.RUNNING
    assert record.workers[0].rss_bytes and record.workers[0].rss_bytes > 1 << 20
    assert path.stat().st_mode & 0o777 == 0o600
    assert decode(got[-1]) == record


def test_cpu_is_a_rate_between_two_samples() -> None:
    sampler = Sampler(gpu=False)
    me = os.getpid()
    assert sampler.sample([me])[me].cpu_percent is None
    # Work until /proc counts some: it counts in clock ticks (10 ms), so a fixed amount of work
    # can show none on a loaded host.
    start = procfs.cpu_seconds(me)
    wait_for(lambda: sum(i * i for i in range(30_000)) and procfs.cpu_seconds(me) != start, 30,
             "this process's CPU time to advance in /proc")  # fmt: skip
    second = sampler.sample([me, 2**22 + 7])  # a pid that does not exist is left out
    assert list(second) == [me]
    percent = second[me].cpu_percent
    assert percent is not None and percent > 0


def test_an_agent_without_metrics_does_not_load_prometheus_client() -> None:
    probe = "import sys, elastic_hydra.launch.wiring; print('prometheus_client' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=60, check=True)  # fmt: skip
    assert shown.stdout.strip() == "False"
