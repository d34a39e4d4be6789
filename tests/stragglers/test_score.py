"""The straggler score on made-up arrivals: who is last, by how much, with hysteresis; and what
the score reads from a rank's file or another node's share, as untrusted input."""

from __future__ import annotations

import json
import random

import pytest

from elastic_hydra.records.stragglers import Arrival, Seen, read_arrivals
from elastic_hydra.stragglers.score import Tracker, scores, summarize

STEP = 0.1  # seconds between collectives


def arrivals(
    world: int,
    steps: range,
    late: dict[int, float] | None = None,
    *,
    noise: float = 0.0,
    seed: int = 0,
) -> dict[int, list[Arrival]]:
    """Each rank's arrival at collectives `steps` of the default group: at step * STEP, plus
    `late[rank]` seconds, plus up to `noise` seconds at random."""
    rnd = random.Random(seed)
    late = late or {}
    return {
        r: [
            Arrival("0", s, "gloo:all_reduce", s * STEP + late.get(r, 0.0) + rnd.random() * noise)
            for s in steps
        ]
        for r in range(world)
    }


def test_the_last_rank_its_margin_and_the_interval() -> None:
    seen, members = summarize(arrivals(4, range(1, 31), {2: 0.03}))
    found, interval = scores(seen, members, 50, 4)
    assert (found[2].last, found[2].of, found[2].op) == (30, 30, "gloo:all_reduce")
    assert found[2].behind == pytest.approx(0.03)
    assert [found[r].last for r in (0, 1, 3)] == [0, 0, 0]  # ties are nobody's last
    assert interval == pytest.approx(STEP)


def test_a_collective_is_scored_once_every_rank_of_its_group_arrived() -> None:
    data = arrivals(4, range(1, 31), {2: 0.03})
    data[3] = data[3][:10]  # rank 3's file is behind: collectives 11-30 wait for it
    found, _ = scores(*summarize(data), 50, 4)
    assert found[2].of == 10
    data.pop(3)  # the default group is the whole world, even when a rank said nothing yet
    assert scores(*summarize(data), 50, 4)[0][2].of == 0


def test_a_slowdown_is_named_within_twenty_collectives_and_cleared_after_it() -> None:
    tracker = Tracker(window=50, behind=0.01, world=4)
    assert tracker.update(*summarize(arrivals(4, range(1, 101), noise=0.005))) == []
    slow = arrivals(4, range(1, 201), noise=0.005)
    for a in range(len(slow[1])):  # rank 1 is 20 % slower from collective 101 on
        if slow[1][a].seq > 100:
            slow[1][a] = Arrival("0", slow[1][a].seq, "gloo:all_reduce", slow[1][a].time + 0.02)
    named_at = None
    for upto in range(101, 201):
        part = {r: [a for a in items if a.seq <= upto] for r, items in slow.items()}
        if changes := tracker.update(*summarize(part)):
            (change,) = changes
            assert (change.named, change.score.rank) == (True, 1)
            named_at = upto
            break
    assert named_at is not None and named_at - 100 <= 15
    healed = {r: items + [Arrival("0", s, "gloo:all_reduce", s * STEP) for s in range(201, 221)]
              for r, items in slow.items()}  # fmt: skip
    (cleared,) = tracker.update(*summarize(healed))
    assert (cleared.named, cleared.score.rank) == (False, 1)


def test_a_cleared_rank_is_not_named_again_on_the_stretch_it_was_cleared_of() -> None:
    # Rank 2 is last by 0.1 s at collectives 25-64, then on time: scored after every
    # collective, as a watch that keeps up does. Cleared within MIN_SCORED collectives of the
    # end, it stays cleared while the long window still holds 40 late collectives of 50.
    data = arrivals(4, range(1, 121), noise=0.002, seed=3)
    data[2] = [Arrival("0", a.seq, a.op, a.time + (0.1 if 25 <= a.seq < 65 else 0.0))
               for a in data[2]]  # fmt: skip
    tracker, changes = Tracker(window=50, behind=0.01, world=4), []
    for upto in range(1, 121):
        part = {r: [a for a in items if a.seq <= upto] for r, items in data.items()}
        changes += [(upto, c.score.rank, c.named) for c in tracker.update(*summarize(part))]
    (named_at, *_), (cleared_at, *_) = changes  # named once, cleared once
    assert [c[1:] for c in changes] == [(2, True), (2, False)]
    assert named_at <= 25 + 15 and 65 < cleared_at <= 65 + 15


