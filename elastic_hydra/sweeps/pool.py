"""The pool: a sweep's jobs side by side on one machine, each in its own slot of GPUs and CPUs.

Knows nothing of Hydra: the launcher plugin (`hydra_plugins.elastic_hydra_pool`) turns each job
of a sweep into a `PoolJob` whose `run` is the job itself. Here a job starts the moment a slot
(see `slots`) frees (continuous, not in batches), stop signals reach every running job, and
each job's `result.json` is read back.

Each job is a fork of the pool, made after Hydra composed the sweep: it starts in milliseconds
with everything imported (a fresh interpreter costs about a second of CPU per job). It runs in
a session of its own (a Ctrl-C on the terminal reaches the pool, which forwards it, so a second
one still hurries the jobs), with its slot's CPUs and CUDA_VISIBLE_DEVICES, and gets SIGTERM
(a clean stop: logs and summary written) if the pool dies.
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import selectors
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

from elastic_hydra.errors import EXIT_BUG
from elastic_hydra.records.summary import JobResult
from elastic_hydra.rundir import PRIVATE_DIR, PRIVATE_FILE, RunDir
from elastic_hydra.stopsignals import StopFlag, handle_signals, record_early
from elastic_hydra.sweeps.slots import Slot

_TICK = 1.0  # the view's refresh period (elapsed times)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolJob:
    """One job of the sweep, ready to start."""

    number: int  # Hydra's job number (hydra.job.num)
    overrides: tuple[str, ...]
    run: Callable[[], int]  # the job, in its forked process: its exit code (or it execs)
    run_dir: Path


class State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(slots=True)
class JobRow:
    """One job's progress, as the view shows it."""

    job: PoolJob
    state: State = State.QUEUED
    slot: Slot | None = None
    started: float | None = None
    ended: float | None = None
    result: JobResult | None = None
    pid: int | None = None

    def elapsed(self, now: float) -> float | None:
        if self.started is None:
            return None
        return (self.ended if self.ended is not None else now) - self.started


class PoolView(Protocol):
    """What shows the pool's progress (a live table on a terminal, lines elsewhere)."""

    def started(self, row: JobRow) -> None: ...

    def ended(self, row: JobRow) -> None: ...

    def tick(self, rows: Sequence[JobRow], now: float) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolOutcome:
    rows: tuple[JobRow, ...]
    signum: int | None  # the stop signal that ended the sweep early, if any
    origin: float  # when the pool started (monotonic)
    slots: int

    def to_json(self) -> dict[str, object]:
        """pool.json: which job ran in which slot, when (seconds from the pool's start)."""

        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.origin, 4)

        jobs = [
            {
                "number": r.job.number,
                "overrides": list(r.job.overrides),
                "state": r.state.value,
                "slot": None if r.slot is None else r.slot.index,
                "where": None if r.slot is None else r.slot.describe(),
                "start_s": since(r.started),
                "end_s": since(r.ended),
                "exit_code": None if r.result is None else r.result.exit_code,
            }
            for r in self.rows
        ]
        return {"slots": self.slots, "signal": self.signum, "jobs": jobs}


def run_pool(
    jobs: Sequence[PoolJob],
    slots: Sequence[Slot],
    *,
    view: PoolView,
    stagger: float = 0.0,
    signum: int | None = None,
) -> PoolOutcome:
    """Run `jobs` on `slots`, each starting as soon as a slot is free (and `stagger` seconds
    after the previous start); a stop signal stops every running job and starts no other.

    Args:
        signum: a stop signal received before the pool started: nothing starts.
    """
    rows = [JobRow(job=j) for j in jobs]
    origin = time.monotonic()
    flag = StopFlag(signum)
    try:
        with handle_signals(flag):
            _Dispatch(rows, slots, view=view, stagger=stagger, flag=flag).run()
    finally:
        flag.close()
    return PoolOutcome(rows=tuple(rows), signum=flag.signum, origin=origin, slots=len(slots))


