"""A gloo worker that holds its process group open until told: the test looks at its sockets.

store_wait.py DIR     writes DIR/ready_<RANK>, waits for DIR/go, then all_reduce and exit 0
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
out = Path(sys.argv[1])
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
(out / f".ready_{rank}").write_text(str(os.getpid()))
(out / f".ready_{rank}").replace(out / f"ready_{rank}")  # the test reads it whole or not at all
deadline = time.monotonic() + 60
while not (out / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
value = torch.tensor([1.0])
dist.all_reduce(value)
dist.destroy_process_group()
sys.exit(0 if int(value.item()) == int(os.environ["WORLD_SIZE"]) else 3)
