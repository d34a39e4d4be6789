"""`elastic-hydra stacks [RUN_DIR]`: where a running job's ranks on this node are, right now.

The run's latest attempt and its worker pids come from its events.jsonl; each rank is asked for
its stacks as the hang watch asks (DUMP_SIGNAL: faulthandler answers from C, and the rank goes
on as before). The ranks are printed grouped by place, the odd group first, each group with one
rank's main-thread stack. Without a directory: the latest run under ./eh_logs that is still
running (it has no summary.json yet).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from elastic_hydra.errors import ConfigError
from elastic_hydra.hangs import verdict
from elastic_hydra.hangs.watch import Workers, dump_ranks
from elastic_hydra.records.hangs import HangRank, RankState
from elastic_hydra.report.events_file import EventsRead, last_start, read_events
from elastic_hydra.rundir import LOGS_ROOT, RunDir, running_runs

USAGE = f"""usage: elastic-hydra stacks [RUN_DIR]

Every rank's stack on this node, grouped by where the ranks are, without stopping them.
Without a directory: the latest run under ./{LOGS_ROOT} that is still running."""


def main(args: Sequence[str]) -> int:
    """Print the grouped stacks; 1 when no rank could be asked."""
    run = run_dir_of("stacks", args, USAGE)
    if run is None:
        return 0
    workers = live_workers(run)
    alive = [lr for lr, pid in enumerate(workers.pids) if _alive(pid)]
    if not alive:
        print(f"elastic-hydra stacks: no worker of {run.root} is running")
        return 1
    ranks = dump_ranks(workers, alive)
    print(f"elastic-hydra stacks: {run.root}, attempt {workers.attempt}, {len(alive)} rank(s)")
    for where, members in verdict.groups([r for r in ranks if r.state is not RankState.EXITED]):
        print(f"\n{verdict.who(members)} {where}")
        print(_stack_text(members[0]))
    return 0


def run_dir_of(command: str, args: Sequence[str], usage: str) -> RunDir | None:
    """The run dir a subcommand's one argument names (`stacks`, `save`), else the latest one
    still running under ./eh_logs; None when it was asked for its usage (printed)."""
    if list(args) in (["-h"], ["--help"]):
        print(usage)
        return None
    if len(args) > 1:
        raise ConfigError(command, "takes one run dir", " ".join(args), usage.splitlines()[0])
    return RunDir(Path(args[0]) if args else running_run(Path(LOGS_ROOT), command))


def running_run(root: Path, command: str = "stacks") -> Path:
    """The run dir under `root` whose events were written last, among runs still running (for
    `elastic-hydra COMMAND` without a run dir)."""
    live = running_runs(root)
    if not live:
        raise ConfigError(
            command, "no running job", str(root), f"expected elastic-hydra {command} RUN_DIR"
        )
    return max(live, key=lambda run: run.events.stat().st_mtime).root


def live_workers(run: RunDir) -> Workers:
    """The latest attempt's workers, from events.jsonl; global ranks from their environment."""
    read = EventsRead(events=())
    with contextlib.suppress(OSError):  # its last line may be cut short: the run goes on
        read = read_events(run.events)
    if (started := last_start(read.events)) is None:
        raise ConfigError(
            "stacks", "no workers started in this run", str(run.root), "expected a running job"
        )
    return Workers(
        run=run,
        attempt=started.attempt,
        pids=started.pids,
        ranks=tuple(_rank(pid, lr) for lr, pid in enumerate(started.pids)),
        host=socket.gethostname(),
    )


def _rank(pid: int, local_rank: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"RANK="):
                return int(item[5:])
    return local_rank


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stack_text(rank: HangRank) -> str:
    lines = verdict.main_stack_lines(rank)
    if lines is None:
        return f"  (rank {rank.rank}: {rank.state.replace('_', ' ')})"
    return "\n".join(lines)
