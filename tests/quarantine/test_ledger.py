"""The ledger file: its format, its checks of untrusted content, pruning, permissions, and many
real processes writing it at once."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastic_hydra.durations import parse_duration, show_duration
from elastic_hydra.quarantine.ledger import (
    MAX_BYTES,
    Ledger,
    LedgerError,
    QuarantineEntry,
    one_line,
    parse_ledger,
)
from tests.conftest import REPO, wait_for

NOW = 1_800_000_000.0


def entry(host: str = "node-3", gpu: int | None = None, *, until: float = NOW + 3600,
          reason: str = "preflight: node-3 at 41 % of the median GEMM rate",
          added: float = NOW, job: str = "run-1") -> QuarantineEntry:  # fmt: skip
    return QuarantineEntry(host=host, gpu=gpu, reason=reason, added=added, until=until, job=job)


def ledger(tmp_path: Path, warnings: list[str] | None = None, now: float = NOW) -> Ledger:
    sink = warnings if warnings is not None else []
    return Ledger(tmp_path / "ledger.json", warn=sink.append, clock=lambda: now)


def test_a_missing_ledger_is_empty_and_added_entries_read_back(tmp_path: Path) -> None:
    book = ledger(tmp_path)
    assert book.active(NOW) == []
    book.add([entry("node-3", 5), entry("node-1")])
    assert [e.target for e in book.active(NOW)] == ["node-1", "node-3 gpu 5"]
    doc = json.loads(book.path.read_text())
    assert doc["version"] == 1 and len(doc["entries"]) == 2
    assert doc["entries"][0] == {"host": "node-1", "gpu": None, "reason": entry().reason,
                                 "added": NOW, "until": NOW + 3600, "job": "run-1"}  # fmt: skip


def test_a_ledger_we_create_is_private_and_one_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    book = ledger(tmp_path)
    book.add([entry()])
    assert stat.S_IMODE(book.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(book.lock_path.stat().st_mode) == 0o600
    book.path.chmod(0o640)  # an administrator shares it with a group
    book.add([entry("node-4")])
    assert stat.S_IMODE(book.path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_expired_entries_are_ignored_and_pruned_on_write(tmp_path: Path) -> None:
    book = ledger(tmp_path, now=NOW - 7200)  # written two hours ago
    book.add([entry("old", added=NOW - 7200, until=NOW - 1), entry("live")])
    assert [e.host for e in book.active(NOW)] == ["live"]
    assert [e.host for e in book.active(NOW - 7200)] == ["live", "old"]
    ledger(tmp_path, now=NOW).add([entry("new")])
    assert [e["host"] for e in json.loads(book.path.read_text())["entries"]] == ["live", "new"]


def test_one_entry_per_host_and_gpu_the_longest_wins(tmp_path: Path) -> None:
    book = ledger(tmp_path)
    book.add([entry("n1", until=NOW + 100, reason="first")])
    book.add([entry("n1", until=NOW + 500, reason="second")])
    book.add([entry("n1", until=NOW + 200, reason="shorter")])
    assert [(e.until, e.reason) for e in book.active(NOW)] == [(NOW + 500, "second")]


def test_clear_by_host_gpu_or_all(tmp_path: Path) -> None:
    book = ledger(tmp_path)
    book.add([entry("n1"), entry("n1", 2), entry("n1", 3), entry("n2"), entry("n3", 2)])
    assert book.clear(host="n1", gpu=2) == 1
    assert book.clear(host="N1.cluster.local") == 2  # its short name, any case
    assert book.clear(host="nowhere") == 0
    assert [e.target for e in book.active(NOW)] == ["n2", "n3 gpu 2"]
    assert book.clear() == 2
    assert book.active(NOW) == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"entries": []}', "no version"),
        (b'{"version": 1, "entries": {}}', "entries: not a list"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_a_malformed_file_is_one_warning_and_no_entries(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    warnings: list[str] = []
    book = ledger(tmp_path, warnings)
    book.path.write_bytes(content)
    assert book.active(NOW) == []
    assert len(warnings) == 1 and str(book.path) in warnings[0] and problem in warnings[0]


def test_malformed_entries_are_skipped_named_once_and_dropped_by_the_next_write(
    tmp_path: Path,
) -> None:
    good = entry("good").to_json()
    bad = [
        "a string",
        {**good, "host": "x; rm -rf /"},
        {**good, "gpu": -1},
        {**good, "gpu": True},
        {**good, "reason": "two\nlines"},
        {**good, "reason": "x" * 501},
        {**good, "until": "tomorrow"},
        {**good, "until": NOW - 10},  # before added
        {**good, "added": float("nan")},
        {k: v for k, v in good.items() if k != "job"},
    ]
    warnings: list[str] = []
    book = ledger(tmp_path, warnings)
    book.path.write_text(json.dumps({"version": 1, "entries": [*bad, good], "more": 1}))
    assert [e.host for e in book.active(NOW)] == ["good"]
    assert len(warnings) == 1
    assert "10 malformed entries ignored (entry 0: not a JSON object)" in warnings[0]
    book.add([entry("new")])
    assert [e["host"] for e in json.loads(book.path.read_text())["entries"]] == ["good", "new"]


def test_a_huge_file_a_fifo_and_a_newer_release_are_not_read(tmp_path: Path) -> None:
    warnings: list[str] = []
    book = ledger(tmp_path, warnings)
    book.path.write_bytes(b" " * (MAX_BYTES + 1))
    assert book.active(NOW) == [] and "larger than" in warnings[-1]
    book.path.unlink()
    os.mkfifo(book.path)  # reading it would block forever
    assert book.active(NOW) == [] and "not a regular file" in warnings[-1]
    book.path.unlink()
    book.path.write_text(json.dumps({"version": 2, "entries": []}))
    assert book.active(NOW) == [] and "newer" in warnings[-1]
    with pytest.raises(LedgerError, match="newer release"):
        book.add([entry()])
    assert json.loads(book.path.read_text())["version"] == 2  # left as it was


def test_an_unwritable_place_is_a_ledger_error(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "missing-dir" / "ledger.json")
    with pytest.raises(LedgerError, match="cannot be changed"):
        book.add([entry()])
    with pytest.raises(LedgerError, match="cannot be changed"):
        Ledger(tmp_path).add([entry()])  # a directory
    with pytest.raises(OSError):
        Ledger(tmp_path).read()  # a reader (the gate) warns and lets the node join


def test_entries_check_their_own_values() -> None:
    with pytest.raises(ValueError, match="host"):
        entry("bad host")
    with pytest.raises(ValueError, match="until"):
        entry(until=NOW - 1)
    assert one_line("a\tb\n  c" + "x" * 600).startswith("a b c")
    assert len(one_line("x" * 600)) == 500


def test_parse_never_raises_on_odd_json() -> None:
    for doc in ([1], {"version": 1, "entries": [None, [], 1.5]}, {"version": "1"}, "x", 3):
        found = parse_ledger(json.dumps(doc).encode())
        assert found.entries == () and found.problem


def test_durations() -> None:
    assert parse_duration("24h") == 86400 and parse_duration("1h30m") == 5400
    assert parse_duration(90) == 90 and parse_duration("2.5") == 2.5
    assert parse_duration("7d") == 7 * 86400
    for bad in ("", "h", "24x", "-5", "0", "nan", "1h 2", True, "inf"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert show_duration(86399) == "23h59m" and show_duration(42) == "42s"
    assert show_duration(3600) == "1h" and show_duration(2 * 86400 + 7200) == "2d2h"


# A writer process: waits for the start file, then adds its entries one call at a time.
WRITER = """
import sys, time
from pathlib import Path
from elastic_hydra.quarantine.ledger import Ledger, QuarantineEntry
path, start, me, count = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
Path(f"{start}.{me}").touch()  # ready: imported
deadline = time.monotonic() + 30
while not start.exists() and time.monotonic() < deadline:
    time.sleep(0.001)
