"""The goodput ledger: where a run's wall time (and GPU-seconds) went, from its typed events.
Pure: the events, the agent's start and end, and the progress notes come in as values.

One node's timeline is cut into spans, each of one `Phase`, so that every second between the
agent's start and its end belongs to exactly one phase. The cuts are the changes of the agent's
phase machine (`agent.phases`, which `top`'s live phase reads too), with what only hindsight
knows added:

- start-up: agent start to the first `joining`, and the first round to its workers started;
- rendezvous: `joining` to the round (the first one), and a membership change (the ranks a lost
  node broke included) to the next attempt's workers running (stopping the group, the new
  round, the spawn);
- preflight: the battery between a round and the workers, from the `preflight` event (stamped at
  the verdict, with the node's `seconds` in the battery): the `seconds` before it, carved out of
  whichever phase the round was in (start-up, rendezvous or restart), which goes on after it;
- running: workers started to the first real failure of the attempt (a worker the launcher did
  not stop, exiting non-zero), a hang verdict that ends it, the last worker's exit, a membership
  change or a stop signal;
- hung: carved out of running: the hang verdict's `idle` seconds before it;
- restart: a failure or hang verdict to the next attempt's workers started, when there is one
  (stop, backoff, re-rendezvous, spawn);
- stopping: the end of the last attempt (success, a final failure, a stop signal, a failed
  rendezvous) to the agent's end (exit barrier, records, summary);
- unattributed: after the last event, when the timeline does not end with `finish` (the events
  file stopped early).

Work lost to a failure is counted beside the phases (it is running time, or hung time): from the
last progress the hang watch saw on any rank of the attempt (the failing exit's `last_progress`;
the attempt's start when it saw none), or a hang verdict's `idle`, to the failure; not known
where no hang watch ran (`hang.timeout=null`).
GPU-seconds are wall seconds times the GPUs the node's workers hold (0 where they hold none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elastic_hydra.agent.events import Event, Finish, Hang, Preflight, WorkerExited, WorkersStarted
from elastic_hydra.agent.phases import AgentPhase, PhaseMachine
from elastic_hydra.records.goodput import Ledger, LostWork, Phase, PhaseTime

_AFTER_FAILURE = None  # a span after a failure: restart if an attempt follows, else stopping


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """A stretch of one phase, in the events' monotonic seconds."""

    phase: Phase
    start: float
    end: float
    attempt: int | None = None  # the attempt running (or last started), None before the first

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


# The ledger's phase for each of the machine's; a failure's stretch is told by what follows it.
_LEDGER = {
    AgentPhase.STARTUP: Phase.STARTUP,
    AgentPhase.RENDEZVOUS: Phase.RENDEZVOUS,
    AgentPhase.PREFLIGHT: Phase.PREFLIGHT,
    AgentPhase.RUNNING: Phase.RUNNING,
    AgentPhase.FAILED: _AFTER_FAILURE,
    AgentPhase.RESTART: Phase.RESTART,
    AgentPhase.STOPPING: Phase.STOPPING,
    AgentPhase.DONE: Phase.STOPPING,  # the exit barrier, the records, the summary
}


class _Cutter:
    """Walks the events once through the agent's phase machine, opening a new span at each
    change; adds what hindsight knows (the hung stretches, the preflight battery's seconds, the
    work a failure lost)."""

    def __init__(self, start: float) -> None:
        self.machine = PhaseMachine()
        self.marks: list[tuple[float, Phase | None, int | None]] = [(start, Phase.STARTUP, None)]
        self.hung: list[tuple[float, float]] = []
        # attempt, what failed, when, the last progress before (None: not known)
        self.lost: list[tuple[int, str, float, float | None]] = []
        self.started_at = start

    @property
    def attempt(self) -> int | None:
        return self.machine.attempt

    def mark(self, at: float, phase: Phase | None) -> None:
        self.marks.append((max(at, self.marks[-1][0]), phase, self.attempt))

    def see(self, ev: Event) -> None:
        running = self.machine.phase is AgentPhase.RUNNING
        before = _LEDGER[self.machine.phase]
        match ev:
            case WorkerExited() if running and ev.returncode != 0 and not ev.terminated_by_launcher:
                since = None  # the watch's last progress, on the monotonic clock
                if ev.last_progress is not None:
                    since = ev.last_progress - (ev.wall_time - ev.mono_time)
                    since = max(min(since, ev.mono_time), self.started_at)
                self.lost.append((ev.attempt, f"rank {ev.rank} {ev.exit}", ev.mono_time, since))
            case Hang() if running:
                since = max(ev.mono_time - ev.idle, self.started_at, self.marks[-1][0])
                self.hung.append((since, ev.mono_time))
                self.lost.append((ev.attempt, "hang", ev.mono_time, since))
            case Preflight() if not running:  # the battery, carved out of the phase it was in
                self.mark(ev.mono_time - max(0.0, ev.seconds), Phase.PREFLIGHT)
                self.mark(ev.mono_time, before)
        if self.machine.see(ev):
            if isinstance(ev, WorkersStarted):
                self.started_at = ev.mono_time
            self.mark(ev.mono_time, _LEDGER[self.machine.phase])

    def spans(self, end: float, last: Event | None) -> list[Span]:
        marks = list(self.marks)
        if not isinstance(last, Finish):  # the timeline stops early (or tells nothing)
            at = max(marks[-1][0], last.mono_time if last is not None else marks[0][0])
            marks.append((at, Phase.UNATTRIBUTED, self.attempt))
        out: list[Span] = []
        for i, (at, phase, attempt) in enumerate(marks):
            until = marks[i + 1][0] if i + 1 < len(marks) else end
            restarted = any(p is Phase.RUNNING for _, p, _ in marks[i + 1 :])
            final = phase or (Phase.RESTART if restarted else Phase.STOPPING)
            span = Span(phase=final, start=at, end=min(until, end), attempt=attempt)
            out += _carve(span, self.hung)
        return _merged([s for s in out if s.end > s.start])


