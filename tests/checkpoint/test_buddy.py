"""The buddy ring: snapshots pushed to and fetched from another agent over real TCP sockets on
127.0.0.1, every request as untrusted input; and two or three keepers of one job that lose a
node and take its ranks' snapshots from the survivor's memory, not from the checkpoint home.
tests/checkpoint/test_snapshots_real.py runs it with real agents and workers."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_hydra.checkpoint import codec
from elastic_hydra.checkpoint.buddy import (
    DIGEST,
    MAGIC,
    NONCE,
    BuddyBusyError,
    BuddyError,
    Ring,
    Server,
    fetch,
    mac,
    push,
)
from elastic_hydra.checkpoint.keeper import Keeper, Offer, open_area
from elastic_hydra.checkpoint.layout import Area
from elastic_hydra.plan import CheckpointSpec, Endpoint
from tests.checkpoint.test_keeper import node
from tests.conftest import wait_for

JOB = "train"


def area_in(tmp_path: Path, name: str) -> Area:
    (tmp_path / name).mkdir()
    return open_area(tmp_path / name)


def snap(area: Area, rank: int, step: int, payload: object = None) -> Path:
    area.rank_dir(rank).mkdir(mode=0o700, exist_ok=True)
    codec.write({"w": payload if payload is not None else [rank, step]}, area.snapshot(rank, step))
    return area.snapshot(rank, step)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(area_in(tmp_path, "peer"), job=JOB, host="127.0.0.1", secret=None, limit=0)
    s.accepting = frozenset({0, 1})
    try:
        yield s
    finally:
        s.close()


def test_a_pushed_snapshot_lands_whole_in_the_peers_buddy_copies_and_comes_back(
    tmp_path: Path, server: Server
) -> None:
    mine = area_in(tmp_path, "mine")
    path = snap(mine, 1, 7, payload=list(range(100_000)))
    assert push(server.address, path, job=JOB, rank=1, step=7, secret=None) is True
    copy = server.area.buddy.snapshot(1, 7)
    assert copy.read_bytes() == path.read_bytes()
    assert oct(copy.stat().st_mode & 0o777) == oct(0o600)
    assert push(server.address, path, job=JOB, rank=1, step=7, secret=None) is False  # held
    fresh = area_in(tmp_path, "fresh")  # a replacement node: nothing of its own
    size = fetch(server.address, fresh, job=JOB, rank=1, step=7, secret=None, limit=0)
    assert size == path.stat().st_size and codec.read(fresh.snapshot(1, 7)) == codec.read(path)
    assert [p.name for p in fresh.rank_dir(1).iterdir()] == ["step-7.snap"]  # no part left


def test_only_the_newest_two_copies_of_a_rank_are_kept_and_an_older_one_is_not_taken(
    tmp_path: Path, server: Server
) -> None:
    mine = area_in(tmp_path, "mine")
    for step in (3, 4, 5):
        push(server.address, snap(mine, 0, step), job=JOB, rank=0, step=step, secret=None)
    assert server.area.buddy.steps(0) == [4, 5]
    assert push(server.address, snap(mine, 0, 2), job=JOB, rank=0, step=2, secret=None) is False
    assert server.area.buddy.steps(0) == [4, 5]


def test_between_rounds_a_push_is_told_to_come_back_later(tmp_path: Path, server: Server) -> None:
    path = snap(area_in(tmp_path, "mine"), 0, 1)
    server.paused = True  # its nodes agree on the next attempt's step
    with pytest.raises(BuddyBusyError):
        push(server.address, path, job=JOB, rank=0, step=1, secret=None)
    server.paused = False
    assert push(server.address, path, job=JOB, rank=0, step=1, secret=None) is True


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"rank": 5}, "rank 5 is not the previous node's"),
        ({"job": "other"}, "of another job"),
        ({"size": 1 << 20}, "over checkpoint.max_memory"),
    ],
)
def test_a_push_the_ring_does_not_expect_is_refused_and_leaves_nothing(
    tmp_path: Path, change: dict[str, object], refusal: str
) -> None:
    peer = area_in(tmp_path, "peer")
    s = Server(peer, job=JOB, host="127.0.0.1", secret=None, limit=4096)
    s.accepting = frozenset({0})
    try:
        header = {"op": "put", "job": JOB, "rank": 0, "step": 1, "size": 10} | change
        with raw_request(s.address, header) as (_, reply):
            answer = reply.readline().decode()  # type: ignore[attr-defined]
            assert answer.startswith("no ") and answer.rstrip().endswith(refusal), answer
    finally:
        s.close()
    assert not peer.buddy.root.exists()


class raw_request:  # noqa: N801 (a context manager, used as a function)
    """A hand-made request (signed with `secret`), for what a real client never sends."""

    def __init__(self, at: Endpoint, header: object, secret: bytes | None = None) -> None:
        self.at, self.header, self.secret = at, header, secret

    def __enter__(self) -> tuple[socket.socket, object]:
        self.conn = socket.create_connection((self.at.host, self.at.port), timeout=10)
        self.reply = self.conn.makefile("rb")
        hello = self.reply.read(len(MAGIC) + NONCE)
        assert hello.startswith(MAGIC)
        self.nonce = hello[len(MAGIC) :]
        body = json.dumps(self.header, sort_keys=True, separators=(",", ":")).encode()
        signature = mac(self.secret, self.nonce, body).hex()
        self.conn.sendall(json.dumps({"h": self.header, "mac": signature}).encode() + b"\n")
        return self.conn, self.reply

    def __exit__(self, *exc: object) -> None:
        self.reply.close()
        self.conn.close()


@pytest.mark.parametrize("fault", ["digest", "cut"])
def test_a_transfer_whose_bytes_do_not_check_leaves_no_copy(
    tmp_path: Path, server: Server, fault: str
) -> None:
    header = {"op": "put", "job": JOB, "rank": 0, "step": 3, "size": 1000}
    with raw_request(server.address, header) as (conn, reply):
        assert reply.readline() == b"go\n"  # type: ignore[attr-defined]
        conn.sendall(b"x" * (1000 if fault == "digest" else 400))
        if fault == "digest":
            conn.sendall(bytes(2 * DIGEST))  # not the digest of those bytes
            assert reply.readline() == b"no the bytes do not match their digest\n"  # type: ignore[attr-defined]
        else:
            conn.shutdown(socket.SHUT_WR)  # hangs up halfway
            assert reply.readline() == b"no the peer hung up in the middle of a transfer\n"  # type: ignore[attr-defined]
    assert server.area.buddy.steps(0) == []
    assert list(server.area.buddy.rank_dir(0).iterdir()) == []  # no partial file either


def test_a_line_too_long_or_not_a_request_is_refused(server: Server) -> None:
    for line in (b"x" * 70_000 + b"\n", b"{}\n", b'{"h": {"op": "rm"}, "mac": "00"}\n'):
        with socket.create_connection((server.address.host, server.address.port), 10) as conn:
            reply = conn.makefile("rb")
            reply.read(len(MAGIC) + NONCE)
            conn.sendall(line)
            assert reply.readline().startswith(b"no "), line[:40]


def test_with_the_jobs_secret_a_peer_without_it_can_neither_push_nor_fetch(
    tmp_path: Path,
) -> None:
    peer, mine = area_in(tmp_path, "peer"), area_in(tmp_path, "mine")
    s = Server(peer, job=JOB, host="127.0.0.1", secret=b"s3cret", limit=0)
    s.accepting = frozenset({0})
    try:
        path = snap(mine, 0, 1)
        with pytest.raises(BuddyError, match="not signed with the job's secret"):
            push(s.address, path, job=JOB, rank=0, step=1, secret=None)
        with pytest.raises(BuddyError, match="not signed with the job's secret"):
            push(s.address, path, job=JOB, rank=0, step=1, secret=b"wrong")
        assert push(s.address, path, job=JOB, rank=0, step=1, secret=b"s3cret")
        fresh = area_in(tmp_path, "fresh")
        with pytest.raises(BuddyError, match="not signed with the job's secret"):
            fetch(s.address, fresh, job=JOB, rank=0, step=1, secret=None, limit=0)
        fetch(s.address, fresh, job=JOB, rank=0, step=1, secret=b"s3cret", limit=0)
        assert fresh.snapshot(0, 1).read_bytes() == path.read_bytes()
    finally:
        s.close()
    # A server without the secret (someone else's, where the store says ours is) is not believed.
    fake = Server(area_in(tmp_path, "fake"), job=JOB, host="127.0.0.1", secret=None, limit=0)
    try:
        snap(fake.area, 0, 2)
        other = area_in(tmp_path, "other")
        with pytest.raises(BuddyError, match="not signed with the job's secret"):
            fetch(fake.address, other, job=JOB, rank=0, step=2, secret=b"s3cret", limit=0)
        assert other.steps(0) == []
    finally:
        fake.close()


def test_a_fetch_of_a_snapshot_the_peer_does_not_hold_or_over_the_limit_fails(
    tmp_path: Path, server: Server
) -> None:
    fresh = area_in(tmp_path, "fresh")
    with pytest.raises(BuddyError, match="no snapshot of rank 0 at step 9"):
        fetch(server.address, fresh, job=JOB, rank=0, step=9, secret=None, limit=0)
    snap(server.area, 0, 9, payload="x" * 10_000)
    with pytest.raises(BuddyError, match=r"over checkpoint\.max_memory"):
        fetch(server.address, fresh, job=JOB, rank=0, step=9, secret=None, limit=1000)
    assert fresh.steps(0) == []


# --------------------------------------------------------------------------- keepers of a job
class Round:
    """The round's store as the nodes' gathers see it: each waits for every node's word."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.words: dict[str, dict[int, bytes]] = {}
        self.cond = threading.Condition()

    def member(self, rank: int) -> Member:
        return Member(self, rank)


