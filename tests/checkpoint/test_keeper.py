"""The agent's side: the area, the offer the nodes agree on, the copies in the home and their
checks. Plain files and a fake exchange here; tests/checkpoint/test_snapshots_real.py runs it
with real workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from elastic_hydra.agent.inherit import SNAPSHOTS
from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.checkpoint import api, codec
from elastic_hydra.checkpoint.keeper import CopyError, Keeper, Offer, open_area, remove_stale_areas
from elastic_hydra.checkpoint.layout import AREA_PREFIX, Area
from elastic_hydra.plan import CheckpointSpec, Endpoint
from tests.conftest import wait_for


def node(rank: int = 0, nodes: int = 1, nproc: int = 2) -> NodeAssignment:
    return NodeAssignment(
        group_rank=rank, group_world_size=nodes, base_rank=rank * nproc,
        world_size=nodes * nproc, role_base_rank=rank * nproc, role_world_size=nodes * nproc,
        master=Endpoint(host="127.0.0.1", port=1),
    )  # fmt: skip


class Exchange:
    """The other nodes' words, as the round's store would give them."""

    def __init__(self, others: Sequence[bytes | None] = ()) -> None:
        self.others = list(others)
        self.waited: list[float] = []

    @property
    def round(self) -> int:
        return 1

    def gather(self, topic: str, value: bytes, *, limit: int, timeout: float) -> list[bytes | None]:
        self.waited.append(timeout)
        return [value, *self.others]

    def first(self, topic: str, value: bytes, *, limit: int, timeout: float) -> bytes:
        """The first proposal: another node's, when there is one."""
        return next((v for v in self.others if v is not None), value)

    def offered(self, topic: str, *, limit: int) -> bytes | None:
        return next((v for v in self.others if v is not None), None)


def snap(area: Area, rank: int, step: int, payload: object = None) -> None:
    area.rank_dir(rank).mkdir(mode=0o700, exist_ok=True)
    codec.write({"w": payload if payload is not None else [rank, step]}, area.snapshot(rank, step))


def keeper(tmp_path: Path, name: str = "a", **spec: object) -> Keeper:
    (tmp_path / f"shm-{name}").mkdir()
    area = open_area(tmp_path / f"shm-{name}")
    home = str(tmp_path / "home")
    said: list[str] = []
    out = Keeper(CheckpointSpec(home=home, job="train", **spec), area, say=said.append)  # type: ignore[arg-type]
    out.said = said  # type: ignore[attr-defined]
    return out


def said(k: Keeper) -> list[str]:
    return k.said  # type: ignore[attr-defined,no-any-return]


def test_the_offer_is_the_newest_step_every_rank_holds_and_newer_ones_are_dropped(
    tmp_path: Path,
) -> None:
    k = keeper(tmp_path)
    for rank, step in [(0, 4), (0, 5), (1, 3), (1, 4)]:
        snap(k.area, rank, step)
    (k.area.rank_dir(1) / ".step-5.77.part").write_bytes(b"half")  # a write a kill cut short
    exchange = Exchange()
    assert k.offer(node(), 2, exchange) == Offer(step=4, source="memory")
    assert json.loads(k.area.restore.read_text()) == {"format": 1, "step": 4, "source": "memory"}
    assert k.area.steps(0) == [4] and k.area.steps(1) == [3, 4]  # 5: a timeline that ended
    assert exchange.waited == [30.0]


def other_node(
    holds: dict[int, list[int]], ranks: tuple[int, int], home: Sequence[int] = ()
) -> bytes:
    """Another node's word, as Keeper.offer publishes it."""
    word = {"holds": {str(r): s for r, s in holds.items()}, "ranks": list(ranks),
            "home": list(home), "at": None}  # fmt: skip
    return json.dumps(word).encode()


def test_nodes_agree_on_a_step_all_hold_and_a_node_that_said_nothing_holds_nothing(
    tmp_path: Path,
) -> None:
    k = keeper(tmp_path)
    for rank, step in [(0, 6), (0, 7), (1, 6), (1, 7)]:
        snap(k.area, rank, step)
    other = other_node({2: [5, 6], 3: [5, 6]}, (2, 2))
    two = node(0, nodes=2)
    assert k.offer(two, 2, Exchange([other])).step == 6
    assert k.offer(two, 2, Exchange([None])).step is None  # one node said nothing
    assert k.offer(two, 2, Exchange([b"garbage"])).step is None
    assert k.area.steps(0) == []  # nothing offered: nothing of the old timeline stays


def test_every_node_waits_for_the_others_word_and_one_that_holds_nothing_starts_afresh(
    tmp_path: Path,
) -> None:
    """A node that holds nothing (a replacement) waits too: another node may hold its ranks."""
    k = keeper(tmp_path)
    exchange = Exchange([other_node({2: [3], 3: [3]}, (2, 2))])
    assert k.offer(node(0, nodes=2), 2, exchange) == Offer(step=None)
    assert exchange.waited == [30.0]
    assert api_offer(k.area) == {"format": 1, "step": None, "source": ""}


