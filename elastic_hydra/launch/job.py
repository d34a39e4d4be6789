"""One launch of a composed job: its plan, its private run dir, the saved config, the agent, the
result. A command runs one job, or one per point of a sweep.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_hydra import stopsignals
from elastic_hydra.config import boundary
from elastic_hydra.config.boundary import JobContext
from elastic_hydra.config.composed import Composed, ComposedJob, to_yaml
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.errors import EXIT_CONFIG, ConfigError
from elastic_hydra.plan import LaunchPlan, QuarantineSpec, to_dict
from elastic_hydra.records.failures import signal_name
from elastic_hydra.records.summary import JobResult, RunStatus, RunSummary
from elastic_hydra.redact import redact, redact_env
from elastic_hydra.report.notices import warn
from elastic_hydra.report.summary import save_summary
from elastic_hydra.resolve import timeouts
from elastic_hydra.resolve.quarantine import resolve_quarantine
from elastic_hydra.resolve.resolver import resolve_config
from elastic_hydra.rundir import LOGS_ROOT, PRIVATE_DIR, RunDir, write_kept, write_private

if TYPE_CHECKING:  # resolve.kubernetes loads for `--plan=jobset|trainjob` only
    from elastic_hydra.resolve.kubernetes import K8sSpec


class SweepStopped(BaseException):
    """A signal stopped a launch: the rest of the sweep must not start.

    A BaseException, so that Hydra's job runner, which records an Exception and moves on to the
    next job, lets it through. A launcher that ran jobs elsewhere (the pool) hands back what
    they returned, as `returned`.
    """

    def __init__(self, exit_code: int, returned: Sequence[object] = ()) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code
        self.returned = list(returned)


def run_command(inv: Invocation) -> int:
    """Run every job of the command; the exit code of the run, or of the sweep as a whole."""
    runner = JobRunner()
    stopped: int | None = None
    returned: list[Any] = []
    try:
        returned = boundary.run(inv, runner)
    except SweepStopped as exc:
        stopped, returned = exc.exit_code, exc.returned
    results = runner.with_returned(returned)
    if inv.multirun or any(r.swept for r in results):
        from elastic_hydra.report import render

        render.print_sweep(results)
        if stopped is not None:
            return stopped
        return 0 if all(r.exit_code == 0 for r in results) else 1
    if stopped is not None:
        return stopped
    return results[-1].exit_code if results else 0


def plan_of(job: ComposedJob, ctx: JobContext) -> LaunchPlan:
    """The plan of a composed job (the dry run's and the launch's).

    Raises:
        ConfigError: bad input.
    """
    plan = resolve_config(
        job,
        run_dir=str(ctx.run_dir),
        launch_time=ctx.launch_time,
        sweep_job=ctx.overrides if ctx.swept else None,
    )
    for line in timeouts.derive(plan).warnings:  # the refusals were raised by resolve
        warn(line)
    return plan


def quarantine_of(job: ComposedJob) -> QuarantineSpec | None:
    """The quarantine ledger a composed job names (`elastic-hydra quarantine JOB.yaml`): its
    `quarantine.*` keys alone are resolved, so the job need not run on this machine.

    Raises:
        ConfigError: bad input in `quarantine.*`.
    """
    return resolve_quarantine(job.conf.quarantine, os.getcwd())


def plan_dict(plan: LaunchPlan) -> dict[str, Any]:
    """plan.json's content: the plan, secret values of its extra environment masked, and its run
    id as torch has it."""
    return {**to_dict(plan), "run_id": plan.torch_run_id, "env": redact_env(plan.env)}


Prepared = tuple[ComposedJob, LaunchPlan, RunDir]  # a plain run's, checked before Hydra's runner


@dataclass(slots=True)
class JobRunner:
    """Runs the jobs Hydra composes and keeps their results."""

    results: list[JobResult] = field(default_factory=list)

    def prepare(self, cfg: Composed, ctx: JobContext) -> Prepared:
        """Resolve a plain run and make its private run dir, before anything else is written.

        Raises:
            ConfigError: bad input, or a `logs.root` where no run dir can be made; nothing is left.
        """
        job = cfg.job()
        plan = plan_of(job, ctx)
        root = job.conf.logs.root
        try:
            run = RunDir.create(ctx.run_dir, logs_root=Path(root))
        except OSError as exc:
            raise ConfigError(
                "logs.root",
                f"cannot make the run directory {exc.filename or ctx.run_dir} ({exc.strerror})",
                root,
                f"expected a writable directory, e.g. logs.root=$HOME/{LOGS_ROOT}",
            ) from None
        return job, plan, run

    def with_returned(self, returned: list[Any]) -> list[JobResult]:
        """The results of the jobs run here, then those that ran elsewhere (Hydra's launcher
        returned them: a Slurm node's, a pool process's)."""
        seen = {r.run_dir for r in self.results}
        elsewhere = [r for r in returned if isinstance(r, JobResult) and r.run_dir not in seen]
        return [*self.results, *elsewhere]

    def __call__(self, cfg: Composed, ctx: JobContext, prepared: Prepared | None) -> JobResult:
        if prepared is None:  # a sweep's job, in the dir Hydra's launcher made
            run = RunDir(ctx.run_dir)
            run.make_private()
            try:
                job = cfg.job()
                plan = plan_of(job, ctx)
            except ConfigError as exc:
                # Reported here, not raised: Hydra would add its own line, and a sweep must go on.
                print(f"elastic-hydra: error: {exc.line()}", file=sys.stderr)
                save_config(run, ctx, cfg.unresolved())
                return self._record(_result(ctx, EXIT_CONFIG, exc.line()))
        else:
            job, plan, run = prepared
        if plan.run_dir != str(run.root):  # one of several nodes: its own dir in the job's
            run = RunDir(Path(plan.run_dir))
            run.root.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        save_config(run, ctx, job.unresolved, (job.resolved, plan))
        from elastic_hydra.launch import wiring

        if (signum := stopsignals.pending_signal()) is not None:  # stopped before anything ran
            stopped = _stopped_before_the_launch(plan, signum)
            save_summary(run, stopped)
            self._record(_result(ctx, stopped.exit_code, stopped.message, stopped, run=run))
            raise SweepStopped(stopped.exit_code)

        code, summary = wiring.run(plan)
        result = self._record(_result(ctx, code, summary.message, summary, run=run))
        if code > 128 and ctx.swept:
            raise SweepStopped(code)
        return result

    def _record(self, result: JobResult) -> JobResult:
        self.results.append(result)
        path = RunDir(Path(result.run_dir)).result
        whole, short = (
            json.dumps(redact(r.to_json()), indent=2, default=str) + "\n"
            for r in (result, replace(result, summary=None))  # short: fits a full disk's room
        )
        try:
            write_kept(path, whole, [whole, short])
        except OSError as exc:  # the run dir was removed or the disk is full: the code counts
            warn(f"cannot write {path.name} ({exc.strerror}: {exc.filename})")
        return result


def _stopped_before_the_launch(plan: LaunchPlan, signum: int) -> RunSummary:
    """The summary of a launch that a signal stopped after its run dir was made, before any
    worker started (Ctrl-C during the start-up): `report` shows it like any other."""
    from elastic_hydra.launch.worker_factory import host_name
    from elastic_hydra.report.summary import entrypoint_name

    return RunSummary(
        status=RunStatus.STOPPED,
        exit_code=128 + signum,
        message="stopped before the launch",
        entrypoint=entrypoint_name(plan),
        started=time.time(),
        host=host_name(),
        run_id=plan.torch_run_id,
        run_dir=plan.run_dir,
        signal=signal_name(signum),
    )


def _result(
    ctx: JobContext,
    code: int,
    message: str,
    summary: RunSummary | None = None,
    *,
    run: RunDir | None = None,
) -> JobResult:
    return JobResult(
        overrides=tuple(ctx.overrides),
        exit_code=code,
        run_dir=str(run.root if run else ctx.run_dir),
        message=message,
        summary=summary,
        swept=ctx.swept,
    )


def save_config(
    run: RunDir,
    ctx: JobContext,
    unresolved: dict[str, Any],
    planned: tuple[dict[str, Any], LaunchPlan] | None = None,
) -> None:
    """Hydra's saved config (.hydra/), and for a job that resolved, the config resolved once and
    its plan (`planned`); secrets masked.

    Resolved once (`ComposedJob.resolved`), so workers that use Hydra see one set of values
    (e.g. one ${now:}).
    """
    run.hydra_dir.mkdir(mode=PRIVATE_DIR, exist_ok=True)
    saved: dict[Path, Any] = {
        run.saved_config: unresolved,
        run.saved_hydra: {"hydra": ctx.hydra_cfg},
        run.saved_overrides: ctx.overrides,
    }
    if planned is not None:
        saved[run.config] = planned[0]
    texts: dict[str, str] = {}  # by repr: a job without interpolations resolves to itself
    for path, data in saved.items():
        masked = redact(data)
        key = repr(masked)  # tells 1, 1.0 and True apart, as YAML does
        if key not in texts:
            texts[key] = to_yaml(masked)
        write_private(path, texts[key])
    if planned is not None:
        write_private(run.plan, json.dumps(plan_dict(planned[1]), indent=2) + "\n")


def pod_plan_of(job: ComposedJob, pod_env: dict[str, str]) -> LaunchPlan:
    """The plan a manifest's pod 0 will run (`--plan=jobset/trainjob`): see
    `resolve.kubernetes.pod_plan`.

    Raises:
        ConfigError: the pods could not launch this job.
    """
    from elastic_hydra.resolve import kubernetes

    return kubernetes.pod_plan(job, pod_env)


def k8s_of(job: ComposedJob, job_stem: str | None) -> K8sSpec:
    """The job's `k8s.*` keys, validated (`resolve.kubernetes.resolve_k8s`).

    Raises:
        ConfigError: a key Kubernetes would refuse, or no image.
    """
    from elastic_hydra.resolve import kubernetes

    return kubernetes.resolve_k8s(job.conf.k8s, fallback_name=kubernetes.default_name(job_stem))
