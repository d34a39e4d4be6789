"""Every descendant of a launch's workers, found and stopped at the end, daemons included.

A worker that daemonizes (setsid, double fork) leaves its process group and its parent: neither
the group kill nor PR_SET_PDEATHSIG reaches it, and torchrun leaves it running. Two ways to find
it again:

- a cgroup v2 of this launch, where one is writable (root, or a delegated subtree): each worker is
  moved in before it runs any code (see `supervise`), and everything it ever starts stays in it.
  `cgroup.kill` ends all of them at once, from the agent or, if the agent is SIGKILLed, from its
  guard process.
- otherwise the launch's tag: every worker's environment holds `ELASTIC_HYDRA_RUN_DIR`, and a
  descendant's `/proc/PID/environ` keeps what it inherited. A process that rewrites or clears its
  environment before it daemonizes escapes this fallback; `ELASTIC_HYDRA_CGROUP=off` forces it.

The agent is also a child subreaper, so orphaned descendants become its children, not init's.
It must then reap them too, or every restart leaves zombies behind (a DataLoader's workers, a
checkpoint uploader: each ended one holds a pid until the agent exits, and containers have a few
thousand). `reap_orphans` reaps every ended child the agent did not start itself, and leaves alone
the ones whose exit status their owner reads (the workers, the guard).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import time
import uuid
from collections.abc import Collection
from pathlib import Path

from elastic_hydra.agent.worker_env import RUN_DIR as RUN_DIR_ENV
from elastic_hydra.workers import procfs

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_KILL_WAIT = 5.0
_STALE = re.compile(r"elastic-hydra-([0-9]+)-[0-9a-f]{8}")
CGROUP_ENV = "ELASTIC_HYDRA_CGROUP"  # "off": use the environment tag even where a cgroup works


def become_subreaper() -> None:
    """Orphaned descendants of the workers are re-parented to the agent (reaped by it)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Containment:
    """Finds and kills whatever this launch's workers left behind."""

    def __init__(self, tag: str, environ: dict[str, str] | None = None) -> None:
        self.tag = tag  # the run dir, as the workers' environment has it
        env = os.environ if environ is None else environ
        self.cgroup = None if env.get(CGROUP_ENV) == "off" else _make_cgroup()

    def add(self, pid: int) -> None:
        """Move a worker into the launch's cgroup (before it runs its own code)."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):  # it already exited
                (self.cgroup / "cgroup.procs").write_text(str(pid))

    def members(self) -> list[int]:
        """Live processes of this launch (workers and all their descendants)."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                return [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
            return []
        marker = f"\0{RUN_DIR_ENV}={self.tag}\0".encode()
        return [pid for pid in procfs.pids() if marker in _environ(pid)]

    def kill_all(self, keep: Collection[int] = ()) -> list[int]:
        """SIGKILL every member, wait for them (bounded), reap those re-parented to the agent
        (every ended child but those in `keep`: see `reap_orphans`).

        Returns the pids that were still alive (an empty list after a clean job).
        """
        found = self.members()
        reap_orphans(keep)
        if not found:
            return []
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup / "cgroup.kill").write_text("1")
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + _KILL_WAIT
        while True:
            reap_orphans(keep)
            if not self.members() or time.monotonic() > deadline:
                reap_orphans(keep)
                return found
            time.sleep(0.01)

    def close(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()

    def guard_args(self) -> list[str]:
        """What the guard process needs to do the same after the agent's death."""
        return [str(self.cgroup or ""), f"{RUN_DIR_ENV}={self.tag}"]


def reap_orphans(keep: Collection[int] = ()) -> list[int]:
    """Reap the ended children of this process that it did not start: the workers' descendants
    re-parented to it (it is their subreaper). Returns their pids.

    Left alone, so that their owners still read their exit status: the pids in `keep` (the
    workers not yet reaped, the guard) and any child in this process's own session (what a
    `subprocess.run` of the agent started). No worker's descendant is in that session: every
    worker starts a session of its own, and a process can only leave a session for a new one.
    Cheap when nothing ended: one waitid() that reaps nothing, and no /proc scan.
    """
    try:
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return []
    except ChildProcessError:  # no children at all
        return []
    me, session = os.getpid(), os.getsid(0)
    reaped = []
    for pid in procfs.pids():
        found = procfs.stat(pid)
        if found is None or found.state != "Z" or found.ppid != me:
            continue
        if pid in keep or found.session == session:
            continue
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


def _make_cgroup() -> Path | None:
    """A fresh child of this process's cgroup v2, or None where none can be made."""
    mount, path = _cgroup2_mount(), _own_cgroup()
    if mount is None or path is None:
        return None
    parent = mount / path.lstrip("/")
    _remove_stale(parent)
    group = parent / f"elastic-hydra-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError:
        return None
    if not (group / "cgroup.kill").exists():  # kernels before 5.14
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


def _remove_stale(parent: Path) -> None:
    """Remove the empty cgroups of launches whose agent is gone: an agent killed with its guard
    (SIGKILL to a whole Slurm step, say) cannot remove its own. A cgroup with a process in it is
    never removed (rmdir refuses), nor one whose agent pid is alive."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            found = _STALE.fullmatch(entry.name)
            if found and not os.path.exists(f"/proc/{found.group(1)}"):
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)


def _cgroup2_mount() -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    return None


def _own_cgroup() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    return None


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"\0" + f.read()
    except OSError:
        return b""


def is_subreaper() -> bool:
    """Whether this process is a child subreaper (a worker forked by a template becomes its
    child only then; see `warm/`)."""
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0)
    return value.value == 1
