"""Stop signals: recorded from the launcher's first instruction, then routed to the agent.

Before the agent runs, SIGTERM/SIGINT/SIGHUP/SIGQUIT and SIGUSR1 (a save request) are only
recorded (no KeyboardInterrupt in the middle of Hydra's composition); the CLI checks the record
before it starts anything, and the agent takes it over as its own stop request (`StopFlag`, a
`seams.StopRequest`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# torchrun's default --signals-to-handle, in its order: each is forwarded to the workers, then
# the agent exits 128+N (env.SIGNALS_TO_HANDLE tells the workers, as torchrun does).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# A save request: stop as SIGTERM does, the workers' snapshots saved first (checkpoint/). Slurm's
# `--signal=USR1@T` and `elastic-hydra save` send it. Not forwarded: the workers get SIGTERM
# (agent.worker_env.to_workers; Lightning and submitit read a SIGUSR1 of their own as "requeue
# me").
SAVE_SIGNAL = signal.SIGUSR1
HANDLED = (*STOP_SIGNALS, SAVE_SIGNAL)
_received: list[int] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _received.append(signum)


def record_early() -> None:
    """From now on, a stop signal (or a save request) is recorded until the agent handles it."""
    for sig in HANDLED:
        signal.signal(sig, _record)


def pending_signal() -> int | None:
    """The first stop signal received before the agent took over, if any."""
    return _received[0] if _received else None


class StopFlag:
    """Set by the signal handlers; the wake pipe gets a byte so every wait returns at once."""

    def __init__(self, signum: int | None = None) -> None:
        self.signum = signum
        self.count = 0 if signum is None else 1  # stop signals received: a second one hurries
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            os.set_blocking(fd, False)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum

    def drain(self) -> None:
        """Empty the wake pipe."""
        drain(self.read_fd)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


@contextmanager
def handle_signals(flag: StopFlag) -> Iterator[None]:
    """Route the stop signals and the save request to `flag` (no KeyboardInterrupt), restoring
    handlers after."""
    previous = {sig: signal.signal(sig, flag.handle) for sig in HANDLED}
    old_wake = signal.set_wakeup_fd(flag.write_fd, warn_on_full_buffer=False)
    if flag.signum is None and (early := pending_signal()) is not None:
        flag.handle(early, None)  # recorded after the flag was made, before it took over
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_wake)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def drain(fd: int) -> None:
    """Read a non-blocking descriptor empty (a wake-up pipe)."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
