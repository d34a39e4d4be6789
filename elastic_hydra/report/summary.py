"""summary.json: how a launch ended on this node, every failure record and the root cause.

The console report and `elastic-hydra report` both render this same `RunSummary`.
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic_hydra.agent.events import Event
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.plan import Command, LaunchPlan, PythonModule, PythonScript
from elastic_hydra.records.failures import FailureRecord, job_root_cause, signal_name
from elastic_hydra.records.goodput import Ledger
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.report import goodput


def summarize(
    plan: LaunchPlan,
    outcome: RunOutcome,
    *,
    host: str,
    started: float,
    duration: float,
    job_failures: Sequence[FailureRecord] = (),
    ledger: Ledger | None = None,
) -> RunSummary:
    """The summary of one launch on this node.

    `job_failures` are the records every node published to the rendezvous store: the root cause
    is then the job's earliest real failure, on whichever node it happened.
    """
    cause = None
    if outcome.status is Status.FAILED:
        cause = job_root_cause(job_failures) or job_root_cause(outcome.failures)
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
        failures=outcome.failures,
        job_failures=tuple(job_failures),
        exits=outcome.exits,
        hang=outcome.hang,
        peer_failures=outcome.peer_failures,
        ledger=ledger,
        preflight=outcome.preflight,
    )


def entrypoint_name(plan: LaunchPlan) -> str:
    match plan.entrypoint:
        case PythonScript(path=path):
            return path
        case PythonModule(name=name):
            return f"-m {name}"
        case Command(program=program):
            return program


def node_ledger(
    plan: LaunchPlan, events: Sequence[Event], *, host: str, start: float, end: float
) -> Ledger:
    """This node's goodput ledger (`start`, `end`: the agent's, on the monotonic clock); its
    GPUs are those the plan gives its workers (none where it leaves devices alone)."""
    held = {gpu.uuid for worker in plan.devices for gpu in worker.gpus}
    return goodput.ledger(events, node=host, start=start, end=end, gpus=len(held))