class _Dispatch:
    def __init__(
        self,
        rows: list[JobRow],
        slots: Sequence[Slot],
        *,
        view: PoolView,
        stagger: float,
        flag: StopFlag,
    ) -> None:
        self.rows, self.view, self.stagger, self.flag = rows, view, stagger, flag
        self.queue = deque(rows)
        self.free = deque(slots)
        self.running: dict[int, JobRow] = {}  # pidfd -> row
        self.selector = selectors.DefaultSelector()
        self.selector.register(flag.read_fd, selectors.EVENT_READ)
        self.last_start = float("-inf")
        self.forwarded = 0  # stop signals passed on to the jobs

    def run(self) -> None:
        try:
            while self.running or (self.queue and self.flag.signum is None):
                self._start_due()
                self._wait(self._timeout())
                self._forward_stop()
        finally:
            self.selector.close()

    def _start_due(self) -> None:
        started = False
        while self.queue and self.free and self.flag.signum is None:
            if time.monotonic() - self.last_start < self.stagger:
                break
            self._start(self.queue.popleft(), self.free.popleft())
            started = True
        if started:  # shown at once: a job may end before the next tick
            self.view.tick(self.rows, time.monotonic())

    def _timeout(self) -> float:
        if self.queue and self.free and self.flag.signum is None:
            return max(0.0, self.last_start + self.stagger - time.monotonic())
        return _TICK

    def _start(self, row: JobRow, slot: Slot) -> None:
        job = row.job
        job.run_dir.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        log = os.open(RunDir(job.run_dir).console, flags, PRIVATE_FILE)
        sys.stdout.flush()  # or the child would write what is buffered here a second time
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._child(job, slot, log, parent)
        os.close(log)
        row.state, row.slot, row.started, row.pid = State.RUNNING, slot, time.monotonic(), pid
        self.last_start = row.started
        pidfd = os.pidfd_open(pid)
        self.running[pidfd] = row
        self.selector.register(pidfd, selectors.EVENT_READ)
        self.view.started(row)

    def _child(self, job: PoolJob, slot: Slot, log: int, parent: int) -> NoReturn:
        """The job's process: dies with the pool, its own session, stdio and slot, then the job."""
        code = EXIT_BUG
        try:
            _die_with(parent)
            os.setsid()
            signal.set_wakeup_fd(-1)
            record_early()  # a stop before the job's agent runs is its stop too
            self.selector.close()  # the pool's descriptors are not the job's
            for fd in (*self.running, self.flag.read_fd, self.flag.write_fd):
                os.close(fd)
            devnull = os.open(os.devnull, os.O_RDONLY)
            for target, fd in ((0, devnull), (1, log), (2, log)):
                os.dup2(fd, target)
            # The interpreter's own streams: a live table may have replaced sys.stdout/stderr.
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
            os.environ.update(slot.env())
            if slot.cpus is not None:  # inherited by every thread and process the job makes
                os.sched_setaffinity(0, slot.cpus)
            code = job.run()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(code)

    def _wait(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.fd == self.flag.read_fd:
                self.flag.drain()
            else:
                self._reap(key.fd)
        self.view.tick(self.rows, time.monotonic())

    def _reap(self, pidfd: int) -> None:
        row = self.running.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        assert row.pid is not None and row.slot is not None
        _, status = os.waitpid(row.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        row.ended = time.monotonic()
        row.result = read_result(row.job, 128 - code if code < 0 else code)
        row.state = _state(row.result.exit_code)
        self.free.append(row.slot)
        self.view.ended(row)

    def _forward_stop(self) -> None:
        """Each stop signal the pool gets reaches every running job (a second one hurries)."""
        while self.forwarded < self.flag.count and self.flag.signum is not None:
            self.forwarded += 1
            for row in self.running.values():
                assert row.pid is not None
                os.kill(row.pid, self.flag.signum)


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGTERM when the pool dies; if it already has, now."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _state(exit_code: int) -> State:
    if exit_code == 0:
        return State.SUCCEEDED
    return State.STOPPED if exit_code > 128 else State.FAILED


def read_result(job: PoolJob, code: int) -> JobResult:
    """The job's result.json; a result made from its exit status when it wrote none."""
    run = RunDir(job.run_dir)
    try:
        return JobResult.from_json(json.loads(run.result.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        pass
    how = (
        f"killed by {signal.Signals(code - 128).name}"
        if 128 < code < 128 + signal.NSIG
        else f"exit code {code}"
    )
    told = f"its process ended ({how}) without a result; see {run.console.name}"
    return JobResult(
        overrides=job.overrides,
        exit_code=code,
        run_dir=str(job.run_dir),
        message=told if code else "",
        swept=True,
    )
