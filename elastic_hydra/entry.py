"""The console entry point. It imports nothing heavy before it owns the stop signals.

From the first instruction, SIGINT/SIGTERM/SIGHUP are recorded instead of raising in the middle of
Hydra's composition; the CLI checks the record before it starts anything, and the agent takes it
over as its own stop request.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_received: list[int] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _received.append(signum)


def pending_signal() -> int | None:
    """The first stop signal received before the agent took over, if any."""
    return _received[0] if _received else None


def main() -> None:
    """`elastic-hydra` and `python -m elastic_hydra`."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)
    if sys.argv[1:2] == ["rdzv-server"]:  # no Hydra: the store process stays small
        from elastic_hydra.rdzv_server import main as server_main

        sys.exit(server_main(sys.argv[2:]))
    from elastic_hydra.cli import main as cli_main

    cli_main()
