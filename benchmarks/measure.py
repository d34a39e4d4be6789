"""One measured run of each workload, for either launcher (and the launch workload's floor).

Each returns {metric key: value}.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from procs import (
    RUN_TIMEOUT_S,
    BenchError,
    alive,
    count_stamps,
    expect_exit,
    free_port,
    launched,
    read_stamp,
    wait_for,
    wait_until,
)
from workloads import C10d, Launcher, command, floor_command, worker_env

MEMORY_NPROC = 4
MEMORY_SLEEP_S = 5.0
LOGS_NPROC = 4
SHUTDOWN_NPROC = 4
SAMPLE_S = 0.005
# Departure: a node without a heartbeat for keep_alive_interval x keep_alive_max_attempt has left.
DEPARTURE_OVERRIDES = (
    "rdzv.keep_alive_interval=1",
    "rdzv.keep_alive_max_attempt=3",
    "rdzv.last_call_timeout=1",
)

# torchrun's error line, e.g. "E1122 00:24:04.772000 5510 .../api.py:1003] failed (exitcode: 1) ..."
TORCHRUN_FAILED = re.compile(
    rb"^E(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) .*failed \(exitcode: 1\) local_rank:", re.M
)
LOG_LINE = re.compile(rb"line \d+$", re.M)


@dataclass(frozen=True)
class Bench:
    """Where runs happen: the private temp root, the worker script, and the log-line count."""

    root: Path
    worker: Path
    lines: int

    def fresh(self, name: str) -> tuple[Path, Path]:
        """A new run directory and its (empty) stamp directory."""
        run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        stamps = run_dir / "stamps"
        stamps.mkdir()
        return run_dir, stamps


def run_launch(launcher: Launcher, bench: Bench, nproc: int) -> dict[str, float]:
    """Wall time of a job whose workers exit 0 at once: start-up, spawn, wait, tear-down."""
    run_dir, stamps = bench.fresh("launch")
    return _launch_wall(command(launcher, bench.worker, nproc, run_dir), run_dir, stamps, nproc)


def run_launch_floor(bench: Bench, nproc: int) -> dict[str, float]:
    """The same wall time with no launcher: a bare program starts the workers and waits."""
    run_dir, stamps = bench.fresh("floor")
    return _launch_wall(floor_command(bench.worker, nproc), run_dir, stamps, nproc)


def _launch_wall(cmd: list[str], run_dir: Path, stamps: Path, nproc: int) -> dict[str, float]:
    """Popen of `cmd` to its exit (0), with workers that exit 0 at once."""
    started = time.perf_counter()
    with launched(cmd, cwd=run_dir, env=worker_env("exit", stamps)) as proc:
        expect_exit(proc, (0,), "launch")
        wall = time.perf_counter() - started
    return {f"launch@{nproc}": wall}


def run_restart(launcher: Launcher, bench: Bench, nproc: int) -> dict[str, float]:
    """Rank 0 fails once all ranks run; one restart. Gives restart gap and detection time."""
    run_dir, stamps = bench.fresh("restart")
    cmd = command(launcher, bench.worker, nproc, run_dir, max_restarts=1)
    stderr_path = run_dir / "launcher.stderr"
    with (
        stderr_path.open("wb") as stderr,
        launched(cmd, cwd=run_dir, env=worker_env("fail", stamps), stderr=stderr) as proc,
    ):
        expect_exit(proc, (0,), "restart")
    failed, _ = read_stamp(stamps / "fail")
    restarted = [read_stamp(stamps / f"start_1_{rank}")[0] for rank in range(nproc)]
    if launcher == "elastic-hydra":
        detected = _event_time(run_dir)
    else:
        detected = _torchrun_failure_time(stderr_path.read_bytes())
    return {
        f"restart_gap@{nproc}": max(restarted) - failed,
        f"detection@{nproc}": detected - failed,
    }


def run_restart_floor(bench: Bench, nproc: int) -> dict[str, float]:
    """The restart gap with no launcher: from a stamp the bare program writes just before it starts
    `nproc` fresh workers to the last one's start stamp (nothing to detect, nothing to stop)."""
    run_dir, stamps = bench.fresh("restart-floor")
    cmd = floor_command(bench.worker, nproc, stamps / "fail")
    with launched(cmd, cwd=run_dir, env=worker_env("start", stamps)) as proc:
        expect_exit(proc, (0,), "restart floor")
    spawning, _ = read_stamp(stamps / "fail")
    started = [read_stamp(stamps / f"start_0_{rank}")[0] for rank in range(nproc)]
    return {f"restart_gap@{nproc}": max(started) - spawning}


