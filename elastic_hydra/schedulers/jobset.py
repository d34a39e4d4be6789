"""JobSet: a pod of a JobSet whose one replicated job runs one launcher per pod.

What a JobSet pod is given, from the controllers' sources:

- the Job controller (kubernetes, pkg/controller/job/indexed_job_utils.go
  `addCompletionIndexEnvVariables`) sets `JOB_COMPLETION_INDEX` in every container of an
  Indexed Job's pod, and job_controller.go gives the pod the hostname `<job-name>-<index>`;
- the JobSet controller (kubernetes-sigs/jobset, pkg/controllers/jobset_controller.go
  `constructJob`/`labelAndAnnotateObject`) names each Job `<jobset>-<replicatedJob>-<jobIndex>`,
  sets the pods' subdomain to `spec.network.subdomain` (default: the JobSet's name) and creates
  that headless service when `network.enableDNSHostnames` is on (the default), and puts the
  labels/annotations `jobset.sigs.k8s.io/jobset-name`, `.../replicatedjob-name`,
  `.../job-index` and `.../restart-attempt` on the pod template.

So node 0 is `<jobset>-<replicatedJob>-0-0.<subdomain>`. The annotations reach the container
only through the downward API: the manifests of `manifests.py` map them onto `JOBSET_NAME`,
`REPLICATED_JOB_NAME`, `JOB_INDEX` and `JOBSET_RESTART_ATTEMPT` (and `JOBSET_SUBDOMAIN` where
the subdomain is not the JobSet's name). The node count is the job file's `nnodes` (the pods'
parallelism); JobSet gives the pod no variable for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_hydra.schedulers.base import SchedulerError, SchedulerNode, count, host

NAME = "jobset"
_FIX = (
    "run inside a JobSet pod whose template maps the jobset.sigs.k8s.io/jobset-name and "
    "replicatedjob-name annotations onto JOBSET_NAME and REPLICATED_JOB_NAME (elastic-hydra "
    "--plan=jobset writes such a manifest), or pick rdzv=c10d"
)


def present(environ: Mapping[str, str]) -> bool:
    return "JOBSET_NAME" in environ


def read(environ: Mapping[str, str]) -> SchedulerNode:
    """This pod of a JobSet.

    Raises:
        SchedulerError: a variable is missing, malformed or contradicts another.
    """
    name = host(environ, "JOBSET_NAME", _FIX)
    rjob = host(environ, "REPLICATED_JOB_NAME", _FIX)
    index = count(environ, "JOB_COMPLETION_INDEX", _FIX)
    job_index = count(environ, "JOB_INDEX", _FIX) if "JOB_INDEX" in environ else 0
    if job_index != 0:
        raise SchedulerError(
            "JOB_INDEX", f"={job_index}: elastic-hydra runs one Job of N pods per JobSet",
            "set replicas: 1 on the replicated job and parallelism/completions to the node count",
        )  # fmt: skip
    subdomain = host(environ, "JOBSET_SUBDOMAIN", _FIX) if "JOBSET_SUBDOMAIN" in environ else name
    attempt = environ.get("JOBSET_RESTART_ATTEMPT", "0").strip() or "0"
    if not attempt.isdigit():
        raise SchedulerError("JOBSET_RESTART_ATTEMPT", f"is not a number (got {attempt!r})", _FIX)
    names = ("JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_INDEX", "JOB_COMPLETION_INDEX",
             "JOBSET_SUBDOMAIN", "JOBSET_RESTART_ATTEMPT")  # fmt: skip
    return SchedulerNode(
        scheduler=NAME,
        flavour="JobSet pod",
        node_rank=index,
        rank_variable="JOB_COMPLETION_INDEX",
        nnodes=None,
        master=f"{name}-{rjob}-0-0.{subdomain}",
        port=None,
        # A JobSet restart recreates every pod, and the store with them: a new attempt, a new id.
        run_id=f"{name}-{attempt}",
        variables=tuple((n, environ[n].strip()) for n in names if n in environ),
    )