class Member:
    def __init__(self, round_: Round, rank: int) -> None:
        self.round_, self.rank = round_, rank

    @property
    def round(self) -> int:
        return 1

    def gather(self, topic: str, value: bytes, *, limit: int, timeout: float) -> list[bytes | None]:
        r = self.round_
        with r.cond:
            r.words.setdefault(topic, {})[self.rank] = value
            r.cond.notify_all()
            r.cond.wait_for(lambda: len(r.words[topic]) == r.nodes, timeout=timeout)
            return [r.words[topic].get(i) for i in range(r.nodes)]

    def first(self, topic: str, value: bytes, *, limit: int, timeout: float) -> bytes:
        with self.round_.cond:
            return self.round_.words.setdefault(topic, {}).setdefault(-1, value)

    def offered(self, topic: str, *, limit: int) -> bytes | None:
        with self.round_.cond:
            return self.round_.words.get(topic, {}).get(-1)


def ring_keeper(tmp_path: Path, name: str) -> Keeper:
    area = area_in(tmp_path, name)
    said: list[str] = []
    ring = Ring(area, job=JOB, host="127.0.0.1", secret=b"k", limit=0, say=said.append)
    spec = CheckpointSpec(home=str(tmp_path / f"home-{name}"), job=JOB)  # node-local disks
    out = Keeper(spec, area, say=said.append, ring=ring)
    out.said = said  # type: ignore[attr-defined]
    return out