def api_offer(area: Area) -> object:
    return json.loads(area.restore.read_text())


def test_a_kept_copy_is_complete_sound_and_offered_to_the_next_launch(tmp_path: Path) -> None:
    first = keeper(tmp_path, "first")
    for rank, step in [(0, 8), (0, 9), (1, 8), (1, 9)]:
        snap(first.area, rank, step)
    first.offer(node(), 2, Exchange())
    assert first.persist() == 9
    assert any("step 9 of ranks 0-1 kept in" in line for line in said(first))
    home = first.home
    assert home.copies() == [8, 9]
    manifest = json.loads(home.manifest(9, 0).read_text())
    assert manifest["job"] == "train" and manifest["world_size"] == 2
    assert set(manifest["ranks"]) == {"0", "1"}
    assert oct(home.part(9, 1).stat().st_mode & 0o777) == oct(0o600)
    first.close()
    assert not first.area.root.exists()

    second = keeper(tmp_path, "second")  # a relaunch: nothing in memory
    offer = second.offer(node(), 2, Exchange())
    assert offer == Offer(step=9, source=str(home.copy_dir(9)))
    os.environ[SNAPSHOTS] = str(second.area.root)
    try:
        os.environ["RANK"] = "1"
        assert api.restore() == {"w": [1, 9], "step": 9}
    finally:
        del os.environ[SNAPSHOTS], os.environ["RANK"]
    grown = keeper(tmp_path, "grown")  # a relaunch on two nodes: 4 ranks
    assert grown.offer(node(nodes=2), 2, Exchange([None])).step is None
    assert said(grown) == [
        "checkpoint: the copy of step 9 is of 2 ranks, this job has 4: not resumed",
        "checkpoint: the copy of step 8 is of 2 ranks, this job has 4: not resumed",
    ]


def test_a_copy_that_is_corrupt_half_written_or_another_jobs_is_refused_with_one_line(
    tmp_path: Path,
) -> None:
    k = keeper(tmp_path)
    for step in (1, 2, 3, 4):
        for rank in (0, 1):
            snap(k.area, rank, step)
        k.offer(node(), 2, Exchange())
        k.persist()
    home = k.home
    assert home.copies() == [3, 4]  # keep=2: older complete copies are removed
    part = home.part(4, 0)
    data = bytearray(part.read_bytes())
    data[-1] ^= 0xFF
    part.write_bytes(bytes(data))  # the same size, another byte
    fresh = keeper(tmp_path, "fresh")
    assert fresh.offer(node(), 2, Exchange()).step == 3
    assert said(fresh) == [
        "checkpoint: the copy of step 4 is not resumed: rank-0.snap does not match its digest"
    ]
    home.manifest(3, 0).write_text(json.dumps({**json.loads(home.manifest(3, 0).read_text()),
                                               "job": "other"}))  # fmt: skip
    home.copy_dir(5).mkdir()  # a copy whose manifest was never written
    (home.copy_dir(5) / "rank-0.snap").write_bytes(b"x")
    again = keeper(tmp_path, "again")
    assert again.offer(node(), 2, Exchange()).step is None
    assert sorted(said(again)) == [
        "checkpoint: the copy of step 3 is not resumed: node-0.json is of another job ('other')",
        "checkpoint: the copy of step 4 is not resumed: rank-0.snap does not match its digest",
        "checkpoint: the copy of step 5 is not resumed: no manifest: it was not completed",
    ]


