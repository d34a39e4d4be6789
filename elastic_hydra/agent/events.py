"""The run's timeline: one JSON object per event in `events.jsonl`. Pure: building, not writing."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class EventKind(enum.Enum):
    JOINING = "joining"  # the agent waits for a rendezvous round to complete
    RENDEZVOUS = "rendezvous"  # a rendezvous round completed
    WORKERS_STARTED = "workers_started"  # pids of the attempt's workers
    WORKER_EXITED = "worker_exited"  # exit code or signal of one worker
    RESTART = "restart"  # the group restarts: reason and delay
    MEMBERSHIP = "membership"  # a node joined, left or ended the job while the workers ran
    EXIT_BARRIER = "exit_barrier"  # after success: how long this node waited for the others
    SIGNAL = "signal"  # the agent received a signal
    STOPPING = "stopping"  # a signal stops the workers: how many, and the grace
    STOP = "stop"  # workers were stopped: why, and pids that would not die
    HANG = "hang"  # no rank made progress for hang.timeout: the verdict, then the action
    FINISH = "finish"  # the run ended: status and exit code


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: EventKind
    wall_time: float  # seconds since the epoch
    mono_time: float  # time.monotonic(), comparable within one host
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """One line of events.jsonl."""
        record = {"event": self.kind.value, "time": self.wall_time, "monotonic": self.mono_time}
        return json.dumps({**record, **self.data}, default=str)
