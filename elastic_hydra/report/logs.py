"""A run's per-rank logs read back as one stream (`elastic-hydra logs`): every node's, every
attempt's, filtered, and a line several ranks wrote alike shown once with their ranks.

The files hold no times, so ranks are merged by their order alone (`Merger`): the next line of
each rank is its head; a head that other ranks' heads equal is shown once for all of them
(`[ranks 0-7]: ...`), after each of those ranks' earlier lines; heads that differ keep their
rank. A traceback is never merged with another rank's, even an equal one: each is its own
failure. Following a live run (`drain(final=False)`), a head waits up to the merge window for the
ranks that have not written that far yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elastic_hydra.agent.events import RendezvousRound
from elastic_hydra.gpus import format_cpus
from elastic_hydra.report.events_file import read_events
from elastic_hydra.rundir import RunDir

STREAMS = ("stdout", "stderr")
_TB_START = "Traceback (most recent call last):"
_TB_LINKS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """One rank's file of one attempt on one node."""

    path: Path
    node: str  # the node's name ("" on a single-node run)
    attempt: int
    rank: int  # the global rank
    stream: str

    def label(self, several_attempts: bool) -> str:
        where = f"{self.node}:" if self.node else ""
        when = f" attempt {self.attempt}" if several_attempts else ""
        return f"[{where}rank {self.rank}{when}{'' if self.stream == 'stdout' else ' err'}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Select:
    """Which logs: None for all of a kind; `attempts` None: the last attempt of each node."""

    ranks: frozenset[int] | None = None
    nodes: frozenset[str] | None = None
    attempts: frozenset[int] | None = None
    all_attempts: bool = False
    streams: tuple[str, ...] = STREAMS


def sources(run: RunDir, chosen: Select) -> list[Source]:
    """The files of `run` (and of its nodes' run dirs inside it) that `chosen` names, in the
    order they are shown: by node, attempt, stream, rank."""
    nodes = [(n.root.name, n) for n in run.nodes()] or [("", run)]
    found: list[Source] = []
    for name, node in nodes:
        if chosen.nodes is not None and name not in chosen.nodes:
            continue
        attempts = node.attempts()
        if chosen.attempts is not None:
            attempts = [a for a in attempts if a in chosen.attempts]
        elif not chosen.all_attempts:
            attempts = attempts[-1:]
        bases = _base_ranks(node)
        for attempt in attempts:
            base = bases.get(attempt, 0)
            for stream in chosen.streams:
                for local in node.local_ranks(attempt):
                    rank = base + local
                    if chosen.ranks is not None and rank not in chosen.ranks:
                        continue
                    path = (
                        node.stdout(attempt, local)
                        if stream == "stdout"
                        else node.stderr(attempt, local)
                    )
                    found.append(
                        Source(path=path, node=name, attempt=attempt, rank=rank, stream=stream)
                    )
    return found


def _base_ranks(node: RunDir) -> dict[int, int]:
    """Each attempt's global rank of local rank 0, from the node's timeline (0 when it has
    none: a single-node run)."""
    if not node.events.is_file():
        return {}
    return {
        e.attempt: e.base_rank or 0
        for e in read_events(node.events).events
        if isinstance(e, RendezvousRound)
    }


@dataclass(slots=True)
class _Lane:
    """One source's lines not shown yet, and whether it is inside a traceback."""

    source: Source
    lines: list[str] = field(default_factory=list)
    in_traceback: bool = False
    waited: float = 0.0  # when its head became the head (following a live run)
    shown: int = 0  # lines shown: the lane furthest behind goes first, to keep ranks in step


