"""A hang as typed records: where each rank was (`HangRank`, its process groups' collectives in
`GroupState`) and the verdict with its action (`HangRecord`). Pure.

`hangs/` finds and shares them; summary.json, the report and `elastic-hydra stacks` show them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from elastic_hydra.jsonrecord import JsonRecord
from elastic_hydra.plan import HangAction


class RankState(enum.StrEnum):
    """Where a rank of a hung job was found."""

    DUMPED = "dumped"  # its stacks are in HangRank.threads
    STOPPED = "stopped"  # SIGSTOPped: it cannot dump
    EXITED = "exited"
    NO_DUMP = "no_dump"  # not run through the bootstrap (cmd=, bootstrap=false) and no py-spy


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupState(JsonRecord):
    """One process group's collectives on one rank, when its job was found hung: the last it
    issued (torch's sequence number) and, from the Flight Recorder, the last it completed and
    the last collective's op and input sizes ("" and None where the recorder is off)."""

    group: str  # torch.distributed's name of the group ("0": the default group)
    issued: int
    completed: int | None = None
    op: str = ""  # e.g. gloo:all_reduce
    sizes: str = ""  # its input sizes, e.g. [[2, 3]]


@dataclass(frozen=True, slots=True, kw_only=True)
class HangRank(JsonRecord):
    """Where one rank was when its job was found hung."""

    rank: int
    local_rank: int
    pid: int
    host: str = ""
    node_rank: int | None = None
    state: RankState
    file: str = ""  # the innermost frame of the user's code
    line: int = 0
    function: str = ""
    code: str = ""  # that line's source
    call: str = ""  # the library call below it, e.g. torch.distributed...all_reduce
    odd: bool = False  # in the odd group out
    threads: tuple[dict[str, Any], ...] = ()  # {"thread_id", "main", "frames": [...]}
    groups: tuple[GroupState, ...] = ()  # its collectives by process group
    no_groups: str = ""  # why there are none: torch.distributed not in use, no answer, ...


@dataclass(frozen=True, slots=True, kw_only=True)
class HangRecord(JsonRecord):
    """A hang: no rank made progress for `idle_s` seconds; every rank's place, then the action."""

    verdict: str
    idle_s: float
    timeout_s: float
    action: HangAction
    attempt: int
    time: float  # when it was found (wall clock)
    ranks: tuple[HangRank, ...] = ()
