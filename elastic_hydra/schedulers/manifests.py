"""The Kubernetes manifests of a job: a JobSet, or a Kubeflow TrainJob with its runtime.

Pure: plain data in (`K8sSpec`, `Workload`), the manifests out as plain mappings, in the order
`kubectl apply -f -` creates them. What each side owns, so that the agent and Kubernetes never
both restart:

- **The agent owns worker failures.** The pod restarts its workers under `restart.*`; when it
  gives up it exits 1 (2 for a mistake in the job, 70 for a bug of ours). The Job's
  `podFailurePolicy` turns those exit codes into `FailJob`, and the JobSet's `failurePolicy` turns
  a Job failed by that policy into `FailJobSet`: the set ends once, nothing is restarted twice.
  Pods never restart in place (`restartPolicy: Never`).
- **Kubernetes owns pod loss.** A pod evicted or preempted (condition `DisruptionTarget`), or
  one whose agent exited 75 (stopped with the workers' snapshots kept), is replaced without
  counting (`Ignore`); any other pod failure (the agent OOM-killed, its node
  gone) is replaced up to `k8s.pod_replacements` times (`backoffLimit`). A replacement pod
  joins the running c10d rendezvous: the others re-rendezvous without spending a restart. Past
  that limit the Job fails and the JobSet restarts the whole set up to `k8s.jobset_restarts` times.
- **nnodes=MIN:MAX** is a JobSet of MAX pods whose agents meet in one c10d rendezvous; losing a
  pod shrinks the job, its replacement grows it back. The Job succeeds when pod 0 (the store's
  host, whose agent leaves last) succeeds (`successPolicy`), so pods still pending for lack of
  room do not keep a finished job alive.

The job file reaches the pods in a ConfigMap mounted at `JOB_DIR`, unless `k8s.job_file` names
one inside the image. The rendezvous is reached by DNS: JobSet's headless service (network
`enableDNSHostnames`, subdomain = the JobSet's name) gives pod i of the one Job the name
`<name>-node-0-<i>.<name>`, and Trainer's PET_MASTER_ADDR is the same name for a TrainJob.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from elastic_hydra.errors import EXIT_PREEMPTED_SAVED
from elastic_hydra.plan import NodeRange

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
REPLICATED_JOB = "node"  # Trainer's name for the trainer's replicated job and container
CONTAINER = "node"
RDZV_PORT = 29400  # Trainer's PET_MASTER_PORT; the JobSet's c10d port too
JOB_DIR = "/etc/elastic-hydra"
JOB_FILE = "job.yaml"
AGENT_EXIT_CODES = (1, 2, 70)  # gave up after its restarts, a mistake in the job, our bug
_ANNOTATION = "metadata.annotations['jobset.sigs.k8s.io/{}']"
# The JobSet annotations the preset reads, mapped onto variables (jobset.read).
JOBSET_ENV = (
    ("JOBSET_NAME", "jobset-name"),
    ("REPLICATED_JOB_NAME", "replicatedjob-name"),
    ("JOB_INDEX", "job-index"),
    ("JOBSET_RESTART_ATTEMPT", "restart-attempt"),
)


# A Kubernetes quantity (apimachinery's resource.Quantity), without a sign: 8, 7500m, 64Gi, 1e9.
QUANTITY = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?")
_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "P": 1e15, "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
           "Ei": 2**60}  # fmt: skip
SHM_AUTO = "auto"
SHM_PER_WORKER_GI = 1  # /dev/shm per worker when k8s.memory is not set


def quantity(text: str) -> float:
    """The value of a Kubernetes quantity (bytes for memory, cores for CPU).

    Raises:
        ValueError: not a quantity.
    """
    found = QUANTITY.fullmatch(text)
    if found is None:
        raise ValueError(text)
    number, suffix = found.group(1), found.group(3) or ""
    if suffix not in _SUFFIX:  # an exponent, e.g. 1e9 (E alone is exa, Ei exbi)
        return float(number + suffix)
    return float(number) * _SUFFIX[suffix]


@dataclass(frozen=True, slots=True, kw_only=True)
class K8sSpec:
    """The `k8s.*` keys, validated (resolve/kubernetes.py)."""

    image: str
    name: str
    namespace: str
    service_account: str | None
    job_file: str  # the job file's path in the image; "": shipped in a ConfigMap
    workdir: str
    gpus_per_node: int
    cpu: str | None  # a Kubernetes quantity: request = limit; None: none
    memory: str | None  # the same
    shm: str | None  # /dev/shm's size: a quantity, SHM_AUTO, or None (the runtime's 64 MiB)
    pod_replacements: int
    jobset_restarts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What every pod runs: `elastic-hydra [JOB] ARGS`, with the job file's text if shipped."""

    job_text: str | None  # the job file, shipped in a ConfigMap; None: none, or in the image
    args: tuple[str, ...]  # after the job file: overrides, the preset's, `--` and script args
    nnodes: NodeRange
    nproc_per_node: int
    stop_grace: float


