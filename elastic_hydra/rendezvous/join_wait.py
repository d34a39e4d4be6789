"""A rendezvous join that blocks in torch, waited for where a signal still stops the agent.

torch's `next_rendezvous` blocks until enough nodes joined: it runs in a thread while the agent
watches its stop flag, and a join that waits is told on the console (at 5, 30 and 60 s, then
every minute; on a terminal, one status line rewritten every second).

`JoinWait` is a part of `TorchRendezvous`; the attributes it reads are declared below.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from elastic_hydra.agent.seams import StopRequest
from elastic_hydra.errors import RendezvousError
from elastic_hydra.plan import Dynamic, LaunchPlan

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
