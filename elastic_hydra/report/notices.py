"""One-line notices on stderr, without rich: the success line and a multi-node job's progress.

A launch that succeeds never loads rich (about 0.1 s of start-up); `render` is imported only for
a report that needs it (a failure, a plan, a sweep table).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from elastic_hydra.agent.events import Event, EventKind
from elastic_hydra.plan import HangAction
from elastic_hydra.records import RunSummary
from elastic_hydra.rundir import RunDir

_GREEN, _RESET = "\x1b[32m", "\x1b[0m"


def took(summary: RunSummary) -> str:
    return f"{summary.duration_s:.2f} s, {summary.attempts} attempt(s)"


def succeeded(summary: RunSummary) -> None:
    head = "elastic-hydra: succeeded"
    if colour():
        head = _GREEN + head + _RESET
    say(f"{head} ({took(summary)}); run dir {summary.run_dir}")


def progress(event: Event, *, multi_node: bool) -> None:
    """One line for each restart, and for the steps of a multi-node job that otherwise look like
    a hang (joining, the round, nodes joining or leaving)."""
    d = event.data
    match event.kind:
        case EventKind.RESTART:
            who = "the workers hung" if d["rank"] is None else f"rank {d['rank']} failed"
            say(f"elastic-hydra: {who}: {d['reason']}")
        case EventKind.HANG:
            then = {
                HangAction.REPORT: "they keep running",
                HangAction.RESTART: "stopping them (a failure)",
            }
            say(
                f"elastic-hydra: {d['verdict']}. Every rank's stacks: "
                f"{RunDir.stacks_shown(d['attempt'], '*')}; "
                f"{then.get(d['action'], 'stopping the job')} (hang.action={d['action']})"
            )
        case EventKind.STOPPING:
            say(
                f"elastic-hydra: {d['signal']}: stopping {d['workers']} worker(s), up to "
                f"{d['grace']:g} s (stop_grace); Ctrl-C again to kill them now"
            )
        case _ if not multi_node:
            return
        case EventKind.JOINING:
            say(f"elastic-hydra: joining the rendezvous (attempt {d['attempt']})")
        case EventKind.RENDEZVOUS:
            say(
                f"elastic-hydra: node {d['node_rank']} of {d['nodes']}, world size "
                f"{d['world_size']}, master {d['master']}"
            )
        case EventKind.MEMBERSHIP if d.get("collateral"):
            ranks = ",".join(str(r) for r in d["collateral"])
            here = f"rank(s) {ranks} here failed with it (collateral, not this node's failure)"
            say(f"elastic-hydra: {d['reason']}; {here}")
        case EventKind.MEMBERSHIP:
            say(f"elastic-hydra: {d['reason']}")


def warn(text: str) -> None:
    """Something went wrong that does not change the job's outcome (a file we could not write)."""
    say(f"elastic-hydra: warning: {text}")


def colour(stream: TextIO | None = None) -> bool:
    """Colour as rich decides it: NO_COLOR wins, then FORCE_COLOR, then a terminal that has it."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return _terminal(stream or sys.stderr)


def say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def status(line: str | None) -> None:
    """A status line a terminal rewrites in place (None clears it); see `live`."""
    sys.stderr.write("\r\x1b[2K" + (line or ""))
    sys.stderr.flush()


def live() -> bool:
    """Whether stderr is a terminal that can rewrite a status line."""
    return _terminal(sys.stderr)


def _terminal(stream: TextIO) -> bool:
    """A terminal that understands escape sequences (not TERM=dumb)."""
    return stream.isatty() and os.environ.get("TERM", "") not in ("dumb", "unknown")
