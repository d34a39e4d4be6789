"""The torchrun agents in a torch rendezvous: found, named, and the advice that names them.

A torchrun agent joins through the same handler but publishes no facts and no failure records:
it is found by what it did not publish, named by its node rank, host, pid and ranks in every
change and error, and a job that mixes it with elastic-hydra agents gets the advice it needs
(its TCP store sharing keeps stale keys across restarts).

`TorchrunAgents` is a part of `TorchRendezvous`; the attributes it reads are declared below.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from elastic_hydra.errors import RendezvousError
from elastic_hydra.plan import Dynamic, DynamicBackend
from elastic_hydra.records.failures import PeerChange, PeerFailure, peer_name
from elastic_hydra.rendezvous import store_keys
from elastic_hydra.rendezvous.torch_handler import (
    RendezvousHandler,
    Store,
    agent_name,
    dynamic_state,
    foreign_state,
    node_name,
    reason,
)


class TorchrunAgents:
    """The round's torchrun agents, and how errors and changes name them."""

    handler: RendezvousHandler
    spec: Dynamic
    where: str
    say: Callable[[str], None]
    _round: int
    # The round's torchrun agents (no facts published): torch's node -> (node rank, ranks)
    _torchrun: dict[object, tuple[int, str]]
    _told_timings: bool  # the line on torchrun agents' timings was said

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
        address, while their workers reuse it without a per-attempt prefix (stale keys). And
        its timings are torch's where they judge torchrun agents: said once."""
        if not mixed:
            return
        if (
            not self._told_timings
            and self.spec.torchrun_departure_bound > self.spec.departure_bound
        ):
            self._told_timings = True
            self.say(
                "elastic-hydra: torchrun agents are in this job: they are judged gone after "
                f"{self.spec.torchrun_departure_bound:g} s without a heartbeat (torch's default), "
                f"elastic-hydra agents after {self.spec.departure_bound:g} s"
            )
        if not self.handler.use_agent_store:
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

    def _lost(self, exc: BaseException) -> str:
        if (foreign := foreign_state(exc)) is not None:
            return (
                f"refused the rendezvous state in the store of the {self.where}: {foreign}; none"
                f" of it ran. Something other than the job's agents wrote there: keep the store"
                f" where only the job's nodes reach it"
            )
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
