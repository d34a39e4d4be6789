"""Fills the file system of PATH (writes PATH until it is full), then exits 0, printing nothing.

fill_disk.py PATH
"""

from __future__ import annotations

import errno
import os
import sys


def main() -> int:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    block = b"\0" * 4096
    try:
        while True:
            os.write(fd, block)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
