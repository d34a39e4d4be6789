"""The verdict from data: every node's report rated against the round's medians (pure)."""

from __future__ import annotations

import json

import pytest

from elastic_hydra.plan import PreflightMode
from elastic_hydra.preflight.probe import pairings  # plain Python: torch is imported lazily
from elastic_hydra.preflight.results import (
    MAX_REPORT,
    GpuThrottle,
    LinkResult,
    NodeProblem,
    NodeReport,
    WorkerResult,
    read_report,
)
from elastic_hydra.preflight.verdict import Judgement, Rating, judge, rate
from elastic_hydra.records.preflight import Check, PreflightVerdict

RATING = Rating(mode=PreflightMode.QUICK, min_ratio=0.8, round=3)


def node(
    n: int,
    gemm: list[float],
    *,
    gpus: bool = False,
    intra: float | None = None,
    cross: float | None = None,
    problems: tuple[NodeProblem, ...] = (),
    throttled: tuple[GpuThrottle, ...] = (),
    links: dict[int, float] | None = None,
) -> NodeReport:
    nproc = len(gemm)
    workers = tuple(
        WorkerResult(
            local_rank=lr,
            rank=n * nproc + lr,
            device="cuda" if gpus else "cpu",
            gpu=lr if gpus else None,
            gemm_gflops=rate_,
            intra_busbw=intra if lr == 0 else None,
            cross_busbw=cross if lr == 0 else None,
            links=tuple(LinkResult(peer=p, busbw=bw) for p, bw in (links or {}).items())
            if lr == 0
            else (),
        )
        for lr, rate_ in enumerate(gemm)
    )
    return NodeReport(
        node=n, host=f"host{n}", workers=workers, problems=problems, throttled=throttled
    )


def test_a_healthy_job_passes_with_one_line_and_its_figures() -> None:
    verdict = rate([node(n, [100.0, 98.0], cross=11.2) for n in range(4)], RATING)
    assert verdict.passed and verdict.bad_nodes == () and verdict.bad_hosts == ()
    assert verdict.gemm_median == 99.0 and verdict.allreduce_busbw == 11.2
    assert verdict.lines() == [
        "preflight: allreduce across 4 nodes at 11.2 GB/s bus bandwidth",
        "preflight: 4 node(s) passed: GEMM median 99.0 GFLOP/s",
    ]
    assert not any(f.fatal for f in verdict.findings)


def test_a_slow_gpu_names_its_node_host_and_index_with_the_throttle_reason() -> None:
    slow = node(
        3,
        [100.0, 100.0, 100.0, 100.0, 100.0, 41.0],
        gpus=True,
        throttled=(GpuThrottle(gpu=5, reasons=("power cap",)),),
    )
    reports = [node(n, [100.0] * 6, gpus=True) for n in range(3)] + [slow]
    verdict = rate(reports, RATING)
    assert verdict.bad_nodes == (3,) and verdict.bad_hosts == ("host3",)
    line = (
        "preflight: node 3 (host3) gpu 5 at 41 % of the median GEMM rate "
        "(41.0 of 100.0 GFLOP/s) (throttled: power cap)"
    )
    assert [f.line for f in verdict.findings if f.fatal] == [line]
    assert [(g.host, g.gpu, g.line) for g in verdict.bad_gpus] == [("host3", 5, line)]


def test_a_cpu_worker_just_under_the_ratio_fails_and_one_just_over_passes() -> None:
    reports = [node(0, [100.0]), node(1, [100.0]), node(2, [79.0]), node(3, [81.0])]
    verdict = rate(reports, Rating(mode=PreflightMode.QUICK, min_ratio=0.8, round=0))
    # median of 100, 100, 79, 81 is 90.5: 79 is 87 %, 81 is 89 %: both pass at 0.8 ...
    assert verdict.passed
    # ... and both fail at 0.9
    strict = rate(reports, Rating(mode=PreflightMode.QUICK, min_ratio=0.9, round=0))
    assert strict.bad_nodes == (2, 3)
    assert "rank 2 (cpu) at 87 % of the median GEMM rate" in strict.findings[0].line
    assert strict.bad_gpus == ()


