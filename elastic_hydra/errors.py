"""The launcher's exceptions. Pure: no I/O.

ElasticHydraError
 ├── ConfigError          a user's configuration is wrong: one line, exit code 2
 ├── RendezvousError      the rendezvous could not complete (unreachable, closed, timed out): exit 3
 ├── WorkerStartError     a worker could not be started (E2BIG, EAGAIN, ENOMEM): exit 1
 └── LogWriteError        a worker's log could not be written (a full disk): the job stops, exit 1

Beside the tree, `STORE_ERRORS`: what a rendezvous store raises, caught where a store is used.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_WORKERS_FAILED = 1
EXIT_CONFIG = 2
EXIT_RENDEZVOUS = 3
# This node left the job for a fault of its own: its preflight, or a hardware failure of its
# workers (restart.on_class.hardware=exclude); the other nodes go on where nnodes' MIN allows.
EXIT_PREFLIGHT_NODE = 4
EXIT_PREFLIGHT_JOB = 5  # another node failed its preflight; too few nodes remain to train
EXIT_QUARANTINED = 6  # this node is in the quarantine ledger: it left before the rendezvous
EXIT_BUG = 70  # a bug in elastic-hydra, and nothing else (sysexits' EX_SOFTWARE)
# Stopped by a signal (a preemption) after the workers' snapshot of one agreed step was kept in
# the checkpoint home: run it again and it resumes there (sysexits' EX_TEMPFAIL).
EXIT_PREEMPTED_SAVED = 75

# How the errors (and the docs: tests/test_docs.py compares) tell a user to install PyTorch for
# torch's rendezvous backends. Pinned to the release the tests run: a bare `torch` takes whatever
# is newest, and on these machines several GB of CUDA wheels (DESIGN section 9).
TORCH_INSTALL = "pip install torch==2.13.0"

# What a call on a rendezvous store raises when the store is gone, too slow, or lacks the key, and
# what its untrusted values raise when they do not parse: torch's c10d store raises DistStoreError
# and DistNetworkError (RuntimeError subclasses) and OSError (TimeoutError, ConnectionError among
# them); torch's EtcdStore LookupError (a key that did not come) and ValueError; python-etcd's own
# errors (no builtin base) are raised as ConnectionError by the rendezvous before they reach us
# (`rendezvous.torch_handler.guarded`); json, int() and bytes.decode raise ValueError.
STORE_ERRORS: tuple[type[Exception], ...] = (RuntimeError, OSError, LookupError, ValueError)


class ElasticHydraError(Exception):
    """Base of every error the launcher reports to its user without a traceback."""

    exit_code = EXIT_WORKERS_FAILED


class ConfigError(ElasticHydraError):
    """A configuration value is wrong.

    Rendered as `<key>: <problem> (got <value>); <expected>. <hint>`.
    """

    exit_code = EXIT_CONFIG

    def __init__(
        self, key: str, problem: str, value: object, expected: str, hint: str = ""
    ) -> None:
        self.key = key
        self.problem = problem
        self.value = value
        self.expected = expected
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        got = (
            self.value
            if isinstance(self.value, str) and self.value.startswith("<")
            else repr(self.value)
        )
        text = f"{self.key}: {self.problem} (got {got}); {self.expected}."
        return f"{text} {self.hint}" if self.hint else text


class RendezvousError(ElasticHydraError):
    """The rendezvous failed; the message says what, where and which setting to change."""

    exit_code = EXIT_RENDEZVOUS


class WorkerStartError(ElasticHydraError):
    """A worker process could not be started; the message names the cause and what to do."""


class LogWriteError(ElasticHydraError):
    """A worker's output could not be written to its log file (a full disk, an I/O error)."""

    def __init__(self, cause: OSError) -> None:
        where = f" ({cause.filename})" if cause.filename else ""
        super().__init__(f"cannot write the workers' logs: {cause.strerror}{where}")
