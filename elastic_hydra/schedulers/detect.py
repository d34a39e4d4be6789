"""`rdzv=auto`: the one scheduler whose environment is present, Slurm included.

A node under two schedulers at once (a SkyPilot task on a Slurm cluster, say) is ambiguous:
the user names the preset. A PyTorchJob's variables count only inside a Kubernetes pod (see
`kubeflow.present`), because torch gives every worker the same names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from elastic_hydra.schedulers import dstack, jobset, kubeflow, skypilot
from elastic_hydra.schedulers.base import SchedulerError, SchedulerNode

Reader = Callable[[Mapping[str, str]], SchedulerNode]
# The presets that read a scheduler's environment, by name (Slurm resolves apart: `_slurm`).
READERS: dict[str, Reader] = {
    kubeflow.NAME: kubeflow.read,
    jobset.NAME: jobset.read,
    skypilot.NAME: skypilot.read,
    dstack.NAME: dstack.read,
}
_PRESENT: dict[str, Callable[[Mapping[str, str]], bool]] = {
    "slurm": lambda environ: "SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ,
    # JobSet before kubeflow: Trainer v2 runs its nodes as JobSet pods, but sets PET_* itself
    # and none of the names our JobSet manifest maps in.
    jobset.NAME: jobset.present,
    kubeflow.NAME: kubeflow.present,
    skypilot.NAME: skypilot.present,
    dstack.NAME: dstack.present,
}
_MARKERS = {
    "slurm": "SLURM_JOB_ID",
    jobset.NAME: "JOBSET_NAME",
    kubeflow.NAME: "PET_NNODES (or a PyTorchJob's MASTER_ADDR/WORLD_SIZE/RANK)",
    skypilot.NAME: "SKYPILOT_NODE_RANK",
    dstack.NAME: "DSTACK_NODE_RANK",
}


def detect(environ: Mapping[str, str]) -> str:
    """The preset whose scheduler started this process: slurm, kubeflow, jobset, skypilot or
    dstack.

    Raises:
        SchedulerError: none is present, or more than one is.
    """
    found = [name for name, present in _PRESENT.items() if present(environ)]
    if len(found) == 1:
        return found[0]
    if not found:
        looked = ", ".join(_MARKERS.values())
        raise SchedulerError(
            "rdzv=auto", f"found no scheduler's environment (looked for {looked})",
            "launch under Slurm, Kubernetes (JobSet, Kubeflow), SkyPilot or dstack, or pick "
            "rdzv=c10d with rdzv.endpoint=HOST:PORT",
        )  # fmt: skip
    both = " and ".join(f"{n} ({_MARKERS[n].split(' ')[0]})" for n in found)
    raise SchedulerError(
        "rdzv=auto", f"is ambiguous: found {both}",
        f"name the scheduler: rdzv={found[0]} or rdzv={found[1]}",
    )  # fmt: skip


def read(name: str, environ: Mapping[str, str]) -> SchedulerNode:
    """This node as the named scheduler (not slurm) placed it.

    Raises:
        SchedulerError: as the scheduler's reader does.
    """
    return READERS[name](environ)


_SLURM_SHOWN = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST",
                "SLURM_STEP_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_NNODES",
                "SLURM_NODEID")  # fmt: skip


def describe(backend: str, environ: Mapping[str, str]) -> str | None:
    """`--plan`'s line for a preset that reads a scheduler: which one (for `auto`, the one
    detected) and from which variables; None for the other backends.

    Raises:
        SchedulerError: as `detect` and the readers do (resolution has said so already).
    """
    if backend not in (*READERS, "slurm", "auto"):
        return None
    name = detect(environ) if backend == "auto" else backend
    how = "detected by rdzv=auto" if backend == "auto" else f"rdzv={backend}"
    if name == "slurm":
        said = ", ".join(f"{k}={environ[k]}" for k in _SLURM_SHOWN if k in environ)
        return f"slurm ({how}) from {said}"
    node = read(name, environ)
    return f"{node.describe()}; {how}"
