"""The guard: kills the workers' process groups when the agent dies, even by SIGKILL.

A ~1 ms shell process of its own holds the only other end of a pipe from the agent; the agent
tells it each worker's group as the group starts. End of file without `exit` is the agent's
death: it kills every group it was told of, then whatever left them (see `contain`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess

from elastic_hydra.workers.console import write_all
from elastic_hydra.workers.contain import Containment


class GroupGuard:
    """Kills the workers' whole process groups (grandchildren too) if the agent dies.

    PR_SET_PDEATHSIG reaches the workers only. This ~1 ms shell process reads the groups to guard
    from a pipe that only the agent holds: end of file without a clean `exit` means the agent is
    gone (even by SIGKILL), and it SIGKILLs every group it was told about.
    """

    _SCRIPT = (
        'while read -r g; do case $g in exit) exit 0;; reset) gs="";; *) gs="$gs $g";; esac; '
        "done; for g in $gs; do kill -s KILL -- -$g 2>/dev/null; done; "
        # Then whatever left the groups: the launch's cgroup, else the tagged environments.
        'if [ -n "$1" ]; then echo 1 > "$1/cgroup.kill"; i=0; '
        'until rmdir "$1" || [ $i -ge 100 ]; do sleep 0.05; i=$((i+1)); done; '
        'else for p in /proc/[0-9]*; do grep -qsFxz -- "$2" "$p/environ" && '
        'kill -s KILL "${p#/proc/}"; done; fi 2>/dev/null'
    )

    def __init__(self, containment: Containment) -> None:
        read_fd, self._write_fd = os.pipe()  # not inherited by workers: EOF means agent death
        self._proc = subprocess.Popen(
            ["/bin/sh", "-c", self._SCRIPT, "guard", *containment.guard_args()],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the terminal must not take the guard down
        )
        os.close(read_fd)

    @property
    def pid(self) -> int:
        """The guard's own pid: its exit status is read by `close`, never by the reaper."""
        return self._proc.pid

    def _send(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError):
            write_all(self._write_fd, f"{line}\n".encode())

    def watch(self, pgid: int) -> None:
        self._send(str(pgid))

    def forget_all(self) -> None:
        """The guarded groups are gone (their ids may be reused): drop them."""
        self._send("reset")

    def close(self) -> None:
        self._send("exit")
        os.close(self._write_fd)
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
