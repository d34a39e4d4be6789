"""Start, watch and stop one attempt's worker processes. Knows nothing of restarts or rendezvous.

Each worker runs in its own session (so a stop reaches its grandchildren through the process group)
and dies with the agent (PR_SET_PDEATHSIG). Exits are seen through pidfds in a selector, so a
failure wakes the agent at once instead of at the next poll; the same selector pumps teed output.
Whatever the workers leave behind and the agent inherits as their subreaper is reaped as it ends
(at least once a second while the workers run, and after every stop): never the workers
themselves or the guard, whose exit status is read here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from elastic_hydra.agent.seams import Exited
from elastic_hydra.errors import LogWriteError, WorkerStartError
from elastic_hydra.rundir import PRIVATE_DIR, PRIVATE_FILE
from elastic_hydra.stopsignals import drain
from elastic_hydra.workers import procfs
from elastic_hydra.workers.console import ConsoleSink, LinePrefixer, MergeGroup, write_all
from elastic_hydra.workers.contain import Containment, reap_orphans
from elastic_hydra.workers.guard import GroupGuard
from elastic_hydra.workers.notes import tidy_notes
from elastic_hydra.workers.spawn import Spawner, WorkerProcess, WorkerSpec, popen_cold

_KILL_WAIT = 5.0  # bounded wait for SIGKILLed processes to disappear
_REAP_EVERY = 1.0  # seconds between looks for ended orphans while the workers run
_CONSOLE_WAIT = 1.0  # seconds an attempt's end waits for the console to take the workers' lines


def _private_dirs(rank_dir: Path) -> None:
    """attempt_<n>/<local_rank>/, private like the run dir."""
    for directory in (rank_dir.parent, rank_dir):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=PRIVATE_DIR, parents=True)


def _start_error(spec: WorkerSpec, exc: OSError) -> WorkerStartError:
    name = errno.errorcode.get(exc.errno or 0, "")
    hint = {
        errno.E2BIG: " An argument or the environment is too large for the kernel (one argument "
        "may be at most 128 KiB): pass large values in a file.",
        errno.EAGAIN: " The machine or the user's process limit is full (ulimit -u, pids.max).",
        errno.ENOMEM: " The machine is out of memory.",
    }.get(exc.errno or 0, "")
    return WorkerStartError(
        f"cannot start the worker of local rank {spec.local_rank}: {exc.strerror} ({name})"
        f"{f' at {exc.filename}' if exc.filename else ''}.{hint}"
    )


class _Worker:
    def __init__(
        self,
        spec: WorkerSpec,
        sink: ConsoleSink | None,
        spawner: Spawner | None = None,
        group: MergeGroup | None = None,
    ) -> None:
        self.spec = spec
        _private_dirs(spec.stdout.parent)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        out = os.open(spec.stdout, flags, PRIVATE_FILE)
        err = os.open(spec.stderr, flags, PRIVATE_FILE)
        self.files = {1: out, 2: err}
        tee = spec.tee and sink is not None
        gate, self._go = os.pipe()
        try:
            proc = None
            if spawner is not None:  # warm: forked; None when it cannot (then cold)
                proc = spawner.spawn(spec, gate=gate, out=out, err=err, pipes=tee)
            self.proc: WorkerProcess = proc or popen_cold(spec, gate, out, err, tee)
        except OSError:
            for fd in (out, err, self._go):
                os.close(fd)
            raise
        finally:
            os.close(gate)
        self.pid = self.proc.pid
        if spec.cpus:
            # Set before the worker's program starts; its threads inherit it.
            os.sched_setaffinity(self.pid, spec.cpus)
        self.pidfd = os.pidfd_open(self.pid)
        self.pipes: dict[int, tuple[int, LinePrefixer, IO[bytes]]] = {}
        if tee:
            assert sink is not None and self.proc.stdout and self.proc.stderr
            for stream, pipe in ((1, self.proc.stdout), (2, self.proc.stderr)):
                os.set_blocking(pipe.fileno(), False)
                fold = str(spec.stderr) if stream == 2 else None  # tracebacks: on stderr
                prefixer = LinePrefixer(
                    spec.prefix, sink, stream, fold, rank=spec.local_rank, group=group
                )
                self.pipes[pipe.fileno()] = (stream, prefixer, pipe)
        self.exited: Exited | None = None

    def release(self, go: bool = True) -> None:
        """Let the worker run its program (see _TRAMPOLINE), or, with go=False, make it exit."""
        if self._go < 0:
            return
        if go:
            with contextlib.suppress(BrokenPipeError):  # it died already: its exit tells the rest
                os.write(self._go, b"go\n")
        os.close(self._go)
        self._go = -1

    def paused(self) -> bool:
        """Whether the worker is stopped (SIGSTOP, SIGTSTP, a debugger)."""
        found = procfs.stat(self.pid)
        return found is not None and found.stopped

    def group_alive(self) -> bool:
        """Whether a live (non-zombie) process remains in the worker's process group."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # killpg also finds zombies, which no signal removes (e.g. a grandchild whose reaper,
        # PID 1 of a container, never reaps): look for a member that is still running.
        return any(_live_member(pid, self.pid) for pid in procfs.pids())

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


