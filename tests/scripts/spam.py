"""Writes deterministic output: many lines, a 1 MiB line, invalid UTF-8, no final newline.

    spam.py LINES

`expected(rank, lines)` returns the exact (stdout, stderr) bytes that rank writes; tests import it.
"""

from __future__ import annotations

import os
import sys

BIG = 1 << 20


def expected(rank: int, lines: int) -> tuple[bytes, bytes]:
    """Exactly what rank `rank` writes to (stdout, stderr)."""
    out = b"".join(b"rank %d line %d\n" % (rank, i) for i in range(lines))
    out += b"rank %d big " % rank + b"x" * BIG + b"\n"
    out += b"rank %d bad utf-8 \xff\xfe\xc3\x28 \x80 end\n" % rank
    out += b"rank %d tail without newline" % rank
    err = b"".join(b"rank %d err %d\n" % (rank, i) for i in range(max(1, lines // 10)))
    err += b"rank %d err bad \xff end\n" % rank
    return out, err


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> int:
    lines = int(sys.argv[1])
    out, err = expected(int(os.environ["RANK"]), lines)
    # Many writes of different sizes, interleaving the two streams, like a real program.
    step = 4096
    for i in range(0, max(len(out), len(err)), step):
        _write(1, out[i : i + step])
        _write(2, err[i : i + step])
    return 0


if __name__ == "__main__":
    sys.exit(main())
