"""The preflight verdict into the ledger: which entries a node adds for itself (pure), and the
launch's wrapper that writes them after the battery, a failed write costing one warning."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.launch.preflight import Quarantining
from elastic_hydra.plan import Endpoint, PreflightMode, QuarantineSpec
from elastic_hydra.quarantine.from_verdict import entries, quarantined_line
from elastic_hydra.quarantine.ledger import Ledger
from elastic_hydra.records.preflight import Check, Finding, PreflightVerdict

NOW = 1_800_000_000.0
HOUR = 3600.0


def finding(node: int, line: str, gpu: int | None = None, fatal: bool = True) -> Finding:
    return Finding(check=Check.GEMM, line=line, fatal=fatal, node=node, host="h", gpu=gpu)


def verdict(*found: Finding) -> PreflightVerdict:
    bad = tuple(sorted({f.node for f in found if f.fatal and f.node is not None}))
    return PreflightVerdict(
        mode=PreflightMode.QUICK, round=0, nodes=3, findings=found, bad_nodes=bad,
        bad_hosts=tuple("forged-by-a-report" for _ in bad),
    )  # fmt: skip


def mine(v: PreflightVerdict, node: int) -> list[tuple[str, int | None, str, float, str]]:
    found = entries(v, node_rank=node, host="node-1", job="run-7", now=NOW, cooldown=HOUR)
    return [(e.host, e.gpu, e.reason, e.until, e.job) for e in found]


def test_a_node_that_passed_adds_nothing_and_a_bad_one_only_itself_by_its_own_name() -> None:
    v = verdict(
        finding(1, "preflight: node 1 (h) preflight.paths /d is read-only"),
        finding(2, "preflight: node 2 (h) rank 2 (cpu) at 41 % of the median GEMM rate"),
        finding(0, "preflight: allreduce across 3 nodes at 1 GB/s", fatal=False),
    )
    assert mine(v, 0) == []
    assert mine(v, 1) == [
        (
            "node-1",
            None,
            "preflight: node 1 (h) preflight.paths /d is read-only",
            NOW + HOUR,
            "run-7",
        ),
    ]  # its own name, never the host a report claimed


def test_a_bad_gpu_quarantines_that_gpu_and_any_other_finding_the_whole_host() -> None:
    gpus = verdict(finding(1, "gpu 5 slow", gpu=5), finding(1, "gpu 2 slow", gpu=2),
                   finding(1, "gpu 5 ecc", gpu=5))  # fmt: skip
    assert [(h, g, r) for h, g, r, _, _ in mine(gpus, 1)] == [
        ("node-1", 2, "gpu 2 slow"), ("node-1", 5, "gpu 5 slow"),
    ]  # fmt: skip
    both = verdict(finding(1, "gpu 5 slow", gpu=5), finding(1, "disk full"))
    assert [(g, r) for _, g, r, _, _ in mine(both, 1)] == [(None, "disk full")]


def test_the_line_says_what_until_when_and_how_to_let_it_back() -> None:
    v = verdict(finding(1, "disk full"))
    added = entries(v, node_rank=1, host="node-1", job="run-7", now=NOW, cooldown=HOUR)
    line = quarantined_line(added, ledger="/shared/q.json", cooldown=HOUR)
    assert line == (
        "elastic-hydra: quarantined node-1 until 2027-01-15 09:00 UTC (quarantine.cooldown=1h) "
        "in /shared/q.json: later rounds and jobs that read it leave it out. To let it back: "
        "elastic-hydra quarantine clear node-1 --ledger /shared/q.json"
    )


class FakeBattery:
    def __init__(self, result: PreflightVerdict) -> None:
        self.result = result

    def check(self, node: NodeAssignment, attempt: int, restart_count: int) -> PreflightVerdict:
        return self.result


def node(rank: int) -> NodeAssignment:
    return NodeAssignment(
        group_rank=rank, group_world_size=3, base_rank=rank, world_size=3, role_base_rank=rank,
        role_world_size=3, master=Endpoint(host="127.0.0.1", port=1),
    )  # fmt: skip


def wrapped(ledger: Path, v: PreflightVerdict) -> tuple[Quarantining, list[str], list[str]]:
    said: list[str] = []
    warned: list[str] = []
    spec = QuarantineSpec(ledger=str(ledger), cooldown=HOUR)
    q = Quarantining(FakeBattery(v), spec, host="node-1", job="run-7", say=said.append,
                     warn=warned.append, clock=lambda: NOW)  # fmt: skip
    return q, said, warned


def test_the_bad_node_writes_the_ledger_after_its_battery(tmp_path: Path) -> None:
    ledger = tmp_path / "q.json"
    v = verdict(finding(1, "disk full"))
    for rank in (0, 2):  # the healthy nodes of the round write nothing
        q, said, warned = wrapped(ledger, v)
        assert q.check(node(rank), 0, 0) is v and said == warned == [] and not ledger.exists()
    q, said, warned = wrapped(ledger, v)
    found = q.check(node(1), 0, 0)
    (entry,) = Ledger(ledger, clock=lambda: NOW).active(NOW)
    assert (entry.host, entry.gpu, entry.reason) == ("node-1", None, "disk full")
    assert entry.job == "run-7"
    assert warned == [] and said == [quarantined_line([entry], ledger=str(ledger), cooldown=HOUR)]
    # The bad node's verdict (its summary.json) says what it put into the ledger, until when.
    assert (found.quarantined, found.quarantined_until) == (("node-1",), NOW + HOUR)
    assert dataclasses.replace(found, quarantined=(), quarantined_until=None) == v


def test_a_ledger_that_cannot_be_written_is_one_warning_not_a_crash(tmp_path: Path) -> None:
    v = verdict(finding(1, "disk full"))
    q, said, warned = wrapped(tmp_path / "missing-dir" / "q.json", v)
    assert q.check(node(1), 0, 0) is v  # nothing quarantined: the verdict as the battery gave it
    assert said == [] and len(warned) == 1
    assert warned[0].startswith("this node failed its preflight but was not quarantined: ")
    assert "cannot be changed" in warned[0]
