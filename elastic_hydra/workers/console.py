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

_MAX_PENDING = 8 << 20  # a line longer than this is forwarded in pieces
TRACEBACK = b"Traceback (most recent call last):"
# The last line of a traceback that only says a peer of a collective is gone: never a root cause.
COLLATERAL = (b"Connection closed by peer", b"Connection reset by peer")
_MAX_HELD = 1 << 20  # a traceback longer than this is forwarded as it is
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


class ConsoleSink:
    """The agent's stdout (stream 1) and stderr (stream 2), written by a thread of its own.

    The log files never wait for a stalled console: a terminal paused with Ctrl-S, a pager that
    stops reading or a blocked log driver fills a bounded buffer; once it has not moved for a
    second, console lines are dropped and counted (the files keep every byte), and one line says
    how many were not shown. A console that is only slower than the workers is waited for.
    """

    def __init__(
        self, stdout_fd: int = 1, stderr_fd: int = 2, limit: int = 4 << 20, stall: float = 1.0
    ) -> None:
        self.fds = {1: stdout_fd, 2: stderr_fd}
        self.limit = limit
        self.stall = stall  # seconds without progress after which the console counts as stalled
        self.dropped = 0  # lines not shown
        self._reported = 0
        self._queue: deque[tuple[int, bytes]] = deque()
        self._size = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False  # the thread holds a chunk it has not finished writing
        self._moved = time.monotonic()  # when the console last took a chunk

    def write(self, stream: int, data: bytes) -> None:
        """Queue whole lines for the console. A full buffer waits for a console that moves, and
        drops the lines (counted) once it has not moved for `stall` s."""
        with self._cond:
            while self._full(data) and (wait := self._moved + self.stall - time.monotonic()) > 0:
                self._cond.wait(wait)
            if self._full(data):
                self.dropped += data.count(b"\n")
                return
            if not self._queue and not self._busy:
                self._moved = time.monotonic()  # the console was idle, not stalled
            self._queue.append((stream, data))
            self._size += len(data)
            self._cond.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console", daemon=True)
            self._thread.start()

    def _full(self, data: bytes) -> bool:
        return self._size > 0 and self._size + len(data) > self.limit

    def close(self, timeout: float) -> bool:
        """Let the console take what is queued: up to `timeout` s, and no longer than `stall` s
        without progress. Then say how many lines it missed. False if it did not take them all."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                now = time.monotonic()
                left = min(deadline, self._moved + self.stall) - now
                if left <= 0:
                    self.dropped += sum(data.count(b"\n") for _, data in self._queue)
                    self._queue.clear()
                    break
                self._cond.wait(left)
        drained = not self._busy
        self._notice()
        return drained

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                stream, data = self._queue.popleft()
                self._busy = True
            self._notice()
            self._put(stream, data)
            with self._cond:
                self._size -= len(data)
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


class LinePrefixer:
    """Buffers a stream until a newline, then writes each complete line with a prefix.

    With `fold_into` (the stream's log file), a traceback is held until its last line, then
    written whole, or as that line alone when it is collateral (`COLLATERAL`).
    """

    def __init__(
        self, prefix: bytes, sink: ConsoleSink, stream: int, fold_into: str | None = None
    ) -> None:
        self.prefix = prefix
        self.sink = sink
        self.stream = stream
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
            self._write([lines])

    def flush(self) -> None:
        """Write what is held and a last line that has no newline yet."""
        lines, self.held, self.held_size = self.held, [], 0
        if self.pending:
            lines.append(bytes(self.pending))
            self.pending.clear()
        self._write(lines)

    def _write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        text = b"\n".join(lines)
        if self.prefix:
            text = self.prefix + text.replace(b"\n", b"\n" + self.prefix)
        self.sink.write(self.stream, text + b"\n")

    def _fold(self, lines: list[bytes]) -> list[bytes]:
        """The lines to show now: tracebacks held until their last line (the first line after
        the header that is not indented), collateral ones folded into it."""
        shown: list[bytes] = []
        for line in lines:
            tag = _TORCH_RANK.match(line)
            body = line[tag.end() :] if tag else line
            if not self.held:
                if body.rstrip() == TRACEBACK:
                    self.held, self.held_size = [line], len(line)
                else:
                    shown.append(line)
                continue
            self.held.append(line)
            self.held_size += len(line)
            frame = body[:1] in (b" ", b"\t")
            if frame and self.held_size <= _MAX_HELD:
                continue
            if not frame and any(c in body for c in COLLATERAL):
                shown.append(line + self._folded(len(self.held)))
            else:
                shown += self.held
            self.held, self.held_size = [], 0
        return shown

    def _folded(self, count: int) -> bytes:
        return (
            f"  (collateral: a peer went away; traceback of {count} lines folded, whole in "
            f"{self.fold_into})"
        ).encode()