def _merged(cut: list[Span]) -> list[Span]:
    """Neighbouring spans of one phase and attempt as one (a failure that ended the run, then
    its `finish`: one stretch of stopping)."""
    out: list[Span] = []
    for span in cut:
        if out and (out[-1].phase, out[-1].attempt) == (span.phase, span.attempt):
            out[-1] = Span(phase=span.phase, start=out[-1].start, end=span.end,
                           attempt=span.attempt)  # fmt: skip
        else:
            out.append(span)
    return out


def _carve(span: Span, hung: Sequence[tuple[float, float]]) -> list[Span]:
    """A running span with the hung stretches inside it cut out as their own spans."""
    if span.phase is not Phase.RUNNING:
        return [span]
    out, at = [], span.start
    for began, ended in sorted(hung):
        since, until = max(began, at), min(ended, span.end)
        if until <= since:
            continue
        out.append(Span(phase=Phase.RUNNING, start=at, end=since, attempt=span.attempt))
        out.append(Span(phase=Phase.HUNG, start=since, end=until, attempt=span.attempt))
        at = until
    out.append(Span(phase=Phase.RUNNING, start=at, end=span.end, attempt=span.attempt))
    return out


def spans(events: Sequence[Event], *, start: float, end: float) -> list[Span]:
    """A node's time from `start` to `end` (monotonic, as the events' `mono_time`) cut into
    phase spans that cover it without gaps or overlaps."""
    return _walk(events, start).spans(end, _closing(events))


def _walk(events: Sequence[Event], start: float) -> _Cutter:
    cutter = _Cutter(start)
    for ev in events:
        cutter.see(ev)
    return cutter


def _closing(events: Sequence[Event]) -> Event | None:
    """The last event, or the `finish` after which only the end's events follow (the exit
    barrier): the agent's end, told."""
    last = events[-1] if events else None
    return next((e for e in reversed(events) if isinstance(e, Finish)), last)


def ledger(
    events: Sequence[Event],
    *,
    node: str,
    start: float,
    end: float,
    gpus: int = 0,
) -> Ledger:
    """One node's ledger.

    Args:
        events: the node's timeline, in order.
        node: the node's name (its host).
        start, end: the agent's start and end, on the events' monotonic clock.
        gpus: the GPUs this node's workers hold (0: none).
    """
    cutter = _walk(events, start)
    cut = cutter.spans(end, _closing(events))
    wall = max(0.0, end - start)
    phases = []
    for phase in Phase:
        seconds = sum(s.seconds for s in cut if s.phase is phase)
        phases.append(PhaseTime(phase=phase, wall_s=_r(seconds), gpu_s=_r(seconds * gpus)))
    lost = tuple(
        LostWork(
            attempt=attempt,
            cause=cause,
            at_s=_r(at - start),
            lost_s=None if since is None else _r(max(0.0, at - since)),
        )
        for attempt, cause, at, since in cutter.lost
    )
    return Ledger(nodes=(node,), wall_s=_r(wall), gpus=gpus, phases=tuple(phases), lost=lost)


def job_ledger(ledgers: Sequence[Ledger]) -> Ledger | None:
    """A job's account: the sum of the nodes' ledgers given (wall in node-seconds)."""
    if not ledgers:
        return None
    phases = tuple(
        PhaseTime(
            phase=phase,
            wall_s=_r(sum(led.seconds(phase) for led in ledgers)),
            gpu_s=_r(sum(p.gpu_s for led in ledgers for p in led.phases if p.phase is phase)),
        )
        for phase in Phase
    )
    return Ledger(
        nodes=tuple(n for led in ledgers for n in led.nodes),
        wall_s=_r(sum(led.wall_s for led in ledgers)),
        gpus=sum(led.gpus for led in ledgers),
        phases=phases,
        lost=tuple(w for led in ledgers for w in led.lost),
    )


def attributed_fraction(led: Ledger) -> float:
    """The share of wall time some phase other than `unattributed` accounts for (1.0: all)."""
    if led.wall_s <= 0:
        return 1.0
    known = sum(p.wall_s for p in led.phases if p.phase is not Phase.UNATTRIBUTED)
    return known / led.wall_s


def _r(seconds: float) -> float:
    return round(seconds, 6)
