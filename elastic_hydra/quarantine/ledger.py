"""The quarantine ledger: one JSON file of bad hosts and GPUs, shared by every node and job.

The file may live on a shared file system and be written by many agents at once, on many
nodes, and by `elastic-hydra quarantine`. So:

- a writer holds an exclusive POSIX lock (`fcntl.lockf`, which NFS carries) on a sidecar lock
  file (`<ledger>.lock`) while it reads, changes and replaces the ledger; the new content goes
  to a temporary file in the same directory, is fsynced, and is renamed over the ledger (then
  the directory is fsynced): a reader, which takes no lock, sees the old file or the new one,
  never a half-written one;
- the file is untrusted input: at most `MAX_BYTES`, at most `MAX_ENTRIES` entries, each entry
  checked field by field; a malformed file or entry is named in one warning and skipped, never
  raised to the agent (a writer keeps the entries that were valid);
- entries whose cooldown is over are ignored by readers and pruned by the next write;
- a ledger we create (and its lock file) is 0600; one that exists keeps its mode.

Format: `{"version": 1, "entries": [{"host", "gpu", "reason", "added", "until", "job"}, ...]}`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = 1
MAX_BYTES = 4 << 20  # a ledger of 10,000 entries with long reasons is about 3 MiB
MAX_ENTRIES = 10_000
MAX_REASON = 500  # characters of evidence kept per entry
MAX_GPU = 1023
PRIVATE_FILE = 0o600
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_JOB = re.compile(r"[!-~]{1,128}")  # printable ASCII without spaces: any run id torch takes
CLI_JOB = "cli"  # the job of an entry added by hand


class LedgerError(Exception):
    """The ledger cannot be changed (unwritable, or written by a newer release); one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QuarantineEntry:
    """One bad host, or one bad GPU of a host, kept out until `until`."""

    host: str  # node name as the job sees it (hostname / Slurm node name)
    gpu: int | None  # None: the whole node
    reason: str  # one line, e.g. "preflight: node-3 gpu 5 at 41 % of the median GEMM rate"
    added: float  # wall time
    until: float  # added + cooldown
    job: str  # run id that added it ("cli" when added by hand)

    def __post_init__(self) -> None:
        problem = entry_problem(self)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def new(
        cls, *, host: str, gpu: int | None, evidence: str, now: float, cooldown: float, job: str
    ) -> QuarantineEntry:
        """An entry that starts `now` and lasts `cooldown` seconds (a plan's
        `quarantine.cooldown`), its evidence made one line (see `one_line`).

        Raises:
            ValueError: a host, GPU or job that an entry cannot hold.
        """
        return cls(
            host=host, gpu=gpu, reason=one_line(evidence), added=now, until=now + cooldown, job=job
        )

    @property
    def target(self) -> str:
        """`node-3` or `node-3 gpu 5`."""
        return self.host if self.gpu is None else f"{self.host} gpu {self.gpu}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def entry_problem(entry: QuarantineEntry) -> str | None:
    """What is wrong with an entry's values (None: nothing)."""
    if not isinstance(entry.host, str) or not _HOST.fullmatch(entry.host):
        return f"host: not a host name ({str(entry.host)[:40]!r})"
    gpu = entry.gpu
    if gpu is not None and (type(gpu) is not int or not 0 <= gpu <= MAX_GPU):
        return f"gpu: expected null or an index 0..{MAX_GPU} ({str(gpu)[:20]!r})"
    if not isinstance(entry.reason, str) or not entry.reason.strip():
        return "reason: expected one line of evidence"
    if len(entry.reason) > MAX_REASON or not entry.reason.isprintable():
        return f"reason: expected one printable line of at most {MAX_REASON} characters"
    for name in ("added", "until"):
        value = getattr(entry, name)
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            return f"{name}: expected a time in seconds since the epoch ({str(value)[:20]!r})"
    if entry.until < entry.added:
        return "until: before added"
    if not isinstance(entry.job, str) or not _JOB.fullmatch(entry.job):
        return f"job: not a run id ({str(entry.job)[:40]!r})"
    return None


