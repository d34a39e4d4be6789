"""What one node of a round measured and found, as it publishes it to the others. Pure.

A `NodeReport` travels through the rendezvous store, so reading one is reading untrusted input:
`read_report` bounds its size, checks every field and every number, and turns anything else into
a reason (that node then fails its preflight) rather than an exception in the agent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from elastic_hydra.jsonrecord import JsonRecord
from elastic_hydra.records.preflight import Check

MAX_REPORT = 64 << 10  # bytes of one node's report
MAX_WORKERS = 1024
MAX_PROBLEMS = 64
MAX_TEXT = 300  # characters of one problem or error shown
MAX_SAMPLES = 64  # GEMM windows of one worker


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkResult(JsonRecord):
    """The bus bandwidth between this worker's node and a higher one (full)."""

    peer: int  # node rank
    busbw: float  # GB/s, the median repetition
    best: float | None = None  # GB/s, the best repetition (None: the median is all there is)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerResult(JsonRecord):
    """What one probe worker measured (written by `preflight.probe`)."""

    local_rank: int
    rank: int
    device: str  # "cpu" or "cuda"
    gpu: int | None = None  # the GPU's index on its host (CUDA_VISIBLE_DEVICES' entry)
    gemm_gflops: float | None = None  # the median of gemm_samples
    gemm_samples: tuple[float, ...] = ()  # GFLOP/s of each timed window
    intra_busbw: float | None = None  # GB/s of the allreduce inside the node (local rank 0)
    intra_best: float | None = None  # GB/s of its best repetition
    cross_busbw: float | None = None  # GB/s of the allreduce across nodes (local rank 0)
    links: tuple[LinkResult, ...] = ()  # full, local rank 0: each link to a higher node
    error: str = ""  # why it measured nothing


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeProblem(JsonRecord):
    """A node check that failed: a path full, read-only or missing, a sick GPU, no endpoint."""

    check: Check
    what: str  # "preflight.paths /data is read-only"
    gpu: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuThrottle(JsonRecord):
    """NVML's throttle reasons of one GPU, in words (they explain a slow GEMM)."""

    gpu: int
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeReport(JsonRecord):
    """One node's share of the round's preflight."""

    node: int  # node rank in the round
    host: str
    workers: tuple[WorkerResult, ...] = ()
    problems: tuple[NodeProblem, ...] = ()
    throttled: tuple[GpuThrottle, ...] = ()
    error: str = ""  # the probe group failed as a whole (timed out, could not start)

    def encode(self) -> bytes:
        return json.dumps(self.to_json()).encode()


def read_report(raw: bytes | None, node: int, nproc: int, nodes: int = 0) -> NodeReport | str:
    """Node `node`'s report, or why it is none (missing, too large, malformed, implausible)."""
    if raw is None:
        return "published no preflight result in time"
    if len(raw) > MAX_REPORT:
        return f"published a preflight result of {len(raw)} bytes (at most {MAX_REPORT})"
    try:
        report = NodeReport.from_json(json.loads(raw))
    except (ValueError, TypeError, RecursionError) as exc:
        return f"published an unreadable preflight result ({str(exc)[:MAX_TEXT]})"
    if report.node != node:
        return f"published a preflight result in the name of node {report.node}"
    if len(report.problems) > MAX_PROBLEMS or len(report.workers) > MAX_WORKERS:
        return "published a preflight result with too many entries"
    if report.error:
        return f"preflight probe failed: {_clip(report.error)}"
    if sorted(w.local_rank for w in report.workers) != list(range(nproc)):
        return f"published preflight results for other than its {nproc} worker(s)"
    for w in report.workers:
        if any(not node < link.peer < nodes for link in w.links):
            return "published a preflight result naming a link to no node of the round"
        if len(w.gemm_samples) > MAX_SAMPLES:
            return "published a preflight result with too many samples"
        figures = (w.gemm_gflops, w.intra_busbw, w.intra_best, w.cross_busbw, *w.gemm_samples)
        for value in (*figures, *(k.busbw for k in w.links), *(k.best for k in w.links)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                return f"published an impossible measurement ({value!r:.40})"
    return report


def _clip(text: str) -> str:
    text = " ".join(text.split())
    clean = "".join(ch if ch.isprintable() else "?" for ch in text)
    return clean if len(clean) <= MAX_TEXT else clean[: MAX_TEXT - 3] + "..."


def clip(text: str) -> str:
    """Text from another node as one printable, bounded line."""
    return _clip(text)