def jobset(spec: K8sSpec, work: Workload) -> list[dict[str, Any]]:
    """The manifests of a JobSet of `nnodes.max` pods running `rdzv=jobset`."""
    job = _job_spec(spec, work, env=[*_jobset_env(), _pod_ip()])
    body = {
        "network": {"enableDNSHostnames": True, "subdomain": spec.name,
                    "publishNotReadyAddresses": True},
        "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job}}],
        "failurePolicy": _failure_policy(spec),
    }  # fmt: skip
    jobset_doc = {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _meta(spec, spec.name),
        "spec": body,
    }
    return [*_config_map(spec, work), jobset_doc]


def trainjob(spec: K8sSpec, work: Workload) -> list[dict[str, Any]]:
    """The manifests of a TrainJob of `nnodes.max` nodes running `rdzv=kubeflow`, with a
    TrainingRuntime of its own: the runtime holds the Job's failure policy, which a TrainJob
    cannot set, and mounts the job file."""
    job = _job_spec(spec, work, env=[_pod_ip()])
    runtime_job = {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": job,
    }
    runtime = {
        "apiVersion": TRAINER_API,
        "kind": "TrainingRuntime",
        "metadata": _meta(spec, f"{spec.name}-runtime"),
        "spec": {
            # torch: Trainer's Torch plugin sets PET_*; numProcPerNode is the TrainJob's (v2.3).
            "mlPolicy": {"numNodes": work.nnodes.max, "torch": {}},
            "template": {"spec": {
                "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                                    "template": runtime_job}],
                "failurePolicy": _failure_policy(spec),
            }},
        },
    }  # fmt: skip
    container = job["template"]["spec"]["containers"][0]
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": container["command"],
        "args": container["args"],
        "numNodes": work.nnodes.max,
        "numProcPerNode": work.nproc_per_node,
    }
    if "resources" in container:
        trainer["resourcesPerNode"] = container["resources"]
    train = {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": _meta(spec, spec.name),
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                           "name": f"{spec.name}-runtime"},
            "trainer": trainer,
        },
    }  # fmt: skip
    return [*_config_map(spec, work), runtime, train]


def _meta(spec: K8sSpec, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": {"app.kubernetes.io/managed-by": "elastic-hydra", "elastic-hydra/job": spec.name},
    }


def _config_map(spec: K8sSpec, work: Workload) -> list[dict[str, Any]]:
    if work.job_text is None:
        return []
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(spec, f"{spec.name}-job"),
            "data": {JOB_FILE: work.job_text},
        }
    ]


def job_path(spec: K8sSpec, work: Workload) -> str | None:
    """Where the pods find the job file (None: the command has none)."""
    if spec.job_file:
        return spec.job_file
    return f"{JOB_DIR}/{JOB_FILE}" if work.job_text is not None else None


