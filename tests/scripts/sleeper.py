"""Sleeps until stopped, after announcing itself with a ready marker.

    sleeper.py --dir D [--ignore-term RANKS] [--grandchild RANKS]
               [--fail-rank R [--fail-code N] [--go FILE]]

Writes D/ready_<RANK> = {"pid": ..., "grandchild": pid or null} once set up (atomically). With
--ignore-term the listed ranks (comma-separated; "all") ignore SIGTERM; with --grandchild they
start a `sleep` grandchild first. --fail-rank R makes rank R wait until every local rank is ready
(and FILE exists, with --go) and then exit with --fail-code. SIGINT kills the worker without a
KeyboardInterrupt traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _ranks(text: str) -> set[int] | None:
    """None = all ranks."""
    return None if text == "all" else {int(r) for r in text.split(",") if r}


def _wanted(ranks: set[int] | None, rank: int) -> bool:
    return ranks is None or rank in ranks


def write_atomic(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--ignore-term", default="", type=str)
    parser.add_argument("--grandchild", default="", type=str)
    parser.add_argument("--fail-rank", default=-1, type=int)
    parser.add_argument("--fail-code", default=3, type=int)
    parser.add_argument("--go", default=None, type=Path)
    parser.add_argument("--seconds", default=300.0, type=float)
    opts = parser.parse_args()
    rank = int(os.environ["RANK"])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if opts.ignore_term and _wanted(_ranks(opts.ignore_term), rank):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = None
    if opts.grandchild and _wanted(_ranks(opts.grandchild), rank):
        # Not a Python child: it must die through the process group, not through our cleanup.
        grandchild = subprocess.Popen(["sleep", str(opts.seconds)], stdin=subprocess.DEVNULL).pid
    opts.dir.mkdir(parents=True, exist_ok=True)
    write_atomic(opts.dir / f"ready_{rank}", {"pid": os.getpid(), "grandchild": grandchild})
    print(f"rank {rank} ready", flush=True)
    if rank == opts.fail_rank:
        nproc = int(os.environ["LOCAL_WORLD_SIZE"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = all((opts.dir / f"ready_{r}").exists() for r in range(nproc))
            if ready and (opts.go is None or opts.go.exists()):
                return int(opts.fail_code)
            time.sleep(0.01)
        return 99  # the peers never came up, or no go
    time.sleep(opts.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
