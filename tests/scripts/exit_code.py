"""Exits with a chosen code, optionally only on one rank or one attempt.

    exit_code.py [--code N] [--rank R] [--attempt K] [--dir D]

The code comes from --code, else from $CODE, else 0. The failing process is rank R (any rank when
--rank is absent) on attempt K (TORCHELASTIC_RESTART_COUNT; any attempt when absent). On an attempt
that fails, the other ranks sleep until the launcher stops them; on any other attempt they exit 0.
With --dir every process records D/attempt<restart_count>_rank<rank>.json (pid and environment),
and the failing process waits for its peers' records before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", type=int, default=None)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--attempt", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None)
    opts = parser.parse_args()
    code = opts.code if opts.code is not None else int(os.environ.get("CODE", "0"))
    rank = int(os.environ["RANK"])
    restart_count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    world_size = int(os.environ["WORLD_SIZE"])
    if opts.dir is not None:
        opts.dir.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "rank": rank, "env": dict(os.environ)}
        path = opts.dir / f"attempt{restart_count}_rank{rank}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    failing_attempt = code != 0 and opts.attempt in (None, restart_count)
    if not failing_attempt:
        return 0
    if opts.rank in (None, rank):
        if opts.dir is not None:  # let every peer record itself first
            names = [f"attempt{restart_count}_rank{r}.json" for r in range(world_size)]
            deadline = time.monotonic() + 30
            while not all((opts.dir / n).exists() for n in names) and time.monotonic() < deadline:
                time.sleep(0.01)
        print(f"rank {rank} failing with exit code {code}", file=sys.stderr, flush=True)
        return code
    time.sleep(300)  # a healthy peer: the launcher stops it
    return 0


if __name__ == "__main__":
    sys.exit(main())
