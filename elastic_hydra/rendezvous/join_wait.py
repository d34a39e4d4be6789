"""A rendezvous join that blocks in torch, waited for where a signal still stops the agent.

torch's `next_rendezvous` blocks until enough nodes joined: it runs in a thread while the agent
watches its stop flag, and a join that waits is told on the console (at 5, 30 and 60 s, then
every minute; on a terminal, one status line rewritten every second). The line says what it
waits for, from torch's shared state: a store that refuses connections, nodes up to the minimum,
the last call for more once the minimum is in, the running job to let this node in, or a place
in a job that has its maximum; and the setting that bounds that wait.

`JoinWait` is a part of `TorchRendezvous`; the attributes it reads are declared below.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from elastic_hydra.agent.seams import StopRequest
from elastic_hydra.errors import RendezvousError
from elastic_hydra.plan import Dynamic, DynamicBackend, LaunchPlan
from elastic_hydra.rendezvous.torch_handler import RendezvousHandler, dynamic_state, this_node

_T = TypeVar("_T")
# Seconds into a join at which the console hears of it; then every 60 s.
WAIT_NOTICES = (5.0, 30.0, 60.0)


class JoinWait:
    """Blocking torch calls, run so that a signal stops them and a long join is told."""

    plan: LaunchPlan
    spec: Dynamic
    where: str
    interrupt: StopRequest
    say: Callable[[str], None]
    status: Callable[[str | None], None] | None
    handler: RendezvousHandler  # None until torch's handler is created (the join connects)
    _refused: str | None  # while the store refuses connections: why (see torch_handler)

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
        # The clock starts again when torch's handler exists: its join (and join_timeout) starts
        # then, after the import of torch and the connection, which may take seconds of their own.
        started, notice_at, joining = time.monotonic(), WAIT_NOTICES[0], False
        shown = False
        try:
            while thread.is_alive():
                thread.join(0.05)
                if self.interrupt.signum is not None:
                    raise RendezvousError(f"stopped by a signal during the rendezvous {what}")
                now = time.monotonic()
                if not joining and self.handler is not None:
                    started, joining = now, True
                    notice_at = 1.0 if shown else WAIT_NOTICES[0]
                waited = now - started
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

    def _join_setting(self) -> tuple[str, float]:
        """The setting that bounds a join: legacy etcd reads rdzv.timeout, not join_timeout."""
        if self.spec.backend is DynamicBackend.ETCD:
            return "rdzv.timeout", self.spec.timeout
        return "rdzv.join_timeout", self.spec.join_timeout

    def _join_bound(self) -> str:
        key, value = self._join_setting()
        return f"{key}={value:g} s"

    def _still_waiting(self, waited: float) -> str:
        """What the join waits for now, from torch's shared state as this node last read it."""
        if self.handler is None:  # torch's handler is being created: it connects to the store
            if self._refused is not None:
                return (
                    f"elastic-hydra: waiting for the rendezvous store at {self.spec.endpoint} "
                    f"to accept connections ({self._refused}): {waited:.0f} s of "
                    f"rdzv.connect_timeout={self.spec.connect_timeout:g} s"
                )
            return f"elastic-hydra: loading torch, connecting to the {self.where}: {waited:.0f} s"
        state, me = dynamic_state(self.handler), this_node(self.handler)
        nodes = self.plan.nnodes
        if state is None or state.closed:  # legacy etcd: no shared state to read
            return (
                f"elastic-hydra: waiting for at least {nodes.min} node(s) (nnodes={nodes}) at "
                f"the {self.where}: {waited:.0f} s of {self._join_bound()}"
            )
        if me in state.redundancy_list:
            return (
                f"elastic-hydra: the job at the {self.where} has its {nodes.max} node(s) "
                f"(nnodes={nodes}): waiting as a spare until one leaves ({waited:.0f} s)"
            )
        if me in state.wait_list or (state.complete and me not in state.participants):
            return (
                f"elastic-hydra: waiting to join the running job at the {self.where}: its "
                f"nodes re-join at their next check of the rendezvous; {waited:.0f} s of "
                f"{self._join_bound()}"
            )
        joined = len(state.participants)
        if joined >= nodes.min and state.deadline is not None:
            left = max(0.0, (state.deadline - datetime.now(UTC)).total_seconds())
            return (
                f"elastic-hydra: {joined} of {nodes.max} node(s) joined the {self.where}; "
                f"last call for more: {left:.0f} s left "
                f"(rdzv.last_call_timeout={self.spec.last_call_timeout:g} s)"
            )
        of = f"{nodes.min} (min)" if nodes.min != nodes.max else f"{nodes.min}"
        return (
            f"elastic-hydra: {joined} of {of} node(s) joined the {self.where}; "
            f"{waited:.0f} s of {self._join_bound()}"
        )
