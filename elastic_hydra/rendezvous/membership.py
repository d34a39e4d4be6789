"""A round's membership changes, as every node of the job tells them alike.

A member of the round is in it, waiting for the next one (it re-joins: its workers failed, or it
follows a change it saw first), or gone (torch dropped it for a heartbeat older than the
departure bound). A departure comes first: every survivor names the node whose heartbeat stopped,
not the first survivor to re-join. A node that follows a change says so in the store before it
re-joins, so the others do not take it for a node that restarted its workers.

`Membership` is a part of `TorchRendezvous`; the attributes it reads are declared below.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from elastic_hydra.agent.events import ChangeKind
from elastic_hydra.agent.seams import Change
from elastic_hydra.errors import RendezvousError
from elastic_hydra.plan import LaunchPlan
from elastic_hydra.records.failures import PeerChange
from elastic_hydra.rendezvous import store_keys
from elastic_hydra.rendezvous.torch_handler import (
    Store,
    dynamic_state,
    is_ours,
    node_name,
    this_node,
)
from elastic_hydra.rendezvous.torchrun_agents import TorchrunAgents

STATE_CACHE = 1.0  # seconds torch's dynamic handler reuses its last read of the shared state


class Membership(TorchrunAgents):
    """seams.Rendezvous.poll on torch's shared state."""

    plan: LaunchPlan
    job_store: Store | None
    _members: frozenset[object]  # the round's nodes, as torch names them
    _gone: frozenset[object]  # members missing since _gone_at
    _gone_at: float

    def poll(self) -> Change | None:
        try:
            waiting = self.handler.num_nodes_waiting()  # syncs the shared state (cached 1 s)
        except Exception as exc:  # torch's handler: see torch_handler
            raise RendezvousError(self._lost(exc)) from None
        state = dynamic_state(self.handler)
        if state is not None and state.closed:
            return Change(kind=ChangeKind.CLOSED, reason=self._closed_reason())
        if state is None:  # legacy etcd keeps no heartbeats: a departure shows as worker failures
            if not waiting:
                return None
            return self._followed(
                ChangeKind.JOINED, f"{waiting} new node(s) waiting to join", nodes=waiting
            )
        # A member is in the round, or waiting for the next one (it re-joins: its workers
        # failed, or it follows a change it saw first), or gone: syncing drops nodes whose last
        # heartbeat is older than the departure bound (this node included, when its own
        # heartbeat thread ran late: that is not a departure).
        listed = set(state.wait_list)
        back = listed & self._members
        alive = self._members & (set(state.participants) | back | {this_node(self.handler)})
        gone = frozenset(self._members - alive)
        new = len(listed - self._members)
        # A departure comes first: the members that re-join after it follow it, and every
        # node names the node whose heartbeat stopped, whichever survivor re-joined first.
        if gone or state.round != self._round:
            if state.round == self._round and not self._confirmed(gone):
                return None
            theirs = [n for n in gone if not is_ours(n)] if gone else self._torchrun
            bound = self.spec.torchrun_departure_bound if theirs else self.spec.departure_bound
            return self._followed(
                ChangeKind.LEFT,
                f"{self._names(gone) or 'a node'} {PeerChange.LEFT} (no heartbeat for {bound:g} s)",
                nodes=len(alive) + new,
                peers=self._peers(gone, PeerChange.LEFT),
            )
        self._confirmed(gone)
        if new > 0:
            return self._followed(
                ChangeKind.JOINED, f"{new} new node(s) waiting to join", nodes=new
            )
        if not back:
            return None
        restarted = self._restarted(back)
        if not restarted:  # each follows a change this node did not see: it will, re-joining
            return self._followed(
                ChangeKind.JOINED,
                f"{self._names(back)} re-joined after a change: a new round for every node",
                nodes=len(back),
            )
        return self._followed(
            ChangeKind.JOINED,
            f"{self._names(restarted)} {PeerChange.RESTARTED}: a new round for every node",
            nodes=len(restarted),
            peers=self._peers(restarted, PeerChange.RESTARTED),
        )

    def _followed(self, kind: ChangeKind, reason: str, **change: Any) -> Change:
        """The change, once this node said in the store that it follows it: when it waits for
        the next round, the others do not take it for a node that restarted its workers."""
        if self.job_store is not None:
            key = store_keys.follower_key(self.plan.torch_run_id, self._round, self._me())
            with contextlib.suppress(*store_keys.STORE_READ_ERRORS):
                self.job_store.set(key, kind.value)
        return Change(kind=kind, reason=reason, **change)

    def _restarted(self, back: set[object]) -> set[object]:
        """The members waiting again that restarted their workers: not those that said they
        follow a change (elastic-hydra agents say so before they re-join; torchrun agents do
        not, and count as restarted, as torchrun restarts its workers for either)."""
        if self.job_store is None:
            return back
        run_id, round_ = self.plan.torch_run_id, self._round
        restarted = set()
        for node in back:
            key = store_keys.follower_key(run_id, round_, node_name(node))
            try:
                follows = bool(self.job_store.check([key]))
            except store_keys.STORE_READ_ERRORS:
                follows = False
            if not follows:
                restarted.add(node)
        return restarted

    def _me(self) -> str:
        return node_name(this_node(self.handler))

    def _confirmed(self, gone: frozenset[object]) -> bool:
        """Whether members missing from the round are gone. A member that restarts its workers
        leaves the participants one store write before it enters the wait list: it counts as
        gone only when a later read of the store (torch caches it for a second) still says so."""
        now = time.monotonic()
        if gone != self._gone:
            self._gone, self._gone_at = gone, now
        return bool(gone) and now - self._gone_at > STATE_CACHE
