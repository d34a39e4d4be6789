"""What a worker is to start (`WorkerSpec`) and how its process comes to be, as `supervise` sees
it: started cold (`popen_cold`: a fresh program behind the agent's gate) or by a `Spawner` (the
warm template of `warm/`, which forks it).

`supervise` needs the same few things of either: the pid (its own process group), the exit
status once it ends (the worker is the agent's child either way), and, when output is teed,
the read ends of its stdout and stderr pipes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from elastic_hydra.workers.notes import WorkerNotes


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """One worker to start: its ranks, program, environment, files and console prefix."""

    local_rank: int
    rank: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    stdout: Path
    stderr: Path
    tee: bool  # copy output to the console (else the worker writes straight into the files)
    prefix: bytes = b""
    cpus: tuple[int, ...] | None = None  # CPU affinity; None: the agent's
    pass_fds: tuple[int, ...] = ()  # descriptors the worker inherits (rank 0's store socket)
    notes: WorkerNotes | None = None  # tidied once the worker is gone


class WorkerProcess(Protocol):
    """What `subprocess.Popen` gives of a worker, and a forked one gives too."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    @property
    def stderr(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None:
        """The exit code (-N: killed by signal N) once it ended, reaping it; else None."""
        ...

    def wait(self, timeout: float | None = None) -> int:
        """Raises subprocess.TimeoutExpired when it is still running after `timeout` s."""
        ...


class Spawner(Protocol):
    """Starts a worker some other way than a fresh interpreter (None: start it cold)."""

    @property
    def pid(self) -> int | None:
        """A process of its own that the agent started (never reaped as an orphan)."""
        ...

    def spawn(
        self, spec: WorkerSpec, *, gate: int, out: int, err: int, pipes: bool
    ) -> WorkerProcess | None:
        """The worker of `spec`, in its own session, stopped until a line arrives on `gate`
        (its stdin until then; end of file: it exits 125), its stdout and stderr on `out` and
        `err`, or on new pipes whose read ends it returns when `pipes`. None: start it cold.
        """
        ...


_PR_SET_PDEATHSIG = 1


# util-linux's setpriv sets the death signal and execs the worker: a ~1 ms C program, where a
# Python preexec_fn forces a full fork of the agent (~10 ms per worker, measured).
@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv")


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


# The worker's first program after setpriv: it runs no code of the worker until the agent says so.
# The death signal is armed by then, but the agent may have died just before: check the parent.
# Then wait for the agent's go (one line on the gate, stdin): the agent sends it once the guard
# knows the worker's group and the worker is in the launch's cgroup, so nothing the worker starts
# can escape either. End of file means the agent died meanwhile. The line is read into a variable
# of the shell's own (not `_`, which is inherited and exported: the worker would see `_=go`).
_TRAMPOLINE = '[ "$PPID" = "$1" ] && read -r eh_go || exit 125; shift; exec "$@" </dev/null'


def _launch_options(argv: tuple[str, ...]) -> tuple[list[str], Callable[[], None] | None]:
    gated = ["/bin/sh", "-c", _TRAMPOLINE, "sh", str(os.getpid()), *argv]
    if (setpriv := _setpriv()) is not None:
        return [setpriv, "--pdeathsig", "KILL", "--", *gated], None
    return gated, _die_with_parent(os.getpid())


def _die_with_parent(parent: int) -> Callable[[], None]:
    libc = _libc()  # loaded here: the child runs between fork and exec

    def child() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the agent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return child


def popen_cold(spec: WorkerSpec, gate: int, out: int, err: int, tee: bool) -> WorkerProcess:
    """The worker of `spec` as a new program (see _TRAMPOLINE): its own session, the death
    signal armed, stopped until a line arrives on `gate`."""
    argv, preexec = _launch_options(spec.argv)
    return subprocess.Popen(
        argv,
        env=spec.env,
        cwd=spec.cwd,
        stdin=gate,
        stdout=subprocess.PIPE if tee else out,
        stderr=subprocess.PIPE if tee else err,
        start_new_session=True,
        pass_fds=spec.pass_fds,
        preexec_fn=preexec,  # noqa: PLW1509 - the agent forks from its only thread
    )
