"""Pure pieces of the multi-node path: torchrun's rank assignment and the job-wide root cause."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from elastic_hydra.agent.events import ChangeKind
from elastic_hydra.agent.outcome import root_cause
from elastic_hydra.errors import STORE_ERRORS, RendezvousError
from elastic_hydra.plan import Dynamic, DynamicBackend, Endpoint, NodeRange
from elastic_hydra.records.failures import (
    FailureRecord,
    PeerChange,
    PeerFailure,
    WorkerExit,
    job_root_cause,
    lost_a_peer,
)
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.rendezvous import hang_share as share
from elastic_hydra.rendezvous import join_wait
from elastic_hydra.rendezvous.store_keys import (
    ASSIGNED_RANKS,
    NODE_FACTS,
    ROLE_INFO,
    NodeFacts,
    config_mismatch,
    exit_barrier,
    node_ranks,
    publish_facts,
    publish_failure,
    rank_table,
    ranked,
    read_facts,
    read_failures,
)
from elastic_hydra.rendezvous.torch_backend import TorchRendezvous
from elastic_hydra.rendezvous.torch_handler import _wait_for_store, guarded, quiet_torch_cpp, reason
from tests.agent.test_executor import FakeStop, make_plan
from tests.conftest import free_port, wait_for


def test_ranks_are_contiguous_per_node_in_node_rank_order() -> None:
    infos: list[Mapping[str, Any]] = [
        {"role": "default", "rank": i, "local_world_size": n} for i, n in enumerate([2, 4, 1])
    ]
    assert rank_table(infos) == [[0, 7, 0, 7], [2, 7, 2, 7], [6, 7, 6, 7]]


class DictStore:
    """The part of a torch Store that the node facts use, on a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]


def test_slurm_node_order_ranks_the_nodes_not_torchs_order() -> None:
    # torch ranked the nodes 0, 1, 2 by host name and pid; Slurm numbers them 2, 0, 1.
    store = DictStore()
    for rank, order in enumerate([2, 0, 1]):
        publish_facts(store, rank, NodeFacts("ab12", order))
    facts = read_facts(store, 3, wait=True)
    assert [ranked(facts).index(rank) for rank in range(3)] == [2, 0, 1]
    assert config_mismatch(facts, 0) is None


def test_nodes_that_resolved_different_configs_are_found_and_torchrun_agents_are_skipped() -> None:
    store = DictStore()
    publish_facts(store, 0, NodeFacts("aaaa", None))
    publish_facts(store, 2, NodeFacts("bbbb", None))  # node 1 is a torchrun agent: no facts
    facts = read_facts(store, 3, wait=False)
    assert sorted(facts) == [0, 2]
    assert (config_mismatch(facts, 0), config_mismatch(facts, 2)) == (2, 0)
    assert [ranked(facts).index(r) for r in (0, 2)] == [0, 1]  # no node order: torch's


@pytest.mark.parametrize(
    ("forged", "message"),
    [
        (b"not json", "node 1 published unreadable facts"),
        (b'{"config": "ab"}', "node 1 published unreadable facts"),
        (b'{"config": "../x", "order": 0}', "node 1 published '../x' as its config hash"),
        (b'{"config": "ab", "order": -1}', "node 1 published '-1' as its node order"),
        (b'{"config": "ab", "order": true}', "node 1 published 'True' as its node order"),
        (b'{"config": "ab", "order": 1e99}', "as its node order"),
        (b"\xff" * 10_000, "node 1 published unreadable facts"),
    ],
)
def test_forged_node_facts_are_refused(forged: bytes, message: str) -> None:
    store = DictStore()
    publish_facts(store, 0, NodeFacts("ab", 0))
    store.set(f"{NODE_FACTS}1", forged)
    with pytest.raises(ValueError, match=re.escape(message)):
        read_facts(store, 2, wait=True)


