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

from elastic_hydra import stopsignals
from elastic_hydra.errors import EXIT_CONFIG
from elastic_hydra.rendezvous.local import listen_socket

PREFIX = "elastic-hydra rdzv-server"
ERR = sys.stderr


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PREFIX,
        description="Host the c10d rendezvous store (a torch TCPStore) until stopped by a signal.",
    )
    parser.add_argument("--port", type=int, default=29400, help="0 picks a free port (printed)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only); give the address "
        "the agents' machines reach this one by, e.g. --host node0",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"{PREFIX}: --port: out of range (got {args.port}); expected 0..65535", file=ERR)
        return EXIT_CONFIG
    # Block the stop signals first: from here they wait for sigwait instead of being lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, stopsignals.STOP_SIGNALS)
    try:
        sock = listen_socket(args.host, args.port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(
            f"{PREFIX}: cannot listen on {args.host}:{args.port} ({reason}); expected an address "
            "of this machine (--host) and a free port (--port)",
            file=ERR,
        )
        return EXIT_CONFIG
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        print(f"{PREFIX}: needs PyTorch: pip install torch", file=ERR)
        sock.close()
        return EXIT_CONFIG
    port = sock.getsockname()[1]
    store = TCPStore(  # torch's own store, on the socket bound to --host alone
        args.host,
        port,
        is_master=True,
        multi_tenant=True,
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
        timeout=timedelta(seconds=60),
    )
    sock.detach()  # the store owns it
    print(
        f"{PREFIX}: c10d store listening on {args.host}:{port}, without authentication; "
        f"agents use rdzv=c10d rdzv.endpoint={args.host}:{port} rdzv.is_host=false",
        flush=True,
    )
    signum = stopsignals.pending_signal() or signal.sigwait(stopsignals.STOP_SIGNALS)
    print(f"{PREFIX}: {signal.Signals(signum).name}, stopping", flush=True)
    del store
    return 128 + signum  # stopped by a signal, as every launcher reports it
