"""`--plan=jobset` and `--plan=trainjob`: the job's Kubernetes manifests, as YAML for
`kubectl apply -f -`.

The pods run `elastic-hydra` on the same job file (shipped in a ConfigMap, or `k8s.job_file` in
the image) with the same overrides, plus the preset's: `rdzv=jobset` (or `rdzv=kubeflow` under
Trainer, which sets PET_*), the job's `nnodes`, and `local_addr=$(POD_IP)`. The job is resolved
as pod 0 will resolve it before anything is printed, so a manifest is only printed for a job its
pods can launch. What the manifests hold, and who restarts what: `schedulers.manifests`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml  # type: ignore[import-untyped]

from elastic_hydra.config import boundary
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.errors import ConfigError
from elastic_hydra.launch import job
from elastic_hydra.schedulers import manifests
from elastic_hydra.schedulers.manifests import K8sSpec, Workload

# Keys the manifest sets for the pods: the command's own values of them are not passed on.
_SET_HERE = ("rdzv", "rdzv.backend", "rdzv.endpoint", "rdzv.is_host", "nnodes", "local_addr")


def show_manifest(inv: Invocation) -> int:
    """Print the manifests of `--plan=jobset|trainjob` (`inv.plan`).

    Raises:
        ConfigError: a sweep, torchrun's flags, a bad `k8s.*` key, a job its pods cannot run.
    """
    kind = inv.plan or "jobset"
    if inv.multirun or inv.torchrun:
        raise ConfigError(
            "--plan", f"={kind} writes the manifest of one job file or key=value command",
            kind, "drop -m / torchrun's flags (elastic-hydra --plan=yaml ... writes a job file)",
        )  # fmt: skip
    cfg, _ = boundary.compose(inv)
    stem = inv.job.stem if inv.job else None
    spec = job.k8s_of(cfg.job(), stem)
    nnodes = str(cfg.job().conf.nnodes)
    preset = ["rdzv=jobset", f"rdzv.endpoint=:{manifests.RDZV_PORT}"] if kind == "jobset" else [
        "rdzv=kubeflow"]  # fmt: skip
    kept = [w for w in _override_words(inv) if not _set_here(w)]
    tail = ["--", *inv.script_args] if inv.script_args else []
    args = (*kept, *preset, f"nnodes={nnodes}", "local_addr=$(POD_IP)", *tail)
    pod_inv = dataclasses.replace(
        inv,
        overrides=(*[o for o in inv.overrides if not _set_here(o)], *preset, f"nnodes={nnodes}",
                   "local_addr=127.0.0.1"),
        plan=None,
    )  # fmt: skip
    pod_cfg, _ = boundary.compose(pod_inv)
    plan = job.pod_plan_of(pod_cfg.job(), _pod0_env(kind, spec, nnodes))
    text = None if spec.job_file or inv.job is None else inv.job.read_text()
    work = Workload(
        job_text=text,
        args=args,
        nnodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        stop_grace=plan.stop_grace,
    )
    docs = manifests.jobset(spec, work) if kind == "jobset" else manifests.trainjob(spec, work)
    print(dump(docs), end="")
    return 0


def _override_words(inv: Invocation) -> list[str]:
    """The key=value words the user typed (before `--`), byte for byte."""
    words = list(inv.words)
    if "--" in words:
        words = words[: words.index("--")]
    kept = []
    for word in words:
        if word.startswith("--plan") or (inv.job is not None and "=" not in word
                                         and word.endswith((".yaml", ".yml"))):  # fmt: skip
            continue
        if word.startswith("-") or "=" not in word:
            raise ConfigError(
                "--plan", "writes a manifest of a job file and key=value overrides only",
                word, "drop Hydra's flags from the command",
            )  # fmt: skip
        kept.append(word)
    return kept


def _set_here(word: str) -> bool:
    key = word.partition("=")[0].lstrip("+~")
    return key in _SET_HERE or key.startswith("k8s.") or key == "k8s"


def _pod0_env(kind: str, spec: K8sSpec, nnodes: str) -> dict[str, str]:
    """The scheduler's variables of pod 0, for the check that the pods can launch the job."""
    if kind == "jobset":
        return {
            "JOBSET_NAME": spec.name,
            "REPLICATED_JOB_NAME": manifests.REPLICATED_JOB,
            "JOB_COMPLETION_INDEX": "0",
        }
    count = nnodes.rpartition(":")[2].strip() or "1"
    return {
        "PET_NNODES": count if count.isdigit() else "1",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": f"{spec.name}-{manifests.REPLICATED_JOB}-0-0.{spec.name}",
        "PET_MASTER_PORT": str(manifests.RDZV_PORT),
    }


def _literal(dumper: Any, text: str) -> Any:
    """Multi-line strings (the job file) as YAML literal blocks, readable in the manifest."""
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    pass


_Dumper.add_representer(str, _literal)


def dump(docs: list[dict[str, Any]]) -> str:
    """The manifests as one YAML stream, `---` between them."""
    return "---\n".join(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100) for doc in docs)
