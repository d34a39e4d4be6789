"""The preflight battery's settings (`preflight.*`) -> `PreflightSpec`, every value checked.

Preflight on several nodes needs a rendezvous whose store every node shares (c10d, etcd): the
nodes exchange their results through it so that each computes the same verdict. Static nodes
have none, so preflight there is refused rather than run blind.
"""

from __future__ import annotations

import os

from elastic_hydra.config.schema import PreflightConf
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import NodeRange, PreflightMode, PreflightSpec, Static
from elastic_hydra.resolve.runtime import seconds

MAX_PATHS = 32
MAX_GEMM = 16384
MAX_ALLREDUCE_MB = 4096.0


def resolve_preflight(p: PreflightConf, *, nnodes: NodeRange, rdzv: object) -> PreflightSpec:
    """The battery's spec; ConfigError names the key at fault."""
    try:
        mode = PreflightMode(str(p.mode).strip().lower())
    except ValueError:
        raise ConfigError(
            "preflight.mode", "not a preflight mode", p.mode,
            "expected off, quick or full, e.g. preflight=quick",
        ) from None  # fmt: skip
    if mode is not PreflightMode.OFF and isinstance(rdzv, Static) and nnodes.max > 1:
        raise ConfigError(
            "preflight.mode", "needs a shared rendezvous store on several nodes", mode.value,
            "use rdzv=c10d (or etcd), or preflight=off with rdzv=static",
        )  # fmt: skip
    if not 0 < p.min_ratio <= 1:
        raise ConfigError(
            "preflight.min_ratio", "is not a share of the median", p.min_ratio,
            "expected a number in (0, 1], e.g. preflight.min_ratio=0.8",
        )  # fmt: skip
    if not 8 <= p.gemm_size <= MAX_GEMM:
        raise ConfigError(
            "preflight.gemm_size", "is out of range", p.gemm_size,
            f"expected 8 to {MAX_GEMM}, e.g. preflight.gemm_size=512",
        )  # fmt: skip
    if not 0 < p.allreduce_mb <= MAX_ALLREDUCE_MB:
        raise ConfigError(
            "preflight.allreduce_mb", "is out of range", p.allreduce_mb,
            f"expected MiB in (0, {MAX_ALLREDUCE_MB:g}], e.g. preflight.allreduce_mb=4",
        )  # fmt: skip
    if not 1 <= p.allreduce_reps <= 1000:
        raise ConfigError(
            "preflight.allreduce_reps", "is out of range", p.allreduce_reps,
            "expected 1 to 1000, e.g. preflight.allreduce_reps=5",
        )  # fmt: skip
    if p.min_free_gb < 0:
        raise ConfigError(
            "preflight.min_free_gb", "is negative", p.min_free_gb, "expected GiB >= 0, e.g. 1"
        )
    gemm_seconds = seconds("preflight.gemm_seconds", p.gemm_seconds)
    timeout = seconds("preflight.timeout", p.timeout)
    if timeout <= gemm_seconds:
        raise ConfigError(
            "preflight.timeout", "leaves no time beyond the GEMM", timeout,
            f"expected more than preflight.gemm_seconds ({gemm_seconds:g}), e.g. 60",
        )  # fmt: skip
    return PreflightSpec(
        mode=mode,
        min_ratio=float(p.min_ratio),
        gemm_size=int(p.gemm_size),
        gemm_seconds=gemm_seconds,
        allreduce_bytes=max(4, int(p.allreduce_mb * (1 << 20)) // 4 * 4),
        allreduce_reps=int(p.allreduce_reps),
        timeout=timeout,
        paths=_paths(list(p.paths)),
        min_free_bytes=int(p.min_free_gb * (1 << 30)),
    )


def _paths(paths: list[str]) -> tuple[str, ...]:
    if len(paths) > MAX_PATHS:
        raise ConfigError(
            "preflight.paths", f"names more than {MAX_PATHS} directories", len(paths),
            "expected a short list, e.g. preflight.paths=[/data,/checkpoints]",
        )  # fmt: skip
    for path in paths:
        if not path or "\0" in path or not os.path.isabs(path):
            raise ConfigError(
                "preflight.paths", "holds a path that is not absolute", path,
                "expected absolute directories, e.g. preflight.paths=[/data]",
            )  # fmt: skip
    return tuple(os.path.normpath(p) for p in paths)
