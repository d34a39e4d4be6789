"""Worker output to the console: whole lines, each with its rank's prefix, bytes kept as is.

One exception: a Python traceback that ends in a known collateral error (a collective's peer went
away: gloo's `Connection closed by peer`) is folded into its last line on the console, naming the
log file that keeps it whole. After a membership change or a failure on another rank, every
surviving rank prints one; the console then shows one line per rank before the agent's own
explanation. The log files are written before the tee and keep every byte.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_MAX_PENDING = 8 << 20  # a line longer than this is forwarded in pieces
TRACEBACK = b"Traceback (most recent call last):"
# The last line of a traceback that only says a peer of a collective is gone: never a root cause.
COLLATERAL = (b"Connection closed by peer", b"Connection reset by peer")
_MAX_HELD = 1 << 20  # a traceback longer than this is forwarded as it is
_CHUNK = 1 << 16  # bytes the console thread gathers for one write
# torch.distributed's excepthook starts each line of a traceback with the rank: "[rank0]: ".
_TORCH_RANK = re.compile(rb"\[rank\d+\]: ?")


def write_all(fd: int, data: bytes) -> None:
    """Write every byte, through interrupted and would-block writes."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except (InterruptedError, BlockingIOError):
            time.sleep(0.001)


@dataclass(frozen=True, slots=True, eq=False)
class MergeGroup:
    """The workers of one attempt on this node whose identical lines are shown once."""

    label: Callable[[Sequence[int]], bytes]  # the prefix of several local ranks: [default0-7]:
    size: int  # how many of them reach the console: a line all of them said waits no longer


@dataclass(slots=True, kw_only=True)
class _Line:
    """Console output waiting for its turn in its rank's queue."""

    stream: int
    text: bytes  # one line without its prefix, or a block (prefixed already), ending in \n
    seq: int  # arrival order across every queue
    due: float  # when it may be shown without the same line from the other ranks
    prefix: bytes = b""
    block: bool = False  # shown as it is, never merged (a traceback, output without a group)


_Queue = tuple[MergeGroup | None, int]  # a rank's queue: its group and local rank


