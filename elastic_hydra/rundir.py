"""Every path of one launch, owned by one object."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class RunDir:
    """`<root>/` = Hydra's output dir of this launch.

    plan.json, config.yaml (resolved), events.jsonl, summary.json, .hydra/ (Hydra's saved config),
    attempt_<n>/<local_rank>/{stdout.log, stderr.log, error.json, fault.log}. `n` counts every
    start of the worker group (restarts and membership changes), so no attempt's logs are ever
    overwritten. error.json is torch's TORCHELASTIC_ERROR_FILE; fault.log the crash dump.
    """

    root: Path

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

    def rank_dir(self, round_no: int, local_rank: int) -> Path:
        return self.root / f"attempt_{round_no}" / str(local_rank)

    def stdout(self, round_no: int, local_rank: int) -> Path:
        return self.rank_dir(round_no, local_rank) / "stdout.log"

    def stderr(self, round_no: int, local_rank: int) -> Path:
        return self.rank_dir(round_no, local_rank) / "stderr.log"

    def error_file(self, round_no: int, local_rank: int) -> Path:
        return self.rank_dir(round_no, local_rank) / "error.json"

    def fault_file(self, round_no: int, local_rank: int) -> Path:
        return self.rank_dir(round_no, local_rank) / "fault.log"
