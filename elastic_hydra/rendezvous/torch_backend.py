"""Multi-node rendezvous through PyTorch's own handlers: c10d, etcd-v2 and legacy etcd.

torch is imported here and in `torch_handler` only, and only for these backends. The store keys
for rank assignment and the exit barrier are torchrun's, so elastic-hydra and torchrun agents can
share one rendezvous.

`TorchRendezvous` joins a round and ends the job; what the round's changes are is `membership`'s,
the torchrun agents among its nodes are `torchrun_agents`', the wait for a join is `join_wait`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elastic_hydra.agent.events import ChangeKind, ExitBarrier
from elastic_hydra.agent.outcome import Status
from elastic_hydra.agent.seams import (
    JobFailures,
    JobShare,
    NodeAssignment,
    Observer,
    StopRequest,
)
from elastic_hydra.errors import RendezvousError
from elastic_hydra.plan import Dynamic, Endpoint, LaunchPlan
from elastic_hydra.records.failures import FailureRecord
from elastic_hydra.records.hangs import HangRank
from elastic_hydra.records.stragglers import Key, Seen
from elastic_hydra.rendezvous import hang_share, sealed_records, store_keys
from elastic_hydra.rendezvous.arrivals import ArrivalShare
from elastic_hydra.rendezvous.join_wait import JoinWait
from elastic_hydra.rendezvous.membership import Membership
from elastic_hydra.rendezvous.torch_handler import (
    RendezvousHandler,
    Store,
    bound_tcp_store,
    create_handler,
    dynamic_state,
    guarded,
    node_name,
)

# torchrun's keys (torch/distributed/elastic/agent/server/api.py, utils/store.py).
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"  # RendezvousStoreInfo's keys
GATHER = "elastic_hydra/gather/"  # under the round's prefix: {topic}/{node rank}
GATHER_POLL = 0.05  # seconds between looks at the nodes' values
READ_WAIT = 10.0  # seconds a gather waits for the nodes that published to have read (a loaded host)


class TorchRendezvous(Membership, JoinWait):
    """One node's view of a torch rendezvous (implements seams.Rendezvous)."""

    def __init__(
        self,
        plan: LaunchPlan,
        interrupt: StopRequest,
        say: Callable[[str], None] = lambda _line: None,
        status: Callable[[str | None], None] | None = None,
    ) -> None:
        assert isinstance(plan.rdzv, Dynamic)
        self.plan = plan
        self.spec: Dynamic = plan.rdzv
        self.interrupt = interrupt
        self.say = say  # a line on the console while a join waits
        self.status = status  # on a terminal: a status line rewritten every second instead
        self.where = (
            f"{self.spec.backend.value} rendezvous '{plan.torch_run_id}' at {self.spec.endpoint}"
        )
        self.node: NodeAssignment | None = None
        self.store: Store | None = None  # this round's store
        self.job_store: Store | None = None  # the store under every round's prefix
        self._members: frozenset[object] = frozenset()
        self._worker_store: Store | None = None  # node 0 after a membership change: see _master
        self._round = -1
        self._hangs = 0  # hangs this agent shared (the key of the next one's ranks)
        self._arrivals: ArrivalShare | None = None  # this round's straggler share
        self._seen: set[str] = set()  # every node of every round this agent took part in
        # The round's torchrun agents (no facts published): torch's node -> (node rank, ranks)
        self._torchrun: dict[object, tuple[int, str]] = {}
        self._told_timings = False
        self._gone: frozenset[object] = frozenset()  # members missing since _gone_at
        self._gone_at = 0.0
        secret = os.environ.get(sealed_records.SECRET_ENV)
        self.secret = secret.encode() if secret else None
        self.handler: RendezvousHandler = None  # created by the first join (network I/O)
        self._refused: str | None = None  # why the c10d store refuses connections, meanwhile

    # ------------------------------------------------------------------------------ the protocol
    def next_round(self) -> NodeAssignment:
        self.node = self._blocking(self._join, "join")
        return self.node

    def publish_failure(self, record: FailureRecord) -> None:
        if self.job_store is None or self.node is None:
            return
        where = dataclasses.replace(
            record,
            node_rank=self.node.group_rank,
            rdzv_round=self._round,
            node=self._me(),
        )
        store_keys.publish_failure(self.job_store, self.plan.torch_run_id, where, self.secret)

    def share_progress(self, last: float) -> float:
        """seams.JobShare: this node's latest progress out, the job's latest in."""
        if self.job_store is None or self.node is None:
            return last
        run_id, node = self.plan.torch_run_id, self.node
        hang_share.publish_progress(self.job_store, run_id, self._round, node.group_rank, last)
        latest = hang_share.latest_progress(
            self.job_store, run_id, self._round, node.group_world_size, time.time()
        )
        return last if latest is None else max(last, latest)

    def share_hang(self, ranks: Sequence[HangRank]) -> tuple[list[HangRank], int]:
        """seams.JobShare: every node's ranks, and how many nodes said nothing."""
        if self.job_store is None or self.node is None:
            return list(ranks), 0
        self._hangs += 1
        return hang_share.share_hang(
            self.job_store,
            self.plan.torch_run_id,
            key=f"{self._round}/{self._hangs}",
            node=self.node.group_rank,
            nodes=self.node.group_world_size,
            ranks=ranks,
            stopped=lambda: self.interrupt.signum is not None,
        )

    def share_arrivals(
        self, seen: Mapping[Key, Seen], members: Mapping[str, set[int]]
    ) -> tuple[dict[Key, Seen], dict[str, set[int]]] | None:
        """seams.JobShare: every node's collectives on node 0's clock (see `arrivals`)."""
        if self.job_store is None or self.node is None:
            return dict(seen), dict(members)
        if self._arrivals is None or self._arrivals.round != self._round:
            if self._arrivals is not None:
                self._arrivals.closed = True
            self._arrivals = ArrivalShare(
                self.job_store, run_id=self.plan.torch_run_id, round=self._round,
                node=self.node.group_rank, nodes=self.node.group_world_size,
                stopped=lambda: self.interrupt.signum is not None,
            )  # fmt: skip
        return self._arrivals.share(seen, members)

    def end(self, status: Status, observer: Observer) -> JobFailures:
        if status is Status.SUCCEEDED:
            waited = self.exit_barrier()
            observer.emit(
                ExitBarrier(
                    wall_time=time.time(),
                    mono_time=time.monotonic(),
                    waited=waited,
                    completed=waited is not None,
                )
            )
        # A node stopped by a signal, one that failed its preflight, was excluded for a hardware
        # fault or is in the quarantine ledger leaves the job running for the others.
        leaving = (Status.STOPPED, Status.PREFLIGHT_FAILED, Status.EXCLUDED, Status.QUARANTINED)
        if status not in leaving:
            self.shutdown()
        checked = self.job_failures()
        return JobFailures(
            records=tuple(checked.records), ignored=checked.ignored, last_round=self._round
        )

    @property
    def round(self) -> int:
        """seams.NodeExchange: torch's round number (the same on every node of it)."""
        return self._round

    def gather(self, topic: str, value: bytes, *, limit: int, timeout: float) -> list[bytes | None]:
        """seams.NodeExchange: every node's value under `topic` in this round's store. A value
        longer than `limit` comes back cut at `limit + 1` bytes (its reader sees it was long).
        The round's torchrun agents publish nothing: they are not waited for."""
        if self.store is None or self.node is None:
            return [value]
        store, me = self.store, self.node
        keys = [f"{GATHER}{topic}/{i}" for i in range(me.group_world_size)]
        silent = {rank for rank, _ in self._torchrun.values()}
        deadline = time.monotonic() + timeout
        try:
            store.set(keys[me.group_rank], value)
            while True:
                present = [bool(store.check([key])) for key in keys]
                heard = all(there or i in silent for i, there in enumerate(present))
                if heard or time.monotonic() >= deadline or self.interrupt.signum:
                    break
                time.sleep(GATHER_POLL)
            found = [k for k, there in zip(keys, present, strict=True) if there]
            values = dict(zip(found, store.multi_get(found), strict=True)) if found else {}
        except store_keys.STORE_READ_ERRORS as exc:
            raise RendezvousError(self._lost(exc)) from None
        self._wait_for_readers(f"{GATHER}{topic}/read", len(found))
        return [bytes(values[k])[: limit + 1] if k in values else None for k in keys]

    def _wait_for_readers(self, key: str, readers: int) -> None:
        """Count this node's read of a gather, then wait (at most READ_WAIT) until each node that
        published has read: the node whose agent hosts the store may end right after a gather
        (a preflight that stops the job), and its store must outlive the others' reads. A store
        gone while this node waits costs nothing here: its values are read already."""
        assert self.store is not None
        deadline = time.monotonic() + READ_WAIT
        with contextlib.suppress(*store_keys.STORE_READ_ERRORS):
            count = int(self.store.add(key, 1))
            while count < readers and time.monotonic() < deadline and not self.interrupt.signum:
                time.sleep(GATHER_POLL)
                count = int(self.store.add(key, 0))

    def first(self, topic: str, value: bytes, *, limit: int, timeout: float) -> bytes:
        """seams.NodeExchange: the round store's counter for `topic` elects the first node to
        ask; the others wait for its value. Unlike `gather`, a signal does not cut the wait
        short: the value is set right after the count, and a stop signal is what asks (a save
        request)."""
        if self.store is None or self.node is None:
            return value[: limit + 1]
        store, key = self.store, f"{GATHER}{topic}"
        deadline = time.monotonic() + timeout
        try:
            if int(store.add(f"{key}/count", 1)) == 1:
                store.set(f"{key}/value", value)
                return value[: limit + 1]
            while not store.check([f"{key}/value"]):
                if time.monotonic() >= deadline:
                    return value[: limit + 1]
                time.sleep(GATHER_POLL)
            return bytes(store.get(f"{key}/value"))[: limit + 1]
        except store_keys.STORE_READ_ERRORS as exc:
            raise RendezvousError(self._lost(exc)) from None

    def offered(self, topic: str, *, limit: int) -> bytes | None:
        """seams.NodeExchange: the value `first` set under `topic` in this round's store, if
        any (one `check`, and a `get` only when it is there)."""
        if self.store is None or self.node is None:
            return None
        store, key = self.store, f"{GATHER}{topic}/value"
        try:
            return bytes(store.get(key))[: limit + 1] if store.check([key]) else None
        except store_keys.STORE_READ_ERRORS as exc:
            raise RendezvousError(self._lost(exc)) from None

    def job_share(self) -> JobShare:
        return self  # the hangs ride on the job's store

    def close(self) -> None:
        pass  # `end` decides: barrier, close the job, or leave it running

    # --------------------------------------------------------------------------------- the end
    def job_failures(self) -> sealed_records.Checked:
        """Every node's published failure records that pass the checks (none when the store is
        gone), and how many did not."""
        if self.job_store is None:
            return sealed_records.Checked(records=[], ignored=0)
        legacy = dynamic_state(self.handler) is None  # legacy etcd names no participants
        return store_keys.read_failures(
            self.job_store,
            self.plan.torch_run_id,
            secret=self.secret,
            nodes=None if legacy else self._seen,
            last_round=self._round,
        )

    def exit_barrier(self) -> float | None:
        """After success, wait for the other nodes to finish; None when it gave up."""
        if self.store is None or self.node is None:
            return 0.0
        return store_keys.exit_barrier(
            self.store,
            self.node.group_world_size,
            timeout=self.spec.exit_barrier_timeout,
            stop=self.interrupt,
            job_changed=self._changed_but_joined,
        )

    def _changed_but_joined(self) -> bool:
        try:
            change = self.poll()
        except RendezvousError:
            return True  # the store is gone
        return change is not None and change.kind is not ChangeKind.JOINED

    def shutdown(self) -> None:
        """Close the rendezvous for this run id: nodes still in it stop instead of waiting."""
        if self.handler is None:
            return  # never connected
        with contextlib.suppress(Exception):  # torch's handler: the store is already gone
            self.handler.shutdown()

    # ------------------------------------------------------------------------------- internals
    def _join(self) -> NodeAssignment:
        info = self._next_rendezvous()
        first_round = self.store is None
        store = guarded(info.store, self.spec.backend)
        try:
            # Node 0 first: a joining node's torch handler (a torchrun node's, or a new agent's in
            # its first round) waits inside the rendezvous for this round's master, so the
            # others' facts, waited for in a node order, would never come before it.
            if info.rank == 0:
                master = self._master(info, store)
            group_rank, order = self._group_rank(info, store)
            node = store_keys.assign_ranks(
                self.plan.role, self.plan.nproc_per_node, store, group_rank, info.world_size
            )
            if info.rank != 0:  # after our role info: a torchrun node 0 waits for it
                master = self._master(info, store)
            # Every elastic-hydra node published its facts before its part of assign_ranks.
            facts = store_keys.read_facts(store, info.world_size, wait=False)
        except store_keys.STORE_READ_ERRORS as exc:
            raise RendezvousError(self._lost(exc)) from None
        self._check_mixed(len(facts) < info.world_size, first_round)
        self._torchrun = self._torchrun_nodes(store, set(range(info.world_size)) - set(facts))
        other = store_keys.config_mismatch(facts, info.rank)
        if other is not None:
            raise RendezvousError(
                f"node {other} of the {self.where} resolved a different config than this node "
                f"(hash {facts[other].config} vs {self.plan.config_hash}): start every node with "
                "the same job file and overrides, and take per-launch values such as ${now:} "
                "from hydra.run.dir, not from the job's keys"
            )
        self._enter_round(info, store)
        return NodeAssignment(
            group_rank=group_rank,
            group_world_size=info.world_size,
            master=master,
            use_agent_store=self.handler.use_agent_store,
            departure_bound=self.spec.torchrun_departure_bound
            if self._torchrun
            else self.spec.departure_bound,
            members=self._round_members(order),
            **node,
        )

    def _round_members(self, order: list[int]) -> tuple[str, ...]:
        """The round's nodes by node rank (`order`: their torch ranks), as torch names them; ()
        when torch keeps no participants (legacy etcd) or they are not the round's ranks (the
        state is any agent's writing)."""
        state = dynamic_state(self.handler)
        if state is None:
            return ()
        by_rank = {rank: node_name(node) for node, rank in state.participants.items()}
        if set(by_rank) != set(order) or len(by_rank) != len(order):
            return ()
        return tuple(by_rank[rank] for rank in order)

    def _next_rendezvous(self) -> Any:
        """torch's next round (its RendezvousInfo), its errors told as ours."""
        if self.handler is None:
            self.handler = create_handler(
                self.plan,
                self.where,
                refused=self._store_refused,
                stopped=lambda: self.interrupt.signum is not None,
            )
        from torch.distributed.elastic.rendezvous import api

        try:
            info = self.handler.next_rendezvous()
        except api.RendezvousTimeoutError:
            raise RendezvousError(
                f"the {self.where} did not complete within {self._join_bound()}: fewer than "
                f"{self.plan.nnodes.min} node(s) joined (nnodes={self.plan.nnodes}). Start the "
                "other nodes with the same rdzv.id and rdzv.endpoint, or raise "
                f"{self._join_setting()[0]}"
            ) from None
        except api.RendezvousClosedError:
            raise RendezvousError(
                f"the {self.where} is closed: this job already ended on another node. "
                "Pick a new rdzv.id to start a new job"
            ) from None
        except Exception as exc:  # torch's handler: see torch_handler
            raise RendezvousError(self._lost(exc)) from None
        return info

    def _store_refused(self, why: str | None) -> None:
        self._refused = why  # told by the wait notices (join_wait)

    def _enter_round(self, info: Any, store: Store) -> None:
        """The round's stores, members and number, once this node is in it."""
        self.store = store
        under = getattr(info.store, "underlying_store", info.store)  # every round's prefix
        self.job_store = guarded(under, self.spec.backend)
        state = dynamic_state(self.handler)
        if state is not None:
            self._members, self._round = frozenset(state.participants), state.round
            self._gone = frozenset()
            self._seen |= {node_name(n) for n in self._members}
        else:
            self._round += 1

    def _group_rank(self, info: Any, store: Store) -> tuple[int, list[int]]:
        """This node's rank, and the round's torch ranks in node-rank order: in Slurm's node
        order when the plan has one (every node is an elastic-hydra agent then), else torch's.
        Without the agent's store, the workers' rank 0 hosts their store where torch's rank 0
        is, so torch's order stays."""
        order = self.spec.node_order
        facts = store_keys.NodeFacts(self.plan.config_hash, order)
        store_keys.publish_facts(store, info.rank, facts)
        if order is None or not self.handler.use_agent_store:
            return int(info.rank), list(range(info.world_size))
        ranked = store_keys.ranked(store_keys.read_facts(store, info.world_size, wait=True))
        return ranked.index(info.rank), ranked

    def _master(self, info: Any, store: Store) -> Endpoint:
        """MASTER_ADDR/PORT of this round, the same on every node, on a store fresh to the round.

        torch's handler publishes them only when it first builds them, then hands the workers the
        same agent store in every round: a node joining a later round would wait for the keys
        forever, and workers restarted by a membership change (same restart count, so the same
        key prefix) would read the previous round's keys. So in a round where torch published
        nothing, node 0 starts a fresh store for the workers and publishes it; the others read.
        """
        if info.rank != 0 and not store.check([MASTER_ADDR]):
            # Node 0 assigned the ranks without publishing the round's store: a torchrun agent
            # that keeps its first round's store (see _check_mixed).
            raise RendezvousError(self._mixed_restart_advice("node 0, a torchrun agent, keeps"))
        if info.rank == 0 and not store.check([MASTER_ADDR]):
            addr = info.bootstrap_store_info.master_addr
            self._worker_store = bound_tcp_store(addr, 0, multi_tenant=True, wait_for_workers=False)
            store.set(MASTER_ADDR, addr.encode())
            store.set(MASTER_PORT, str(self._worker_store.port).encode())
        addr = store.get(MASTER_ADDR).decode()
        return Endpoint(host=addr, port=int(store.get(MASTER_PORT).decode()))