class ConsoleSink:
    """The agent's stdout (stream 1) and stderr (stream 2), written by a thread of its own.

    With `merge` > 0, a line a rank prints waits up to `merge` s for the same line from the other
    ranks of its group and is then shown once, with all of their ranks (`[default0-7]: ...`); a
    line every rank said goes at once. Each rank's lines keep their order (lines a rank printed
    before its copy of a merged line are shown before it); lines that differ keep their rank's
    prefix; a traceback is never merged: it is one block.

    The log files never wait for a stalled console: a terminal paused with Ctrl-S, a pager that
    stops reading or a blocked log driver fills a bounded buffer; once it has not moved for a
    second, console lines are dropped and counted (the files keep every byte), and one line says
    how many were not shown. A console that is only slower than the workers is waited for.
    """

    def __init__(
        self,
        stdout_fd: int = 1,
        stderr_fd: int = 2,
        limit: int = 4 << 20,
        stall: float = 1.0,
        merge: float = 0.0,
    ) -> None:
        self.fds = {1: stdout_fd, 2: stderr_fd}
        self.limit = limit
        self.stall = stall  # seconds without progress after which the console counts as stalled
        self.merge = merge  # seconds a line waits for the same line from other ranks; 0: off
        self.dropped = 0  # lines not shown
        self._reported = 0
        self._queues: dict[_Queue, deque[_Line]] = {}
        # Per queue: where each mergeable line waits (seqs, oldest first).
        self._index: dict[_Queue, dict[tuple[int, bytes], deque[int]]] = {}
        # How many ranks of a group hold a line: (id of the group, stream, line).
        self._holding: dict[tuple[int, int, bytes], int] = {}
        self._seq = 0
        self._released = 0  # lines below this seq are due now (a flush, a full buffer)
        self._size = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False  # the thread holds a chunk it has not finished writing
        self._idle = True  # the thread waits with nothing it may show yet
        self._moved = time.monotonic()  # when the console last took a chunk

    def write(self, stream: int, data: bytes) -> None:
        """Queue text as it is (whole lines, prefixed already): never merged."""
        self._add((None, -1), [_Line(stream=stream, text=data, seq=0, due=0.0, block=True)])

    def lines(
        self,
        stream: int,
        units: list[list[bytes]],
        rank: int,
        prefix: bytes,
        group: MergeGroup | None = None,
    ) -> None:
        """Queue a rank's output: each unit one line (merged with the same line from the
        group's other ranks when merging is on) or a block of lines (a traceback), as it is."""
        if group is None or self.merge <= 0:
            self.write(stream, _prefixed(prefix, [line for unit in units for line in unit]))
            return
        queued = []
        for unit in units:
            block = len(unit) > 1
            text = _prefixed(prefix, unit) if block else unit[0] + b"\n"
            queued.append(
                _Line(stream=stream, text=text, seq=0, due=0.0, prefix=prefix, block=block)
            )
        self._add((group, rank), queued)

    def _add(self, queue: _Queue, lines: list[_Line]) -> None:
        size = sum(len(line.text) for line in lines)
        with self._cond:
            if self._full(size):
                self._released = self._seq  # a full buffer shows what waits for other ranks
                self._cond.notify_all()
            while self._full(size) and (wait := self._moved + self.stall - time.monotonic()) > 0:
                self._cond.wait(wait)
            if self._full(size):
                self.dropped += sum(line.text.count(b"\n") for line in lines)
                return
            now = time.monotonic()
            if not self._busy and self._idle:
                self._moved = now  # the console was idle, not stalled
            mine = self._queues.setdefault(queue, deque())
            group_size = queue[0].size if queue[0] is not None else 0
            for line in lines:
                line.seq, self._seq = self._seq, self._seq + 1
                line.due = now if line.block else now + self.merge
                mine.append(line)
                if not line.block:
                    same = (line.stream, line.text)
                    seqs = self._index.setdefault(queue, {}).setdefault(same, deque())
                    seqs.append(line.seq)
                    if len(seqs) == 1 and self._hold(queue[0], same, 1) >= group_size:
                        self._released = self._seq  # it, and what each rank printed before it
            self._size += size
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console", daemon=True)
            self._thread.start()

    def _pick(self, now: float) -> tuple[_Queue | None, dict[_Queue, int]]:
        """The queue whose first line is the oldest, if it may be shown now, and where each
        other rank of its group holds the same line (seq); (None, {}) when nothing may go."""
        if not self._queues:
            return None, {}
        key = min(self._queues, key=lambda k: self._queues[k][0].seq)
        line = self._queues[key][0]
        if line.block:
            return key, {}
        group = key[0]
        same = (line.stream, line.text)
        holders = {}
        if self._holding[(id(group), *same)] > 1:  # another rank holds it too
            holders = {
                other: seqs[0]
                for other, index in self._index.items()
                if other[0] is group and other != key and (seqs := index.get(same))
            }
        if line.due <= now or line.seq < self._released:
            return key, holders
        return None, {}

    def _hold(self, group: MergeGroup | None, same: tuple[int, bytes], change: int) -> int:
        """Count one more (or one fewer) of `group`'s ranks holding this line; how many do."""
        key = (id(group), *same)
        held = self._holding.get(key, 0) + change
        if held:
            self._holding[key] = held
        else:
            del self._holding[key]
        return held

    def _oldest(self) -> _Line | None:
        return min((q[0] for q in self._queues.values()), key=lambda x: x.seq, default=None)

    def _take(self, key: _Queue, holders: dict[_Queue, int]) -> list[tuple[int, bytes]]:
        """Remove the oldest line and its copies from the queues; what to show, in order."""
        shown: list[tuple[int, bytes]] = []
        ranks = [key[1]]
        for other, seq in holders.items():  # what a rank printed before its copy goes first
            while (line := self._pop(other)).seq != seq:
                shown.append((line.stream, line.text if line.block else line.prefix + line.text))
            ranks.append(other[1])
        line = self._pop(key)
        group = key[0]
        if line.block or group is None:
            shown.append((line.stream, line.text))
        elif len(ranks) > 1:
            shown.append((line.stream, group.label(sorted(ranks)) + line.text))
        else:
            shown.append((line.stream, line.prefix + line.text))
        return shown

    def _pop(self, key: _Queue) -> _Line:
        queue = self._queues[key]
        line = queue.popleft()
        if not queue:
            del self._queues[key]
        if not line.block:
            index = self._index[key]
            same = (line.stream, line.text)
            seqs = index[same]
            seqs.popleft()
            if not seqs:
                del index[same]
                self._hold(key[0], same, -1)
            if not index:
                del self._index[key]
        self._size -= len(line.text)
        return line

    def _full(self, size: int) -> bool:
        return self._size > 0 and self._size + size > self.limit

    def flush(self, timeout: float) -> bool:
        """Show what waits for other ranks now (an attempt ended: nothing more will join it),
        and let the console take everything queued: up to `timeout` s, and no longer than
        `stall` s without progress. False if it did not take it all (the rest is dropped)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._released = self._seq
            self._cond.notify_all()
            while self._queues or self._busy:
                now = time.monotonic()
                left = min(deadline, self._moved + self.stall) - now
                if left <= 0:
                    for queue in self._queues.values():
                        self.dropped += sum(line.text.count(b"\n") for line in queue)
                    self._queues.clear()
                    self._index.clear()
                    self._holding.clear()
                    break
                self._cond.wait(left)
            return not self._busy

    def close(self, timeout: float) -> bool:
        """Flush (see `flush`), then say how many lines the console missed."""
        drained = self.flush(timeout)
        self._notice()
        return drained

    def _run(self) -> None:
        while True:
            with self._cond:
                while (key := self._pick(now := time.monotonic()))[0] is None:
                    self._idle = True
                    wake = self._oldest()
                    self._cond.wait(None if wake is None else max(wake.due - now, 0.001))
                self._idle = False
                shown: list[tuple[int, bytes]] = []
                gathered = 0
                while gathered < _CHUNK and (queue := key[0]) is not None:
                    more = self._take(queue, key[1])  # and what else may go in the same write
                    gathered += sum(len(data) for _, data in more)
                    shown += more
                    key = self._pick(now)
                self._busy = True
            self._notice()
            for stream, data in _by_stream(shown):
                self._put(stream, data)
            with self._cond:
                self._busy = False
                self._moved = time.monotonic()
                self._cond.notify_all()

    def _notice(self) -> None:
        """Once the console moves again: how many lines it missed."""
        missed = self.dropped - self._reported
        if missed > 0:
            self._reported = self.dropped
            self._put(
                2,
                f"elastic-hydra: {missed} lines not shown on the console; "
                "all are in the log files\n".encode(),
            )

    def _put(self, stream: int, data: bytes) -> None:
        # A console that went away (`| head`) loses its copy; the log files still get everything.
        with contextlib.suppress(OSError):
            write_all(self.fds[stream], data)


def _by_stream(shown: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """Consecutive pieces for one stream joined: one write each."""
    joined: list[tuple[int, list[bytes]]] = []
    for stream, data in shown:
        if joined and joined[-1][0] == stream:
            joined[-1][1].append(data)
        else:
            joined.append((stream, [data]))
    return [(stream, b"".join(pieces)) for stream, pieces in joined]


def _prefixed(prefix: bytes, lines: list[bytes]) -> bytes:
    text = b"\n".join(lines)
    if prefix:
        text = prefix + text.replace(b"\n", b"\n" + prefix)
    return text + b"\n"


class LinePrefixer:
    """Buffers a stream until a newline, then gives the sink each complete line with a prefix.

    With `fold_into` (the stream's log file), a traceback is held until its last line, then
    written whole, or as that line alone when it is collateral (`COLLATERAL`). With a `group`,
    the sink may merge a line with the same line from the group's other ranks.
    """

    def __init__(
        self,
        prefix: bytes,
        sink: ConsoleSink,
        stream: int,
        fold_into: str | None = None,
        *,
        rank: int = 0,
        group: MergeGroup | None = None,
    ) -> None:
        self.prefix = prefix
        self.sink = sink
        self.stream = stream
        self.rank = rank
        self.group = group
        self.pending = bytearray()
        self.fold_into = fold_into
        self.held: list[bytes] = []  # a traceback's lines so far
        self.held_size = 0

    def feed(self, data: bytes) -> None:
        cut = data.rfind(b"\n")
        if cut < 0:
            self.pending += data
            if len(self.pending) > _MAX_PENDING:
                self.flush()
            return
        lines = bytes(self.pending) + data[:cut] if self.pending else data[:cut]
        self.pending = bytearray(data[cut + 1 :])
        if self.fold_into is not None and (self.held or TRACEBACK in lines):
            self._write(self._fold(lines.split(b"\n")))
        else:
            self._write([[line] for line in lines.split(b"\n")])

    def flush(self) -> None:
        """Write what is held and a last line that has no newline yet."""
        units = [self.held] if self.held else []
        self.held, self.held_size = [], 0
        if self.pending:
            units.append([bytes(self.pending)])
            self.pending.clear()
        self._write(units)

    def _write(self, units: list[list[bytes]]) -> None:
        if units:
            self.sink.lines(self.stream, units, self.rank, self.prefix, self.group)

    def _fold(self, lines: list[bytes]) -> list[list[bytes]]:
        """The lines to show now, one unit each, and each traceback as one unit: held until its
        last line (the first line after the header that is not indented), collateral ones
        folded into that line."""
        shown: list[list[bytes]] = []
        for line in lines:
            tag = _TORCH_RANK.match(line)
            body = line[tag.end() :] if tag else line
            if not self.held:
                if body.rstrip() == TRACEBACK:
                    self.held, self.held_size = [line], len(line)
                else:
                    shown.append([line])
                continue
            self.held.append(line)
            self.held_size += len(line)
            frame = body[:1] in (b" ", b"\t")
            if frame and self.held_size <= _MAX_HELD:
                continue
            if not frame and any(c in body for c in COLLATERAL):
                shown.append([line + self._folded(len(self.held))])
            else:
                shown.append(self.held)
            self.held, self.held_size = [], 0
        return shown

    def _folded(self, count: int) -> bytes:
        return (
            f"  (collateral: a peer went away; traceback of {count} lines folded, whole in "
            f"{self.fold_into})"
        ).encode()