def one_line(text: str) -> str:
    """Evidence as an entry keeps it: one printable line, at most MAX_REASON characters."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerRead:
    """What a read found: the valid entries (expired ones too), and what was wrong, if anything
    (one line for the whole file)."""

    entries: tuple[QuarantineEntry, ...] = ()
    problem: str | None = None
    unreadable: bool = False  # the whole file was unusable (not JSON, too large, ...)
    newer: bool = False  # written by a newer release: never overwritten


def parse_ledger(data: bytes) -> LedgerRead:
    """A ledger file's bytes, checked; never raises."""
    if len(data) > MAX_BYTES:
        return LedgerRead(problem=f"larger than {MAX_BYTES} bytes; ignored", unreadable=True)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return LedgerRead(problem=f"not JSON ({str(exc)[:80]}); ignored", unreadable=True)
    if not isinstance(doc, dict):
        return LedgerRead(problem="not a JSON object; ignored", unreadable=True)
    version = doc.get("version")
    if type(version) is not int:
        return LedgerRead(problem="no version; ignored", unreadable=True)
    if version > VERSION:
        newer = f"version {version}, newer than this release's {VERSION}; ignored"
        return LedgerRead(problem=newer, unreadable=True, newer=True)
    raw = doc.get("entries")
    if not isinstance(raw, list):
        return LedgerRead(problem="entries: not a list; ignored", unreadable=True)
    entries: list[QuarantineEntry] = []
    bad: list[str] = []
    for number, item in enumerate(raw[:MAX_ENTRIES]):
        try:
            entries.append(_entry(item))
        except (TypeError, ValueError) as exc:
            bad.append(f"entry {number}: {exc}")
    if len(raw) > MAX_ENTRIES:
        bad.append(f"{len(raw) - MAX_ENTRIES} entries beyond the first {MAX_ENTRIES}")
    problem: str | None = None
    if bad:
        problem = f"{len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} ignored ({bad[0]})"
    return LedgerRead(entries=tuple(entries), problem=problem)


def _entry(item: object) -> QuarantineEntry:
    if not isinstance(item, dict):
        raise TypeError("not a JSON object")
    fields = ("host", "gpu", "reason", "added", "until", "job")
    if missing := [f for f in fields if f not in item]:
        raise ValueError(f"{missing[0]}: missing")
    return QuarantineEntry(**{f: item[f] for f in fields})


def render_ledger(entries: Sequence[QuarantineEntry]) -> str:
    """The file's text for these entries."""
    doc = {"version": VERSION, "entries": [e.to_json() for e in entries]}
    return json.dumps(doc, indent=1) + "\n"


def merge(
    current: Sequence[QuarantineEntry], added: Sequence[QuarantineEntry], now: float
) -> list[QuarantineEntry]:
    """The entries after adding: expired ones pruned; one entry per (host, gpu), the one that
    lasts longest (a later add with a longer cooldown extends it; its evidence replaces the
    older one's); sorted by host, then whole node first, then GPU."""
    kept: dict[tuple[str, int | None], QuarantineEntry] = {}
    for entry in [*current, *added]:
        if entry.until <= now:
            continue
        key = (entry.host, entry.gpu)
        if key not in kept or entry.until >= kept[key].until:
            kept[key] = entry
    return sorted(kept.values(), key=_order)


def _order(entry: QuarantineEntry) -> tuple[str, int]:
    return (entry.host, -1 if entry.gpu is None else entry.gpu)


def matches(entry: QuarantineEntry, host: str | None, gpu: int | None) -> bool:
    """Whether `clear(host=, gpu=)` takes this entry: every filter given must match (a host
    matches its short name too)."""
    if host is not None and not same_host(entry.host, host):
        return False
    return gpu is None or entry.gpu == gpu


