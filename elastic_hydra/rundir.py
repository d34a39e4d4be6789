"""Every path and file name of one launch, owned by one object.

A run directory is private (directories 0700, files 0600, as torchrun's log dir): it holds the
job's config and its workers' output. `RunDir.create` remembers which directories the launch made,
so that `discard` can remove exactly those and nothing a user made, never above `logs.root`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


@dataclass(frozen=True, slots=True)
class RunDir:
    """`<root>/` = Hydra's output dir of this launch.

    plan.json, config.yaml (resolved), events.jsonl, summary.json, result.json, .hydra/ (the saved
    config: config.yaml, hydra.yaml, overrides.yaml), attempt_<n>/<local_rank>/{stdout.log,
    stderr.log, error.json, fault.log}. `n` counts every start of the worker group (restarts and
    membership changes), so no attempt's logs are ever overwritten. error.json is torch's
    TORCHELASTIC_ERROR_FILE; fault.log the crash dump.
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
        for path in [self.plan, self.config, self.events, self.summary, self.result, *saved]:
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
        return self.root / "plan.json"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def hydra_dir(self) -> Path:
        return self.root / ".hydra"

    @property
    def saved_config(self) -> Path:
        """The job's config as composed, unresolved (Hydra's .hydra/config.yaml)."""
        return self.hydra_dir / "config.yaml"

    @property
    def saved_hydra(self) -> Path:
        return self.hydra_dir / "hydra.yaml"

    @property
    def saved_overrides(self) -> Path:
        return self.hydra_dir / "overrides.yaml"

    def rank_dir(self, attempt: int, local_rank: int) -> Path:
        return self.root / f"attempt_{attempt}" / str(local_rank)

    def stdout(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / "stdout.log"

    def stderr(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / "stderr.log"

    def error_file(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / "error.json"

    def fault_file(self, attempt: int, local_rank: int) -> Path:
        return self.rank_dir(attempt, local_rank) / "fault.log"

    def stacks_file(self, attempt: int, local_rank: int) -> Path:
        """Every thread's stack, each time the agent asked (a hang, `elastic-hydra stacks`)."""
        return self.rank_dir(attempt, local_rank) / "stacks.txt"

    def progress_file(self, attempt: int, local_rank: int) -> Path:
        """When the worker's main thread last moved (hang detection)."""
        return self.rank_dir(attempt, local_rank) / "progress"


def write_private(path: Path, text: str) -> None:
    """Write a whole file, private, atomically: a full disk leaves the old file (or none), never
    a truncated one.

    Raises:
        OSError: the file could not be written (the partial temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def open_private(path: Path) -> int:
    """An append-only descriptor of a private file (events.jsonl)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
