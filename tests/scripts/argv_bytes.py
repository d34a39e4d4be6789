"""Writes its arguments byte for byte, then exits with a chosen code.

argv_bytes.py OUT CODE ARGS...   OUT gets ARGS as the bytes the kernel passed (os.fsencode),
                                 NUL-separated; stdout and stderr get them one a line
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    out, code, args = sys.argv[1], int(sys.argv[2]), [os.fsencode(a) for a in sys.argv[3:]]
    with open(out + ".tmp", "wb") as f:
        f.write(b"\0".join(args))
    os.rename(out + ".tmp", out)
    for stream in (sys.stdout.buffer, sys.stderr.buffer):
        stream.write(b"".join(a + b"\n" for a in args))
        stream.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
