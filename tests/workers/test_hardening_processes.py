"""Hardening of supervision, with real processes: nothing outlives the agent (SIGKILL during
start-up, daemons), a console that stops reading freezes nothing, a stopped worker is resumed to
exit, and a worker that cannot start or a full disk is a named failure, never exit 70.

A worker re-parented to init is no descendant of the test any more, so these tests find what a
launch left by a marker in its processes' command lines.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from elastic_hydra.agent.events import Stop, WorkersStarted
from elastic_hydra.errors import WorkerStartError
from elastic_hydra.report.events_file import read_events
from elastic_hydra.workers import contain
from elastic_hydra.workers.console import ConsoleSink
from elastic_hydra.workers.spawn import WorkerSpec
from elastic_hydra.workers.supervise import LocalWorkers
from tests.conftest import ELASTIC_HYDRA, WORKERS, tmpfs, wait_for

pytestmark = pytest.mark.timeout(180)
TIMEOUT = 60


def unmarked(marker: str) -> bool:
    return not marked(marker)


def marked(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def assert_none_left(marker: str, what: str) -> None:
    try:
        wait_for(lambda: not marked(marker), 10, what)
    except AssertionError:
        left = marked(marker)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"{what}: {left} still alive")


def agent(tmp_path: Path, *args: str, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [*ELASTIC_HYDRA, f"logs.root={tmp_path / 'logs'}", *args],
        cwd=tmp_path,
        **{"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, **popen},
    )


def cgroup_v2(text: str) -> str:
    """The cgroup v2 path in the text of a /proc/PID/cgroup (its `0::` line)."""
    (path,) = [line[3:] for line in text.splitlines() if line.startswith("0::")]
    return path


def cgroups_left(agent_pid: int) -> list[str]:
    """The cgroups of the launch whose agent is `agent_pid` (others may run beside the tests).

    os.walk, not Path.rglob: the launches of other tests make and remove cgroups meanwhile, and
    rglob raises for a directory gone between its listing and its scan (os.walk skips it)."""
    prefix = f"elastic-hydra-{agent_pid}-"
    return [
        os.path.join(parent, name)
        for parent, names, _ in os.walk("/sys/fs/cgroup")
        for name in names
        if name.startswith(prefix)
    ]


# ------------------------------------------------------------- SIGKILL of the agent at start-up
@pytest.mark.parametrize("nproc", [1, 4])
def test_no_worker_survives_an_agent_killed_at_any_moment_of_its_start(
    tmp_path: Path, nproc: int
) -> None:
    rng = random.Random(nproc)
    survivors = []
    for trial in range(25):
        marker = f"eh-startup-{uuid.uuid4().hex}"
        proc = agent(
            tmp_path, f"script={WORKERS / 'idle.py'}", f"nproc_per_node={nproc}", "--", marker
        )
        try:
            proc.wait(timeout=rng.uniform(0.15, 0.6))  # the kill lands at a random moment
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.wait()
        try:
            wait_for(functools.partial(unmarked, marker), 5, "the workers to die")
        except AssertionError:
            survivors.append((trial, marked(marker)))
            for pid in marked(marker):
                os.kill(pid, signal.SIGKILL)
    assert survivors == []


# --------------------------------------------------------------------------------------- daemons
@pytest.mark.parametrize(
    ("mode", "end", "cgroup"),
    [
        ("ok", "exit", "on"),
        ("fail", "exit", "on"),
        ("wait", "SIGTERM", "on"),
        ("wait", "SIGKILL", "on"),
        ("ok", "exit", "off"),
        ("wait", "SIGKILL", "off"),
    ],
)
def test_a_daemonized_descendant_does_not_outlive_the_job(
    tmp_path: Path, mode: str, end: str, cgroup: str
) -> None:
    marker, pidfile = f"eh-daemon-{uuid.uuid4().hex}", tmp_path / "daemon.pid"
    proc = agent(
        tmp_path,
        f"script={WORKERS / 'daemonize.py'}",
        "stop_grace=5",
        "--",
        mode,
        str(pidfile),
        marker,
        env={**os.environ, "ELASTIC_HYDRA_CGROUP": cgroup},
    )
    try:
        wait_for(pidfile.exists, 20, "the daemon to start")
        if end != "exit":
            os.kill(proc.pid, getattr(signal, end))
        code = proc.wait(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    expected = {"exit": 0 if mode == "ok" else 1, "SIGTERM": 143, "SIGKILL": -9}[end]
    assert code == expected
    assert_none_left(marker, "the daemon")
    # Where the daemon ran: in a cgroup the launch made for itself, a child of the one the
    # launcher started in (named after its agent); with the cgroup off, in the launcher's own.
    ran_in = cgroup_v2(Path(f"{pidfile}.cgroup").read_text())
    ours = cgroup_v2(Path("/proc/self/cgroup").read_text())  # the agent's, as it inherited it
    if cgroup == "on":
        launch = rf"{re.escape(ours.rstrip('/'))}/elastic-hydra-{proc.pid}-[0-9a-f]{{8}}"
        assert re.fullmatch(launch, ran_in), (ran_in, launch)
    else:
        assert ran_in == ours
    wait_for(lambda: not cgroups_left(proc.pid), 10, "the launch's cgroup to be removed")


# --------------------------------------------------------------------------------------- zombies
def zombies(pid: int) -> list[int]:
    """The zombie children of process `pid` (the agent's: its workers and what it inherited)."""
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
    return found


def zombies_include(parent: int, pid: int) -> bool:
    return pid in zombies(parent)


def test_what_each_restart_kills_is_reaped_during_the_run(tmp_path: Path) -> None:
    # Each rank leaves 2 processes in its group and exits 1; the stop kills them, re-parented to
    # the agent (their subreaper). Unreaped, they piled up: 32 zombies seen at the end here.
    marker = f"eh-zombie-{uuid.uuid4().hex}"
    proc = agent(
        tmp_path, f"script={WORKERS / 'orphans.py'}", "nproc_per_node=2",
        "restart.max_restarts=10", "--", "exit", "1", marker,
    )  # fmt: skip
    most, deadline = 0, time.monotonic() + TIMEOUT
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            most = max(most, len(zombies(proc.pid)))
            time.sleep(0.005)  # a sample of the agent's children, not a wait for it
        code = proc.wait(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert code == 1
    (summary,) = (tmp_path / "logs").rglob("summary.json")
    assert json.loads(summary.read_text())["restarts"] == 10
    assert most <= 6, f"{most} zombie children of the agent at once"  # one attempt's at most
    assert_none_left(marker, "the workers' children")


def test_orphans_that_end_while_the_workers_run_are_reaped(tmp_path: Path) -> None:
    # A worker that double-forks short-lived helpers: each ended one is the agent's child.
    marker, done = f"eh-zombie-{uuid.uuid4().hex}", tmp_path / "done"
    proc = agent(
        tmp_path, f"script={WORKERS / 'orphans.py'}", "--", "brief", "20", marker, str(done)
    )
    try:
        wait_for(done.exists, 20, "the worker to leave its orphans")
        wait_for(
            lambda: not zombies(proc.pid), 5, "the agent to reap them",
            detail=lambda: f"{len(zombies(proc.pid))} zombie children of the agent",
        )  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == 143
    finally:
        proc.kill()
        proc.wait()


def test_the_reaper_leaves_the_status_of_children_it_did_not_inherit_to_their_owners() -> None:
    # This test process is no subreaper: its own children stand for what the agent inherits (a
    # session of their own, as a worker's descendants have) and for what it started itself.
    kept = subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True)  # a worker
    own = subprocess.Popen(["sh", "-c", "exit 4"])  # a subprocess.run of the agent's
    orphan = subprocess.Popen(["sh", "-c", "exit 5"], start_new_session=True)
    for child in (kept, own, orphan):
        wait_for(functools.partial(zombies_include, os.getpid(), child.pid), 10, "its end")
    reaped = contain.reap_orphans(keep=[kept.pid])
    assert orphan.pid in reaped and kept.pid not in reaped and own.pid not in reaped
    orphan.returncode = 5  # reaped: nothing left for its Popen to wait for
    assert kept.wait(timeout=5) == 3  # their owners still read their exit status
    assert own.wait(timeout=5) == 4


def test_the_next_launch_removes_the_cgroups_of_agents_killed_with_their_guard(
    tmp_path: Path,
) -> None:
    # SIGKILL to a whole Slurm step takes the agent and its guard at once: nothing removes the
    # launch's cgroup then. The next launch removes such cgroups when they are empty.
    mount, own = contain._cgroup2_mount(), contain._own_cgroup()
    assert mount is not None and own is not None, "the launcher's cgroup tests need cgroup v2"
    parent = mount / own.lstrip("/")  # where the launcher, our child, makes its cgroup
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = parent / f"elastic-hydra-{gone.pid}-deadbeef"
    alive = parent / f"elastic-hydra-{os.getpid()}-deadbeef"
    stale.mkdir()
    alive.mkdir()
    try:
        proc = agent(
            tmp_path, f"script={WORKERS / 'exit_code.py'}", env={**os.environ, "CODE": "0"}
        )
        assert proc.wait(timeout=TIMEOUT) == 0
        assert not stale.exists()  # its agent is gone
        assert alive.exists()  # its agent (this test) is alive: never touched
    finally:
        for group in (stale, alive):
            # Another test's launch removes `stale` too, maybe between a check and an rmdir here.
            with contextlib.suppress(FileNotFoundError):
                group.rmdir()


# ------------------------------------------------------------------------ a console that stalls
@pytest.fixture
def stalled_stdout() -> Iterator[int]:
    """A pipe nobody reads: it fills at 64 KiB, and every write after that blocks."""
    read_fd, write_fd = os.pipe()
    try:
        yield write_fd
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_console_that_stops_reading_freezes_nothing(tmp_path: Path, stalled_stdout: int) -> None:
    lines = 200_000
    err = tmp_path / "stderr.txt"
    with err.open("wb") as err_file:
        proc = agent(
            tmp_path,
            f"script={WORKERS / 'lines.py'}",
            "nproc_per_node=2",
            "--",
            str(lines),
            stdout=stalled_stdout,
            stderr=err_file,
        )
        try:
            code = proc.wait(timeout=TIMEOUT)
        finally:
            proc.kill()
            proc.wait()
    assert code == 0, err.read_text()
    for log in sorted((tmp_path / "logs").rglob("stdout.log")):
        assert log.read_bytes().count(b"\n") == lines  # every byte in the files
    assert "lines not shown on the console; all are in the log files" in err.read_text()


def test_sigterm_stops_a_job_whose_console_stopped_reading(
    tmp_path: Path, stalled_stdout: int
) -> None:
    proc = agent(
        tmp_path,
        f"script={WORKERS / 'lines.py'}",
        "nproc_per_node=2",
        "stop_grace=3",
        "--",
        "0",
        stdout=stalled_stdout,
    )
    try:

        def logs_grow_past_the_pipe() -> bool:
            logs = list((tmp_path / "logs").rglob("stdout.log"))
            return bool(logs) and all(p.stat().st_size > 8 << 20 for p in logs)

        wait_for(logs_grow_past_the_pipe, 30, "the logs to keep growing while the console stalls")
        os.kill(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        code = proc.wait(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert code == 143
    assert time.monotonic() - started < 3 + 5 + 2  # stop_grace + the console's grace + margin


# ------------------------------------------------------------------------------ a stopped worker
def test_a_stopped_worker_is_resumed_to_exit_and_recorded(tmp_path: Path) -> None:
    proc = agent(
        tmp_path,
        f"script={WORKERS / 'stop_self.py'}",
        "nproc_per_node=2",
        "stop_grace=30",
        "--",
        str(tmp_path),
    )
    try:
        wait_for((tmp_path / "READY_1").exists, 20, "rank 1 to start")

        def rank_1_stopped() -> bool:
            (events,) = (tmp_path / "logs").rglob("events.jsonl")
            started = [e for e in read_events(events).events if isinstance(e, WorkersStarted)]
            if not started:  # a worker may run before the agent's event of their start
                return False
            stat = Path(f"/proc/{started[0].pids[1]}/stat").read_bytes()
            return stat.rsplit(b")", 1)[1].split()[0] == b"T"

        wait_for(rank_1_stopped, 20, "rank 1 to stop itself")
        os.kill(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        code = proc.wait(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert code == 143
    assert time.monotonic() - started < 10  # not the 30 s grace: SIGCONT let it take SIGTERM
    read = read_events(next((tmp_path / "logs").rglob("events.jsonl")))
    (stop,) = [e for e in read.events if isinstance(e, Stop)]
    assert stop.paused_ranks == (1,)


# ---------------------------------------------------------------- workers that cannot be started
def test_an_argument_too_large_for_the_kernel_is_a_named_failure(tmp_path: Path) -> None:
    # In a job file: on the command line the launcher itself could not be started with it.
    job = tmp_path / "big.yaml"
    job.write_text(f"defaults: [elastic_hydra_base, _self_]\nargs: [{'x' * 200_000}]\n")
    proc = agent(tmp_path, str(job), f"script={WORKERS / 'idle.py'}")
    _, err = proc.communicate(timeout=TIMEOUT)
    text = err.decode()
    assert proc.returncode == 1, text
    assert "cannot start the worker of local rank 0: Argument list too long (E2BIG)" in text
    assert "internal error" not in text and "Traceback" not in text
    (summary,) = (tmp_path / "logs").rglob("summary.json")
    assert json.loads(summary.read_text())["status"] == "failed"


def test_a_fork_that_fails_is_a_named_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_more_processes(*args: object, **kwargs: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", no_more_processes)
    spec = WorkerSpec(
        local_rank=0,
        rank=0,
        argv=("true",),
        env={},
        cwd=str(tmp_path),
        stdout=tmp_path / "0" / "stdout.log",
        stderr=tmp_path / "0" / "stderr.log",
        tee=False,
    )
    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(WorkerStartError, match=r"\(EAGAIN\).*ulimit -u"):
            LocalWorkers([spec], None, read_fd)
    finally:
        os.close(read_fd)
        os.close(write_fd)


# ---------------------------------------------------------------------------------- a full disk
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", "size=2m") as disk:
        yield disk


def test_a_disk_that_fills_mid_run_stops_the_job_with_a_named_reason(
    tmp_path: Path, small_disk: Path
) -> None:
    marker = f"eh-disk-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [*ELASTIC_HYDRA, f"logs.root={small_disk}", f"script={WORKERS / 'lines.py'}",
         "--", "0", marker],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    _, err = proc.communicate(timeout=TIMEOUT)
    text = err.decode()
    assert proc.returncode == 1, text
    assert "cannot write the workers' logs: No space left on device" in text
    assert "internal error" not in text and "Traceback" not in text
    assert_none_left(marker, "the workers after a full disk")
    (summary,) = small_disk.rglob("summary.json")  # written in the room kept for it
    assert json.loads(summary.read_text())["status"] == "failed"
    assert not list(small_disk.rglob(".*.room"))


def test_a_disk_the_worker_fills_keeps_the_summary_and_the_report_names_it(
    tmp_path: Path, small_disk: Path
) -> None:
    proc = subprocess.run(
        # bootstrap=false: no notes of the bootstrap's in the rank dir, whose removal at the end
        # would free the pages the end's files need (the disk must stay full to the end).
        [*ELASTIC_HYDRA, f"logs.root={small_disk}", f"script={WORKERS / 'fill_disk.py'}",
         "bootstrap=false", "--", str(small_disk / "filler")],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    (summary,) = small_disk.rglob("summary.json")
    saved = json.loads(summary.read_text())
    assert saved["status"] == "succeeded"
    assert "no space left on device" in saved["message"]
    assert "no space left on device" in proc.stderr.splitlines()[-1]  # the final message
    (result,) = small_disk.rglob("result.json")
    assert json.loads(result.read_text())["exit_code"] == 0
    assert not list(small_disk.rglob(".*.room"))  # the kept room is released


def test_console_sink_counts_what_a_stalled_console_missed() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, True)
    err_read, err_write = os.pipe()
    sink = ConsoleSink(write_fd, err_write, limit=1 << 16, stall=0.2)
    try:
        for i in range(20_000):
            sink.write(1, b"line %d\n" % i)
        assert sink.dropped > 0
        assert not sink.close(timeout=1.0)
    finally:
        for fd in (read_fd, write_fd, err_read, err_write):
            os.close(fd)
