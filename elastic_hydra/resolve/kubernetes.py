"""The `k8s.*` keys, validated, and the plan a manifest's pods will run.

`--plan=jobset` and `--plan=trainjob` resolve the job as its pod 0 will (the preset's overrides
applied, the scheduler's variables of pod 0 given), so a manifest is only printed for a job that
its pods can launch; then the `k8s.*` keys become a `K8sSpec`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from elastic_hydra.config.composed import ComposedJob
from elastic_hydra.config.schema import K8sConf
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import LaunchPlan
from elastic_hydra.resolve.resolver import Host, resolve_config
from elastic_hydra.schedulers.manifests import SHM_AUTO, K8sSpec, quantity

__all__ = ["K8sSpec", "default_name", "pod_plan", "resolve_k8s"]

# A DNS-1035 label: the JobSet's name starts a pod's host name, `<name>-node-0-<i>`, which must
# stay within 63 characters (the Job controller's limit), with room for the indexes.
MAX_NAME = 40
_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")


def resolve_k8s(conf: K8sConf, *, fallback_name: str) -> K8sSpec:
    """The `k8s.*` keys of a job whose manifest is printed.

    Raises:
        ConfigError: a missing image, a name Kubernetes refuses, a negative count, a relative path.
    """
    if not conf.image.strip():
        raise ConfigError(
            "k8s.image", "is needed for a manifest", "", "expected the pods' image, e.g. "
            "k8s.image=ghcr.io/me/train:1.0 (with elastic-hydra, torch and the job's code)",
        )  # fmt: skip
    if not _IMAGE.fullmatch(conf.image) or len(conf.image) > 512:
        raise ConfigError("k8s.image", "not an image reference", conf.image, "e.g. repo/img:tag")
    name = conf.name or fallback_name
    if not _LABEL.fullmatch(name) or len(name) > MAX_NAME:
        raise ConfigError(
            "k8s.name", "not a DNS label Kubernetes accepts here", name,
            f"expected lower-case letters, digits and '-', starting with a letter, at most "
            f"{MAX_NAME} characters (pod names add -node-0-<i>)",
        )  # fmt: skip
    if not _LABEL.fullmatch(conf.namespace) or len(conf.namespace) > 63:
        raise ConfigError("k8s.namespace", "not a namespace name", conf.namespace, "e.g. ml-team")
    account = conf.service_account
    if account is not None and (not _SUBDOMAIN.fullmatch(account) or len(account) > 253):
        raise ConfigError(
            "k8s.service_account", "not a service account name", account, "e.g. trainer"
        )
    for key, path in (("k8s.job_file", conf.job_file), ("k8s.workdir", conf.workdir)):
        if path and not path.startswith("/"):
            raise ConfigError(key, "is not an absolute path", path, "expected e.g. /app/job.yaml")
    for key, count in (
        ("k8s.gpus_per_node", conf.gpus_per_node),
        ("k8s.pod_replacements", conf.pod_replacements),
        ("k8s.jobset_restarts", conf.jobset_restarts),
    ):
        if count < 0:
            raise ConfigError(key, "is negative", count, "expected 0 or more")
    cpu, memory, shm = (
        _quantity("k8s.cpu", conf.cpu, "e.g. 8 or 7500m (cores)", least=0.001),
        _quantity("k8s.memory", conf.memory, "e.g. 64Gi", least=2**20),
        conf.shm if conf.shm == SHM_AUTO else _quantity("k8s.shm", conf.shm, "e.g. 16Gi or auto",
                                                        least=2**20),
    )  # fmt: skip
    if memory is not None and shm not in (None, SHM_AUTO) and quantity(shm) > quantity(memory):
        raise ConfigError(
            "k8s.shm", f"is more than the pod's memory, k8s.memory={memory} (/dev/shm in memory "
            "counts against it: the pod would be OOM-killed filling it)", shm,
            "a size under k8s.memory, or auto (half of it)",
        )  # fmt: skip
    return K8sSpec(
        image=conf.image,
        name=name,
        namespace=conf.namespace,
        service_account=account,
        job_file=conf.job_file,
        workdir=conf.workdir,
        gpus_per_node=conf.gpus_per_node,
        cpu=cpu,
        memory=memory,
        shm=shm,
        pod_replacements=conf.pod_replacements,
        jobset_restarts=conf.jobset_restarts,
    )


def _quantity(key: str, value: str | None, example: str, *, least: float) -> str | None:
    """A resource's quantity as Kubernetes writes it, or None.

    Raises:
        ConfigError: not a quantity, or less than `least` (a millicore, a MiB).
    """
    if value is None:
        return None
    try:
        amount = quantity(str(value))
    except ValueError:
        raise ConfigError(key, "not a Kubernetes quantity", value, example) from None
    if amount < least:
        raise ConfigError(key, "is too small for a pod", value, example)
    return str(value)


def default_name(job_stem: str | None) -> str:
    """`elastic-hydra-<job file name>`, made a DNS label; `elastic-hydra` without a job file."""
    if not job_stem:
        return "elastic-hydra"
    stem = re.sub(r"[^a-z0-9-]+", "-", job_stem.lower()).strip("-")
    return f"elastic-hydra-{stem}"[:MAX_NAME].rstrip("-")


def pod_plan(job: ComposedJob, pod_env: Mapping[str, str]) -> LaunchPlan:
    """The plan pod 0 will run: `job` composed with the preset's overrides, resolved with the
    scheduler's variables of pod 0 on top of this machine's environment.

    Raises:
        ConfigError: the pods could not launch this job.
    """
    host = Host.current()
    host = dataclasses.replace(host, environ={**host.environ, **pod_env})
    return resolve_config(job, host=host)
