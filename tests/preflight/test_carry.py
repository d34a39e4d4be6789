"""A round that only lost nodes carries the last battery's verdict over, and only when every node
of the round agrees: the battery's vote (`Battery._carried`) between real threads, one a node,
over an exchange with the seam's semantics (gather: every node's value or None after the
timeout; first: the first value offered, the same for every node that asks).

The multi-node jobs in test_preflight_jobs.py run it between real agents over a real c10d store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from elastic_hydra.agent.seams import NodeAssignment, WorkerGroup
from elastic_hydra.plan import Endpoint, PreflightMode, PreflightSpec
from elastic_hydra.preflight.battery import Battery, Measured, NodeSetup, ProbeStarter
from elastic_hydra.records.preflight import Check, Finding, PreflightVerdict

TIMEOUT = 2.0  # preflight.timeout: a quarter of it (0.5 s) is the vote's wait


class Exchange:
    """One round's store, shared by the node threads."""

    def __init__(self, nodes: int, round_: int = 5) -> None:
        self.nodes, self.round = nodes, round_
        self.values: dict[tuple[str, int], bytes] = {}
        self.firsts: dict[str, bytes] = {}
        self.changed = threading.Condition()

    def for_node(self, rank: int) -> NodeExchange:
        return NodeExchange(self, rank)


class NodeExchange:
    def __init__(self, shared: Exchange, rank: int) -> None:
        self.shared, self.rank = shared, rank

    @property
    def round(self) -> int:
        return self.shared.round

    def gather(self, topic: str, value: bytes, *, limit: int, timeout: float) -> list[bytes | None]:
        s = self.shared
        with s.changed:
            s.values[topic, self.rank] = value
            s.changed.notify_all()
            s.changed.wait_for(lambda: all((topic, n) in s.values for n in range(s.nodes)), timeout)
            return [s.values.get((topic, n), b"")[: limit + 1] or None for n in range(s.nodes)]

    def first(self, topic: str, value: bytes, *, limit: int, timeout: float) -> bytes:
        with self.shared.changed:
            return self.shared.firsts.setdefault(topic, value)[: limit + 1]

    def offered(self, topic: str, *, limit: int) -> bytes | None:
        return self.shared.firsts.get(topic)


def no_probes(node: NodeAssignment, ids: tuple[int, int, int], settings: str) -> WorkerGroup:
    raise AssertionError("a carried round started the probe group")


def battery(exchange: NodeExchange) -> Battery:
    return Battery(
        PreflightSpec(mode=PreflightMode.QUICK, timeout=TIMEOUT),
        NodeSetup(host="h", run_id="r", nproc=1, paths=(), endpoint=None),
        ProbeStarter(no_probes, lambda r, lr: Path("/nonexistent"), lambda r, lr: Path("/x")),
        exchange,
        say=lambda line: None,
        stopped=lambda: False,
    )


def node(rank: int, members: Sequence[str]) -> NodeAssignment:
    return NodeAssignment(
        group_rank=rank, group_world_size=len(members), base_rank=rank, world_size=len(members),
        role_base_rank=rank, role_world_size=len(members),
        master=Endpoint(host="127.0.0.1", port=1), members=tuple(members),
    )  # fmt: skip


# Round 3's battery: nodes a, b, c; b (node 1) failed it.
LAST = PreflightVerdict(
    mode=PreflightMode.QUICK, round=3, nodes=3, bad_nodes=(1,), bad_hosts=("hb",),
    findings=(Finding(check=Check.GEMM, line="preflight: node 1 slow", fatal=True, node=1,
                      host="hb"),),
    gemm_median=50.0, seconds=12.0,
)  # fmt: skip


def measured(restarts: int = 0) -> Measured:
    return Measured(verdict=LAST, passed=frozenset({"a", "c"}), restarts=restarts)


def rounds(
    members: Sequence[str],
    lasts: Sequence[Measured | None],
    restarts: Sequence[int] | None = None,
    votes: Callable[[int], bool] = lambda rank: True,
) -> list[PreflightVerdict | None]:
    """Each node of the round (a thread) through `_carried`; each node's answer by rank."""
    shared = Exchange(len(members))
    found: dict[int, PreflightVerdict | None] = {}
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            b = battery(shared.for_node(rank))
            b._last = lasts[rank]
            found[rank] = b._carried(node(rank, members), (restarts or [0] * 9)[rank],
                                     time.monotonic())  # fmt: skip
        except BaseException as exc:  # the test fails on it below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(members)) if votes(r)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors
    assert sorted(found) == [r for r in range(len(members)) if votes(r)]  # every voter answered
    return [found.get(r) for r in range(len(members))]


def test_the_round_after_a_node_failed_its_preflight_carries_the_verdict_on_every_node() -> None:
    found = rounds(["c", "a"], [measured(), measured()])  # the two that passed, ranked anew
    for verdict in found:
        assert verdict is not None
        assert (verdict.round, verdict.nodes, verdict.carried_from) == (5, 2, 3)
        assert verdict.passed and verdict.bad_hosts == () and verdict.findings == ()
        assert verdict.gemm_median == 50.0  # the figures of the battery that measured them
        assert verdict.lines() == [
            "preflight: the 2 node(s) of this round passed round 3's battery, with no restart "
            "since: not measured again"
        ]


@pytest.mark.parametrize(
    ("members", "lasts", "restarts"),
    [
        (["a", "c", "d"], [measured()] * 2 + [None], None),  # d is new: it ran no battery
        (["a", "b"], [measured(), measured()], None),  # b failed the last battery
        (["a", "c"], [measured(), measured()], [0, 1]),  # c restarted its workers since
        (["a", "c"], [measured(), None], None),  # c's agent started again (it knows none)
    ],
    ids=["a-new-node", "a-failed-node", "a-restart", "a-node-that-knows-no-battery"],
)
def test_every_node_runs_the_battery_when_one_node_cannot_vouch_for_the_round(
    members: list[str], lasts: list[Measured | None], restarts: list[int] | None
) -> None:
    assert rounds(members, lasts, restarts) == [None] * len(members)


def test_a_vote_that_does_not_come_makes_the_others_run_the_battery() -> None:
    began = time.monotonic()
    found = rounds(["a", "c"], [measured(), measured()], votes=lambda rank: rank == 0)
    assert found == [None, None]
    assert time.monotonic() - began < TIMEOUT  # the vote waited its share (0.5 s), no more


def test_a_node_without_member_names_runs_the_battery_without_a_vote() -> None:
    b = battery(Exchange(1).for_node(0))
    b._last = measured()
    assert b._carried(node(0, []), 0, time.monotonic()) is None
