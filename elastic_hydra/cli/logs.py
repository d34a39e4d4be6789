"""`elastic-hydra logs [RUN_DIR] [-f] [--rank R] [--node N] [--attempt A] [--stream S] [--grep RE]`:
a run's per-rank logs, every node's, as one stream; a line several ranks wrote alike shown once
with their ranks (`report.logs`). `-f` follows a run that is still going, new attempts included,
until it ends (its summary is written) or Ctrl-C.
"""

from __future__ import annotations

import argparse
import re
import select
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from elastic_hydra.cli import top
from elastic_hydra.errors import EXIT_CONFIG, ConfigError
from elastic_hydra.report.logs import STREAMS, Merger, Select, Source, sources
from elastic_hydra.rundir import LOGS_ROOT, RunDir, finished_runs, running_runs
from elastic_hydra.stopsignals import StopFlag, handle_signals

POLL = 0.25  # seconds between looks at the files, following
_CHUNK = 1 << 20  # bytes read at once from one file


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-hydra logs",
        description="A run's per-rank logs as one stream; equal lines of several ranks once.",
    )
    parser.add_argument("run_dir", nargs="?", help=f"default: the newest run under ./{LOGS_ROOT}")
    parser.add_argument("-f", "--follow", action="store_true", help="follow a running job")
    parser.add_argument("--rank", help="global ranks, e.g. 0,4-7")
    parser.add_argument("--node", help="node names (a multi-node run's directories), e.g. vm")
    parser.add_argument("--attempt", help="attempts, e.g. 0,2, or all (default: the last)")
    parser.add_argument("--stream", choices=STREAMS, help="stdout or stderr (default: both)")
    parser.add_argument("--grep", help="only lines that match this regular expression")
    parser.add_argument("--no-merge", action="store_true", help="every rank's lines apart")
    return parser


def run(argv: Sequence[str]) -> int:
    """`main` as top's: bad words in one line (exit 2), a closed pipe ending it quietly."""
    return top.told(main, argv)


def main(argv: Sequence[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_CONFIG if exc.code else 0
    chosen = Select(
        ranks=_numbers("--rank", args.rank),
        nodes=frozenset(args.node.split(",")) if args.node else None,
        attempts=None if args.attempt in (None, "all") else _numbers("--attempt", args.attempt),
        all_attempts=args.attempt == "all",
        streams=(args.stream,) if args.stream else STREAMS,
    )
    pattern = _pattern(args.grep)
    root = Path(args.run_dir) if args.run_dir else _newest()
    if not root.is_dir():
        raise ConfigError("logs", "no such run dir", str(root), "expected a run dir")
    run_dir = RunDir(root)
    found = sources(run_dir, chosen)
    several = chosen.all_attempts or len(chosen.attempts or ()) > 1
    merger = Merger(found, several_attempts=several, merge=0.0 if args.no_merge else 1.0)
    reader = _Reader(merger, pattern)
    if not args.follow:
        reader.read_all(time.monotonic())
        _show(merger.drain())
        return 0 if found else 1
    flag = StopFlag()
    try:
        with handle_signals(flag):
            _follow(run_dir, chosen, reader, flag)
    finally:
        flag.close()
    return 0


def _follow(run_dir: RunDir, chosen: Select, reader: _Reader, flag: StopFlag) -> None:
    """Show lines as they come, new attempts' files included, until the run ends or a signal."""
    followed = {lane.source.path for lane in reader.merger.lanes}
    newest = chosen.attempts is None and not chosen.all_attempts
    while flag.signum is None:
        ended = run_dir.summary.is_file()  # before the last read: nothing written after is lost
        latest = Select(
            ranks=chosen.ranks, nodes=chosen.nodes, attempts=chosen.attempts,
            all_attempts=chosen.all_attempts or newest, streams=chosen.streams,
        )  # fmt: skip
        for source in sources(run_dir, latest):
            if source.path not in followed and (not newest or _after(source, reader)):
                followed.add(source.path)
                reader.offsets.append(0)
                reader.partial.append(b"")
                reader.merger.add(source)
        now = time.monotonic()
        reader.read_all(now)
        _show(reader.merger.drain(now=now, final=ended))
        if ended:
            return
        select.select([flag.read_fd], [], [], POLL)  # a signal ends the wait at once
        flag.drain()


def _after(source: Source, reader: _Reader) -> bool:
    """A file of an attempt no older than those followed on its node (following the newest)."""
    mine = [lane.source.attempt for lane in reader.merger.lanes if lane.source.node == source.node]
    return not mine or source.attempt >= max(mine)


class _Reader:
    """Each source's new complete lines, fed to the merger (a line still being written waits)."""

    def __init__(self, merger: Merger, pattern: re.Pattern[str] | None) -> None:
        self.merger = merger
        self.pattern = pattern
        self.offsets = [0] * len(merger.lanes)
        self.partial = [b""] * len(merger.lanes)

    def read_all(self, now: float) -> None:
        for i, lane in enumerate(self.merger.lanes):
            try:
                with lane.source.path.open("rb") as f:
                    f.seek(self.offsets[i])
                    data = f.read(_CHUNK)
            except OSError:
                continue  # not written yet, or gone
            self.offsets[i] += len(data)
            data = self.partial[i] + data
            complete, _, self.partial[i] = data.rpartition(b"\n")
            if not complete and not data.endswith(b"\n"):
                continue
            lines = complete.decode("utf-8", "surrogateescape").split("\n")
            if self.pattern is not None:
                lines = [line for line in lines if self.pattern.search(line)]
            self.merger.feed(i, lines, now)


def _show(lines: Iterable[str]) -> None:
    out = sys.stdout
    for line in lines:
        out.write(f"{line}\n")
    out.flush()


def _numbers(key: str, text: str | None) -> frozenset[int] | None:
    """`0,4-7` as its numbers; None for None."""
    if text is None:
        return None
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise ConfigError(key, "not a list of numbers", text, "e.g. 0,4-7")
        found.update(range(int(low), int(high or low) + 1))
    return frozenset(found)


def _pattern(text: str | None) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise ConfigError(
            "--grep", f"not a regular expression ({exc})", text, "e.g. 'loss|lr'"
        ) from None


def _newest() -> Path:
    """The newest run under ./eh_logs, running or ended, named on stderr (a multi-node run's,
    not one of its nodes')."""
    root = Path(LOGS_ROOT)
    runs = [r for r in running_runs(root) + finished_runs(root) if r.events.is_file()]
    runs = [r for r in runs if not RunDir(r.root.parent).events.is_file()]  # not a node's dir
    if not runs:
        raise ConfigError("logs", "no run found under", f"./{LOGS_ROOT}", "give a run dir")
    newest = max(runs, key=lambda r: r.events.stat().st_mtime).root
    print(f"elastic-hydra logs: the newest run, {newest}", file=sys.stderr)
    return newest
