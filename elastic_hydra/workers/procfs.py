"""The one reader of /proc/PID/stat: a process's state, parent, group, session and CPU time.

The command name (the second field) is in parentheses and may hold spaces and parentheses of
its own: the fields are those after its last `)`. A process that is gone, or that ended while it
was read, has no `Stat` (None). Linux only, as the rest of this folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat:
    """What /proc/PID/stat says of a process (proc(5)'s fields 3 to 6, 14 and 15)."""

    state: str  # R, S, D, Z (zombie), T (stopped), t (traced), X (dead), ...
    ppid: int
    pgrp: int
    session: int
    cpu_seconds: float  # user + system, all its threads

    @property
    def stopped(self) -> bool:
        """SIGSTOP, SIGTSTP or a debugger: it cannot run (nor dump its stacks)."""
        return self.state in ("T", "t")

    @property
    def live(self) -> bool:
        """Neither a zombie nor dead: a signal still reaches it."""
        return self.state not in ("Z", "X")


def stat(pid: int) -> Stat | None:
    """The process's /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return Stat(
            state=fields[0].decode(),
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            session=int(fields[3]),
            cpu_seconds=(int(fields[11]) + int(fields[12])) / _TICKS,
        )
    except (IndexError, ValueError):  # read as it went
        return None


def state(pid: int) -> str:
    """The process's state letter ("" when it is gone)."""
    found = stat(pid)
    return "" if found is None else found.state


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (None: gone)."""
    found = stat(pid)
    return None if found is None else found.cpu_seconds


def pids() -> list[int]:
    """Every process's pid, as /proc lists them now."""
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
