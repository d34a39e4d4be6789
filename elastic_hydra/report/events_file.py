"""`events.jsonl`: written as the run goes on (`EventLog`), and read back: the one reader of a
run's timeline (`report`, `stacks`, the tests).

The file is written one flushed line per event while the run goes on, so it may end in a line
cut short (the agent was killed mid-write) or be read while still growing; and a newer release
may have written kinds this one does not know. Such lines are skipped and counted, never fatal.
A file in a newer format is refused as a whole, with one message.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from elastic_hydra.agent.events import (
    FORMAT,
    Event,
    EventLineError,
    NewerFormatError,
    UnknownEventKindError,
    WarmFallback,
    WorkersStarted,
    event_from_json,
)
from elastic_hydra.errors import ConfigError
from elastic_hydra.report import notices
from elastic_hydra.rundir import open_private


@dataclass(frozen=True, slots=True, kw_only=True)
class EventsRead:
    """A run's events in file order, and the lines that were not read as one."""

    events: tuple[Event, ...]
    unknown: int = 0  # events of kinds this release does not know (a newer one wrote them)
    unreadable: int = 0  # lines that are no event: cut short by a killed agent, or garbled
    file: str = ""  # the file's name, for the notice

    def skipped(self) -> str | None:
        """What was skipped, in words; None when every line was read."""
        parts = []
        if self.unknown:
            parts.append(f"{self.unknown} of a kind this elastic-hydra does not know")
        if self.unreadable:
            parts.append(f"{self.unreadable} that did not read as an event (cut short?)")
        if not parts:
            return None
        return f"{self.unknown + self.unreadable} line(s) of {self.file} skipped: " + (
            ", ".join(parts)
        )


def read_events(path: Path) -> EventsRead:
    """Every event of an events.jsonl, in order.

    Raises:
        OSError: the file cannot be read (FileNotFoundError: the run wrote none).
        ConfigError: a line is in a newer format than this release reads (exit 2, one line).
    """
    events: list[Event] = []
    unknown = unreadable = 0
    for raw in path.read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):  # bad JSON or UTF-8: cut short, or garbled
            unreadable += 1
            continue
        try:
            events.append(event_from_json(obj))
        except NewerFormatError as exc:
            raise ConfigError(
                path.name,
                f"written in format {exc.found}, newer than this elastic-hydra reads",
                str(path),
                f"expected format {FORMAT} or earlier",
                "Read it with the elastic-hydra that wrote it, or upgrade this one.",
            ) from None
        except UnknownEventKindError:
            unknown += 1
        except EventLineError:
            unreadable += 1
    return EventsRead(events=tuple(events), unknown=unknown, unreadable=unreadable, file=path.name)


def last_start(events: Sequence[Event]) -> WorkersStarted | None:
    """The latest start of the worker group (its attempt and pids); None before the first."""
    return next((e for e in reversed(events) if isinstance(e, WorkersStarted)), None)


class EventLog:
    """Appends each event to events.jsonl as it happens (flushed: nothing lost if killed).

    `echo` also shows restarts on the console and, with `multi_node`, the membership story
    (joining, nodes joining or leaving).
    """

    def __init__(self, path: Path, echo: bool = False, multi_node: bool = False) -> None:
        self.file: IO[str] | None = os.fdopen(open_private(path), "a", buffering=1)
        self.name = path.name
        self.events: list[Event] = []
        self.echo = echo
        self.multi_node = multi_node
        self.error: OSError | None = None  # why the timeline stops early

    def emit(self, event: Event) -> None:
        self.events.append(event)
        if self.file is not None:
            try:
                self.file.write(json.dumps(event.to_json()) + "\n")
            except OSError as exc:  # a full disk: the job goes on, the timeline stops here
                notices.warn(f"cannot write {self.name} ({exc.strerror}); no more events saved")
                self.error = exc
                self._close_file()
        if self.echo:
            notices.progress(event, multi_node=self.multi_node)

    def cold(self, reason: str) -> None:
        """Warm starts are off for the rest of the launch (`warm/`): one event, one notice."""
        self.emit(WarmFallback(reason=reason, wall_time=time.time(), mono_time=time.monotonic()))

    def _close_file(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None

    def close(self) -> None:
        self._close_file()


def disk_full(events: EventLog) -> list[str]:
    """What a full disk already cost the run: the timeline that stopped early."""
    error = events.error
    if error is None or error.errno != errno.ENOSPC:
        return []
    return [f"{events.name} stops early"]
