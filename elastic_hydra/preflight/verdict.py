"""The verdict: every node's report rated against the round's medians. Pure.

Each node rates the same reports the same way, so every node of a round comes to the same
verdict without a coordinator: a node fails when a node check failed, when its probe measured
nothing, when one of its workers multiplies below `min_ratio` of the job's median GEMM rate, or
when its allreduce inside the node runs below `min_ratio` of the nodes' median bus bandwidth.

A slow figure must be confirmed before it costs a node its place: each measurement comes as
several samples (GEMM windows, allreduce repetitions), and a figure below `min_ratio` of the
median is confirmed only when the node's best sample is below `min_ratio` of that median too:
at no moment of the measurement did it reach what a typical node does typically. A healthy node
on a busy host loses some windows to its neighbours but wins others; a throttled or slow one is
slow in every window. (Not against the median of the best samples: a burst, a window while the
others waited, inflates those, and a healthy node was named so on the test host.) A finding that
is not confirmed is printed as a warning (`... not confirmed (best sample at 93 % of the
median): kept`) and excludes nobody: the verdict cannot tell, so it does not guess.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from elastic_hydra.plan import PreflightMode
from elastic_hydra.preflight.results import NodeReport, WorkerResult, clip
from elastic_hydra.records.preflight import BadGpu, Check, Finding, PreflightVerdict


@dataclass(frozen=True, slots=True, kw_only=True)
class Rating:
    """What the verdict needs of the plan."""

    mode: PreflightMode
    min_ratio: float
    round: int


class Judgement(StrEnum):
    """One figure against the job's medians."""

    OK = "ok"
    SLOW = "slow"  # below min_ratio of the median, its best sample too
    UNCONFIRMED = "unconfirmed"  # below min_ratio of the median, but its best sample is not


def judge(value: float, best: float, median: float, min_ratio: float) -> Judgement:
    """`value` (the typical sample) and `best` (the best one) against the job's `median` of the
    typical samples."""
    if median <= 0 or value >= min_ratio * median:
        return Judgement.OK
    if best >= min_ratio * median:
        return Judgement.UNCONFIRMED
    return Judgement.SLOW


def _unconfirmed(best: float, median: float) -> str:
    return f", not confirmed (best sample at {100 * best / median:.0f} % of the median): kept"


def rate(reports: Sequence[NodeReport | str], rating: Rating) -> PreflightVerdict:
    """The round's verdict. `reports[i]` is node i's report, or why it has none."""
    found: list[Finding] = []
    good = [r for r in reports if isinstance(r, NodeReport)]
    for node, report in enumerate(reports):
        if isinstance(report, str):
            found.append(_finding(Check.PROBE, node, "", clip(report), fatal=True))
            continue
        found += [
            _finding(p.check, node, report.host, clip(p.what), fatal=True, gpu=p.gpu)
            for p in report.problems
        ]
        found += [
            _finding(Check.PROBE, node, report.host, f"{_where(w)} {clip(w.error)}", fatal=True)
            for w in report.workers
            if w.error
        ]
    gemm_median = _gemm(good, rating.min_ratio, found)
    _intra(good, rating.min_ratio, found)
    _links(good, rating.min_ratio, found, len(reports))
    cross = [w.cross_busbw for r in good for w in r.workers if w.cross_busbw is not None]
    busbw = statistics.median(cross) if cross else None
    if busbw is not None:
        line = f"preflight: allreduce across {len(reports)} nodes at {busbw:.3g} GB/s bus bandwidth"
        found.append(Finding(check=Check.ALLREDUCE, line=line, fatal=False))
    return _verdict(reports, rating, found, gemm_median, busbw)


def _verdict(
    reports: Sequence[NodeReport | str],
    rating: Rating,
    found: list[Finding],
    gemm_median: float | None,
    busbw: float | None,
) -> PreflightVerdict:
    bad = sorted({f.node for f in found if f.fatal and f.node is not None})
    hosts = {r.node: clip(r.host) for r in reports if isinstance(r, NodeReport)}
    gpus = {(f.host, f.gpu): f.line for f in found if f.fatal and f.gpu is not None and f.host}
    if not bad:
        figure = "" if gemm_median is None else f": GEMM median {gemm_median:.1f} GFLOP/s"
        line = f"preflight: {len(reports)} node(s) passed{figure}"
        found.append(Finding(check=Check.GEMM, line=line, fatal=False))
    return PreflightVerdict(
        mode=rating.mode,
        round=rating.round,
        nodes=len(reports),
        findings=tuple(found),
        bad_nodes=tuple(bad),
        bad_hosts=tuple(hosts.get(n, "") for n in bad),
        bad_gpus=tuple(BadGpu(host=h, gpu=g, line=line) for (h, g), line in gpus.items()),
        gemm_median=gemm_median,
        allreduce_busbw=busbw,
    )