class Merger:
    """Lines of several sources, shown once where equal (see the module's docstring).

    Lines merge across the sources of one stream and one attempt (on every node).

    Args:
        sources: the files, in the order of `sources()`; `add` takes more (a new attempt).
        several_attempts: the labels name the attempt.
        merge: seconds a head waits for the other ranks' lines while following; 0: no merge.
    """

    def __init__(
        self, sources: Sequence[Source], *, several_attempts: bool, merge: float = 1.0
    ) -> None:
        self.lanes = [_Lane(s) for s in sources]
        self.several = several_attempts
        self.merge = merge
        self.last: list[_Lane] = []  # the lanes of the last merged line: a block goes on

    def add(self, source: Source) -> int:
        """A new source (a new attempt's file, following a live run); its index."""
        if any(lane.source.attempt != source.attempt for lane in self.lanes):
            self.several = True  # the labels tell the attempts apart from now on
        self.lanes.append(_Lane(source))
        return len(self.lanes) - 1

    def feed(self, index: int, lines: Iterable[str], now: float = 0.0) -> None:
        lane = self.lanes[index]
        if not lane.lines:
            lane.waited = now
        lane.lines.extend(lines)

    def drain(self, *, now: float = 0.0, final: bool = True) -> Iterator[str]:
        """The lines that can be shown: all of them when `final`, else those whose wait for
        the other ranks is over (following a live run)."""
        while True:
            shown = self._step(now, final)
            if shown is None:
                return
            yield shown

    def _step(self, now: float, final: bool) -> str | None:
        ready = [lane for lane in self.lanes if lane.lines]
        if not ready:
            return None
        for lane in ready:  # a traceback's lines go together, and never merged
            if lane.in_traceback:
                return self._pop(lane, now)
        if self.merge <= 0:
            return self._pop(min(ready, key=lambda lane: lane.shown), now)
        went_on = [lane for lane in self.last if lane.lines]
        if len(went_on) == len(self.last) > 1 and len({lane.lines[0] for lane in went_on}) == 1:
            order = went_on[:1]  # the next line of a block they all wrote (a warning's source)
        else:  # the lane furthest behind first: ranks stay in step
            order = sorted(ready, key=lambda lane: lane.shown)
        for first in order:
            same = self._alike(first, ready)
            if final or not self._may_come(first, same, now):
                text = first.lines[0]
                for lane in same:
                    self._advance(lane, now)
                self.last = same
                return f"{self._label(same)}: {text}"
        return None  # each waits for ranks that may write its line too

    def _alike(self, first: _Lane, ready: Sequence[_Lane]) -> list[_Lane]:
        """The lanes whose next line is `first`'s, in its stream and attempt (a traceback's
        first line is never merged)."""
        head, s = first.lines[0], first.source
        if head == _TB_START:
            return [first]
        return [
            lane for lane in ready
            if lane.lines[0] == head
            and (lane.source.stream, lane.source.attempt) == (s.stream, s.attempt)
        ]  # fmt: skip

    def _may_come(self, first: _Lane, same: Sequence[_Lane], now: float) -> bool:
        """Following: whether a rank that has not written this far may still write this line
        (within the merge window): one whose next line is another wrote something else here."""
        if first.lines[0] == _TB_START or now - min(lane.waited for lane in same) >= self.merge:
            return False
        s = first.source
        return any(
            not lane.lines and lane.shown <= first.shown
            for lane in self.lanes
            if lane not in same
            and (lane.source.stream, lane.source.attempt) == (s.stream, s.attempt)
        )

    def _pop(self, lane: _Lane, now: float) -> str:
        line = lane.lines[0]
        self._advance(lane, now)
        return f"{self._label([lane])}: {line}"

    def _advance(self, lane: _Lane, now: float) -> None:
        line = lane.lines.pop(0)
        lane.shown += 1
        if line == _TB_START:
            lane.in_traceback = True
        elif lane.in_traceback and line and not line.startswith(" ") and line not in _TB_LINKS:
            lane.in_traceback = False  # the exception's line ends it
        lane.waited = now

    def _label(self, lanes: Sequence[_Lane]) -> str:
        if len(lanes) == 1:
            return lanes[0].source.label(self.several)
        s = lanes[0].source
        where = f"{s.node}:" if s.node and len({lane.source.node for lane in lanes}) == 1 else ""
        when = f" attempt {s.attempt}" if self.several else ""
        ranks = format_cpus([lane.source.rank for lane in lanes])
        return f"[{where}ranks {ranks}{when}{'' if s.stream == 'stdout' else ' err'}]"
