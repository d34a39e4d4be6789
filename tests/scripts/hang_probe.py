"""Test worker: each rank does what argv says for its local rank, no torch.

    hang_probe.py MODE_FOR_LOCAL_RANK_0 MODE_FOR_LOCAL_RANK_1 ...

Modes: `wait` (blocks reading a pipe nobody writes), `sleep` (time.sleep), `gil` (a C call that
holds the GIL while it blocks: libc sleep through ctypes.PyDLL), `stop` (SIGSTOPs itself),
`compute:S` (Python arithmetic for S seconds, then exits 0), `cmp-c:S` (one C call of S
seconds, then exits 0), `exit` (exits 0 at once). Writes `$OUT_DIR/<rank>.ready` first.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    mode = sys.argv[1 + int(os.environ["LOCAL_RANK"])]
    ready = Path(os.environ["OUT_DIR"], f"{os.environ['RANK']}.ready")
    ready.with_suffix(".tmp").write_text(str(os.getpid()))
    ready.with_suffix(".tmp").replace(ready)  # a test that polls reads it whole or not at all
    what, _, arg = mode.partition(":")
    if what == "wait":
        read_end, _write_end = os.pipe()
        os.read(read_end, 1)  # nobody writes: blocked in a read
    elif what == "sleep":
        time.sleep(600)
    elif what == "gil":
        ctypes.PyDLL(None).sleep(600)  # holds the GIL: no Python thread runs meanwhile
    elif what == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)
    elif what == "compute":
        deadline, total = time.monotonic() + float(arg), 0
        while time.monotonic() < deadline:
            total += sum(i * i for i in range(1000))
    elif what == "cmp-c":  # one C call that lasts S seconds (calibrated on this machine)
        t0 = time.perf_counter()
        hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 20_000)
        rate = 20_000 / max(time.perf_counter() - t0, 1e-6)
        hashlib.pbkdf2_hmac("sha256", b"x", b"salt", int(rate * float(arg)))
    elif what != "exit":
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
