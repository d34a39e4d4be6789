"""summary.json: how a launch ended on this node, every failure record and the root cause.

The console report and `elastic-hydra report` both render this same `RunSummary`.
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic_hydra.agent.outcome import RunOutcome, Status, WorkerExit, WorkerFailure
from elastic_hydra.plan import Command, LaunchPlan, PythonModule, PythonScript, to_dict
from elastic_hydra.records import (
    ExitRecord,
    FailureRecord,
    RunStatus,
    RunSummary,
    describe_returncode,
    job_root_cause,
    signal_name,
)


def summarize(
    plan: LaunchPlan,
    outcome: RunOutcome,
    failures: Sequence[WorkerFailure],
    *,
    host: str,
    started: float,
    duration: float,
    job_failures: Sequence[FailureRecord] = (),
) -> RunSummary:
    """The summary of one launch on this node.

    `job_failures` are the records every node published to the rendezvous store: the root cause
    is then the job's earliest real failure, on whichever node it happened.
    """
    local = tuple(failure_record(f) for f in failures)
    cause = None
    if outcome.status is Status.FAILED:
        cause = job_root_cause(job_failures) or job_root_cause(local)
    return RunSummary(
        status=RunStatus(outcome.status.value),
        exit_code=outcome.exit_code,
        message=outcome.reason,
        entrypoint=entrypoint_name(plan),
        attempts=outcome.attempts,
        restarts=outcome.restarts,
        started=started,
        duration_s=round(duration, 6),
        host=host,
        run_id=plan.torch_run_id,
        run_dir=plan.run_dir,
        signal=signal_name(outcome.signal) if outcome.signal else None,
        stuck_pids=outcome.stuck_pids,
        root_cause=cause,
        failures=local,
        job_failures=tuple(job_failures),
        exits=tuple(exit_record(e) for e in outcome.exits),
        hang=outcome.hang,
        peer_failures=outcome.peer_failures,
    )


def exit_record(e: WorkerExit) -> ExitRecord:
    told = describe_returncode(e.returncode)
    return ExitRecord(
        local_rank=e.local_rank,
        rank=e.rank,
        pid=e.pid,
        returncode=e.returncode,
        wall_time=e.wall_time,
        mono_time=e.mono_time,
        attempt=e.attempt,
        restart_count=e.restart_count,
        terminated_by_launcher=e.terminated_by_launcher,
        after_node_loss=e.after_node_loss,
        signal=told.signal,
        exit=told.explained,
    )


def failure_record(failure: WorkerFailure) -> FailureRecord:
    e, d = failure.exit, failure.detail
    told = describe_returncode(e.returncode)
    return FailureRecord(
        rank=e.rank,
        local_rank=e.local_rank,
        host=failure.host,
        pid=e.pid,
        attempt=e.attempt,
        restart_count=e.restart_count,
        returncode=e.returncode,
        signal=told.signal,
        exit=told.explained,
        time=failure.time,
        terminated_by_launcher=e.terminated_by_launcher,
        after_node_loss=e.after_node_loss,
        source=d.source,
        message=d.message,
        traceback=tuple(to_dict(d.stacks)),
        error_file=d.error_file,
        stderr_tail=d.stderr_tail,
        stdout_log=d.stdout_log,
        stderr_log=d.stderr_log,
    )


def entrypoint_name(plan: LaunchPlan) -> str:
    match plan.entrypoint:
        case PythonScript(path=path):
            return path
        case PythonModule(name=name):
            return f"-m {name}"
        case Command(program=program):
            return program
