"""Test worker: a healthy loop that spends nearly all its time on one line.

    steady_loop.py torch|quiet|said STEPS PERIOD

`torch`: the loop a hang watch once stopped as hung (gloo): all_reduce, print, sleep PERIOD.
`quiet`: no torch and no output, only `time.sleep(PERIOD)` in the loop.
`said`: one C call of STEPS * PERIOD seconds (libc's usleep, which runs no Python) while a thread
calls `elastic_hydra.progress()` every PERIOD.
Each writes `$OUT_DIR/done.<rank>` at its end.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path

mode, steps, period = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
if mode == "torch":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    for step in range(steps):
        dist.all_reduce(t)
        print("step", step, flush=True)
        time.sleep(period)
    dist.destroy_process_group()
elif mode == "quiet":
    for _ in range(steps):
        time.sleep(period)
else:
    import elastic_hydra

    def say() -> None:
        for _ in range(steps):
            elastic_hydra.progress()
            time.sleep(period)

    sayer = threading.Thread(target=say, daemon=True)
    sayer.start()
    ctypes.CDLL(None).usleep(int(steps * period * 1e6))
    sayer.join()
Path(os.environ["OUT_DIR"], f"done.{os.environ['RANK']}").write_text("done\n")
