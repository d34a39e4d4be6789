"""`checkpoint.*`: the job's checkpoint home (absolute), what is kept, the memory allowed."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Sequence

from elastic_hydra.config.schema import CheckpointConf
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import CheckpointSpec, Command, Entrypoint, PythonModule

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# Overrides that name where the job runs, not which job it is: left out of a sweep job's name.
_SAME_FOR_EVERY_JOB = ("script=", "module=", "cmd=", "logs.", "checkpoint.", "hydra.")
SIZE_FORM = "expected a size, e.g. 4GiB, 512MiB or a number of bytes"


def resolve_checkpoint(
    conf: CheckpointConf, *, logs_root: str, entrypoint: Entrypoint, run_id: str | None, cwd: str
) -> CheckpointSpec:
    """The checkpoint spec of a job.

    The default home is `<logs.root>/checkpoints/<entrypoint>[-<rdzv.id>]`: the same for every
    node (on a shared file system) and every relaunch of the job, never a launch's run dir.

    Raises:
        ConfigError: keep under 1, a size that is none, a relative or empty memory directory.
    """
    if isinstance(conf.keep, bool) or conf.keep < 1:
        raise ConfigError("checkpoint.keep", "must be at least 1", conf.keep, "e.g. 2")
    if not str(conf.memory).strip() or not os.path.isabs(conf.memory):
        raise ConfigError(
            "checkpoint.memory", "is not an absolute path", conf.memory, "e.g. /dev/shm"
        )
    job = _entry_name(entrypoint) + (f"-{_NAME.sub('-', run_id)}" if run_id else "")
    if conf.home is not None and str(conf.home).strip():
        home = os.path.abspath(os.path.join(cwd, os.path.expanduser(str(conf.home))))
    else:
        home = os.path.join(os.path.abspath(os.path.join(cwd, logs_root)), "checkpoints", job)
    return CheckpointSpec(
        home=home,
        job=job,
        resume=conf.resume,
        keep=conf.keep,
        max_memory=_size("checkpoint.max_memory", conf.max_memory),
        memory=str(conf.memory),
        buddy=bool(conf.buddy),
    )


def for_sweep_job(spec: CheckpointSpec, overrides: Sequence[str]) -> CheckpointSpec:
    """The default home of one job of a sweep: the sweep's, then the job's overrides (a relaunch
    of the same sweep finds each job's copies; two jobs never share one)."""
    words = ",".join(o for o in overrides if not o.lstrip("+~").startswith(_SAME_FOR_EVERY_JOB))
    name = _NAME.sub("_", words)[:80].strip("._") or "job"
    name += "-" + hashlib.sha256(words.encode()).hexdigest()[:8]
    return dataclasses.replace(spec, home=os.path.join(spec.home, name), job=f"{spec.job}/{name}")


def _entry_name(entrypoint: Entrypoint) -> str:
    if isinstance(entrypoint, PythonModule):
        name = entrypoint.name
    elif isinstance(entrypoint, Command):
        name = os.path.basename(entrypoint.program)
    else:
        name = os.path.splitext(os.path.basename(entrypoint.path))[0]
    return _NAME.sub("-", name).strip("-.") or "job"


def _size(key: str, value: object) -> int:
    if value is None:
        return 0
    found = _SIZE.fullmatch(str(value).strip())
    if found is None:
        raise ConfigError(key, "not a size", value, SIZE_FORM)
    unit = (found.group(2) or "").upper().removesuffix("B")  # "", K, KI, M, MI ...
    power = "KMGT".index(unit[0]) + 1 if unit else 0
    size = int(float(found.group(1)) * (1024 if unit.endswith("I") else 1000) ** power)
    if size < 1:
        raise ConfigError(key, "must be more than 0 bytes", value, SIZE_FORM)
    return size
