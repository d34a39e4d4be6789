"""Console lines several ranks print alike, shown once: the real sink on pipes, then a real job
of 8 ranks whose start-up warning reaches the console once while every rank's file keeps it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from elastic_hydra.gpus import format_cpus
from elastic_hydra.workers.console import ConsoleSink, LinePrefixer, MergeGroup
from tests.harness import run_raw

pytestmark = pytest.mark.timeout(60)

TB = (
    b"Traceback (most recent call last):\n"
    b'  File "/job/train.py", line 12, in <module>\n'
    b"    raise ValueError('bad batch')\n"
    b"ValueError: bad batch\n"
)


def label(ranks: Sequence[int]) -> bytes:
    return f"[r{format_cpus(ranks)}]:".encode()


class Console:
    """A real ConsoleSink writing into pipes, and one prefixer per rank and stream."""

    def __init__(self, size: int, merge: float) -> None:
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.fds = [self.out_r, self.err_r, out_w, err_w]
        for fd in (self.out_r, self.err_r):
            os.set_blocking(fd, False)
        self.sink = ConsoleSink(out_w, err_w, merge=merge)
        self.group = MergeGroup(label, size)
        self.ranks = {
            (rank, stream): LinePrefixer(
                f"[r{rank}]:".encode(), self.sink, stream, "/log" if stream == 2 else None,
                rank=rank, group=self.group,
            )
            for rank in range(size)
            for stream in (1, 2)
        }  # fmt: skip
        self.text = {1: b"", 2: b""}

    def say(self, rank: int, data: bytes, stream: int = 1) -> None:
        self.ranks[(rank, stream)].feed(data)

    def read(self) -> None:
        for stream, fd in ((1, self.out_r), (2, self.err_r)):
            try:
                while chunk := os.read(fd, 1 << 16):
                    self.text[stream] += chunk
            except BlockingIOError:
                pass

    def wait_for(self, found: Callable[[], bool], within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        while not found():
            assert time.monotonic() < deadline, self.text
            self.read()
            time.sleep(0.005)

    def close(self) -> dict[int, list[bytes]]:
        assert self.sink.close(timeout=5.0)
        self.read()
        for fd in self.fds:
            os.close(fd)
        return {stream: text.splitlines() for stream, text in self.text.items()}


@pytest.fixture
def console() -> Iterator[Callable[[int, float], Console]]:
    made: list[Console] = []

    def make(size: int, merge: float) -> Console:
        made.append(Console(size, merge))
        return made[-1]

    yield make
    for c in made:
        if c.fds[0] >= 0:
            c.sink.close(timeout=1.0)


def test_a_line_every_rank_prints_is_shown_once_at_once(
    console: Callable[[int, float], Console],
) -> None:
    c = console(8, 600.0)  # waiting would outlast the test: it does not wait
    for rank in range(8):
        c.say(rank, b"UserWarning: this option is deprecated\n")
    c.wait_for(lambda: b"\n" in c.text[1])
    assert c.close()[1] == [b"[r0-7]:UserWarning: this option is deprecated"]


def test_each_ranks_order_holds_around_a_merged_line(
    console: Callable[[int, float], Console],
) -> None:
    c = console(3, 600.0)
    c.say(1, b"hello from 1\nsame\nbye from 1\n")
    c.say(0, b"hello from 0\nsame\n")
    c.say(2, b"hello from 2\nsame\n")
    c.wait_for(lambda: b"same" in c.text[1])
    c.say(0, b"bye from 0\n")
    lines = c.close()[1]
    assert lines.count(b"[r0-2]:same") == 1 and len(lines) == 6, lines
    for rank in range(3):
        mine = [ln for ln in lines if ln.startswith(f"[r{rank}]:".encode()) or b"same" in ln]
        hello = mine.index(f"[r{rank}]:hello from {rank}".encode())
        assert hello < mine.index(b"[r0-2]:same"), lines
    assert lines.index(b"[r1]:bye from 1") > lines.index(b"[r0-2]:same")
    assert lines[-1] == b"[r0]:bye from 0"


def test_lines_that_differ_keep_their_prefix_and_a_lone_line_waits_only_its_window(
    console: Callable[[int, float], Console],
) -> None:
    c = console(4, 0.05)
    c.say(0, b"epoch 1 loss 0.5\n")
    c.say(2, b"rank 2 ready\n")
    c.say(1, b"rank 1 ready\n")
    c.say(3, b"epoch 1 loss 0.5\n")  # two of four ranks within the window: merged
    c.wait_for(lambda: c.text[1].count(b"\n") == 3)  # shown after the window, without close
    assert sorted(c.close()[1]) == [b"[r0,3]:epoch 1 loss 0.5", b"[r1]:rank 1 ready",
                                    b"[r2]:rank 2 ready"]  # fmt: skip


def test_tracebacks_are_never_merged_and_streams_stay_apart(
    console: Callable[[int, float], Console],
) -> None:
    c = console(2, 600.0)
    c.say(0, TB, stream=2)
    c.say(1, TB, stream=2)
    c.say(0, b"same text\n", stream=1)
    c.say(1, b"same text\n", stream=2)  # the same words on another stream: not merged
    shown = c.close()
    assert shown[2][:4] == [b"[r0]:" + ln for ln in TB.splitlines()]
    assert shown[2][4:8] == [b"[r1]:" + ln for ln in TB.splitlines()]
    assert shown[2][8:] == [b"[r1]:same text"] and shown[1] == [b"[r0]:same text"]


def test_a_rank_that_repeats_itself_is_not_merged_with_itself(
    console: Callable[[int, float], Console],
) -> None:
    c = console(2, 600.0)
    c.say(0, b"tick\ntick\n")
    c.say(1, b"tick\n")
    assert c.close()[1] == [b"[r0-1]:tick", b"[r0]:tick"]


def test_merge_off_keeps_every_ranks_line(console: Callable[[int, float], Console]) -> None:
    c = console(2, 0.0)
    c.say(0, b"same\n")
    c.say(1, b"same\n")
    c.wait_for(lambda: c.text[1].count(b"\n") == 2)
    assert c.close()[1] == [b"[r0]:same", b"[r1]:same"]


WARN = """
import os, warnings
warnings.warn("this start-up option is deprecated")
print("rank", os.environ["RANK"], "ready")
"""


def test_an_8_rank_start_up_warning_reaches_the_console_once_and_every_log_whole(
    tmp_path: Path,
) -> None:
    script = tmp_path / "warn.py"
    script.write_text(WARN)
    logs = tmp_path / "logs"
    proc = run_raw(f"script={script}", "nproc_per_node=8", f"logs.root={logs}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    err = proc.stderr.decode().splitlines()
    warned = [ln for ln in err if "UserWarning" in ln]
    assert warned == [f"[default0-7]:{script}:3: UserWarning: this start-up option is deprecated"]
    out = proc.stdout.decode().splitlines()
    assert sorted(out) == sorted(f"[default{r}]:rank {r} ready" for r in range(8))
    (summary,) = logs.rglob("summary.json")
    for rank in range(8):
        log = (summary.parent / f"attempt_0/{rank}/stderr.log").read_text()
        assert log == (
            f"{script}:3: UserWarning: this start-up option is deprecated\n"
            '  warnings.warn("this start-up option is deprecated")\n'
        )
    off = run_raw(f"script={script}", "nproc_per_node=8", f"logs.root={logs}", "logs.merge=0",
                  cwd=tmp_path)  # fmt: skip
    assert sum("UserWarning" in ln for ln in off.stderr.decode().splitlines()) == 8
