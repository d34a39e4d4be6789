"""summary.json: how a launch ended, every failure record, and its root cause, as plain JSON.

The console summary and `elastic-hydra report` both render this same data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from elastic_hydra.outcome import (
    RunOutcome,
    Status,
    WorkerExit,
    WorkerFailure,
    explain_returncode,
    first_failure,
    signal_name,
    signal_of,
)
from elastic_hydra.plan import Command, LaunchPlan, PythonModule, PythonScript, to_dict


def summarize(
    plan: LaunchPlan,
    outcome: RunOutcome,
    failures: Sequence[WorkerFailure],
    *,
    host: str,
    started: float,
    duration: float,
    job_failures: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The machine-readable summary.json of one launch on this node.

    `job_failures` are the records every node published to the rendezvous store: the root cause
    is then the job's earliest real failure, on whichever node it happened.
    """
    cause = first_failure(failures) if outcome.status is Status.FAILED else None
    local = failure_record(cause) if cause else None
    job_cause = job_root_cause(job_failures) if outcome.status is Status.FAILED else None
    return {
        "status": outcome.status.value,
        "exit_code": outcome.exit_code,
        "message": outcome.reason,
        "entrypoint": entrypoint_name(plan),
        "attempts": outcome.attempts,
        "restarts": outcome.restarts,
        "started": started,
        "duration_s": round(duration, 6),
        "host": host,
        "run_id": plan.run_id,
        "run_dir": plan.run_dir,
        "signal": signal_name(outcome.signal) if outcome.signal else None,
        "stuck_pids": list(outcome.stuck_pids),
        "root_cause": job_cause or local,
        "failures": [failure_record(f) for f in failures],
        "job_failures": [dict(f) for f in job_failures],
        "exits": [_exit_record(e) for e in outcome.exits],
    }


def job_root_cause(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The earliest real failure of the latest rendezvous round that had failures."""
    real = [r for r in records if not r.get("terminated_by_launcher")]
    if not real:
        return None
    last = max(r.get("rdzv_round", 0) for r in real)
    return dict(min((r for r in real if r.get("rdzv_round", 0) == last), key=lambda r: r["time"]))


def _exit_record(e: WorkerExit) -> dict[str, Any]:
    return {**to_dict(e), "signal": _signal(e.returncode), "exit": explain_returncode(e.returncode)}


def failure_record(failure: WorkerFailure) -> dict[str, Any]:
    e, d = failure.exit, failure.detail
    return {
        "rank": e.rank,
        "local_rank": e.local_rank,
        "host": failure.host,
        "pid": e.pid,
        "attempt": e.attempt,
        "restart_count": e.restart_count,
        "returncode": e.returncode,
        "signal": _signal(e.returncode),
        "exit": explain_returncode(e.returncode),
        "time": failure.time,
        "terminated_by_launcher": e.terminated_by_launcher,
        "source": d.source,
        "message": d.message,
        "traceback": to_dict(d.stacks),
        "error_file": d.error_file,
        "stderr_tail": list(d.stderr_tail),
        "stdout_log": d.stdout_log,
        "stderr_log": d.stderr_log,
    }


def _signal(returncode: int) -> str | None:
    sig = signal_of(returncode)
    return signal_name(sig) if sig else None


def entrypoint_name(plan: LaunchPlan) -> str:
    match plan.entrypoint:
        case PythonScript(path=path):
            return path
        case PythonModule(name=name):
            return f"-m {name}"
        case Command(program=program):
            return program