def _events(run_dir: Path) -> Iterator[dict[str, Any]]:
    """elastic-hydra's events from every events.jsonl under `run_dir`/eh_logs, in file order.

    A line still being written (the last one, read while the agent runs) ends the file early.
    """
    for events in (run_dir / "eh_logs").rglob("events.jsonl"):
        for line in events.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break
            yield event


def _event_time(run_dir: Path) -> float:
    """The time of elastic-hydra's first `worker_exited` event for a real (non-zero) failure."""
    for event in _events(run_dir):
        if (
            event.get("event") == "worker_exited"
            and event.get("returncode") not in (0, None)
            and not event.get("terminated_by_launcher")
        ):
            return float(event["time"])
    raise BenchError("no worker_exited event for the failure in events.jsonl")


def _torchrun_failure_time(stderr: bytes) -> float:
    """The local wall-clock time of torchrun's `failed (exitcode: 1) local_rank:` log line."""
    match = TORCHRUN_FAILED.search(stderr)
    if match is None:
        raise BenchError("torchrun logged no 'failed (exitcode: 1)' line")
    month, day, hour, minute, second, micro = (int(g) for g in match.groups())
    year = datetime.now().year  # the log line has no year; a run across New Year is not a case
    return datetime(year, month, day, hour, minute, second, micro).timestamp()


def run_memory(launcher: Launcher, bench: Bench, nproc: int) -> dict[str, float]:
    """Agent peak RSS and CPU time while 4 workers sleep 5 s (sampled every 5 ms, agent only)."""
    run_dir, stamps = bench.fresh("memory")
    cmd = command(launcher, bench.worker, nproc, run_dir)
    env = worker_env("sleep", stamps, sleep=str(MEMORY_SLEEP_S))
    peak = 0
    cpu_at_start: float | None = None
    cpu_before_end: float | None = None
    with launched(cmd, cwd=run_dir, env=env) as proc:
        agent = psutil.Process(proc.pid)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                rss = agent.memory_info().rss
                times = agent.cpu_times()
            except psutil.Error:
                break
            peak = max(peak, rss)
            # Sampled before looking for end stamps, so this CPU reading predates the workers' end.
            if count_stamps(stamps, "end_") == 0:
                cpu_before_end = times.user + times.system
                if cpu_at_start is None and count_stamps(stamps, "start_0_") >= nproc:
                    cpu_at_start = cpu_before_end
            time.sleep(SAMPLE_S)
        expect_exit(proc, (0,), "memory")
    if cpu_at_start is None or cpu_before_end is None:
        raise BenchError("memory: workers' start or end was never observed")
    return {
        "rss": peak / 2**20,
        "cpu_total": cpu_before_end,
        "cpu_monitor": cpu_before_end - cpu_at_start,
    }


def run_logs(launcher: Launcher, bench: Bench, nproc: int) -> dict[str, float]:
    """Workers print `bench.lines` lines each; console tee to a pipe the harness reads fully."""
    run_dir, stamps = bench.fresh("logs")
    cmd = command(launcher, bench.worker, nproc, run_dir, tee=True)
    env = worker_env("print", stamps, lines=str(bench.lines))
    expected = nproc * bench.lines
    started = time.perf_counter()
    with launched(cmd, cwd=run_dir, env=env, stdout=subprocess.PIPE) as proc:
        try:
            out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"logs: launcher still running after {RUN_TIMEOUT_S:.0f} s") from exc
        wall = time.perf_counter() - started
        expect_exit(proc, (0,), "logs")
    received = len(LOG_LINE.findall(out))
    result = {"log_wall": wall, "log_rate": received / wall, "log_lost": float(expected - received)}
    if launcher == "elastic-hydra":
        logs = list((run_dir / "eh_logs").rglob("stdout.log"))
        in_files = sum(len(LOG_LINE.findall(p.read_bytes())) for p in logs)
        result["log_files_lost"] = float(expected - in_files)
    return result


def run_shutdown(launcher: Launcher, bench: Bench, nproc: int) -> dict[str, float]:
    """SIGTERM to the launcher once all workers run, until it and every worker pid are gone."""
    run_dir, stamps = bench.fresh("shutdown")
    cmd = command(launcher, bench.worker, nproc, run_dir)
    with launched(cmd, cwd=run_dir, env=worker_env("hold", stamps)) as proc:
        if not wait_until(lambda: count_stamps(stamps, "start_0_") >= nproc, RUN_TIMEOUT_S):
            raise BenchError("shutdown: workers never all started")
        pids = [read_stamp(stamps / f"start_0_{rank}")[1] for rank in range(nproc)]
        started = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        done = wait_until(
            lambda: proc.poll() is not None and not any(alive(pid) for pid in pids),
            RUN_TIMEOUT_S,
            interval=0.001,
        )
        took = time.perf_counter() - started
        if not done:
            raise BenchError("shutdown: launcher or workers still running after SIGTERM")
    return {"shutdown": took}


