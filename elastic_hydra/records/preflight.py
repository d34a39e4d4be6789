"""The preflight verdict as typed records: what the battery found, which nodes and GPUs it names.
Pure.

Every node of a job computes the same `PreflightVerdict` from every node's results (see
`preflight.verdict`); the executor acts on it (`bad_nodes`), summary.json and `report` carry it,
and a quarantine ledger can be fed from `bad_hosts` and `bad_gpus`, each with its evidence line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic_hydra.jsonrecord import JsonRecord
from elastic_hydra.plan import PreflightMode


class Check(enum.StrEnum):
    """Which check a finding comes from."""

    GEMM = "gemm"  # a worker's matrix multiply rate against the job's median
    ALLREDUCE = "allreduce"  # bus bandwidth inside a node or across nodes
    LINK = "link"  # bus bandwidth between two nodes (full)
    PATH = "path"  # free space and a write probe in logs.root and preflight.paths
    GPU = "gpu"  # NVML health: ECC errors, retired pages
    RENDEZVOUS = "rendezvous"  # the rendezvous endpoint answers
    PROBE = "probe"  # the probe itself failed, timed out, or its node published nothing


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding(JsonRecord):
    """One line of the verdict. `fatal`: the node leaves the job before training."""

    check: Check
    line: str  # as the console shows it: "preflight: node 3 (host) gpu 5 at 41 % of ..."
    fatal: bool
    node: int | None = None  # node rank (None: the job, e.g. its allreduce figure)
    host: str = ""
    gpu: int | None = None  # the GPU's index on its host (CUDA_VISIBLE_DEVICES' entry)
    peer: int | None = None  # the other end of a link


@dataclass(frozen=True, slots=True, kw_only=True)
class BadGpu(JsonRecord):
    host: str
    gpu: int
    line: str  # the evidence


@dataclass(frozen=True, slots=True, kw_only=True)
class PreflightVerdict(JsonRecord):
    """The battery's verdict on one round: the same on every node of the round."""

    mode: PreflightMode
    round: int
    nodes: int  # in the round
    findings: tuple[Finding, ...] = ()
    bad_nodes: tuple[int, ...] = ()  # node ranks that leave the job
    bad_hosts: tuple[str, ...] = ()  # their host names, in the order of bad_nodes
    bad_gpus: tuple[BadGpu, ...] = ()
    gemm_median: float | None = None  # GFLOP/s per worker
    allreduce_busbw: float | None = None  # GB/s across nodes (None: one node)
    seconds: float = 0.0  # this node's time in the battery
    # What this node put into the quarantine ledger for itself (`node-3`, `node-3 gpu 5`), and
    # until when (epoch s): only on the bad node, only with quarantine.ledger set.
    quarantined: tuple[str, ...] = ()
    quarantined_until: float | None = None
    # The round whose battery measured every node of this one (they all passed it, with no
    # restart since): this round ran none. None: this round's own battery.
    carried_from: int | None = None

    @property
    def passed(self) -> bool:
        return not self.bad_nodes

    def lines(self) -> list[str]:
        """The console's lines: every finding, then the round's figures."""
        if self.carried_from is not None:
            return [
                f"preflight: the {self.nodes} node(s) of this round passed round "
                f"{self.carried_from}'s battery, with no restart since: not measured again"
            ]
        return [f.line for f in self.findings]
