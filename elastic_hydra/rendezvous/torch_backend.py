"""Multi-node rendezvous through PyTorch's own handlers: c10d, etcd-v2 and legacy etcd.

torch is imported here and in `torch_handler` only, and only for these backends. The store keys
for rank assignment and the exit barrier are torchrun's, so elastic-hydra and torchrun agents can
share one rendezvous.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from elastic_hydra.agent.events import EventKind
from elastic_hydra.agent.outcome import Status, WorkerExit
from elastic_hydra.agent.seams import (
    Change,
    ChangeKind,
    JobFailures,
    NodeAssignment,
    Observer,
    StopRequest,
)
from elastic_hydra.errors import RendezvousError
from elastic_hydra.hangs import share
from elastic_hydra.plan import Dynamic, DynamicBackend, Endpoint, LaunchPlan
from elastic_hydra.records import HangRecord, PeerChange, PeerFailure, peer_name
from elastic_hydra.rendezvous import sealed_records, store_keys
from elastic_hydra.rendezvous.torch_handler import (
    RendezvousHandler,
    Store,
    agent_name,
    bound_tcp_store,
    create_handler,
    dynamic_state,
    guarded,
    node_name,
    reason,
    this_node,
)

# torchrun's keys (torch/distributed/elastic/agent/server/api.py, utils/store.py).
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"  # RendezvousStoreInfo's keys

_T = TypeVar("_T")
# Seconds into a join at which the console hears of it; then every 60 s.
WAIT_NOTICES = (5.0, 30.0, 60.0)
STATE_CACHE = 1.0  # seconds torch's dynamic handler reuses its last read of the shared state


class TorchRendezvous:
    """One node's view of a torch rendezvous (implements seams.Rendezvous)."""

    def __init__(
        self,
        plan: LaunchPlan,
        interrupt: StopRequest,
        describe: Callable[[WorkerExit, NodeAssignment], dict[str, Any]],
        say: Callable[[str], None] = lambda _line: None,
        status: Callable[[str | None], None] | None = None,
    ) -> None:
        assert isinstance(plan.rdzv, Dynamic)
        self.plan = plan
        self.spec: Dynamic = plan.rdzv
        self.interrupt = interrupt
        self.describe = describe
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
        self._seen: set[str] = set()  # every node of every round this agent took part in
        # The round's torchrun agents (no facts published): torch's node -> (node rank, ranks)
        self._torchrun: dict[object, tuple[int, str]] = {}
        self._gone: frozenset[object] = frozenset()  # members missing since _gone_at
        self._gone_at = 0.0
        secret = os.environ.get(sealed_records.SECRET_ENV)
        self.secret = secret.encode() if secret else None
        self.handler: RendezvousHandler = None  # created by the first join (network I/O)

    # ------------------------------------------------------------------------------ the protocol
    def next_round(self) -> NodeAssignment:
        self.node = self._blocking(self._join, "join")
        return self.node

    def poll(self) -> Change | None:
        try:
            waiting = self.handler.num_nodes_waiting()  # syncs the shared state (cached 1 s)
        except Exception as exc:  # torch's handler: see torch_handler
            raise RendezvousError(self._lost(exc)) from None
        state = dynamic_state(self.handler)
        if state is not None and state.closed:
            return Change(kind=ChangeKind.CLOSED, reason=self._closed_reason())
        if waiting:
            # Members waiting again restarted their workers (a failure there, or they saw the
            # change first); any other waiting node is new.
            back = set(getattr(state, "wait_list", ())) & self._members
            new = waiting - len(back)
            if new > 0:
                return Change(
                    kind=ChangeKind.JOINED, reason=f"{new} new node(s) waiting to join", nodes=new
                )
            return Change(
                kind=ChangeKind.JOINED,
                reason=f"{self._names(back)} {PeerChange.RESTARTED}: a new round for every node",
                nodes=len(back),
                peers=self._peers(back, PeerChange.RESTARTED),
            )
        if state is None:
            return None  # legacy etcd keeps no heartbeats: a departure shows as worker failures
        # Syncing drops nodes whose last heartbeat is older than the departure bound (this node
        # included, when its own heartbeat thread ran late: that is not a departure).
        alive = self._members & (set(state.participants) | {this_node(self.handler)})
        gone = frozenset(self._members - alive)
        if state.round == self._round and not self._confirmed(gone):
            return None
        return Change(
            kind=ChangeKind.LEFT,
            reason=f"{self._names(gone) or 'a node'} {PeerChange.LEFT} (no heartbeat for "
            f"{self.spec.departure_bound:g} s)",
            nodes=len(alive),
            peers=self._peers(gone, PeerChange.LEFT),
        )

    def _confirmed(self, gone: frozenset[object]) -> bool:
        """Whether members missing from the round are gone. A member that restarts its workers
        leaves the participants one store write before it enters the wait list: it counts as
        gone only when a later read of the store (torch caches it for a second) still says so."""
        now = time.monotonic()
        if gone != self._gone:
            self._gone, self._gone_at = gone, now
        return bool(gone) and now - self._gone_at > STATE_CACHE

    def _names(self, nodes: Collection[object]) -> str:
        return ", ".join(sorted(self._name(n) for n in nodes))

    def _name(self, node: object) -> str:
        if (torchrun := self._torchrun.get(node)) is None:
            return node_name(node)
        return peer_name(torchrun[0], agent_name(node), torchrun[1])

    def _peers(self, nodes: Collection[object], what: PeerChange) -> tuple[PeerFailure, ...]:
        """What torchrun agents among `nodes` did: they publish no failure records of their own."""
        found = sorted(
            (t, agent_name(n)) for n in nodes if (t := self._torchrun.get(n)) is not None
        )
        now, round_ = time.time(), self._round
        return tuple(
            PeerFailure(node=a, node_rank=r, ranks=ranks, what=what, rdzv_round=round_, time=now)
            for (r, ranks), a in found
        )

    def _closed_reason(self) -> str:
        if not self._torchrun:
            return "another node ended the job"
        return (
            f"another node ended the job; if it is {self._names(self._torchrun)}, its logs say "
            "why (torchrun agents publish no failures)"
        )

    def publish_failure(self, exit: WorkerExit) -> None:
        if self.job_store is None or self.node is None:
            return
        record = {
            **self.describe(exit, self.node),
            "rdzv_round": self._round,
            "node": node_name(this_node(self.handler)),
        }
        store_keys.publish_failure(self.job_store, self.plan.torch_run_id, record, self.secret)

    def share_progress(self, last: float) -> float:
        """hang_watch.JobShare: this node's latest progress out, the job's latest in."""
        if self.job_store is None or self.node is None:
            return last
        run_id, node = self.plan.torch_run_id, self.node
        share.publish_progress(self.job_store, run_id, self._round, node.group_rank, last)
        latest = share.latest_progress(
            self.job_store, run_id, self._round, node.group_world_size, time.time()
        )
        return last if latest is None else max(last, latest)

    def share_hang(self, record: HangRecord) -> HangRecord:
        """hang_watch.JobShare: every node's ranks and the job-wide verdict."""
        if self.job_store is None or self.node is None:
            return record
        self._hangs += 1
        return share.share_hang(
            self.job_store,
            self.plan.torch_run_id,
            key=f"{self._round}/{self._hangs}",
            node=self.node.group_rank,
            nodes=self.node.group_world_size,
            record=record,
            stopped=lambda: self.interrupt.signum is not None,
        )

    def end(self, status: Status, observer: Observer) -> JobFailures:
        if status is Status.SUCCEEDED:
            waited = self.exit_barrier()
            observer.emit(EventKind.EXIT_BARRIER, waited=waited, completed=waited is not None)
        if status is not Status.STOPPED:  # a node stopped by a signal leaves the job running
            self.shutdown()
        checked = self.job_failures()
        return JobFailures(
            records=tuple(checked.records), ignored=checked.ignored, last_round=self._round
        )

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
        if self.handler is None:
            self.handler = create_handler(self.plan, self.where)
        from torch.distributed.elastic.rendezvous import api

        try:
            info = self.handler.next_rendezvous()
        except api.RendezvousTimeoutError:
            raise RendezvousError(
                f"the {self.where} did not complete within "
                f"rdzv.join_timeout={self.spec.join_timeout:g} s: fewer than "
                f"{self.plan.nnodes.min} node(s) joined (nnodes={self.plan.nnodes}). Start the "
                "other nodes with the same rdzv.id and rdzv.endpoint, or raise rdzv.join_timeout"
            ) from None
        except api.RendezvousClosedError:
            raise RendezvousError(
                f"the {self.where} is closed: this job already ended on another node. "
                "Pick a new rdzv.id to start a new job"
            ) from None
        except Exception as exc:  # torch's handler: see torch_handler
            raise RendezvousError(self._lost(exc)) from None
        first_round = self.store is None
        store = guarded(info.store, self.spec.backend)
        try:
            group_rank = self._group_rank(info, store)
            if info.rank == 0:  # first: a joining torchrun node's handler waits for it
                master = self._master(info, store)
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
        return NodeAssignment(
            group_rank=group_rank,
            group_world_size=info.world_size,
            master=master,
            use_agent_store=self.handler.use_agent_store,
            **node,
        )

    def _group_rank(self, info: Any, store: Store) -> int:
        """This node's rank: in Slurm's node order when the plan has one (every node is an
        elastic-hydra agent then), else torch's. Without the agent's store, the workers' rank 0
        hosts their store where torch's rank 0 is, so torch's order stays."""
        order = self.spec.node_order
        facts = store_keys.NodeFacts(self.plan.config_hash, order)
        store_keys.publish_facts(store, info.rank, facts)
        if order is None or not self.handler.use_agent_store:
            return int(info.rank)
        every = store_keys.read_facts(store, info.world_size, wait=True)
        return store_keys.ordered_rank(every, info.rank)

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

    def _torchrun_nodes(self, store: Store, ranks: set[int]) -> dict[object, tuple[int, str]]:
        """The round's nodes that published no facts (torchrun agents), by torch's node."""
        state = dynamic_state(self.handler)
        if not ranks or state is None:
            return {}
        workers = store_keys.node_ranks(store, ranks)
        return {
            node: (rank, workers.get(rank, ""))
            for node, rank in state.participants.items()
            if rank in ranks
        }

    def _check_mixed(self, mixed: bool, first_round: bool) -> None:
        """A job with torchrun agents in it restarts only without TCP store sharing: torch
        2.13's agents keep their first round's store for the workers and never re-read its
        address, while their workers reuse it without a per-attempt prefix (stale keys)."""
        if not mixed or not self.handler.use_agent_store:
            return
        if not first_round:
            raise RendezvousError(self._mixed_restart_advice("the torchrun agents in it keep"))
        self.say(
            "elastic-hydra: warning: torchrun agents are in this job; its workers cannot "
            "restart unless every node sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
        )

    def _mixed_restart_advice(self, who_keeps: str) -> str:
        return (
            f"cannot start the workers of a new round of the {self.where}: {who_keeps} the "
            "workers' store of their first round (torch's TCP store sharing), so restarted "
            "workers would meet stale keys. Set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every "
            "node of a job that mixes torchrun and elastic-hydra agents"
        )

    def _blocking(self, call: Callable[[], _T], what: str) -> _T:
        """Run a blocking torch call in a thread so that a signal still stops the agent."""
        result: list[_T] = []
        error: list[BaseException] = []

        def target() -> None:
            try:
                result.append(call())
            except BaseException as exc:
                error.append(exc)

        thread = threading.Thread(target=target, name=f"rendezvous-{what}", daemon=True)
        thread.start()
        started, notice_at = time.monotonic(), WAIT_NOTICES[0]
        shown = False
        try:
            while thread.is_alive():
                thread.join(0.05)
                if self.interrupt.signum is not None:
                    raise RendezvousError(f"stopped by a signal during the rendezvous {what}")
                waited = time.monotonic() - started
                if what != "join" or waited < notice_at:
                    continue
                if self.status is not None:  # a terminal: one line, updated every second
                    self.status(self._still_waiting(waited))
                    shown, notice_at = True, notice_at + 1
                else:
                    self.say(self._still_waiting(waited))
                    notice_at = next(t for t in (*WAIT_NOTICES, notice_at + 60) if t > notice_at)
        finally:
            if shown and self.status is not None:
                self.status(None)
        if error:
            raise error[0]
        return result[0]

    def _still_waiting(self, waited: float) -> str:
        nodes = self.plan.nnodes
        return (
            f"elastic-hydra: waiting for {nodes.min} node(s) (nnodes={nodes}) at the {self.where}: "
            f"{waited:.0f} s of rdzv.join_timeout={self.spec.join_timeout:g} s"
        )

    def _lost(self, exc: BaseException) -> str:
        lost = f"lost the {self.where}: {reason(exc)}."
        if self.spec.backend is not DynamicBackend.C10D:
            return f"{lost} Check that etcd is running"
        if self.spec.is_host is False:  # the store lives apart already (an rdzv-server)
            return f"{lost} Check the store's process at {self.spec.endpoint}"
        host = "The node hosting it may have died"
        if self._torchrun:  # a torchrun agent closes its store when its job fails
            host = (
                f"The node hosting it ended the job or died; torchrun agents publish no "
                f"failures: if it is {self._names(self._torchrun)}, its logs say why"
            )
        return (
            f"{lost} {host}; run the store apart from the agents with `elastic-hydra rdzv-server`"
        )
