"""summary.json: how a launch ended on this node, every failure record and the root cause; and
its writer (`save_summary`), which a full disk does not stop.

The console report and `elastic-hydra report` both render this same `RunSummary`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Sequence

from elastic_hydra.agent.events import Event
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.plan import Command, LaunchPlan, PythonModule, PythonScript
from elastic_hydra.records.failures import FailureRecord, job_root_cause, signal_name
from elastic_hydra.records.goodput import Ledger
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.redact import redact
from elastic_hydra.report import notices
from elastic_hydra.rundir import RunDir, write_kept


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
    if outcome.status in (Status.FAILED, Status.EXCLUDED):
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
        failure_class=outcome.failure_class if cause is None else cause.failure_class,
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
    from elastic_hydra.report import goodput  # at the agent's end: not before the workers start

    held = {gpu.uuid for worker in plan.devices for gpu in worker.gpus}
    return goodput.ledger(events, node=host, start=start, end=end, gpus=len(held))


def save_summary(run: RunDir, summary: RunSummary, disk_full: Sequence[str] = ()) -> RunSummary:
    """summary.json, or the same JSON on stderr when it cannot be written (the run dir was
    removed): the job's outcome and exit code stay what they are. Returns the summary saved.

    On a full disk it goes into the room kept for it since the start (`RunDir.reserve_end`),
    without its list of every failure and exit when the whole would not fit. Its message names
    the full disk then, and whatever else it cost (`disk_full`: "events.jsonl stops early").
    """
    full = _naming_the_disk(summary, disk_full)
    room = _naming_the_disk(summary, [*disk_full, ROOM_USED.format(file=run.summary.name)])
    text = _json(full)
    try:
        if write_kept(run.summary, text, [_json(room), _json(_short(room))]):
            return room
    except OSError as exc:
        notices.warn(f"cannot write {run.summary} ({exc.strerror}); the summary follows")
        with contextlib.suppress(OSError):
            sys.stderr.write(text)
            sys.stderr.flush()
    return full


DISK_FULL = "no space left on device in the run dir"  # then what it cost, in the message
ROOM_USED = "{file} written in the room kept for it"
SUMMARY_ROOM = 128 << 10  # bytes kept for summary.json (a summary with 20 tracebacks: ~60 KiB)
RESULT_ROOM = 16 << 10  # result.json, which holds the summary when it fits


def _naming_the_disk(summary: RunSummary, costs: Sequence[str]) -> RunSummary:
    if not costs:
        return summary
    note = f"{DISK_FULL}: {', '.join(costs)}"
    message = f"{summary.message}; {note}" if summary.message else note
    return dataclasses.replace(summary, message=message)


def _short(summary: RunSummary) -> RunSummary:
    """The summary without its lists (every failure and exit): what fits a full disk's room."""
    return dataclasses.replace(summary, failures=(), job_failures=(), exits=(), peer_failures=())


def _json(summary: RunSummary) -> str:
    return json.dumps(redact(summary.to_json()), indent=2, default=str) + "\n"
