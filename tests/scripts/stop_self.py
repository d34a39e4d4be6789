"""Writes READY_<RANK>; rank 1 then stops itself with SIGSTOP, the others sleep until stopped.

stop_self.py DIR
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
Path(sys.argv[1], f"READY_{rank}").touch()
if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(60)
