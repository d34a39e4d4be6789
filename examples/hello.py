"""A hello-world worker: no torch, just the torchrun environment contract.

Run it under the launcher (from the repository root):

    elastic-hydra examples/jobs/hello.yaml
    elastic-hydra script=examples/hello.py nproc_per_node=4 -- any "args you like"
"""

from __future__ import annotations

import os
import socket
import sys


def main() -> None:
    rank = os.environ.get("RANK", "?")
    world = os.environ.get("WORLD_SIZE", "?")
    local = os.environ.get("LOCAL_RANK", "?")
    print(f"hello from rank {rank}/{world} (local {local}) on {socket.gethostname()}")
    print(f"args: {sys.argv[1:]!r}")


if __name__ == "__main__":
    main()
