"""Worker output to the console: whole lines, each with its rank's prefix, bytes kept as is."""

from __future__ import annotations

import contextlib
import os
import time

_MAX_PENDING = 8 << 20  # a line longer than this is forwarded in pieces


def write_all(fd: int, data: bytes) -> None:
    """Write every byte, through interrupted and would-block writes."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except (InterruptedError, BlockingIOError):
            time.sleep(0.001)


def drain(fd: int) -> None:
    """Read a non-blocking descriptor empty (a wake-up pipe)."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


class ConsoleSink:
    """The agent's stdout (stream 1) and stderr (stream 2), written with raw, complete writes."""

    def __init__(self, stdout_fd: int = 1, stderr_fd: int = 2) -> None:
        self.fds = {1: stdout_fd, 2: stderr_fd}

    def write(self, stream: int, data: bytes) -> None:
        # A console that went away (`| head`) loses its copy; the log files still get everything.
        with contextlib.suppress(BrokenPipeError):
            write_all(self.fds[stream], data)


class LinePrefixer:
    """Buffers a stream until a newline, then writes each complete line with a prefix."""

    def __init__(self, prefix: bytes, sink: ConsoleSink, stream: int) -> None:
        self.prefix = prefix
        self.sink = sink
        self.stream = stream
        self.pending = bytearray()

    def feed(self, data: bytes) -> None:
        cut = data.rfind(b"\n")
        if cut < 0:
            self.pending += data
            if len(self.pending) > _MAX_PENDING:
                self.flush()
            return
        lines = bytes(self.pending) + data[:cut] if self.pending else data[:cut]
        self.pending = bytearray(data[cut + 1 :])
        if self.prefix:
            lines = self.prefix + lines.replace(b"\n", b"\n" + self.prefix)
        self.sink.write(self.stream, lines + b"\n")

    def flush(self) -> None:
        """Write a last line that has no newline yet."""
        if self.pending:
            self.sink.write(self.stream, self.prefix + bytes(self.pending) + b"\n")
            self.pending.clear()
