"""Kubeflow: a Trainer v2 TrainJob's node, or an older PyTorchJob's pod.

Trainer v2's Torch plugin (kubeflow/trainer, pkg/runtime/framework/plugins/torch/torch.go,
`EnforceMLPolicy`) gives the trainer container `PET_NNODES` (the node count),
`PET_NPROC_PER_NODE`, `PET_NODE_RANK` (from the Job's completion index annotation),
`PET_MASTER_ADDR` = `<trainjob>-node-0-0.<trainjob>` and `PET_MASTER_PORT` = 29400, the port of
its headless service. Trainer meant them for torchrun's static rendezvous; we meet at the same
address and port with c10d instead, so that restarts re-rendezvous and `nnodes=MIN:MAX` works.

The older PyTorchJob (kubeflow/training-operator, pkg/controller.v1/pytorch/envvar.go `setPodEnv`
and master.go) gives every pod `MASTER_ADDR` = `<job>-master-0`, `MASTER_PORT` (the master
container's `pytorchjob-port`), `WORLD_SIZE` = the number of pods and `RANK` = the pod's rank
(the master 0, worker i gets i + 1): node-level values under torch's worker names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from elastic_hydra.schedulers.base import (
    SchedulerError,
    SchedulerNode,
    below,
    count,
    host,
    port,
)

NAME = "kubeflow"
TRAINER = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
           "PET_MASTER_PORT")  # fmt: skip
PYTORCHJOB = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_FIX_V2 = "run inside a Kubeflow TrainJob's trainer pod (Trainer sets PET_*), or pick rdzv=c10d"
_FIX_V1 = "run inside a PyTorchJob pod (the operator sets MASTER_ADDR, RANK...), or pick rdzv=c10d"


def present(environ: Mapping[str, str]) -> bool:
    """Trainer's PET_NNODES, or (inside Kubernetes) a PyTorchJob pod's variables. The latter are
    torch's worker names too, so outside a pod (a worker that launches) they mean nothing."""
    if "PET_NNODES" in environ:
        return True
    in_pod = "KUBERNETES_SERVICE_HOST" in environ and "TORCHELASTIC_RUN_ID" not in environ
    return in_pod and all(name in environ for name in PYTORCHJOB)


def read(environ: Mapping[str, str]) -> SchedulerNode:
    """This node of a TrainJob (PET_* present) or of a PyTorchJob.

    Raises:
        SchedulerError: a variable is missing, malformed or contradicts another.
    """
    if any(name in environ for name in TRAINER):
        return _trainer(environ)
    if "MASTER_ADDR" in environ or "WORLD_SIZE" in environ:
        return _pytorchjob(environ)
    raise SchedulerError("PET_NNODES", "is not set (neither is WORLD_SIZE)", _FIX_V2)


def _trainer(environ: Mapping[str, str]) -> SchedulerNode:
    nnodes = count(environ, "PET_NNODES", _FIX_V2, least=1)
    rank = count(environ, "PET_NODE_RANK", _FIX_V2)
    below("PET_NODE_RANK", rank, "PET_NNODES", nnodes, _FIX_V2)
    master = host(environ, "PET_MASTER_ADDR", _FIX_V2)
    number = port(environ, "PET_MASTER_PORT", _FIX_V2)
    nproc = environ.get("PET_NPROC_PER_NODE", "").strip()
    names = [n for n in TRAINER if n in environ]
    return SchedulerNode(
        scheduler=NAME,
        flavour="Trainer v2",
        node_rank=rank,
        rank_variable="PET_NODE_RANK",
        nnodes=nnodes,
        nnodes_variable="PET_NNODES",
        master=master,
        port=number,
        run_id=run_id_of(master),
        gpus_per_node=int(nproc) if nproc.isdigit() else None,
        variables=tuple((n, environ[n].strip()) for n in names),
    )


def _pytorchjob(environ: Mapping[str, str]) -> SchedulerNode:
    nnodes = count(environ, "WORLD_SIZE", _FIX_V1, least=1)
    rank = count(environ, "RANK", _FIX_V1)
    below("RANK", rank, "WORLD_SIZE", nnodes, _FIX_V1)
    master = host(environ, "MASTER_ADDR", _FIX_V1)
    number = port(environ, "MASTER_PORT", _FIX_V1)
    return SchedulerNode(
        scheduler=NAME,
        flavour="PyTorchJob",
        node_rank=rank,
        rank_variable="RANK",
        nnodes=nnodes,
        nnodes_variable="WORLD_SIZE",
        master=master,
        port=number,
        run_id=run_id_of(master),
        variables=tuple((n, environ[n].strip()) for n in PYTORCHJOB),
    )


def run_id_of(master: str) -> str:
    """The master's first DNS label (`<trainjob>-node-0-0`, `<job>-master-0`): the job's own
    name, the same on every node, and a valid run id."""
    label = master if re.fullmatch(r"[0-9.]+|.*:.*", master) else master.partition(".")[0]
    return re.sub(r"[^A-Za-z0-9._-]", "-", label)[:100] or "kubeflow"
