"""The agent's admission check: may this node join the next rendezvous round?

`refusal` is the decision, pure: from the ledger's entries in force, this node's names, the GPUs
its workers would use and whether it runs under Slurm, the one line that keeps it out (or None).
`LedgerGate` reads the ledger for it before every round; a ledger that cannot be read is a
warning, never a refusal and never a crash: the quarantine keeps bad nodes out, it must not keep
good ones out.

A quarantined GPU of an otherwise good node is not taken out of the node's devices here: the
node is refused like a quarantined host when its workers would use that GPU, and the line names
the `gpus=[...]` that leaves it out.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from elastic_hydra.durations import show_duration
from elastic_hydra.quarantine.ledger import Ledger, LedgerError, QuarantineEntry, same_host


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why this node does not join: the entries that keep it out and the line that says so."""

    host: str
    gpus: tuple[int, ...]  # the quarantined GPUs it would use; () for the whole node
    evidence: str  # the first entry's reason
    until: float  # when the last of those entries expires
    line: str


def refusal(
    active: Sequence[QuarantineEntry],
    *,
    names: Sequence[str],
    gpus: frozenset[int],
    ledger: str,
    slurm: bool,
    now: float,
) -> Refusal | None:
    """The refusal of a node whose names are `names` (its Slurm node name, its host name) and
    whose workers use `gpus` (nvidia-smi indices; empty for none), or None to let it join.

    A whole-node entry refuses the node; a GPU entry refuses it when its workers use that GPU.
    """
    mine = [e for e in active if any(same_host(e.host, n) for n in names)]
    node = [e for e in mine if e.gpu is None]
    bad_gpus = [e for e in mine if e.gpu is not None and e.gpu in gpus]
    chosen = node or bad_gpus
    if not chosen:
        return None
    first, until = chosen[0], max(e.until for e in chosen)
    expires = show_time(until)
    what = (
        f"this node ({first.host})"
        if node
        else f"GPU {', '.join(str(e.gpu) for e in bad_gpus)} of this node ({first.host})"
    )
    line = (
        f"{what} is in the quarantine ledger until {expires} (in {show_duration(until - now)}): "
        f"{first.reason} (added by {first.job}); it does not join."
    )
    if not node:
        kept = sorted(gpus - {e.gpu for e in bad_gpus if e.gpu is not None})
        line += f" Leave the GPU out with gpus=[{','.join(map(str, kept))}], or"
    else:
        line += " To let it back:"
    line += f" elastic-hydra quarantine clear {first.host} --ledger {shlex.quote(ledger)}"
    if not node:
        line += f" --gpu {bad_gpus[0].gpu}"
    if slurm:
        line += f". Under Slurm, resubmit with {exclude_flag(active)}"
    return Refusal(
        host=first.host,
        gpus=tuple(e.gpu for e in bad_gpus if e.gpu is not None) if not node else (),
        evidence=first.reason,
        until=until,
        line=line,
    )


def show_time(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M UTC")


def exclude_flag(active: Sequence[QuarantineEntry]) -> str:
    """`--exclude=n1,n3`: every host with an entry in force, for sbatch/srun."""
    hosts = sorted({e.host for e in active})
    return f"--exclude={','.join(hosts)}"


class LedgerGate:
    """Reads the ledger before each round and decides with `refusal`.

    Args:
        ledger: the ledger file.
        names: this node's names (its Slurm node name first, then its host name).
        gpus: the GPU indices this node's workers use.
        slurm: whether the job runs under Slurm (the line then gives the `--exclude=`).
    """

    def __init__(
        self,
        ledger: Path,
        *,
        names: Sequence[str],
        gpus: frozenset[int],
        slurm: bool,
        warn: Callable[[str], None],
        cooldown: float,
        job: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = Ledger(ledger, warn=warn, clock=clock)
        self.cooldown = cooldown
        self.job = job
        self.names = tuple(n for n in names if n)
        self.gpus = gpus
        self.slurm = slurm
        self.warn = warn
        self.clock = clock

    def refusal(self) -> Refusal | None:
        """This node's refusal now, or None (also when the ledger cannot be read: warned)."""
        now = self.clock()
        try:
            active = self.ledger.active(now)
        except OSError as exc:
            self.warn(
                f"quarantine ledger {self.ledger.path}: cannot be read ({exc.strerror or exc}); "
                "this node joins unchecked"
            )
            return None
        return refusal(
            active,
            names=self.names,
            gpus=self.gpus,
            ledger=str(self.ledger.path),
            slurm=self.slurm,
            now=now,
        )

    def exclude(self, evidence: str) -> str:
        """seams.Admission: this node's entry in the ledger, for `cooldown` seconds."""
        now, host = self.clock(), self.names[0]
        try:
            entry = QuarantineEntry.new(
                host=host, gpu=None, evidence=f"hardware: {evidence}", now=now,
                cooldown=self.cooldown, job=self.job,
            )  # fmt: skip
            self.ledger.add([entry])
        except (OSError, LedgerError, ValueError) as exc:
            return f"the quarantine ledger {self.ledger.path} could not take it: {exc}"
        return (
            f"{host} is in the quarantine ledger {self.ledger.path} until {show_time(entry.until)}"
        )


def stderr_warning(line: str) -> None:
    sys.stderr.write(f"elastic-hydra: warning: {line}\n")
    sys.stderr.flush()
