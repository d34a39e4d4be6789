"""`elastic-hydra rdzv-server [--host H] [--port P]`: the c10d store as a process of its own.

The words are read here; the store itself is `elastic_hydra.rendezvous.server`. `entry` hands
this subcommand its words before anything imports Hydra: the store process stays small.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from elastic_hydra.errors import EXIT_CONFIG
from elastic_hydra.rendezvous import server


def main(argv: Sequence[str]) -> int:
    """Serve the store until a signal stops it; 128 + the signal's number, or 2 for bad words."""
    parser = argparse.ArgumentParser(
        prog=server.PREFIX,
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
        print(
            f"{server.PREFIX}: --port: out of range (got {args.port}); expected 0..65535",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    return server.serve(args.host, args.port)
