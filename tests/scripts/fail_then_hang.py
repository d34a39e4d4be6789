"""Fails on the first attempt, hangs on the next (no torch).

    fail_then_hang.py

Attempt 0 (TORCHELASTIC_RESTART_COUNT=0): the last local rank exits 3, the others sleep until
the launcher stops them. Later attempts: every rank sleeps without progress (at most 120 s), so
the hang watch finds them hung. Writes `$OUT_DIR/<attempt>.<rank>.ready` first.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> int:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank, local_rank = os.environ["RANK"], int(os.environ["LOCAL_RANK"])
    ready = Path(os.environ["OUT_DIR"], f"{attempt}.{rank}.ready")
    ready.with_suffix(".tmp").write_text(str(os.getpid()))
    ready.with_suffix(".tmp").replace(ready)  # a test that polls reads it whole or not at all
    if attempt == 0 and local_rank == int(os.environ["LOCAL_WORLD_SIZE"]) - 1:
        return 3
    time.sleep(120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
