"""The admission decision (pure) and the gate that reads the ledger for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_hydra.quarantine.gate import LedgerGate, Refusal, exclude_flag, refusal
from elastic_hydra.quarantine.ledger import Ledger, QuarantineEntry

NOW = 1_800_000_000.0
DAY = 86400.0


def entry(host: str, gpu: int | None = None, reason: str = "slow", left: float = DAY,
          job: str = "run-7") -> QuarantineEntry:  # fmt: skip
    return QuarantineEntry(host=host, gpu=gpu, reason=reason, added=NOW, until=NOW + left, job=job)


def decide(active: list[QuarantineEntry], *, names: tuple[str, ...] = ("node-3",),
           gpus: frozenset[int] = frozenset(), slurm: bool = False) -> Refusal | None:  # fmt: skip
    return refusal(active, names=names, gpus=gpus, ledger="/shared/ledger.json", slurm=slurm,
                   now=NOW)  # fmt: skip


def test_a_whole_node_entry_refuses_with_its_evidence_expiry_and_how_to_clear_it() -> None:
    found = decide([entry("node-3", reason="preflight: node-3 gpu 5 at 41 % of the median")])
    assert found is not None
    assert found.line == (
        "this node (node-3) is in the quarantine ledger until 2027-01-16 08:00 UTC (in 1d): "
        "preflight: node-3 gpu 5 at 41 % of the median (added by run-7); it does not join. "
        "To let it back: elastic-hydra quarantine clear node-3 --ledger /shared/ledger.json"
    )
    assert (found.host, found.gpus, found.until) == ("node-3", (), NOW + DAY)


def test_under_slurm_the_line_gives_the_exclude_of_every_quarantined_host() -> None:
    active = [entry("node-1", left=60), entry("node-3"), entry("node-7", gpu=2)]
    found = decide(active, slurm=True)
    assert found is not None
    assert found.line.endswith(". Under Slurm, resubmit with --exclude=node-1,node-3,node-7")
    assert exclude_flag(active) == "--exclude=node-1,node-3,node-7"
    assert "--exclude" not in (decide(active) or found).line


def test_names_match_by_slurm_name_or_host_name_short_or_long() -> None:
    active = [entry("node-3")]
    assert decide(active, names=("", "node-3.cluster.local")) is not None
    assert decide(active, names=("NODE-3",)) is not None
    assert decide(active, names=("node-30", "node-4")) is None
    assert decide([entry("node-3.cluster.local")], names=("node-3",)) is not None


def test_a_quarantined_gpu_refuses_only_a_node_whose_workers_use_it() -> None:
    active = [entry("node-3", gpu=5, reason="gpu 5 throttled")]
    assert decide(active, gpus=frozenset({0, 1})) is None
    assert decide(active, gpus=frozenset()) is None  # a CPU job
    found = decide(active, gpus=frozenset(range(8)))
    assert found is not None and found.gpus == (5,)
    assert found.line.startswith("GPU 5 of this node (node-3) is in the quarantine ledger")
    assert "Leave the GPU out with gpus=[0,1,2,3,4,6,7], or elastic-hydra quarantine clear" in (
        found.line
    )
    assert found.line.endswith("--ledger /shared/ledger.json --gpu 5")


def test_other_hosts_entries_let_this_one_join() -> None:
    assert decide([entry("node-1"), entry("node-2", gpu=0)]) is None
    assert decide([]) is None


def test_the_gate_reads_the_ledger_each_time_and_joins_when_it_cannot(tmp_path: Path) -> None:
    warnings: list[str] = []
    path = tmp_path / "ledger.json"
    gate = LedgerGate(path, names=("node-3",), gpus=frozenset(), slurm=False, cooldown=60.0,
                      job="j", warn=warnings.append, clock=lambda: NOW)  # fmt: skip
    assert gate.refusal() is None
    Ledger(path).add([entry("node-3")])
    assert gate.refusal() is not None  # read again: a later round sees a new entry
    Ledger(path).clear(host="node-3")
    assert gate.refusal() is None
    path.write_text("{broken")
    assert gate.refusal() is None and "not JSON" in warnings[-1]
    path.unlink()
    path.mkdir()  # unreadable as a file
    assert gate.refusal() is None and "joins unchecked" in warnings[-1]


@pytest.mark.parametrize("left", [-1.0, 0.0])
def test_an_expired_entry_does_not_refuse(tmp_path: Path, left: float) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(
        '{"version": 1, "entries": [{"host": "node-3", "gpu": null, "reason": "r", '
        f'"added": {NOW - 10}, "until": {NOW + left}, "job": "j"}}]}}'
    )
    gate = LedgerGate(path, names=("node-3",), gpus=frozenset(), slurm=False, cooldown=60.0,
                      job="j", warn=print, clock=lambda: NOW)  # fmt: skip
    assert gate.refusal() is None


def test_a_node_excluded_for_a_hardware_fault_is_refused_later_and_an_unwritable_ledger_said(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.json"
    gate = LedgerGate(path, names=("node-3",), gpus=frozenset(), slurm=False, cooldown=3600.0,
                      job="run-1", warn=print, clock=lambda: NOW)  # fmt: skip
    line = gate.exclude("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert line.startswith(f"node-3 is in the quarantine ledger {path} until "), line
    (kept,) = Ledger(path).active(NOW)
    assert (kept.host, kept.gpu, kept.job, kept.until) == ("node-3", None, "run-1", NOW + 3600)
    assert kept.reason.startswith("hardware: NVRM: Xid") and gate.refusal() is not None
    blocked = LedgerGate(tmp_path / "no" / "dir" / "x.json", names=("node-3",), gpus=frozenset(),
                         slurm=False, cooldown=60.0, job="j", warn=print)  # fmt: skip
    (tmp_path / "no").write_text("a file where a directory should be")
    assert "could not take it" in blocked.exclude("Xid 79")
