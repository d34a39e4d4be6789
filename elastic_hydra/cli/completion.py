"""Shell completion: Hydra's completion with the job file given as a path.

Hydra completes from COMP_LINE, where a job file is a `--config-dir`/`--config-name` pair; our
command line names the file itself, so the line is rewritten before Hydra reads it.
"""

from __future__ import annotations

import os
from pathlib import Path


def completion_args(args: list[str]) -> list[str]:
    """Completion re-reads COMP_LINE itself: rewrite its job file, and load that job."""
    line = os.environ.get("COMP_LINE")
    if line is None or not ({"-sc", "--shell-completion"} & set(args)):
        return args
    words = line.split(" ")
    jobs = [w for w in words if w.endswith((".yaml", ".yml")) and "=" not in w]
    if not jobs:
        return args
    job = Path(jobs[0])
    flags = ["--config-dir", str(job.resolve().parent), "--config-name", job.stem]
    os.environ["COMP_LINE"] = " ".join(" ".join(flags) if w == jobs[0] else w for w in words)
    return [*flags, *args]