def test_role_ranks_count_within_each_role_as_torchrun_does() -> None:
    infos: list[Mapping[str, Any]] = [
        {"role": "trainer", "rank": 0, "local_world_size": 2},
        {"role": "reader", "rank": 1, "local_world_size": 3},
        {"role": "trainer", "rank": 2, "local_world_size": 2},
    ]
    # [base global rank, world size, base role rank, role world size]
    assert rank_table(infos) == [[0, 7, 0, 4], [2, 7, 0, 3], [5, 7, 2, 4]]


def record(rank: int, time: float, rdzv_round: int | None = 0, **extra: Any) -> FailureRecord:
    fields = {"local_rank": 0, "pid": 1, "attempt": 0, "returncode": 1, **extra}
    return FailureRecord(rank=rank, time=time, rdzv_round=rdzv_round, host="h", **fields)


def test_the_job_root_cause_is_the_earliest_real_failure_of_the_last_failing_round() -> None:
    records = [
        record(5, 10.0, terminated_by_launcher=True),  # stopped by its launcher: never blamed
        record(3, 11.0),
        record(1, 12.5),  # a collective error on another node, after rank 3 died
        record(0, 30.0, rdzv_round=1, terminated_by_launcher=True),
        record(6, 31.0, rdzv_round=1),
        record(2, 32.0, rdzv_round=1),
    ]
    cause = job_root_cause(records[:3])
    assert cause is not None and cause.rank == 3
    latest = job_root_cause(records)
    assert latest is not None and latest.rank == 6  # the round that ended the job


def test_no_real_failure_means_no_job_root_cause() -> None:
    assert job_root_cause([]) is None
    assert job_root_cause([record(1, 1.0, terminated_by_launcher=True)]) is None


def test_one_rule_for_the_root_cause_here_and_job_wide_ties_go_to_the_lower_rank() -> None:
    # Two ranks failing in the same millisecond: this node's outcome and the job-wide summary
    # named different ranks before (by rank here, by list order there); one rule now.
    tied = [record(4, 5.0, rdzv_round=None), record(2, 5.0, rdzv_round=None)]
    local = job_root_cause(tied)
    exits = [
        WorkerExit(local_rank=r.rank, rank=r.rank, pid=r.rank, returncode=1, wall_time=5.0,
                   mono_time=5.0, attempt=0)
        for r in tied
    ]  # fmt: skip
    on_node = root_cause(exits)
    job_wide = job_root_cause([record(4, 5.0), record(2, 5.0)])
    assert local is not None and on_node is not None and job_wide is not None
    assert local.rank == on_node.rank == job_wide.rank == 2


def test_a_failure_record_from_the_store_is_checked_field_by_field() -> None:
    good = record(3, 1.5).to_json()
    assert FailureRecord.from_json(good) == record(3, 1.5)
    for field, bad in [("rank", "3"), ("time", "soon"), ("terminated_by_launcher", 1),
                       ("traceback", "not a list"), ("stderr_tail", [1, 2])]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"FailureRecord\.{field}"):
            FailureRecord.from_json({**good, field: bad})
    with pytest.raises(ValueError, match=r"FailureRecord\.pid: missing"):
        FailureRecord.from_json({k: v for k, v in good.items() if k != "pid"})


# ------------------------------------------------------------------------ torchrun nodes of a job
def test_a_torchrun_nodes_ranks_are_read_from_its_rank_assignment_untrusted() -> None:
    store = DictStore()
    nodes = {0: (2, [0, 5]), 1: (3, [2, 5]), 2: (1, [5, 6]), 3: (1, ["x", 5]), 4: (-1, [6, 6])}
    for node, (size, assigned) in nodes.items():
        store.set(f"{ROLE_INFO}{node}", json.dumps({"role": "r", "local_world_size": size}))
        store.set(f"{ASSIGNED_RANKS}{node}", json.dumps(assigned))
    store.set(f"{ROLE_INFO}5", b"\x80 not json")
    store.set(f"{ASSIGNED_RANKS}5", b"[0]")
    # 3 and 4 hold nonsense, 5 is not JSON, 6 has no keys: nothing said of them
    assert node_ranks(store, range(7)) == {0: "0-1", 1: "2-4", 2: "5"}


