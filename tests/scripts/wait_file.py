"""Prints a line (no flush), then waits for a file to appear and exits 0 (5 after 30 s without it).

    wait_file.py TOKEN PATH

Without unbuffered stdout the line would sit in the worker's buffer and the wait would never end.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    token, path = sys.argv[1], sys.argv[2]
    print(f"{token} rank {os.environ['RANK']}")  # deliberately no flush=True
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return 0
        time.sleep(0.01)
    return 5


if __name__ == "__main__":
    sys.exit(main())