def _job_spec(spec: K8sSpec, work: Workload, env: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch/v1 Job spec of the pods (one Job of nnodes.max indexed pods)."""
    path = job_path(spec, work)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": ["elastic-hydra"],
        "args": [*([path] if path else []), *work.args],
        "env": env,
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}],
    }
    if spec.workdir:
        container["workingDir"] = spec.workdir
    if resources := _resources(spec):
        container["resources"] = resources
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # The agent stops its workers within stop_grace and then writes its summary.
        "terminationGracePeriodSeconds": int(work.stop_grace) + 15,
        "containers": [container],
    }
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if work.job_text is not None and not spec.job_file:
        mounts.append({"name": "job", "mountPath": JOB_DIR, "readOnly": True})
        volumes.append({"name": "job", "configMap": {"name": f"{spec.name}-job"}})
    if (shm := shm_size(spec, work.nproc_per_node)) is not None:
        # A container's own /dev/shm is 64 MiB: DataLoader workers and NCCL fail in it.
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
    if mounts:
        container["volumeMounts"] = mounts
        pod["volumes"] = volumes
    count = work.nnodes.max
    job: dict[str, Any] = {
        "completionMode": "Indexed",
        "parallelism": count,
        "completions": count,
        "backoffLimit": spec.pod_replacements,
        "podFailurePolicy": {
            "rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER,
                 "operator": "In", "values": list(AGENT_EXIT_CODES)}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                          "status": "True"}]},
                {"action": "Ignore", "onExitCodes": {"containerName": CONTAINER,
                 "operator": "In", "values": [EXIT_PREEMPTED_SAVED]}},
            ]
        },
        "template": {"spec": pod},
    }  # fmt: skip
    if work.nnodes.min != work.nnodes.max:
        job["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    return job


def shm_size(spec: K8sSpec, nproc_per_node: int) -> str | None:
    """The pods' /dev/shm size: `k8s.shm`, or for `auto` half of `k8s.memory` (a memory-backed
    volume counts against the pod's memory limit), else 1Gi per worker."""
    if spec.shm != SHM_AUTO:
        return spec.shm
    if spec.memory is not None:
        return f"{max(1, int(quantity(spec.memory) / 2 / 2**20))}Mi"
    return f"{SHM_PER_WORKER_GI * max(1, nproc_per_node)}Gi"


def _resources(spec: K8sSpec) -> dict[str, Any]:
    """Requests equal to limits for CPU and memory (a pod that gets what it asks for, and is
    the last to be evicted); GPUs as a limit, which Kubernetes copies into the request."""
    limits: dict[str, str] = {}
    if spec.cpu is not None:
        limits["cpu"] = spec.cpu
    if spec.memory is not None:
        limits["memory"] = spec.memory
    requests = dict(limits)
    if spec.gpus_per_node:
        limits["nvidia.com/gpu"] = str(spec.gpus_per_node)
    return {k: v for k, v in (("limits", limits), ("requests", requests)) if v}


def _failure_policy(spec: K8sSpec) -> dict[str, Any]:
    """A Job failed by its pod failure policy (the agent gave up) ends the set; one failed by
    pod losses past `backoffLimit` restarts it, up to `k8s.jobset_restarts` times."""
    return {
        "maxRestarts": spec.jobset_restarts,
        "rules": [
            {"name": "agent-gave-up", "action": "FailJobSet",
             "onJobFailureReasons": ["PodFailurePolicy"]},
        ],
    }  # fmt: skip


def _jobset_env() -> list[dict[str, Any]]:
    """The JobSet annotations, through the downward API (JobSet sets no variable itself)."""
    return [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": _ANNOTATION.format(key)}}}
        for name, key in JOBSET_ENV
    ]


def _pod_ip() -> dict[str, Any]:
    """POD_IP, the agent's `local_addr` (`$(POD_IP)` in the args): the address the other pods
    reach, which a pod's own host name may not be."""
    return {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