def offer_all(keepers: list[Keeper], nproc: int = 1) -> list[Offer]:
    """Every node's offer of one round, the nodes in parallel (each waits for the others)."""
    r = Round(len(keepers))
    offers: list[Offer | None] = [None] * len(keepers)

    def one(i: int) -> None:
        offers[i] = keepers[i].offer(node(i, nodes=len(keepers), nproc=nproc), nproc, r.member(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(keepers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(o is not None for o in offers)
    return [o for o in offers if o is not None]


@pytest.mark.parametrize("replacement_rank", [1, 0])
def test_a_lost_nodes_ranks_come_back_from_the_survivors_memory(
    tmp_path: Path, replacement_rank: int
) -> None:
    """Node 1 is lost with its memory and its disk; a fresh node takes its place, as node 1 or
    (the round ordered otherwise) as node 0. Each rank's snapshot of the newest step comes from
    the survivor: its own, or its copy of the lost node's."""
    a, b = ring_keeper(tmp_path, "a"), ring_keeper(tmp_path, "b")
    new = None
    try:
        assert offer_all([a, b]) == [Offer(step=None)] * 2  # a fresh start: the ring aims
        for step in (1, 2, 3):
            snap(a.area, 0, step)
            snap(b.area, 1, step)
        # Written at once: the newest is pushed, the older ones skipped.
        wait_for(lambda: a.area.buddy.steps(1) == [3] and b.area.buddy.steps(0) == [3],
                 30, "each node's copy of the other's newest snapshot")  # fmt: skip
        b.close()  # lost: its area (memory) is gone, and its home was never written
        new = ring_keeper(tmp_path, "new")
        order = [a, new] if replacement_rank == 1 else [new, a]
        offers = offer_all(order)
        assert offers == [Offer(step=3, source="memory")] * 2
        # Rank 0 runs on order[0], rank 1 on order[1]: both hold step 3 in their own area now.
        for rank, k in enumerate(order):
            assert codec.read(k.area.snapshot(rank, 3)) == {"w": [rank, 3]}
        fetched = [line for line in new.said if "came from node" in line]  # type: ignore[attr-defined]
        moved = [line for line in a.said if "came from this node's copy" in line]  # type: ignore[attr-defined]
        lost_rank = 1 if replacement_rank == 1 else 0
        assert fetched and f"rank {lost_rank}'s snapshot of step 3 came from node" in fetched[0]
        assert "no read of the checkpoint home" in fetched[0]
        assert moved == ([] if replacement_rank == 1 else [
            "checkpoint: rank 1's snapshot of step 3 came from this node's copy of it "
            "(checkpoint.buddy)"])  # fmt: skip
        assert not (tmp_path / "home-new").exists()  # the new node read no disk
        # The ring aims again: the new node's snapshots reach the survivor.
        snap(new.area, replacement_rank, 4)
        wait_for(lambda: 4 in a.area.buddy.steps(replacement_rank), 30, "the new node's copy")
    finally:
        a.close()
        if new is not None:
            new.close()


def test_when_the_holder_cannot_be_reached_every_node_falls_back_to_the_home(
    tmp_path: Path,
) -> None:
    """A node says it holds the lost rank's copy, but its server is gone by the time the new node
    asks: the new node says so, and every node takes the same home copy instead."""
    a, b = ring_keeper(tmp_path, "a"), ring_keeper(tmp_path, "b")
    try:
        offer_all([a, b])
        snap(a.area, 0, 5)
        a.area.buddy.rank_dir(1).mkdir(parents=True, mode=0o700)
        codec.write({"w": [1, 5]}, a.area.buddy.snapshot(1, 5))
        assert a.ring is not None
        a.ring.server.close()  # it still says it holds rank 1's copy, but cannot give it
        b.close()
        new = ring_keeper(tmp_path, "new")
        try:
            offers = offer_all([a, new])
            assert offers == [Offer(step=None)] * 2  # no home copy either: a fresh start
            assert any("rank 1's snapshot of step 5 did not come" in line
                       for line in new.said)  # type: ignore[attr-defined]  # fmt: skip
        finally:
            new.close()
    finally:
        a.close()
    assert not os.path.exists(a.area.root)


def test_the_floor_is_the_oldest_step_the_other_nodes_copies_reach_once_round_the_ring(
    tmp_path: Path,
) -> None:
    """Three nodes: each learns how far the previous node's copies reach from its own copies,
    and the others' from the pushes that come round the ring."""
    keepers = [ring_keeper(tmp_path, name) for name in "abc"]
    try:
        offer_all(keepers)
        for step in range(1, 5):  # each step's copies in place before the next
            for rank, k in enumerate(keepers):
                snap(k.area, rank, step)

            def copied(step: int = step) -> bool:
                return all(step in k.area.buddy.steps((r - 1) % 3) for r, k in enumerate(keepers))

            wait_for(copied, 30, f"the copies of step {step}")
        for me, k in enumerate(keepers):
            assert k.ring is not None
            reach = k.ring.reach()
            assert {n for n in reach if n != me} == {0, 1, 2} - {me}, (me, reach)
            floor = json.loads(k.area.floor.read_text())["step"]
            assert floor == min(v for n, v in reach.items() if n != me) and floor >= 2, reach
    finally:
        for k in keepers:
            k.close()


@pytest.mark.parametrize(
    ("floor", "kept"), [(3, list(range(4, 12))), (9, [9, 10, 11]), (None, [10, 11])]
)
def test_a_worker_keeps_its_snapshots_from_the_floor_on_at_most_eight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, floor: int | None, kept: list[int]
) -> None:
    from elastic_hydra.agent.inherit import SNAPSHOTS
    from elastic_hydra.checkpoint import api

    area = area_in(tmp_path, "shm")
    monkeypatch.setenv(SNAPSHOTS, str(area.root))
    monkeypatch.setenv("RANK", "0")
    if floor is not None:
        area.floor.write_text(json.dumps({"step": floor}))
    for step in range(12):
        assert api.snapshot({"w": step}, step=step)
    assert area.steps(0) == kept


def test_the_plan_says_where_a_launch_resumes_and_what_the_copies_cost_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from elastic_hydra.cli.plan import _resume_from
    from elastic_hydra.report.plan_view import describe_checkpoint
    from tests.checkpoint.test_keeper import Exchange
    from tests.harness import plan_of

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    home = tmp_path / "home"
    words = ["script=train.py", "rdzv=c10d", "rdzv.endpoint=127.0.0.1:29400", "rdzv.id=j",
             f"checkpoint.home={home}"]  # fmt: skip
    one, two = plan_of(*words), plan_of(*words, "nnodes=2")
    assert one.checkpoint is not None
    assert _resume_from(one) == "nothing yet (no complete copy): a fresh start"
    k = Keeper(one.checkpoint, area_in(tmp_path, "shm"), say=lambda line: None)
    for rank in (0, 1):
        snap(k.area, rank, 4, payload="x" * (1 << 20))
    k.offer(node(), 2, Exchange())
    assert k.persist() == 4
    k.close()
    assert _resume_from(one) == "step 4 (the newest complete copy, of 2 ranks, 1 MiB a rank)"
    line = describe_checkpoint(two, _resume_from(two))
    assert "a copy of each node's snapshots in the next node's memory (checkpoint.buddy)" in line
    assert "checkpoint.buddy" not in describe_checkpoint(one, "")
    assert "checkpoint.buddy" not in describe_checkpoint(
        plan_of(*words, "nnodes=2", "checkpoint.buddy=false"), ""
    )
