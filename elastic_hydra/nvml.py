"""NVML (nvidia-ml-py's `pynvml`, optional): the one place that imports, starts and stops it.

`load()` gives the module initialised, or None where it is not installed or finds no driver or
no GPU (the caller then does without: `nvidia-smi`, empty GPU columns, a skipped check);
`shutdown()` ends it and never raises. Nothing is imported or started when this module is
imported. Its users: the machine's GPUs (`resolve.machine`), a worker's GPU use
(`observe.sample`), a GPU's health (`preflight.node_checks`).
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType


def load() -> ModuleType | None:
    """pynvml, initialised; None where it is not installed, or finds no driver or no GPU."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # not installed; no driver: NVML raises its own error classes
        return None
    return nvml


def shutdown(nvml: ModuleType) -> None:
    """End what `load` started; a driver that went away is no error here."""
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()
