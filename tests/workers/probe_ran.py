"""Test worker: what the bootstrap notes of the main thread running Python code.

    probe_ran.py PROGRESS_FILE OUT_FILE

Loops in Python for 1 s, then blocks in one C call (libc usleep, the GIL released) for 1.5 s.
A thread copies the progress file's second line (the last time the main thread ran Python code)
into OUT_FILE in each phase, as `loop T` and `block T`, after `start T` and `blocked T`.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time

progress, out = sys.argv[1], sys.argv[2]


def note(line: str) -> None:
    with open(out, "a") as f:
        f.write(line + "\n")


def snapshot(name: str, delay: float) -> None:
    time.sleep(delay)
    with open(progress) as f:
        note(f"{name} {f.read().split()[1]}")


note(f"start {time.time()}")
threading.Thread(target=snapshot, args=("loop", 0.7)).start()
end = time.monotonic() + 1.0
while time.monotonic() < end:
    pass
note(f"blocked {time.time()}")
snap = threading.Thread(target=snapshot, args=("block", 1.0))
snap.start()
ctypes.CDLL(None).usleep(1_500_000)
snap.join()