def test_a_copy_of_another_world_size_or_missing_a_rank_is_not_resumed(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.offer(node(rank=0, nodes=2), 2, Exchange([None]))
    for rank in (0, 1):  # the workers' snapshots; node 1 never writes its part of the copy
        snap(k.area, rank, 1)
    k.persist()
    fresh = keeper(tmp_path, "fresh")
    assert fresh.offer(node(), 2, Exchange()).step is None
    assert said(fresh) == [
        "checkpoint: the copy of step 1 is not resumed: no part of rank 2 (2 missing)"
    ]
    fresh.home.manifest(1, 0).write_text("{" * 100)
    with pytest.raises(CopyError, match=r"node-0\.json cannot be read"):
        fresh.check(1, ())
    bad = {"format": 1, "job": "train", "step": 1, "world_size": 2, "ranks": {"0": {}}}
    fresh.home.manifest(1, 0).write_text(json.dumps(bad))
    with pytest.raises(CopyError, match=r"the part of rank '0' is not one"):
        fresh.check(1, ())


def test_the_area_of_a_killed_agent_is_removed_by_the_next_one(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    base = tmp_path / "shm"
    base.mkdir()
    dead = base / f"{AREA_PREFIX}{gone.stdout.strip()}-1"
    alive = base / f"{AREA_PREFIX}{os.getpid()}-2"
    mine = base / "someone-elses"
    for path in (dead, alive, mine):
        path.mkdir()
    assert remove_stale_areas(base) == [dead]
    assert alive.exists() and mine.exists()


def test_persist_without_a_round_or_a_common_step_keeps_nothing(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    assert k.persist() is None  # no round: the workers never started
    snap(k.area, 0, 1)
    k.offer(node(), 2, Exchange())
    snap(k.area, 1, 2)
    assert k.persist() is None
    assert said(k) == ["checkpoint: the ranks here hold no step in common: nothing was kept"]


def test_a_word_that_is_not_a_list_of_steps_holds_nothing(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    both = [(0, 1), (1, 1)]
    for rank, step in both:
        snap(k.area, rank, step)
    good = json.loads(other_node({2: [1], 3: [1]}, (2, 2)))
    assert k.offer(node(0, nodes=2), 2, Exchange([json.dumps(good).encode()])).step == 1
    bad_words: list[object] = [
        good | {"holds": {"2": "1", "3": [1]}},  # not a list
        good | {"holds": {"2": [True, -1, 1.0], "3": [1]}},  # no step among them
        good | {"holds": {"2": [1], "3": [1], "4": [1]}, "ranks": [2, 3]},  # past the world
        good | {"at": ["127.0.0.1", -1]},  # not an address
        good | {"holds": {"2": list(range(100)), "3": [1]}},  # longer than two copies can be
        [1],
    ]
    for bad in bad_words:
        assert k.offer(node(0, nodes=2), 2, Exchange([json.dumps(bad).encode()])).step is None, bad
        for rank, step in both:
            snap(k.area, rank, step)


def test_a_stop_signal_asks_for_one_step_and_keeps_it_once_every_rank_has_it(
    tmp_path: Path,
) -> None:
    k = keeper(tmp_path)
    k.offer(node(), 2, Exchange())
    for rank, step in [(0, 4), (0, 5), (1, 4)]:  # rank 1 is a step behind
        snap(k.area, rank, step)

    def workers() -> None:  # they see the request after their snapshots, and stop at its step
        wait_for(k.area.save_request.exists, 10, "the save request")
        for rank, step in [(1, 5), (0, 6), (1, 6), (0, 7), (1, 7)]:
            snap(k.area, rank, step)

    thread = threading.Thread(target=workers)
    thread.start()
    try:
        assert k.save(node(), 10.0, lambda: True) == 7  # two past the newest any rank held
    finally:
        thread.join()
    assert json.loads(k.area.save_request.read_text())["step"] == 7
    assert k.home.copies() == [6, 7]
    os.environ[SNAPSHOTS], os.environ["RANK"] = str(k.area.root), "0"
    try:
        api.snapshot({"w": 1}, step=6)
        assert not api.save_requested()  # not yet at the agreed step
        api.snapshot({"w": 1}, step=7)
        assert api.save_requested()
    finally:
        del os.environ[SNAPSHOTS], os.environ["RANK"]


def test_on_two_nodes_the_step_leaves_the_other_node_time_to_see_the_request(
    tmp_path: Path,
) -> None:
    k = keeper(tmp_path)
    two = node(0, nodes=2)
    k.offer(two, 2, Exchange([None]))
    assert not k.asked()  # no node proposed a step yet
    for step in range(6):  # 0.125 s apart: four steps in SAVE_NOTICE (0.5 s)
        for rank in (0, 1):
            snap(k.area, rank, step)
            stamp = 1_000_000 + step * 0.125
            os.utime(k.area.snapshot(rank, step), (stamp, stamp))
    assert k._lead([0, 1]) == 2 + 4
    assert k.save(two, 0.0, lambda: False) == 5  # no grace: the newest held, nothing asked
    k.exchange = Exchange([b"11"])  # another node proposed step 11 (5 + 2 + 4)
    assert k.asked()
    assert keeper(tmp_path, "alone")._lead([0, 1]) == 2  # one node: nothing to wait for


def test_a_snapshot_that_does_not_come_keeps_the_newest_held_and_says_so(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.offer(node(), 2, Exchange())
    for rank in (0, 1):
        snap(k.area, rank, 3)
    assert k.save(node(), 0.2, lambda: True) == 3
    assert said(k)[-1] == (
        "checkpoint: the snapshot of step 5 did not come within 0.2 s (stop_grace); "
        "step 3 was kept instead"
    )
    empty = keeper(tmp_path, "empty")
    empty.offer(node(), 2, Exchange())
    assert empty.save(node(), 5.0, lambda: True) is None
    assert said(empty) == [
        "checkpoint: a stop signal came and no rank holds a snapshot: nothing was saved"
    ]