def run_rendezvous(launcher: Launcher, bench: Bench, nodes: int) -> dict[str, float]:
    """`nodes` agents x 1 worker over c10d, started back to back; last agent to last worker."""
    run_dir, stamps = bench.fresh("rendezvous")
    rdzv = C10d(nnodes=str(nodes), endpoint=f"127.0.0.1:{free_port()}", run_id=run_dir.name)
    env = worker_env("start", stamps)
    with contextlib.ExitStack() as stack:
        agents = []
        for node in range(nodes):
            cmd = command(launcher, bench.worker, 1, run_dir / f"node{node}", rdzv=rdzv)
            last_start = time.time()
            agents.append(stack.enter_context(launched(cmd, cwd=run_dir, env=env)))
        for node, agent in enumerate(agents):
            expect_exit(agent, (0,), f"rendezvous agent {node}")
    started = [read_stamp(stamps / f"start_0_{rank}")[0] for rank in range(nodes)]
    return {f"rendezvous@{nodes}": max(started) - last_start}


def run_departure(launcher: Launcher, bench: Bench, nodes: int) -> dict[str, float]:
    """elastic-hydra only: nnodes=1:`nodes`; SIGKILL the last agent once every worker runs, until
    agent 0 records the departure (a `membership` event with `change: left`)."""
    if launcher != "elastic-hydra":
        raise BenchError("departure: torchrun has no equivalent (it never notices)")
    run_dir, stamps = bench.fresh("departure")
    rdzv = C10d(nnodes=f"1:{nodes}", endpoint=f"127.0.0.1:{free_port()}", run_id=run_dir.name)
    node_dirs = [run_dir / f"node{node}" for node in range(nodes)]
    env = worker_env("hold", stamps)
    with contextlib.ExitStack() as stack:
        agents = []
        for node, node_dir in enumerate(node_dirs):
            # Agent 0 hosts the c10d store: the agent killed later does not take it along.
            is_host = "true" if node == 0 else "false"
            cmd = command(launcher, bench.worker, 1, node_dir, rdzv=rdzv)
            cmd += [*DEPARTURE_OVERRIDES, f"rdzv.is_host={is_host}"]
            agents.append(stack.enter_context(launched(cmd, cwd=run_dir, env=env)))
        pids = wait_for(lambda: _workers(node_dirs, stamps), RUN_TIMEOUT_S, interval=0.05)
        if pids is None:
            raise BenchError(f"departure: the workers of all {nodes} agents never ran together")
        victims = pids[-1]
        killed = time.time()
        agents[-1].send_signal(signal.SIGKILL)
        left = wait_for(lambda: _left_time(node_dirs[0]), RUN_TIMEOUT_S, interval=0.01)
        if left is None:
            raise BenchError("departure: agent 0 never recorded the killed agent leaving")
        if not wait_until(lambda: not any(alive(pid) for pid in victims), 5.0):
            raise BenchError("departure: the killed agent's workers outlived it")
    return {f"departure@{nodes}": left - killed}


def _workers(node_dirs: list[Path], stamps: Path) -> list[list[int]] | None:
    """Each agent's worker pids once every agent's latest round has all the agents and its
    workers were started (none exited since) and wrote their start stamps; otherwise None."""
    stamped = {read_stamp(path)[1] for path in stamps.glob("start_*")}
    pids = []
    for node_dir in node_dirs:
        ends = ("rendezvous", "workers_started", "worker_exited")  # not hang_watch and the like
        match [e for e in _events(node_dir) if e.get("event") in ends][-2:]:
            case [{"event": "rendezvous", "nodes": n}, {"event": "workers_started", "pids": p}]:
                if n != len(node_dirs) or not stamped.issuperset(p):
                    return None
                pids.append([int(pid) for pid in p])
            case _:
                return None
    return pids


def _left_time(run_dir: Path) -> float | None:
    """The time of the agent's first `membership` event with `change: left`, if any."""
    for event in _events(run_dir):
        if event.get("event") == "membership" and event.get("change") == "left":
            return float(event["time"])
    return None