book = Ledger(path)
now = time.time()
for i in range(count):
    book.add([QuarantineEntry(host=f"{me}-{i}", gpu=i % 3 or None, reason=f"w {me} {i}",
                              added=now, until=now + 3600, job=f"job-{me}")])
"""

# A reader process: reads the file as fast as it can until the stop file, counts bad reads.
READER = """
import json, sys
from pathlib import Path
path, stop = Path(sys.argv[1]), Path(sys.argv[2])
reads = bad = 0
while not stop.exists():
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        continue
    reads += 1
    try:
        doc = json.loads(data)
        assert doc["version"] == 1 and isinstance(doc["entries"], list)
    except Exception:
        bad += 1
print(reads, bad)
"""


def test_many_processes_adding_at_once_lose_nothing_and_the_file_is_always_valid(
    tmp_path: Path,
) -> None:
    path, start, stop = tmp_path / "ledger.json", tmp_path / "start", tmp_path / "stop"
    writers, each = 12, 8
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path), str(stop)], stdout=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(start), f"w{n}", str(each)], env=env
        )
        for n in range(writers)
    ]
    try:
        ready = [tmp_path / f"start.w{n}" for n in range(writers)]
        wait_for(lambda: all(r.exists() for r in ready), timeout=60, what="writers ready")
        start.touch()  # all at once
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        out, _ = reader.communicate(timeout=30)
    assert codes == [0] * writers
    reads, bad = map(int, out.split())
    assert reads > 0 and bad == 0
    found = Ledger(path).active(time.time())
    assert len(found) == writers * each
    assert {e.host for e in found} == {f"w{n}-{i}" for n in range(writers) for i in range(each)}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_entry_from_a_verdict_line_and_a_plans_cooldown() -> None:
    made = QuarantineEntry.new(
        host="node-3", gpu=5, evidence="preflight: node-3 gpu 5\nat 41 %", now=NOW,
        cooldown=86400.0, job="a1b2c3.slurm-7",
    )  # fmt: skip
    assert (made.reason, made.added, made.until) == ("preflight: node-3 gpu 5 at 41 %", NOW,
                                                     NOW + 86400)  # fmt: skip
    with pytest.raises(ValueError, match="job"):
        QuarantineEntry.new(host="n", gpu=None, evidence="x", now=NOW, cooldown=1, job="a b")
