"""What else ran on this host during a benchmark, so that a report says the machine was shared
only when it was.

The host's CPU time (/proc/stat: every process's, user, nice and system) minus the harness's own
and that of the descendants it waited for (os.times) is what other processes used meanwhile. The
load average cannot tell: the benchmark's own launchers and workers raise it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# Other processes' CPU, in cores averaged over the run, from which a report says that other work
# shared the machine: below it is the kernel's and idle daemons' housekeeping.
SHARED_CORES = 0.05
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuReading:
    """The host's and the harness's CPU seconds so far, at a monotonic instant."""

    at: float
    host_s: float  # every process on the host: user + nice + system
    ours_s: float  # this process and the descendants it waited for


def read_cpu() -> CpuReading:
    """A reading now (Linux: /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()  # "cpu user nice system ..."
    host = sum(int(f) for f in fields[1:4]) * _TICK_S
    times = os.times()
    ours = times.user + times.system + times.children_user + times.children_system
    return CpuReading(at=time.monotonic(), host_s=host, ours_s=ours)


def others_cores(start: CpuReading, end: CpuReading) -> float:
    """The CPU other processes used between two readings, in cores (1.0: one core busy all the
    while). A descendant the harness has not waited for yet counts as another process."""
    wall = end.at - start.at
    other = (end.host_s - start.host_s) - (end.ours_s - start.ours_s)
    return max(other, 0.0) / wall if wall > 0 else 0.0