@pytest.mark.parametrize(
    "error",
    [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
        "peer [127.0.0.1]:1961. This is typically caused by a remote worker crashing.",
        "RuntimeError: [pair.cc:534] Read error [10.0.0.2]:41273: Connection reset by peer",
        "torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
        "process exited or there was a network error, NCCL version 2.21.5\nncclRemoteError: A "
        "call failed possibly due to a network error or a remote process exiting prematurely.",
        "RuntimeError: [pair.cc:598] Write error: Broken pipe",
    ],
)
def test_errors_of_a_lost_peer_are_told_apart(error: str) -> None:
    assert lost_a_peer(error)


@pytest.mark.parametrize(
    "error",
    [
        "ValueError: boom from rank 0",
        "torch.OutOfMemoryError: CUDA out of memory.",
        "",
        "ConnectionResetError: [Errno 104] Connection reset by peer",  # a download, say
        "BrokenPipeError: [Errno 32] Broken pipe",
        # Timeouts: every rank of a hang raises them, whoever is at fault.
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:446] Application timeout "
        "caused pair closure",
        "torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE) ran for 600000 milliseconds before timing "
        "out.\nNCCL communicator was aborted on rank 1.",
    ],
)
def test_a_ranks_own_fault_is_not_a_lost_peer(error: str) -> None:
    assert not lost_a_peer(error)


def test_a_torchrun_nodes_failure_reads_back_from_the_summary() -> None:
    peer = PeerFailure(
        node="10.0.0.1, pid 42", node_rank=0, ranks="0-7", what=PeerChange.RESTARTED,
        rdzv_round=3, time=1.5,
    )  # fmt: skip
    assert peer.line() == (
        "node 0 (torchrun agent on 10.0.0.1, pid 42; ranks 0-7) restarted its workers"
    )
    summary = RunSummary(status=RunStatus.FAILED, exit_code=1, peer_failures=(peer,))
    assert RunSummary.from_json(json.loads(json.dumps(summary.to_json()))) == summary
    with pytest.raises(ValueError, match=r"PeerFailure\.rdzv_round"):
        PeerFailure.from_json({**peer.to_json(), "rdzv_round": "3"})
    with pytest.raises(ValueError, match=r"PeerFailure\.what"):  # a store's word we do not know
        PeerFailure.from_json({**peer.to_json(), "what": "vanished"})


@dataclass(frozen=True, order=True)
class Node:
    addr: str
    pid: int


@dataclass
class State:
    participants: dict[Node, int]
    wait_list: set[Node] = dataclasses.field(default_factory=set)
    round: int = 0
    closed: bool = False
    redundancy_list: set[Node] = dataclasses.field(default_factory=set)
    deadline: datetime | None = None
    complete: bool = False


class FakeHandler:
    """The parts of torch's dynamic handler that `TorchRendezvous.poll` reads."""

    def __init__(self, state: State, this: Node) -> None:
        self._state_holder = SimpleNamespace(state=state)
        self._this_node = this

    def num_nodes_waiting(self) -> int:
        return len(self._state_holder.state.wait_list)


A, B = Node("10.0.0.1", 11), Node("10.0.0.2", 22)


