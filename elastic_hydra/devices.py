"""What this machine offers workers: GPU and CPU counts, read without importing torch."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask), as torch's cpu_count does."""
    return len(os.sched_getaffinity(0))


def gpu_count(environ: Mapping[str, str]) -> int:
    """NVIDIA GPUs usable by workers: the driver's count, limited by CUDA_VISIBLE_DEVICES."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return 0
    try:
        out = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    total = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    if visible is None:
        return total
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    usable = 0
    for entry in entries:
        # CUDA stops at the first invalid entry (e.g. -1 hides every device).
        if (entry.isdigit() and int(entry) < total) or entry.startswith(("GPU-", "MIG-")):
            usable += 1
        else:
            break
    return usable