def _gemm(reports: list[NodeReport], min_ratio: float, found: list[Finding]) -> float | None:
    """Each worker's GEMM rate against the median of every worker of the job."""
    rated = [w for r in reports for w in r.workers if w.gemm_gflops is not None]
    if not rated:
        return None
    median = statistics.median(w.gemm_gflops for w in rated if w.gemm_gflops is not None)
    for report in reports:
        throttled = {t.gpu: t.reasons for t in report.throttled}
        for w in report.workers:
            if w.gemm_gflops is None:
                continue
            best = _best_gemm(w)
            judged = judge(w.gemm_gflops, best, median, min_ratio)
            if judged is Judgement.OK:
                continue
            why = throttled.get(w.gpu, ()) if w.gpu is not None else ()
            note = f" (throttled: {clip(', '.join(why))})" if why else ""
            what = (
                f"{_where(w)} at {100 * w.gemm_gflops / median:.0f} % of the median GEMM rate "
                f"({w.gemm_gflops:.1f} of {median:.1f} GFLOP/s){note}"
            )
            slow = judged is Judgement.SLOW
            what += "" if slow else _unconfirmed(best, median)
            found.append(
                _finding(Check.GEMM, report.node, report.host, what, fatal=slow, gpu=w.gpu)
            )
    return median


def _best_gemm(w: WorkerResult) -> float:
    return max(w.gemm_samples, default=w.gemm_gflops or 0.0)


def _intra(reports: list[NodeReport], min_ratio: float, found: list[Finding]) -> None:
    """Each node's allreduce inside the node against the nodes' median."""
    figures = {
        r.node: (w.intra_busbw, w.intra_best or w.intra_busbw)
        for r in reports
        for w in r.workers
        if w.intra_busbw is not None
    }
    if not figures:
        return
    median = statistics.median(v for v, _ in figures.values())
    line = f"preflight: allreduce inside each node at {median:.3g} GB/s bus bandwidth (median)"
    found.append(Finding(check=Check.ALLREDUCE, line=line, fatal=False))
    for report in reports:
        if report.node not in figures:
            continue
        value, best = figures[report.node]
        judged = judge(value, best, median, min_ratio)
        if judged is Judgement.OK:
            continue
        slow = judged is Judgement.SLOW
        what = f"allreduce inside the node at {value:.3g} GB/s of {median:.3g} GB/s median"
        what += "" if slow else _unconfirmed(best, median)
        found.append(_finding(Check.ALLREDUCE, report.node, report.host, what, fatal=slow))


def _links(reports: list[NodeReport], min_ratio: float, found: list[Finding], nodes: int) -> None:
    """Every link's bus bandwidth against the median link (full). A slow link is named, not
    blamed on either end; a node whose every link is slow (of three nodes or more) is the node."""
    figures = {
        (r.node, link.peer): (link.busbw, link.best or link.busbw)
        for r in reports
        for w in r.workers
        for link in w.links
    }
    if not figures:
        return
    hosts = {r.node: clip(r.host) for r in reports}
    median = statistics.median(v for v, _ in figures.values())
    judged = {pair: judge(*figures[pair], median, min_ratio) for pair in figures}
    slow = {pair for pair, j in judged.items() if j is Judgement.SLOW}
    line = f"preflight: {len(figures)} links between nodes at {median:.3g} GB/s (median)"
    found.append(Finding(check=Check.LINK, line=line, fatal=False))
    for a, b in sorted(pair for pair, j in judged.items() if j is not Judgement.OK):
        value, best = figures[(a, b)]
        what = (
            f"preflight: link {_name(a, hosts)} <-> {_name(b, hosts)} at "
            f"{value:.3g} GB/s of {median:.3g} GB/s median"
        )
        what += "" if (a, b) in slow else _unconfirmed(best, median)
        found.append(
            Finding(check=Check.LINK, line=what, fatal=False, node=a, host=hosts[a], peer=b)
        )
    for n in range(nodes) if nodes >= 3 else ():
        mine = [pair for pair in figures if n in pair]
        if len(mine) == nodes - 1 and all(pair in slow for pair in mine):
            what = f"every link at under {100 * min_ratio:.0f} % of the median link bandwidth"
            found.append(_finding(Check.LINK, n, hosts.get(n, ""), what, fatal=True))


def _name(node: int, hosts: dict[int, str]) -> str:
    return f"node {node} ({hosts[node]})" if hosts.get(node) else f"node {node}"


def _where(w: WorkerResult) -> str:
    if w.gpu is not None:
        return f"gpu {w.gpu}"
    return f"rank {w.rank} ({w.device})" if w.rank >= 0 else f"local rank {w.local_rank}"


def _finding(
    check: Check, node: int, host: str, what: str, *, fatal: bool, gpu: int | None = None
) -> Finding:
    name = _name(node, {node: clip(host)})
    return Finding(
        check=check,
        line=f"preflight: {name} {what}",
        fatal=fatal,
        node=node,
        host=clip(host),
        gpu=gpu,
    )