class LocalWorkers:
    """One attempt's worker processes on this node."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        sink: ConsoleSink | None,
        wake_fd: int,
        guard: GroupGuard | None = None,
        containment: Containment | None = None,
        *,
        hurry: Callable[[], bool] = lambda: False,
        spawner: Spawner | None = None,
        label: Callable[[Sequence[int]], bytes] | None = None,
    ) -> None:
        self._guard = guard
        self._sink = sink
        teed = sum(1 for s in specs if s.tee)
        # Lines several ranks print alike are shown once, with the prefix `label` gives them.
        self._group = MergeGroup(label, teed) if label is not None and teed > 1 else None
        self._spawner = spawner  # warm starts: workers forked from a template (warm/)
        self._hurry = hurry  # true once the user asked again: skip the rest of the grace
        self._sel = selectors.DefaultSelector()
        self._wake_fd = wake_fd
        self._sel.register(wake_fd, selectors.EVENT_READ, None)
        self.workers: list[_Worker] = []
        self.paused: list[int] = []  # local ranks found stopped (SIGSTOP) when stop() began
        self.log_error: OSError | None = None  # a log file that could not be written
        self._log_error_seen = False
        try:
            for spec in specs:
                self._start(spec, sink, containment)
        except BaseException as exc:
            self.stop(signal.SIGKILL, 0.0)
            self.close()
            if isinstance(exc, OSError):
                raise _start_error(spec, exc) from exc
            raise

    def _start(
        self, spec: WorkerSpec, sink: ConsoleSink | None, contain: Containment | None
    ) -> None:
        worker = _Worker(spec, sink, self._spawner, self._group)
        self.workers.append(worker)
        if contain is not None:
            contain.add(worker.pid)
        if self._guard is not None:
            self._guard.watch(worker.pid)
        self._sel.register(worker.pidfd, selectors.EVENT_READ, worker)
        for fd in worker.pipes:
            self._sel.register(fd, selectors.EVENT_READ, (worker, fd))
        worker.release()

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def running(self) -> list[int]:
        return [w.spec.local_rank for w in self.workers if w.exited is None]

    def wait(self, timeout: float | None) -> list[Exited]:
        """Block until a worker exits, the wake fd is readable, or `timeout` (None: none) passes.

        Teed output is forwarded meanwhile. Returns the workers that exited (possibly none).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _REAP_EVERY if deadline is None else max(0.0, deadline - time.monotonic())
            exited, woken = self._poll(min(left, _REAP_EVERY))
            self.reap_orphans()
            if self.log_error is not None and not self._log_error_seen:
                self._log_error_seen = True  # once: the stop that follows keeps pumping
                raise LogWriteError(self.log_error)
            if exited or woken or (deadline is not None and time.monotonic() >= deadline):
                return exited
            if not self.running() and not any(w.pipes for w in self.workers):
                return exited

    def reap_orphans(self) -> None:
        """Reap the ended descendants the agent inherited, never a worker or the guard."""
        own = [w.pid for w in self.workers if w.proc.returncode is None]
        guard = [] if self._guard is None else [self._guard.pid]
        template = [] if self._spawner is None or self._spawner.pid is None else [self._spawner.pid]
        reap_orphans([*own, *guard, *template])

    def _poll(self, timeout: float | None) -> tuple[list[Exited], bool]:
        exited: list[Exited] = []
        woken = False
        for key, _ in self._sel.select(timeout):
            if key.data is None:
                woken = True
                drain(self._wake_fd)
            elif isinstance(key.data, _Worker):
                exited += self._reap(key.data)
            else:
                worker, fd = key.data
                self._pump(worker, fd)
        return exited, woken

    def _reap(self, worker: _Worker) -> list[Exited]:
        code = worker.proc.poll()
        if code is None:
            return []
        self._sel.unregister(worker.pidfd)
        os.close(worker.pidfd)
        worker.exited = Exited(
            local_rank=worker.spec.local_rank,
            pid=worker.pid,
            returncode=code,
            wall_time=time.time(),
            mono_time=time.monotonic(),
        )
        return [worker.exited]

    def _pump(self, worker: _Worker, fd: int) -> None:
        stream, prefixer, pipe = worker.pipes[fd]
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if data:
            if self.log_error is None:
                try:
                    write_all(worker.files[stream], data)
                except OSError as exc:  # a full disk: the job is stopped, see wait()
                    self.log_error = exc
            prefixer.feed(data)
            return
        prefixer.flush()
        self._sel.unregister(fd)
        del worker.pipes[fd]
        pipe.close()

    def stop(self, sig: int, grace: float) -> tuple[list[Exited], list[int]]:
        """`sig` to every worker's process group, SIGKILL after `grace` s, bounded waits.

        Returns the workers that exited meanwhile and the pids that would not die.
        """
        exited: list[Exited] = []
        self.paused = [w.spec.local_rank for w in self.workers if w.exited is None and w.paused()]
        for w in self.workers:
            w.signal_group(sig)
            w.signal_group(signal.SIGCONT)  # a stopped worker can only handle `sig` once resumed
        exited += self._wait_groups(grace, hurry=self._hurry)
        if any(w.group_alive() for w in self.workers):
            for w in self.workers:
                w.signal_group(signal.SIGKILL)
            exited += self._wait_groups(_KILL_WAIT)
        stuck = [w.pid for w in self.workers if w.exited is None or w.group_alive()]
        self.reap_orphans()  # what the stop killed, re-parented to the agent
        return exited, stuck

    def _wait_groups(
        self, timeout: float, hurry: Callable[[], bool] = lambda: False
    ) -> list[Exited]:
        exited: list[Exited] = []
        deadline = time.monotonic() + timeout
        while any(w.exited is None or w.group_alive() for w in self.workers):
            left = deadline - time.monotonic()
            if left <= 0 or hurry():
                break
            # Grandchildren have no pidfd here: poll the groups at a short, bounded interval.
            found, _ = self._poll(min(left, 0.02))
            exited += found
        return exited

    def close(self) -> None:
        """Forward what is left in the pipes, then release every descriptor."""
        deadline = time.monotonic() + 1.0
        while any(w.pipes for w in self.workers) and time.monotonic() < deadline:
            self._poll(0.05)
        for w in self.workers:
            for fd, (_, prefixer, pipe) in list(w.pipes.items()):
                prefixer.flush()
                self._sel.unregister(fd)
                pipe.close()
            w.pipes.clear()
            if w.exited is None:
                self._sel.unregister(w.pidfd)
                os.close(w.pidfd)
            w.release(go=False)  # never released (its start failed half way): it exits
            for fd in w.files.values():
                os.close(fd)
            # Reap: never leave zombies. One still running is stuck in the kernel (see stop()).
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=0 if w.exited else 0.1)
            if w.spec.notes is not None and w.proc.returncode is not None:
                tidy_notes(w.spec.notes)
        if self._sink is not None:  # the workers' last lines before anything the agent says
            self._sink.flush(_CONSOLE_WAIT)
        self.reap_orphans()
        if self._guard is not None and not any(w.group_alive() for w in self.workers):
            self._guard.forget_all()
        self._sel.close()


def _live_member(pid: int, pgid: int) -> bool:
    found = procfs.stat(pid)
    return found is not None and found.pgrp == pgid and found.live
