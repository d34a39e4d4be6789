"""`elastic-hydra rdzv-server`: the c10d rendezvous store as its own small process.

With torch's c10d backend the agent that first binds the endpoint hosts the store, and when that
agent dies every node loses the rendezvous. Run this on a machine that outlives the agents and
point every node at it (`rdzv=c10d rdzv.endpoint=HOST:PORT`): any agent may then die.
"""

from __future__ import annotations

import signal
import sys
from datetime import timedelta

from elastic_hydra import stopsignals
from elastic_hydra.errors import EXIT_CONFIG, TORCH_INSTALL
from elastic_hydra.rendezvous.local import listen_socket

PREFIX = "elastic-hydra rdzv-server"
ERR = sys.stderr


def serve(host: str, port: int) -> int:
    """Host the store on `host`:`port` (0: a free port, printed) until a stop signal.

    Returns:
        128 + the signal's number; 2 when the address cannot be listened on or torch is missing.
    """
    # Block the stop signals first: from here they wait for sigwait instead of being lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, stopsignals.STOP_SIGNALS)
    try:
        sock = listen_socket(host, port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(
            f"{PREFIX}: cannot listen on {host}:{port} ({reason}); expected an address "
            "of this machine (--host) and a free port (--port)",
            file=ERR,
        )
        return EXIT_CONFIG
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        print(f"{PREFIX}: needs PyTorch: {TORCH_INSTALL}", file=ERR)
        sock.close()
        return EXIT_CONFIG
    port = sock.getsockname()[1]
    store = TCPStore(  # torch's own store, on the socket bound to --host alone
        host,
        port,
        is_master=True,
        multi_tenant=True,
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
        timeout=timedelta(seconds=60),
    )
    sock.detach()  # the store owns it
    print(
        f"{PREFIX}: c10d store listening on {host}:{port}, without authentication; "
        f"agents use rdzv=c10d rdzv.endpoint={host}:{port} rdzv.is_host=false",
        flush=True,
    )
    signum = stopsignals.pending_signal() or signal.sigwait(stopsignals.STOP_SIGNALS)
    print(f"{PREFIX}: {signal.Signals(signum).name}, stopping", flush=True)
    del store
    return 128 + signum  # stopped by a signal, as every launcher reports it
