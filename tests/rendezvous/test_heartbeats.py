"""Heartbeats judged per launcher, on torch's own state holder: an elastic-hydra agent's node is
gone after this agent's bound (3 s by default), a torchrun agent's after torch's default (15 s),
and the state read back from the store is what was there."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

from elastic_hydra.rendezvous.torch_handler import OUR_NODES_FROM, is_ours, judge_heartbeats


class MemoryBackend:
    """torch's RendezvousBackend, in memory: the state as the store would hold it."""

    name = "memory"

    def __init__(self, state: Any) -> None:
        self.bits, self.token = pickle.dumps(state), 0

    def get_state(self) -> tuple[bytes, int]:
        return self.bits, self.token

    def set_state(self, bits: bytes, token: object = None) -> tuple[bytes, int, bool]:
        self.bits, self.token = bits, self.token + 1
        return bits, self.token, True


def holder_after(silent: dict[Any, float]) -> tuple[Any, MemoryBackend]:
    """torch's state holder (this agent beating every 1 s, gone after 3), after one sync of a
    state whose participants last beat `silent[node]` seconds ago."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        RendezvousSettings,
        RendezvousTimeout,
        _BackendRendezvousStateHolder,
        _RendezvousState,
    )

    now = datetime.now(UTC)
    state = _RendezvousState()
    state.participants = {node: rank for rank, node in enumerate(silent)}
    state.last_heartbeats = {node: now - timedelta(seconds=s) for node, s in silent.items()}
    backend = MemoryBackend(state)
    settings = RendezvousSettings("job", 1, 4, RendezvousTimeout(), timedelta(seconds=1), 3)
    holder = _BackendRendezvousStateHolder(backend, settings, cache_duration=0)
    judge_heartbeats(holder, timedelta(seconds=15 - 3))
    holder.sync()
    return holder, backend


def nodes() -> tuple[Any, Any]:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    ours, theirs = _NodeDesc("n0", 10, OUR_NODES_FROM), _NodeDesc("n1", 11, 0)
    assert is_ours(ours) and not is_ours(theirs)
    return ours, theirs


def test_a_torchrun_agent_silent_for_a_beat_of_its_own_is_kept() -> None:
    ours, theirs = nodes()
    holder, backend = holder_after({ours: 0.5, theirs: 6.0})  # torchrun beats every 5 s
    assert set(holder.state.participants) == {ours, theirs}
    assert holder._dead_nodes == []
    # Only the judgement moved: the heartbeat in the state is the one in the store, and a
    # state this node writes back carries it unchanged.
    stored = pickle.loads(backend.bits).last_heartbeats[theirs]
    assert holder.state.last_heartbeats[theirs] == stored
    holder.mark_dirty()
    holder.sync()
    assert backend.token == 1 and pickle.loads(backend.bits).last_heartbeats[theirs] == stored


def test_each_is_dropped_after_its_own_bound() -> None:
    ours, theirs = nodes()
    holder, _ = holder_after({ours: 4.0, theirs: 6.0})  # ours: past 3 s; theirs: within 15 s
    assert (list(holder.state.participants), holder._dead_nodes) == ([theirs], [ours])
    holder, _ = holder_after({ours: 0.5, theirs: 16.0})
    assert (list(holder.state.participants), holder._dead_nodes) == ([ours], [theirs])
