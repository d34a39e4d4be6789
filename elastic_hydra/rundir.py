"""Every path and file name of a run, owned here: `RunDir` for one launch, `SweepDir` for a sweep.

A run directory is private (directories 0700, files 0600, as torchrun's log dir): it holds the
job's config and its workers' output. `RunDir.create` remembers which directories the launch made,
so that `discard` can remove exactly those and nothing a user made, never above `logs.root`.
No other module spells a file name of a run (tests/test_rundir_names.py checks).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
LOGS_ROOT = "eh_logs"  # logs.root's default: run dirs go under ./eh_logs

_PLAN, _CONFIG, _EVENTS = "plan.json", "config.yaml", "events.jsonl"
_SUMMARY, _RESULT, _CONSOLE = "summary.json", "result.json", "console.log"
_HYDRA_DIR, _HYDRA, _OVERRIDES = ".hydra", "hydra.yaml", "overrides.yaml"
_ATTEMPT = "attempt_"  # attempt_<n>/<local rank>/
_STDOUT, _STDERR, _ERROR, _FAULT = "stdout.log", "stderr.log", "error.json", "fault.log"
_STACKS, _PROGRESS = "stacks.txt", "progress"
_POOL = "pool.json"
_ROOM = ".room"  # .summary.json.room: the disk space kept for summary.json since the start
_STATUS = "status.json"  # the agent's status record, replaced every few seconds (observe/)
_ARRIVALS = "arrivals.jsonl"
_COLLECTIVES = "collectives.json"
_FR_PREFIX = "flight_recorder_rank_"  # + the global rank (workers/bootstrap.py writes them)
_PREFLIGHT, _PROBE_RESULT = "preflight_", "measured.json"  # preflight_<round>/<local rank>/


@dataclass(frozen=True, slots=True)
class RunDir:
    """`<root>/` = Hydra's output dir of this launch.

    plan.json, config.yaml (resolved), events.jsonl, summary.json, result.json, .hydra/ (the saved
    config: config.yaml, hydra.yaml, overrides.yaml), attempt_<n>/<local_rank>/{stdout.log,
    stderr.log, error.json, fault.log, stacks.txt, progress,
    collectives.json, flight_recorder_rank_<rank>}; console.log in a pool job's. `n`
    counts every start of the worker group (restarts and membership changes), so no attempt's
    logs are ever overwritten. error.json is torch's TORCHELASTIC_ERROR_FILE; fault.log the crash
    dump. While the launch runs, .summary.json.room and .result.json.room keep the disk space of
    the files its end writes (`reserve_end`).
    """

    root: Path
    created: tuple[Path, ...] = ()  # directories this launch made, outermost first
    logs_root: Path | None = None  # discard never removes this directory's parents

    @classmethod
    def create(cls, root: Path, *, logs_root: Path) -> RunDir:
        """Make `root` and its missing parents, private.

        Raises:
            OSError: a directory could not be made; whatever this call made is removed again.
        """
        root, logs_root = Path(os.path.abspath(root)), Path(os.path.abspath(logs_root))
        missing: list[Path] = []
        path = root
        while not os.path.lexists(path) and path.parent != path:
            missing.append(path)
            path = path.parent
        made: list[Path] = []
        try:
            for directory in reversed(missing):
                try:
                    directory.mkdir(mode=PRIVATE_DIR)
                except FileExistsError:  # a launch started at the same moment made it: not ours
                    continue
                made.append(directory)
        except OSError:
            cls(root, tuple(made), logs_root).discard()
            raise
        if not root.is_dir():
            cls(root, tuple(made), logs_root).discard()
            raise NotADirectoryError(20, "Not a directory", str(root))
        return cls(root, tuple(made), logs_root)

    def reserve_end(self, summary_room: int, result_room: int) -> None:
        """Keep room on the run dir's file system for the files the end of the launch writes
        (summary.json, result.json): a disk that fills meanwhile must not take them too. See
        `write_kept`."""
        reserve(self.summary, summary_room)
        reserve(self.result, result_room)

    def release_end(self) -> None:
        """Give back the room `reserve_end` kept (a launch that ends without those files)."""
        for path in (self.summary, self.result):
            with contextlib.suppress(OSError):
                room(path).unlink()

    def make_private(self) -> None:
        """A run dir someone else made (a sweep job's, made by Hydra's launcher)."""
        with contextlib.suppress(OSError):
            self.root.chmod(PRIVATE_DIR)

    def discard(self) -> None:
        """Remove what this launch wrote and the directories it made, nothing else.

        Only files named here are removed, and a directory only once it is empty: a file someone
        else put there keeps its directory (and that directory's parents).
        """
        saved = [self.saved_config, self.saved_hydra, self.saved_overrides]
        ends = [self.summary, self.result, room(self.summary), room(self.result)]
        for path in [self.plan, self.config, self.events, self.status, *ends, *saved]:
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            self.hydra_dir.rmdir()
        for directory in reversed(self.created):
            if not self._may_remove(directory):
                break
            try:
                directory.rmdir()
            except OSError:  # not empty: someone else's files are in there
                break

    def _may_remove(self, directory: Path) -> bool:
        if self.logs_root is None or directory == self.root:
            return True
        return directory == self.logs_root or self.logs_root in directory.parents

    # ------------------------------------------------------------------------------ the files
    @property
    def plan(self) -> Path:
        return self.root / _PLAN

    @property
    def config(self) -> Path:
        return self.root / _CONFIG

    @property
    def events(self) -> Path:
        return self.root / _EVENTS

    @property
    def summary(self) -> Path:
        return self.root / _SUMMARY

    @property
    def result(self) -> Path:
        return self.root / _RESULT

    @property
    def status(self) -> Path:
        """This node's latest status record (`elastic-hydra top`), replaced as the job goes."""
        return self.root / _STATUS

    @property
    def hydra_dir(self) -> Path:
        return self.root / _HYDRA_DIR

    @property
    def saved_config(self) -> Path:
        """The job's config as composed, unresolved (Hydra's .hydra/config.yaml)."""
        return self.hydra_dir / _CONFIG

    @property
    def saved_hydra(self) -> Path:
        return self.hydra_dir / _HYDRA

    @property
    def saved_overrides(self) -> Path:
        return self.hydra_dir / _OVERRIDES

    @property
    def console(self) -> Path:
        """What a pool job printed (its agent's console), written by the pool."""
        return self.root / _CONSOLE

    def rank_dir(self, attempt: int, local_rank: int) -> Path:
        return self.root / f"{_ATTEMPT}{attempt}" / str(local_rank)

    def attempts(self) -> list[int]:
        """The attempts whose directories exist, in order."""
        found = [p.name.removeprefix(_ATTEMPT) for p in self.root.glob(f"{_ATTEMPT}*")]
        return sorted(int(n) for n in found if n.isdigit())

    def local_ranks(self, attempt: int) -> list[int]:
        """The local ranks of an attempt whose directories exist, in order."""
        where = self.root / f"{_ATTEMPT}{attempt}"
        if not where.is_dir():
            return []
        return sorted(int(p.name) for p in where.iterdir() if p.name.isdigit() and p.is_dir())

    def stdout(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / _STDOUT

    def stderr(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / _STDERR

    def error_file(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / _ERROR

    def fault_file(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / _FAULT

    def stacks_file(self, attempt: int, local_rank: int) -> Path:
        """Every thread's stack, each time the agent asked (a hang, `elastic-hydra stacks`)."""
        return self.rank_dir(attempt, local_rank) / _STACKS

    def progress_file(self, attempt: int, local_rank: int) -> Path:
        """When the worker's main thread last moved (hang detection)."""
        return self.rank_dir(attempt, local_rank) / _PROGRESS

    def collectives_file(self, attempt: int, local_rank: int) -> Path:
        """The worker's collectives when the agent asked (a hang): per process group, the last
        issued and completed, with the op; beside it, `flight_recorder_rank_<rank>`, torch's
        Flight Recorder dump as torchfrtrace reads it (`--prefix flight_recorder_rank_`)."""
        return self.rank_dir(attempt, local_rank) / _COLLECTIVES

    def arrivals_file(self, attempt: int, local_rank: int) -> Path:
        """When the worker arrived at its recent collectives (the straggler score): lines
        `[group, sequence number, op, time]`."""
        return self.rank_dir(attempt, local_rank) / _ARRIVALS

    def preflight_dir(self, round: int, local_rank: int) -> Path:
        """A preflight probe worker's files in a round: stdout.log, stderr.log, result.json."""
        return self.root / f"{_PREFLIGHT}{round}" / str(local_rank)

    def preflight_result(self, round: int, local_rank: int) -> Path:
        return self.preflight_dir(round, local_rank) / _PROBE_RESULT

    def preflight_stdout(self, round: int, local_rank: int) -> Path:
        return self.preflight_dir(round, local_rank) / _STDOUT

    def preflight_stderr(self, round: int, local_rank: int) -> Path:
        return self.preflight_dir(round, local_rank) / _STDERR

    def nodes(self) -> list[RunDir]:
        """The run dirs of a multi-node job's nodes inside this one (each node writes in a
        subdirectory named after it), by name: those with a summary or a timeline."""
        if not self.root.is_dir():
            return []
        found = [
            RunDir(p)
            for p in self.root.iterdir()
            if p.is_dir() and ((p / _SUMMARY).is_file() or (p / _EVENTS).is_file())
        ]
        return sorted(found, key=lambda run: run.root.name)

    @staticmethod
    def stacks_shown(attempt: int, local_rank: str) -> str:
        """Where ranks' stacks are, relative to their run dir, for people: `local_rank` stands
        for the ranks (`*`, `<local rank>`)."""
        return f"{_ATTEMPT}{attempt}/{local_rank}/{_STACKS}"

    @staticmethod
    def collectives_shown(attempt: int) -> str:
        """Where ranks' collectives and Flight Recorder dumps are, relative to their run dir,
        and the torchfrtrace command that reads the dumps, for people."""
        where = f"{_ATTEMPT}{attempt}"
        return (
            f"{where}/*/{_COLLECTIVES}; torch's Flight Recorder dumps: torchfrtrace {where}"
            f" --prefix {_FR_PREFIX}"
        )


def finished_runs(root: Path) -> list[RunDir]:
    """The run dirs under `root`, at any depth, that have a summary: launches that ended."""
    if not root.is_dir():
        return []
    return [RunDir(p.parent) for p in root.rglob(_SUMMARY) if p.is_file()]


def running_runs(root: Path) -> list[RunDir]:
    """The run dirs under `root`, at any depth, with events and no summary yet: launches still
    running (or killed before they could write one)."""
    return [RunDir(p.parent) for p in root.rglob(_EVENTS) if not (p.parent / _SUMMARY).exists()]


@dataclass(frozen=True, slots=True)
class SweepDir:
    """`<root>/` = Hydra's sweep dir of a multirun: a run dir per job, named by its number
    (hydra.sweep.subdir), and pool.json when the pool launcher ran the sweep. A multi-node job's
    nodes each have their own run dir inside their job's."""

    root: Path

    @property
    def pool(self) -> Path:
        """The pool's record: which job ran in which slot, when."""
        return self.root / _POOL

    def job_results(self) -> list[tuple[Path, ...]]:
        """Each job's result files, in job order: its own, then its nodes' in their order; []
        where `root` is no sweep dir."""
        jobs = [p for p in self.root.iterdir() if p.name.isdigit()] if self.root.is_dir() else []
        return [
            (RunDir(job).result, *sorted(job.glob(f"*/{_RESULT}")))
            for job in sorted(jobs, key=lambda p: int(p.name))
        ]


def write_private(path: Path, text: str) -> None:
    """Write a whole file, private, atomically: a full disk leaves the old file (or none), never
    a truncated one.

    Raises:
        OSError: the file could not be written (the partial temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        # An argument that is not UTF-8 (a lone surrogate) is written back as the bytes it was.
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def room(path: Path) -> Path:
    """Where `reserve` keeps the disk space of `path` (a hidden file beside it)."""
    return path.with_name(f".{path.name}{_ROOM}")


def reserve(path: Path, size: int) -> bool:
    """Keep `size` bytes of disk for `path` until `write_kept` writes it; False where the disk
    has no such room now. The blocks are allocated (posix_fallocate, or zeros written), so
    writing into them later needs no new ones; a copy-on-write file system (ZFS) may still."""
    spot = room(path)
    try:
        fd = os.open(spot, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            spot.unlink()
        return False
    return True


def write_kept(path: Path, text: str, on_full_disk: Sequence[str] = ()) -> bool:
    """Write `path` as `write_private` does; where that fails (a full disk), write the first of
    `on_full_disk` (else `text`) that fits into the room `reserve` kept for it, in place, and
    rename it to `path`.

    Returns whether the kept room was needed. The room is released either way.

    Raises:
        OSError: no room was kept, or nothing fits in it (the first error).
    """
    spot = room(path)
    try:
        write_private(path, text)
    except OSError as exc:
        candidates = [t.encode("utf-8", "surrogateescape") for t in (on_full_disk or [text])]
        if not _write_in_place(spot, candidates):
            raise exc from None
        os.replace(spot, path)
        return True
    with contextlib.suppress(OSError):
        spot.unlink()
    return False


def _write_in_place(spot: Path, candidates: list[bytes]) -> bool:
    """Overwrite the kept room with the first candidate that fits, cut to its length."""
    try:
        fd = os.open(spot, os.O_WRONLY)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        data = next((c for c in candidates if len(c) <= size), None)
        if data is None:
            return False
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def open_private(path: Path) -> int:
    """An append-only descriptor of a private file (events.jsonl)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
