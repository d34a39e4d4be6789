"""`elastic-hydra rdzv-server`: the c10d rendezvous store as its own small process.

With torch's c10d backend the agent that first binds the endpoint hosts the store, and when that
agent dies every node loses the rendezvous. Run this on a machine that outlives the agents and
point every node at it (`rdzv=c10d rdzv.endpoint=HOST:PORT`): any agent may then die.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

from elastic_hydra import entry

PREFIX = "elastic-hydra rdzv-server"
ERR = sys.stderr


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PREFIX,
        description="Host the c10d rendezvous store (a torch TCPStore) until stopped by a signal.",
    )
    parser.add_argument("--port", type=int, default=29400, help="0 picks a free port (printed)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"{PREFIX}: --port: out of range (got {args.port}); expected 0..65535", file=ERR)
        return 2
    # Block the stop signals first: from here they wait for sigwait instead of being lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, entry.STOP_SIGNALS)
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        print(f"{PREFIX}: needs PyTorch: pip install torch", file=ERR)
        return 2
    try:
        store = TCPStore(
            "0.0.0.0",  # torch's store listens on every interface whatever the host given
            args.port,
            is_master=True,
            multi_tenant=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )
    except (RuntimeError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        print(
            f"{PREFIX}: --port: cannot listen on {args.port} ({reason}); pick a free port",
            file=ERR,
        )
        return 2
    # torch's TCPStore listens on every interface, without authentication.
    print(
        f"{PREFIX}: c10d store listening on port {store.port} (all interfaces); "
        f"agents use rdzv=c10d rdzv.endpoint=<this host>:{store.port}",
        flush=True,
    )
    signum = entry.pending_signal() or signal.sigwait(entry.STOP_SIGNALS)
    print(f"{PREFIX}: {signal.Signals(signum).name}, stopping", flush=True)
    del store
    return 0
