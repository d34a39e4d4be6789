"""What the events cannot tell of a worker: its CPU and memory (/proc), its GPU (NVML).

CPU is a rate: each sample compares a process's CPU time with the previous sample's, so the first
sample of a process has none. NVML is used where `pynvml` imports and initialises, once, at the
first sample (never at import); without it, the GPU columns stay empty.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from typing import Any

from elastic_hydra import nvml
from elastic_hydra.observe.status import Sample
from elastic_hydra.workers import procfs


class Sampler:
    """Samples worker processes; remembers each one's previous CPU time for its rate."""

    def __init__(self, *, gpu: bool = True) -> None:
        self.previous: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, monotonic)
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.nvml: Any = None
        self.want_gpu = gpu

    def sample(self, pids: Iterable[int]) -> dict[int, Sample]:
        """Each live pid's sample (a pid that is gone is left out)."""
        now = time.monotonic()
        out: dict[int, Sample] = {}
        seen: dict[int, tuple[float, float]] = {}
        gpus = self._gpu()
        for pid in pids:
            cpu = procfs.cpu_seconds(pid)
            if cpu is None:
                continue
            seen[pid] = (cpu, now)
            percent = None
            if (before := self.previous.get(pid)) is not None and now > before[1]:
                percent = round(max(0.0, (cpu - before[0]) / (now - before[1]) * 100), 1)
            util, mem = gpus.get(pid, (None, None))
            out[pid] = Sample(
                cpu_percent=percent, rss_bytes=self._rss(pid), gpu_util=util, gpu_mem_bytes=mem
            )
        self.previous = seen
        return out

    def _rss(self, pid: int) -> int | None:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * self.page
        except (OSError, ValueError, IndexError):
            return None

    def _gpu(self) -> dict[int, tuple[float | None, int | None]]:
        """GPU utilisation (of the device) and memory (of the process), by pid; {} without
        NVML."""
        if self.want_gpu and self.nvml is None:
            self.want_gpu = False  # one try
            self.nvml = nvml.load()  # None: not installed, no driver, no GPU
        if self.nvml is None:
            return {}
        out: dict[int, tuple[float | None, int | None]] = {}
        with contextlib.suppress(Exception):  # a driver that goes away mid-job
            nv = self.nvml
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                util = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else None
                    out[int(proc.pid)] = (util, used)
        return out

    def close(self) -> None:
        if self.nvml is not None:
            nvml.shutdown(self.nvml)
            self.nvml = None