# ------------------------------------------------------------------ noise: confirmed or kept
def sampled(n: int, samples: list[float], *, intra: list[float] | None = None) -> NodeReport:
    """Node n with one CPU worker whose GEMM windows measured `samples` (rate: their median)."""
    ordered = sorted(samples)
    worker = WorkerResult(
        local_rank=0,
        rank=n,
        device="cpu",
        gemm_gflops=ordered[len(ordered) // 2],
        gemm_samples=tuple(samples),
        intra_busbw=sorted(intra)[len(intra) // 2] if intra else None,
        intra_best=max(intra) if intra else None,
    )
    return NodeReport(node=n, host=f"host{n}", workers=(worker,))


HEALTHY = [100.0, 97.0, 103.0, 99.0, 101.0]


def test_a_noisy_healthy_node_below_the_ratio_is_kept_with_a_warning() -> None:
    # node 2 lost three of its five windows to a neighbour: median 60 %, best window 100 %
    noisy = [40.0, 100.0, 55.0, 98.0, 60.0]
    reports = [sampled(0, HEALTHY), sampled(1, HEALTHY), sampled(2, noisy), sampled(3, HEALTHY)]
    verdict = rate(reports, RATING)
    assert verdict.passed and verdict.bad_nodes == () and verdict.bad_hosts == ()
    warning = [f for f in verdict.findings if f.node == 2]
    assert len(warning) == 1 and not warning[0].fatal
    assert warning[0].line == (
        "preflight: node 2 (host2) rank 2 (cpu) at 60 % of the median GEMM rate "
        "(60.0 of 100.0 GFLOP/s), not confirmed (best sample at 100 % of the median): kept"
    )


def test_a_consistently_slow_node_is_named_even_at_its_best() -> None:
    slow = [10.0, 12.0, 9.0, 11.0, 10.5]  # a CPU quota of a tenth: slow in every window
    reports = [sampled(0, HEALTHY), sampled(1, slow), sampled(2, HEALTHY), sampled(3, HEALTHY)]
    verdict = rate(reports, RATING)
    assert verdict.bad_nodes == (1,)
    assert [f.line for f in verdict.findings if f.fatal] == [
        "preflight: node 1 (host1) rank 1 (cpu) at 10 % of the median GEMM rate "
        "(10.5 of 100.0 GFLOP/s)"
    ]
    # moderately slow (70 %) in every window is slow too: noise does not save it
    steady = [70.0, 72.0, 69.0, 71.0, 70.0]
    reports[1] = sampled(1, steady)
    assert rate(reports, RATING).bad_nodes == (1,)


def test_the_same_noisy_reports_give_the_same_verdict_on_every_node() -> None:
    noisy = [40.0, 100.0, 55.0, 98.0, 60.0]
    reports = [sampled(n, noisy if n == 3 else HEALTHY) for n in range(4)]
    assert rate(reports, RATING) == rate(list(reports), RATING)


def test_a_noisy_allreduce_inside_a_node_is_kept_and_a_slow_one_is_named() -> None:
    good, noisy, slow = [5.0, 5.1, 4.9], [1.0, 5.0, 2.0], [0.9, 1.0, 0.8]
    reports = [sampled(n, HEALTHY, intra=good) for n in range(3)]
    verdict = rate([*reports, sampled(3, HEALTHY, intra=noisy)], RATING)
    assert verdict.passed
    assert any("inside the node at 2 GB/s" in f.line and "kept" in f.line for f in verdict.findings)
    assert rate([*reports, sampled(3, HEALTHY, intra=slow)], RATING).bad_nodes == (3,)


@pytest.mark.parametrize(
    ("value", "best", "expected"),
    [
        (90.0, 90.0, Judgement.OK),  # at or above the ratio: no finding
        (70.0, 95.0, Judgement.UNCONFIRMED),  # typical slow, best healthy: cannot tell
        (70.0, 75.0, Judgement.SLOW),  # slow at its best too
        (70.0, 80.0, Judgement.UNCONFIRMED),  # best exactly at the ratio: not below it
        (0.0, 0.0, Judgement.SLOW),
    ],
)
def test_judge_confirms_a_slow_figure_only_when_its_best_sample_is_slow_too(
    value: float, best: float, expected: Judgement
) -> None:
    assert judge(value, best, 100.0, 0.8) is expected


def test_a_node_check_problem_fails_that_node_alone() -> None:
    full = NodeProblem(check=Check.PATH, what="preflight.paths /data is full")
    verdict = rate([node(0, [50.0]), node(1, [50.0], problems=(full,))], RATING)
    assert verdict.bad_nodes == (1,)
    assert verdict.findings[0].line == "preflight: node 1 (host1) preflight.paths /data is full"
    assert verdict.findings[0].check is Check.PATH


def test_a_node_without_a_report_fails_and_the_others_are_still_rated() -> None:
    verdict = rate([node(0, [50.0]), "published no preflight result in time", node(2, [5.0])],
                   RATING)  # fmt: skip
    assert verdict.bad_nodes == (1, 2)
    assert verdict.findings[0].line == "preflight: node 1 published no preflight result in time"
    assert verdict.bad_hosts == ("", "host2")


def test_a_slow_allreduce_inside_one_node_names_that_node() -> None:
    reports = [node(n, [10.0, 10.0], intra=5.0) for n in range(3)]
    reports.append(node(3, [10.0, 10.0], intra=0.9))
    verdict = rate(reports, RATING)
    assert verdict.bad_nodes == (3,)
    assert [f.line for f in verdict.findings if f.fatal] == [
        "preflight: node 3 (host3) allreduce inside the node at 0.9 GB/s of 5 GB/s median"
    ]
    assert "inside each node at 5 GB/s bus bandwidth (median)" in verdict.lines()[0]


def test_every_node_comes_to_the_same_verdict_and_it_survives_json() -> None:
    reports = [node(n, [100.0, 30.0 if n == 1 else 100.0]) for n in range(4)]
    first, again = rate(reports, RATING), rate(list(reports), RATING)
    assert first == again
    assert PreflightVerdict.from_json(json.loads(json.dumps(first.to_json()))) == first


# ------------------------------------------------------------------------------ links (full)
def full(links: dict[tuple[int, int], float], nodes: int) -> list[NodeReport | str]:
    return [
        node(n, [10.0], links={b: bw for (a, b), bw in links.items() if a == n})
        for n in range(nodes)
    ]


def test_a_slow_link_is_named_as_that_link_and_fails_neither_end() -> None:
    links = {(0, 1): 11.2, (0, 2): 11.0, (0, 3): 11.4, (1, 2): 11.3, (1, 3): 10.9, (2, 3): 0.9}
    verdict = rate(full(links, 4), RATING)
    assert verdict.passed
    (slow,) = [f for f in verdict.findings if f.peer is not None]
    assert (
        slow.line
        == "preflight: link node 2 (host2) <-> node 3 (host3) at 0.9 GB/s of 11.1 GB/s median"
    )
    assert (slow.check, slow.node, slow.peer, slow.fatal) == (Check.LINK, 2, 3, False)
    assert "preflight: 6 links between nodes at 11.1 GB/s (median)" in verdict.lines()


def test_a_node_whose_every_link_is_slow_is_that_node() -> None:
    links = {(0, 1): 10.0, (0, 2): 10.0, (0, 3): 1.0, (1, 2): 10.0, (1, 3): 1.0, (2, 3): 1.0}
    verdict = rate(full(links, 4), RATING)
    assert verdict.bad_nodes == (3,)
    assert [f.line for f in verdict.findings if f.fatal] == [
        "preflight: node 3 (host3) every link at under 80 % of the median link bandwidth"
    ]


def test_links_to_no_node_of_the_round_are_refused() -> None:
    report = node(1, [10.0], links={1: 5.0})  # to itself
    assert "naming a link to no node" in str(read_report(report.encode(), 1, nproc=1, nodes=3))
    report = node(1, [10.0], links={3: 5.0})
    assert "naming a link to no node" in str(read_report(report.encode(), 1, nproc=1, nodes=3))
    report = node(1, [10.0], links={2: 5.0})
    assert read_report(report.encode(), 1, nproc=1, nodes=3) == report


def test_every_pair_of_nodes_is_measured_once_in_rounds_of_disjoint_pairs() -> None:
    for nodes in range(2, 10):
        rounds = pairings(nodes)
        pairs = [p for r in rounds for p in r]
        assert sorted(pairs) == [(a, b) for a in range(nodes) for b in range(a + 1, nodes)]
        assert all(len({n for p in r for n in p}) == 2 * len(r) for r in rounds)
        assert len(rounds) == nodes - 1 + nodes % 2


# ------------------------------------------------------------------ reports from the store
def good() -> NodeReport:
    return node(1, [10.0, 10.0])


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (None, "published no preflight result in time"),
        (b"x" * (MAX_REPORT + 1), "bytes (at most"),
        (b"{not json", "unreadable"),
        (b"[]", "unreadable"),
        (json.dumps(good().to_json() | {"node": 0}).encode(), "in the name of node 0"),
        (json.dumps(good().to_json() | {"workers": []}).encode(), "other than its 2 worker(s)"),
        (
            json.dumps(
                good().to_json()
                | {"workers": [w.to_json() | {"gemm_gflops": -1.0} for w in good().workers]}
            ).encode(),
            "impossible measurement",
        ),
        (json.dumps(good().to_json() | {"error": "probe timed out"}).encode(), "timed out"),
    ],
)
def test_an_untrusted_report_becomes_a_reason_never_an_exception(
    raw: bytes | None, why: str
) -> None:
    found = read_report(raw, 1, nproc=2)
    assert isinstance(found, str) and why in found


def test_a_good_report_reads_back_as_it_was_written() -> None:
    assert read_report(good().encode(), 1, nproc=2) == good()