def test_noise_and_a_rank_a_few_ms_late_at_long_steps_are_never_named() -> None:
    tracker = Tracker(window=50, behind=0.01, world=2)
    for seed in range(20):  # two ranks: each is last half the time, by noise
        assert tracker.update(*summarize(arrivals(2, range(1, 200), noise=0.05, seed=seed))) == []
    slow_steps = {
        r: [Arrival("0", s, "op", s * 10.0 + (0.015 if r == 1 else 0)) for s in range(1, 60)]
        for r in range(4)
    }
    found, interval = scores(*summarize(slow_steps), 50, 4)
    assert (found[1].last, interval) == (50, 10.0)
    assert Tracker(50, 0.01, 4).update(*summarize(slow_steps)) == []  # 15 ms of 10 s: noise


def test_a_named_rank_is_not_named_again_while_it_stays_last() -> None:
    tracker = Tracker(window=50, behind=0.01, world=3)
    data = arrivals(3, range(1, 60), {0: 0.05})
    assert [c.named for c in tracker.update(*summarize(data))] == [True]
    assert tracker.update(*summarize(arrivals(3, range(1, 70), {0: 0.05}))) == []
    assert tracker.named == {0}


def test_subgroups_are_scored_among_their_own_ranks() -> None:
    late = {3: 0.04}
    data = {
        r: [
            Arrival("1" if r < 2 else "2", s, "op", s * STEP + late.get(r, 0)) for s in range(1, 40)
        ]
        for r in range(4)
    }
    found, _ = scores(*summarize(data), 50, 4)
    assert (found[3].last, found[3].of, found[1].last) == (39, 39, 0)


def test_nodes_sums_merge_to_the_job_s() -> None:
    data = arrivals(4, range(1, 31), {3: 0.03})
    node0, _ = summarize({r: data[r] for r in (0, 1)})
    node1, _ = summarize({r: data[r] for r in (2, 3)})
    whole, members = summarize(data)
    merged = {k: node0[k].merge(node1[k]) for k in node0}
    assert merged == whole
    assert scores(merged, members, 50, 4) == scores(whole, members, 50, 4)


@pytest.mark.parametrize(
    "line",
    [
        b"", b"[", b"{}", b'["0", 1, "op"]', b'["0", -1, "op", 1.0]', b'["0", true, "op", 1.0]',
        b'["0", 1, "op", "1.0"]', b'["0", 1, "op", NaN]', b'["0", 1, "op", Infinity]',
        b'[0, 1, "op", 1.0]', b'["0", 1.5, "op", 1.0]', b'["' + b"x" * 600 + b'", 1, "op", 1.0]',
    ],
)  # fmt: skip
def test_an_arrival_line_that_is_not_one_is_skipped(line: bytes) -> None:
    assert read_arrivals(line + b'\n["0", 1, "gloo:all_reduce", 2.5]') == [
        Arrival("0", 1, "gloo:all_reduce", 2.5)
    ]


@pytest.mark.parametrize(
    "item",
    [
        None, [], ["0", 1, "op", 1, 0, 1.0, None], ["0", 1, "op", 0, 0, 1.0, None, 1.0],
        ["0", 1, "op", 1, -1, 1.0, None, 1.0], ["0", 1, "op", 1, 0, "1", None, 1.0],
        ["0", 1, "op", 1, 0, 1.0, float("nan"), 1.0], [1, 1, "op", 1, 0, 1.0, None, 1.0],
    ],
)  # fmt: skip
def test_a_shared_collective_that_is_not_one_reads_as_none(item: object) -> None:
    assert Seen.from_json(json.loads(json.dumps(item))) is None


def test_a_shared_collective_reads_back_on_node_zeros_clock() -> None:
    one = Seen("gloo:all_reduce", 2, 3, 10.5, 10.25, 10.0)
    back = Seen.from_json(json.loads(json.dumps(one.to_json("0", 7, offset=0.5))))
    assert back == ("0", 7, Seen("gloo:all_reduce", 2, 3, 10.0, 9.75, 9.5))
