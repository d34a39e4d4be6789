"""What a failed worker left behind: its error file, a crash dump, the tail of its stderr.

Read once, when its exit is seen, into its `FailureRecord`: the agent keeps that record for the
collateral check, the rendezvous store and the summary. Whatever the files hold (a worker may
write anything to its error file), reading them never raises.
"""

from __future__ import annotations

import json
import linecache
import os
from dataclasses import replace
from pathlib import Path

from elastic_hydra.records.failures import FailureRecord, FailureSource, WorkerExit
from elastic_hydra.rundir import RunDir
from elastic_hydra.tracebacks import (
    Stack,
    exception_line,
    hide_launcher_frames,
    parse_error_record,
    parse_fault,
    parse_python,
)

# Enough of a log's end to find a traceback or a crash dump in it, however long the log is.
_TAIL_BYTES = 256 * 1024


def read_failure(run: RunDir, exit: WorkerExit, *, host: str, tail_lines: int) -> FailureRecord:
    """The record of `exit`'s worker (on `host`): how it ended and, from the files of its
    attempt, why."""
    error_file = run.error_file(exit.attempt, exit.local_rank)
    stderr_log = run.stderr(exit.attempt, exit.local_rank)
    tail_text = read_tail(stderr_log)
    lines = tail_text.splitlines()
    base = replace(
        FailureRecord.of(exit, host=host),
        stderr_tail=tuple(lines[-tail_lines:]) if tail_lines else (),
        stdout_log=str(run.stdout(exit.attempt, exit.local_rank)),
        stderr_log=str(stderr_log),
    )
    if (record := _read_json(error_file)) is not None and (
        parsed := _parse_error_record(record)
    ) is not None:
        message, stacks, reported = parsed
        ours = "elastic_hydra" in record  # the bootstrap's record, else torch's @record
        return replace(
            base,
            source=FailureSource.EXCEPTION if ours else FailureSource.ERROR_FILE,
            message=message,
            traceback=stacks,
            # When it failed: its own record's time, unless the exit was seen earlier.
            time=exit.wall_time if reported is None else min(reported, exit.wall_time),
            error_file=str(error_file),
        )
    fault_dump = read_tail(run.fault_file(exit.attempt, exit.local_rank))
    if (crash := parse_fault(fault_dump) or parse_fault(tail_text)) is not None:
        stacks = hide_launcher_frames([_with_source_lines(crash)])
        return replace(
            base,
            source=FailureSource.CRASH,
            message=f"Fatal Python error: {crash.exc_value}",
            traceback=stacks,
        )
    if stacks := hide_launcher_frames(parse_python(tail_text)):
        # Lines printed after a traceback (atexit handlers, warnings) would read as the end of
        # its message: from a log, keep the message's first line.
        last = stacks[-1]
        last = replace(last, exc_value=last.exc_value.split("\n", 1)[0])
        stacks = (*stacks[:-1], last)
        return replace(
            base, source=FailureSource.STDERR, message=exception_line(last), traceback=stacks
        )
    return base


def _with_source_lines(stack: Stack) -> Stack:
    """faulthandler prints no source: add each frame's line, as a traceback shows it."""
    frames = tuple(
        replace(f, line=f.line or linecache.getline(f.filename, f.lineno).strip())
        for f in stack.frames
    )
    return replace(stack, frames=frames)


def read_tail(path: Path, limit: int = _TAIL_BYTES) -> str:
    """The last `limit` bytes of a file as text ('' if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    if len(data) == limit and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]  # drop the partial first line
    return data.decode("utf-8", errors="replace")


def _parse_error_record(
    record: dict[str, object],
) -> tuple[str, tuple[Stack, ...], float | None] | None:
    """The error file's message, stacks and time; None when it is not one of torch's forms."""
    try:
        return parse_error_record(record)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
