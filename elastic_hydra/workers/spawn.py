"""How a worker process comes to be, as `supervise` sees it: started cold (a fresh interpreter,
`subprocess.Popen`) or by a `Spawner` (the warm template of `warm/`, which forks it).

`supervise` needs the same few things of either: the pid (its own process group), the exit
status once it ends (the worker is the agent's child either way), and, when output is teed,
the read ends of its stdout and stderr pipes.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from elastic_hydra.workers.supervise import WorkerSpec


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
