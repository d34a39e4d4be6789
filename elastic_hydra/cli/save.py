"""`elastic-hydra save [RUN_DIR]`: ask a running job's agent on this node to save and stop.

It sends the agent the save request (`stopsignals.SAVE_SIGNAL`, SIGUSR1), as Slurm's
`--signal=USR1@T` does: every rank is asked (`ckpt.save_requested`) to stop after one step the
signalled nodes agree on, the agent keeps that step in the job's checkpoint home and exits 75
(preempted, saved). The agent is the one whose status record the run dir holds, and only if
that process on this host has the run's events file open (a pid that was reused since is not
it). Without a directory: the latest run under ./eh_logs that is still running. In a multi-node
job, run it on each node (`srun elastic-hydra save`, or `scancel --signal=USR1`): a node that is
not asked trains on, and sees the saved nodes leave.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from elastic_hydra.cli.stacks import run_dir_of
from elastic_hydra.errors import ConfigError
from elastic_hydra.observe.status import StatusRecordError, decode
from elastic_hydra.rundir import LOGS_ROOT, RunDir
from elastic_hydra.stopsignals import SAVE_SIGNAL

USAGE = f"""usage: elastic-hydra save [RUN_DIR]

Ask the job's agent on this node to save every rank's snapshot of one step and stop (exit 75).
Without a directory: the latest run under ./{LOGS_ROOT} that is still running."""


def main(args: Sequence[str]) -> int:
    """Send the save request; 0 when sent, 1 when no agent of the run runs here."""
    run = run_dir_of("save", args, USAGE)
    if run is None:
        return 0
    if not run.events.is_file():
        raise ConfigError("save", f"not a run dir (no {run.events.name})", str(run.root), USAGE)
    pid = agent_pid(run)
    if pid is None:
        print(f"elastic-hydra save: no agent of {run.root} is running on this host")
        return 1
    os.kill(pid, SAVE_SIGNAL)
    print(f"elastic-hydra save: asked the agent (pid {pid}) of {run.root} to save and stop")
    return 0


def agent_pid(run: RunDir) -> int | None:
    """The pid of the run's agent on this host, from its status record, or None: no record, or
    that process has not the run's events file open (it ended; its pid may be another's)."""
    try:
        with open(run.status, "rb") as f:
            pid = decode(f.read()).agent_pid
    except (OSError, StatusRecordError):
        return None
    try:
        events = run.events.resolve()
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            try:
                if Path(os.readlink(fd)) == events:
                    return pid
            except OSError:
                continue
    except OSError:
        return None
    return None