def watching(state: State, monkeypatch: pytest.MonkeyPatch) -> tuple[TorchRendezvous, list[float]]:
    """Node A's view of a round of A and B, B a torchrun agent; its clock in the list."""
    rdzv = TorchRendezvous(make_plan(dynamic=True), SimpleNamespace(signum=None))
    rdzv.handler = FakeHandler(state, A)
    rdzv._members, rdzv._round, rdzv._torchrun = frozenset({A, B}), 0, {B: (1, "2-3")}
    clock = [100.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    return rdzv, clock


def test_a_member_between_leaving_the_round_and_waiting_again_has_not_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch's re-join is two store writes: out of the participants, then into the wait list.
    state = State(participants={A: 0})
    rdzv, clock = watching(state, monkeypatch)
    assert rdzv.poll() is None  # B is missing: not gone yet
    clock[0] += 0.5
    assert rdzv.poll() is None  # the same (cached) read
    clock[0] += 0.7
    state.wait_list.add(B)
    change = rdzv.poll()
    assert change is not None and change.kind is ChangeKind.JOINED
    assert change.reason == (
        "node 1 (torchrun agent on 10.0.0.2, pid 22; ranks 2-3) restarted its workers: a new "
        "round for every node"
    )
    assert [p.line() for p in change.peers] == [
        "node 1 (torchrun agent on 10.0.0.2, pid 22; ranks 2-3) restarted its workers"
    ]


def test_a_member_missing_from_two_reads_has_left(monkeypatch: pytest.MonkeyPatch) -> None:
    state = State(participants={A: 0})
    rdzv, clock = watching(state, monkeypatch)
    assert rdzv.poll() is None
    clock[0] += 1.2
    change = rdzv.poll()
    assert change is not None and change.kind is ChangeKind.LEFT and change.nodes == 1
    assert [(p.node_rank, p.what) for p in change.peers] == [(1, "left the job")]
    state.closed = True
    closed = rdzv.poll()
    assert closed is not None and closed.kind is ChangeKind.CLOSED
    assert closed.reason.startswith("another node ended the job; if it is node 1 (torchrun")


def test_a_node_name_from_the_shared_state_is_one_short_printable_word(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Any agent writes its own address into torch's state: it reaches our console and files.
    evil = Node("\x1b]0;pwned\x07host\n" + "x" * 5000, 33)
    state = State(participants={A: 0, evil: 1}, wait_list={evil})
    rdzv, _clock = watching(state, monkeypatch)
    rdzv._members, rdzv._torchrun = frozenset({A, evil}), {}
    change = rdzv.poll()
    assert change is not None and change.kind is ChangeKind.JOINED
    assert change.reason.isprintable() and len(change.reason) < 200, change.reason
    assert change.reason.startswith("?]0;pwned?host?xxx")


class GoneEtcd:
    """torch's EtcdStore after etcd went away: python-etcd's error, no builtin base."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise self.error("No more machines in the cluster")

        return call


def test_a_gone_etcd_store_fails_within_the_store_errors_and_loses_only_what_it_held() -> None:
    import etcd  # python-etcd: the test command installs it, as torch's etcd rendezvous needs

    store = guarded(GoneEtcd(etcd.EtcdConnectionFailed), DynamicBackend.ETCD_V2)
    with pytest.raises(STORE_ERRORS) as caught:
        store.set("key", "value")
    assert isinstance(caught.value, ConnectionError)
    assert reason(caught.value) == "No more machines in the cluster"  # torch's words, as before
    share.publish_progress(store, "run", 0, 0, 1.0)  # lost, the job goes on
    assert share.latest_progress(store, "run", 0, 2, now=5.0) is None
    publish_failure(store, "run", record(0, 1.0), None)
    assert read_failures(store, "run", secret=None, nodes=None, last_round=0).records == []
    assert exit_barrier(store, 2, timeout=1.0, stop=FakeStop(),
                        job_changed=lambda: False) is None  # fmt: skip
    c10d = DictStore()
    assert guarded(c10d, DynamicBackend.C10D) is c10d  # its errors are RuntimeError already


def test_a_store_bug_is_not_taken_for_a_gone_store() -> None:
    # Only the store's failures are swallowed: a mistake of ours still fails loudly.
    with pytest.raises(AttributeError):
        share.publish_progress(GoneEtcd(AttributeError), "run", 0, 0, 1.0)


C = Node("10.0.0.3", 33)


def three_nodes(
    state: State, monkeypatch: pytest.MonkeyPatch
) -> tuple[TorchRendezvous, DictStore, list[float]]:
    """Node A's view of a round of elastic-hydra agents A, B and C; the job's store."""
    rdzv, clock = watching(state, monkeypatch)
    store = DictStore()
    rdzv._members, rdzv._torchrun, rdzv.job_store = frozenset({A, B, C}), {}, store
    return rdzv, store, clock


def test_every_survivor_names_the_node_whose_heartbeat_stopped_not_the_first_to_rejoin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # B was killed: torch dropped it for its old heartbeat. C noticed first and waits for the
    # next round already: C restarted nothing, and the job goes on with A and C.
    state = State(participants={A: 0}, wait_list={C})
    rdzv, store, clock = three_nodes(state, monkeypatch)
    assert rdzv.poll() is None  # B is missing: confirmed by a later read
    clock[0] += 1.2
    change = rdzv.poll()
    assert change is not None and change.kind is ChangeKind.LEFT, change
    assert change.reason.startswith("10.0.0.2 (agent pid 22) left the job"), change.reason
    assert change.nodes == 2  # A and C: C waiting for the next round is still in the job
    # A follows the change: said in the store before it re-joins.
    assert store.check(["elastic_hydra/test-run/followers/0/10.0.0.1 (agent pid 11)"])


def test_a_member_that_follows_a_change_is_not_taken_for_the_one_that_restarted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # C's workers failed and it re-joined; B saw it first and followed; A sees both waiting.
    state = State(participants={A: 0}, wait_list={B, C})
    rdzv, store, _clock = three_nodes(state, monkeypatch)
    store.set("elastic_hydra/test-run/followers/0/10.0.0.2 (agent pid 22)", "joined")
    change = rdzv.poll()
    assert change is not None and change.kind is ChangeKind.JOINED, change
    assert change.reason == (
        "10.0.0.3 (agent pid 33) restarted its workers: a new round for every node"
    )


# ------------------------------------------------------------------------ what a join waits for
def joining(state: State | None, nnodes: NodeRange) -> TorchRendezvous:
    """Node A joining a c10d rendezvous of `nnodes`; no handler yet when `state` is None."""
    plan = dataclasses.replace(make_plan(dynamic=True), nnodes=nnodes)
    rdzv = TorchRendezvous(plan, SimpleNamespace(signum=None))
    if state is not None:
        rdzv.handler = FakeHandler(state, A)
    return rdzv


def test_before_the_minimum_a_join_says_how_many_of_it_joined_and_its_bound() -> None:
    line = joining(State(participants={A: 0}), NodeRange(min=2, max=4))._still_waiting(30.2)
    assert line == (
        "elastic-hydra: 1 of 2 (min) node(s) joined the c10d rendezvous 'test-run' at "
        "node0:29400; 30 s of rdzv.join_timeout=600 s"
    )
    fixed = joining(State(participants={A: 0}), NodeRange(min=2, max=2))._still_waiting(5)
    assert fixed.startswith("elastic-hydra: 1 of 2 node(s) joined the c10d"), fixed


def test_with_the_minimum_a_join_says_it_is_the_last_call_and_how_long_it_has_left() -> None:
    deadline = datetime.now(UTC) + timedelta(seconds=24.6)
    state = State(participants={A: 0, B: 1}, deadline=deadline)
    line = joining(state, NodeRange(min=2, max=4))._still_waiting(5.0)
    assert line == (
        "elastic-hydra: 2 of 4 node(s) joined the c10d rendezvous 'test-run' at node0:29400; "
        "last call for more: 25 s left (rdzv.last_call_timeout=30 s)"
    )


def test_a_node_joining_a_running_job_and_a_spare_say_so() -> None:
    running = State(participants={B: 0}, wait_list={A})
    assert "waiting to join the running job" in joining(
        running, NodeRange(min=1, max=2)
    )._still_waiting(5)
    spare = State(participants={B: 0, C: 1}, redundancy_list={A})
    line = joining(spare, NodeRange(min=1, max=2))._still_waiting(5)
    assert "has its 2 node(s) (nnodes=1:2): waiting as a spare until one leaves" in line, line


def test_while_the_store_refuses_connections_the_wait_names_it_and_the_bound_it_uses() -> None:
    rdzv = joining(None, NodeRange(min=2, max=2))
    assert rdzv._still_waiting(5) == (
        "elastic-hydra: loading torch, connecting to the c10d rendezvous 'test-run' at "
        "node0:29400: 5 s"
    )
    rdzv._store_refused("connection refused")
    assert rdzv._still_waiting(5) == (
        "elastic-hydra: waiting for the rendezvous store at node0:29400 to accept connections "
        "(connection refused): 5 s of rdzv.connect_timeout=10 s"
    )


def test_the_join_notices_count_from_torchs_join_not_from_the_import_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first notice comes while torch loads; once its handler exists, the join (and its
    # join_timeout) starts: the next notice comes one first-notice delay later, not at 30 s.
    monkeypatch.setattr(join_wait, "WAIT_NOTICES", (0.3, 30.0, 60.0))
    rdzv, lines = joining(None, NodeRange(min=2, max=2)), list[str]()
    rdzv.say = lines.append

    def join() -> str:
        wait_for(lambda: lines, 10, "the notice while torch loads")
        rdzv.handler = FakeHandler(State(participants={A: 0}), A)
        wait_for(lambda: len(lines) == 2, 10, "the notice of torch's join")
        return "joined"

    assert rdzv._blocking(join, "join") == "joined"
    assert lines[0].startswith("elastic-hydra: loading torch, connecting to the c10d"), lines
    assert lines[1].endswith("1 of 2 node(s) joined the c10d rendezvous 'test-run' at "
                             "node0:29400; 0 s of rdzv.join_timeout=600 s"), lines  # fmt: skip


def test_a_store_that_refuses_is_retried_for_its_bound_then_named() -> None:
    port = free_port()
    rdzv = make_plan(dynamic=True).rdzv
    assert isinstance(rdzv, Dynamic)
    spec = dataclasses.replace(
        rdzv, endpoint=Endpoint(host="127.0.0.1", port=port), connect_timeout=1.0, is_host=False
    )
    heard: list[str | None] = []
    started = time.monotonic()
    with pytest.raises(RendezvousError) as caught:
        _wait_for_store(spec, heard.append, lambda: False)
    assert 1.0 <= time.monotonic() - started < 5.0
    assert str(caught.value).startswith(
        f"cannot connect to the rendezvous store at 127.0.0.1:{port} (connection refused; "
        "retried for rdzv.connect_timeout=1 s)"
    )
    assert heard and set(heard) == {"connection refused"}
    with socket.create_server(("127.0.0.1", 0)) as server:  # a listener: no wait
        listening = dataclasses.replace(spec, endpoint=Endpoint(host="127.0.0.1",
                                        port=server.getsockname()[1]))  # fmt: skip
        _wait_for_store(listening, heard.append, lambda: False)
    assert heard[-1] is None


# ------------------------------------------------------------------ what the nodes swap per round
def round_of(
    store: object, nodes: int, torchrun: tuple[int, ...] = (), signum: int | None = None
) -> list[TorchRendezvous]:
    """Each node's view of one round on `store` (`signum`: a stop signal came, a save request)."""
    from elastic_hydra.agent.seams import NodeAssignment

    views = []
    for rank in range(nodes):
        rdzv = TorchRendezvous(make_plan(dynamic=True), SimpleNamespace(signum=signum))
        rdzv.store = store
        rdzv.node = NodeAssignment(
            group_rank=rank, group_world_size=nodes, base_rank=rank, world_size=nodes,
            role_base_rank=rank, role_world_size=nodes, master=Endpoint(host="127.0.0.1", port=1),
        )  # fmt: skip
        rdzv._torchrun = {object(): (r, str(r)) for r in torchrun}
        views.append(rdzv)
    return views


def test_every_node_that_asks_gets_the_first_proposal_however_late_a_signal_reaches_it() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    a, b = round_of(store, 2, signum=10)
    assert b.first("save", b"12", limit=32, timeout=5) == b"12"  # b was signalled first
    assert a.first("save", b"13", limit=32, timeout=5) == b"12"  # a, later, takes b's step


def test_a_gather_does_not_wait_for_the_rounds_torchrun_agents() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    a, b, _torchrun = round_of(store, 3, torchrun=(2,))
    a.gather("word", b"a", limit=8, timeout=0)
    started = time.monotonic()
    assert b.gather("word", b"b", limit=8, timeout=30) == [b"a", b"b", None]
    assert time.monotonic() - started < 10  # not the 30 s: node 2 never publishes


STORE_HOST = """
import sys, time, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(store.port, flush=True)
sys.stdin.read()  # until the test closes it: then the store ends with this process
"""


def test_a_gather_returns_once_every_node_that_published_read_and_a_store_gone_then_costs_nothing(
    tmp_path: Path,
) -> None:
    """The store's host may end right after a gather (a preflight that stops the job on every
    node): before it returns, every node that published has read its values; and a node whose
    store ends while it waits for the others' reads keeps the values it read."""
    import subprocess
    import sys

    import torch.distributed as dist

    from tests.harness import launcher_env

    host = subprocess.Popen([sys.executable, "-c", STORE_HOST], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=launcher_env(), text=True)  # fmt: skip
    try:
        assert host.stdout is not None and host.stdin is not None
        port = int(host.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        a, b = round_of(client, 2)
        b.store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        b.store.set("elastic_hydra/gather/word/1", b"b")  # b published, has not read yet
        got: list[list[bytes | None]] = []
        first = threading.Thread(target=lambda: got.append(a.gather("word", b"a", limit=8,
                                                                   timeout=30)))  # fmt: skip
        first.start()
        wait_for(lambda: int(client.add("elastic_hydra/gather/word/read", 0)) == 1, 30,
                 "node 0 to have read")  # fmt: skip
        assert first.is_alive()  # it waits for node 1's read: READ_WAIT (10 s) is not over
        assert b.gather("word", b"b", limit=8, timeout=30) == [b"a", b"b"]
        first.join(30)
        assert got == [[b"a", b"b"]]

        # Node 1 reads first in a new gather and waits for node 0's read; the store's host ends.
        b.store.set("elastic_hydra/gather/again/0", b"a")
        second: list[list[bytes | None]] = []
        waiting = threading.Thread(target=lambda: second.append(b.gather("again", b"b", limit=8,
                                                                         timeout=30)))  # fmt: skip
        waiting.start()
        wait_for(lambda: int(client.add("elastic_hydra/gather/again/read", 0)) == 1, 30,
                 "node 1 to have read")  # fmt: skip
        host.stdin.close()
        assert host.wait(30) == 0
        waiting.join(30)
        assert second == [[b"a", b"b"]]  # not a RendezvousError: the values were read
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


def test_two_threads_loading_torch_quietly_each_keep_the_quiet_level_and_leave_none_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's rendezvous and store threads load torch side by side: the first one out must
    not take the level from the other one, nor the other one then fail removing it again."""
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    second_in, first_out = threading.Event(), threading.Event()
    seen: list[str | None] = []
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with quiet_torch_cpp(True):
                second_in.set()
                first_out.wait(30)
                seen.append(os.environ.get("TORCH_CPP_LOG_LEVEL"))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=second)
    with quiet_torch_cpp(True):
        thread.start()
        second_in.wait(0.5)  # one thread at a time: the second one cannot get in yet
        assert os.environ["TORCH_CPP_LOG_LEVEL"] == "FATAL"
    first_out.set()
    thread.join(30)
    assert not thread.is_alive() and errors == [] and seen == ["FATAL"]
    assert "TORCH_CPP_LOG_LEVEL" not in os.environ


def test_a_users_torch_log_level_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    with quiet_torch_cpp(True):
        assert os.environ["TORCH_CPP_LOG_LEVEL"] == "INFO"
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "INFO"