def same_host(a: str, b: str) -> bool:
    """`node-3` and `node-3.cluster.local` are one host; case does not matter."""
    a, b = a.lower(), b.lower()
    return a == b or a.split(".", 1)[0] == b.split(".", 1)[0]


def _stderr_warning(line: str) -> None:
    sys.stderr.write(f"elastic-hydra: warning: {line}\n")
    sys.stderr.flush()


class Ledger:
    """The ledger at `path`: read without a lock, changed under the lock (see the module).

    Args:
        path: the ledger file (its directory must exist; the file need not).
        warn: where a malformed file or entry is told, one line per read.
        clock: wall time, for pruning on write.
    """

    def __init__(
        self,
        path: Path,
        *,
        warn: Callable[[str], None] = _stderr_warning,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(os.path.abspath(path))  # `.` has no name to put a lock file beside
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.warn = warn
        self.clock = clock

    # ------------------------------------------------------------------------------ reading
    def read(self) -> LedgerRead:
        """Every valid entry of the file (expired ones too); a missing file is an empty one.

        Raises:
            OSError: the file exists but cannot be read (permissions, an I/O error).
        """
        data = self._read_bytes()
        if data is None:
            return LedgerRead()
        found = (
            parse_ledger(data)
            if isinstance(data, bytes)
            else LedgerRead(problem="not a regular file; ignored", unreadable=True)
        )
        if found.problem is not None:
            self.warn(f"quarantine ledger {self.path}: {found.problem}")
        return found

    def _read_bytes(self) -> bytes | bool | None:
        """At most MAX_BYTES + 1 bytes of the file; None if there is none; False for a FIFO or
        a device in its place, which is not read (it could block, or never end)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            return file.read(MAX_BYTES + 1)

    def active(self, now: float) -> list[QuarantineEntry]:
        """The entries still in force at `now`, by host, node first, then GPU."""
        return sorted((e for e in self.read().entries if e.until > now), key=_order)

    # ------------------------------------------------------------------------------ writing
    def add(self, entries: Sequence[QuarantineEntry]) -> None:
        """Add entries (see `merge`); expired entries are pruned.

        Raises:
            LedgerError: the ledger cannot be written.
        """
        with self._changing() as (current, write):
            write(merge(current, entries, self.clock()))

    def clear(self, *, host: str | None = None, gpu: int | None = None) -> int:
        """Remove the entries of `host` (all of them, or its `gpu`'s); neither given: every
        entry. Returns how many entries in force were removed; expired ones are pruned too.

        Raises:
            LedgerError: the ledger cannot be written.
        """
        now = self.clock()
        with self._changing() as (current, write):
            live = [e for e in current if e.until > now]
            kept = [e for e in live if not matches(e, host, gpu)]
            if len(kept) != len(current):
                write(kept)
        return len(live) - len(kept)

    @contextlib.contextmanager
    def _changing(
        self,
    ) -> Iterator[tuple[list[QuarantineEntry], Callable[[Sequence[QuarantineEntry]], None]]]:
        """Under the lock: the current entries, and how to replace them."""
        try:
            with self._locked():
                found = self.read()
                if found.newer:
                    raise LedgerError(
                        f"quarantine ledger {self.path}: written by a newer release of "
                        "elastic-hydra; not changed (use that release)"
                    )
                yield list(found.entries), self._replace
        except OSError as exc:
            raise LedgerError(
                f"quarantine ledger {self.path}: cannot be changed "
                f"({exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''})"
            ) from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _replace(self, entries: Sequence[QuarantineEntry]) -> None:
        """Write the whole ledger to a temporary file beside it, fsync, rename over it."""
        directory = self.path.parent
        try:
            mode = stat.S_IMODE(os.stat(self.path).st_mode)
        except FileNotFoundError:
            mode = PRIVATE_FILE
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                os.fchmod(file.fileno(), mode)
                file.write(render_ledger(entries))
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
                os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
