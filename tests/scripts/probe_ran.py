"""Test worker: what the bootstrap notes of the main thread running Python code.

    probe_ran.py PROGRESS_FILE OUT_FILE

Loops in Python for 2 s, then blocks in one C call (libc usleep, the GIL released) for 3 s,
once the watcher has written its first look (wide margins: a loaded machine delays its looks).
A thread copies the progress file's second line (the last look that found the main thread had
run Python code) into OUT_FILE twice in each phase: `loop1 T`, `loop2 T`, `block1 T`, `block2 T`.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from pathlib import Path

progress, out = sys.argv[1], sys.argv[2]
usleep = ctypes.CDLL(None).usleep


def snapshots(name: str, at: tuple[float, float]) -> None:
    start = time.monotonic()
    for n, when in enumerate(at, 1):
        time.sleep(max(0.0, start + when - time.monotonic()))
        with open(progress) as f:
            line = f.read().split()[1]
        with open(out, "a") as f:
            f.write(f"{name}{n} {line}\n")


deadline = time.monotonic() + 10
while len(Path(progress).read_text().split()) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
loop = threading.Thread(target=snapshots, args=("loop", (0.6, 1.6)))
loop.start()
end = time.monotonic() + 2.0
while time.monotonic() < end:
    pass
loop.join()
block = threading.Thread(target=snapshots, args=("block", (1.0, 2.5)))
block.start()
usleep(3_000_000)
block.join()
