"""One-line notices on stderr, without rich: the success line and a multi-node job's progress.

A launch that succeeds never loads rich (about 0.1 s of start-up); `render` is imported only for
a report that needs it (a failure, a plan, a sweep table).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, TextIO, cast

from elastic_hydra.agent.events import (
    Event,
    Hang,
    HangWatchStarted,
    Joining,
    MembershipChange,
    RendezvousRound,
    Restart,
    Stopping,
    Straggler,
    WarmFallback,
)
from elastic_hydra.plan import (
    LEARN_FLOOR,
    LEARN_GAPS,
    LEARN_MULTIPLE,
    LEARNED,
    HangAction,
    StragglerAction,
)
from elastic_hydra.records.summary import RunSummary
from elastic_hydra.rundir import RunDir

_GREEN, _RESET = "\x1b[32m", "\x1b[0m"


def took(summary: RunSummary) -> str:
    return f"{summary.duration_s:.2f} s, {summary.attempts} attempt(s)"


def succeeded(summary: RunSummary) -> None:
    head = "elastic-hydra: succeeded"
    if colour():
        head = _GREEN + head + _RESET
    say(f"{head} ({took(summary)}); run dir {summary.run_dir}")
    if recovered := len(summary.earlier_failures):  # their tracebacks are worth a look
        say(
            f"elastic-hydra: {recovered} failure(s) recovered by a restart: "
            f"elastic-hydra report {summary.run_dir} shows the traceback(s)"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def progress(event: Event, *, multi_node: bool) -> None:
    """One line for each restart, and for the steps of a multi-node job that otherwise look like
    a hang (joining, the round, nodes joining or leaving)."""
    match event:
        case Restart():
            who = "the workers hung" if event.rank is None else f"rank {event.rank} failed"
            say(f"elastic-hydra: {who}: {event.reason}")
        case Hang():
            then = {
                HangAction.REPORT: "they keep running",
                HangAction.RESTART: "stopping them (a failure)",
            }
            say(
                f"elastic-hydra: {event.verdict}. Every rank's stacks: "
                f"{RunDir.stacks_shown(event.attempt, '*')}; "
                f"{then.get(event.action, 'stopping the job')} (hang.action={event.action})"
            )
        case Straggler(named=True):
            stops = (
                "stopping the job" if event.action == StragglerAction.FAIL else "nothing stopped"
            )
            op = f" ({event.op})" if event.op else ""
            say(
                f"elastic-hydra: straggler: rank {event.rank} arrives last at {event.last} of the"
                f" last {event.of} collectives{op}, median {_ms(event.behind)} behind;"
                f" {stops} (straggler.action={event.action})"
            )
        case Straggler():
            say(
                f"elastic-hydra: straggler: rank {event.rank} no longer arrives last (at"
                f" {event.last} of the last {event.of}, median {_ms(event.behind)} behind)"
            )
        case HangWatchStarted() if _set_by_user(event):
            timeout = "auto" if event.learned else f"{event.timeout:g}"
            say(
                f"elastic-hydra: hang watch: {_hang_rule(event)} without progress on any rank is"
                f" a hang, the first verdict {event.first_verdict:g} s after the start at the"
                f" earliest (hang.timeout={timeout}, hang.warmup={event.warmup:g});"
                f" then {event.action} (hang.action)"
            )
        case Stopping(hung=True):
            say(
                f"elastic-hydra: {event.signal} to the {event.workers} hung worker(s), their"
                f" stacks saved; SIGKILL after {event.grace:g} s (hang.grace)"
            )
        case Stopping():
            say(
                f"elastic-hydra: {event.signal}: stopping {event.workers} worker(s), up to "
                f"{event.grace:g} s (stop_grace); Ctrl-C again to kill them now"
            )
        case WarmFallback():
            say(f"elastic-hydra: warm starts off (warm.imports), cold starts: {event.reason}")
        case _ if not multi_node:
            return
        case Joining():
            say(f"elastic-hydra: joining the rendezvous (attempt {event.attempt})")
        case RendezvousRound():
            say(
                f"elastic-hydra: node {event.node_rank} of {event.nodes}, world size "
                f"{event.world_size}, master {event.master}"
            )
        case MembershipChange(collateral=collateral) if collateral:
            ranks = ",".join(str(r) for r in collateral)
            here = f"rank(s) {ranks} here failed with it (collateral, not this node's failure)"
            say(f"elastic-hydra: {event.reason}; {here}")
        case MembershipChange():
            say(f"elastic-hydra: {event.reason}")


def _set_by_user(watch: HangWatchStarted) -> bool:
    """Whether a hang key differs from its default: the watch's timing is then said at the
    start (with the defaults, a line on every launch would be noise; `--plan` shows it)."""
    default = LEARNED
    return (watch.learned, watch.timeout, watch.warmup, watch.action) != (
        default.learned,
        default.timeout,
        default.warmup,
        default.action,
    )


def _hang_rule(watch: HangWatchStarted) -> str:
    if not watch.learned:
        return f"{watch.timeout:g} s"
    return (
        f"{LEARN_MULTIPLE:g}x the longest gap between the job's progress events (learned from"
        f" {LEARN_GAPS} of them; {LEARN_FLOOR:g} to {watch.timeout:g} s)"
    )


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


class _Console:
    """A standard stream whose reader may go away (`elastic-hydra ... | head -2`, a closed
    terminal): from then on it writes to /dev/null, and the job goes on to its own end."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._lost(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        if exc.errno not in (errno.EPIPE, errno.EIO):
            raise exc
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())  # the workers' tee writes there too (os.write)
        os.close(null)
        self._stream.flush()  # what was buffered goes nowhere

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def console_may_close() -> None:
    """From now on a console that stops reading costs console lines, never the job's outcome."""
    if not isinstance(sys.stdout, _Console):
        sys.stdout = cast(TextIO, _Console(sys.stdout))
    if not isinstance(sys.stderr, _Console):
        sys.stderr = cast(TextIO, _Console(sys.stderr))
