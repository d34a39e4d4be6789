"""What a node does with the round's preflight verdict. Pure.

Every node of a round has the same verdict, so each decides alike without a word to the others:
a node that failed leaves (exit 4, the rendezvous left open for the rest); the others start their
workers when nothing failed, join a new round without the failed nodes when at least nnodes' MIN
remain (a membership change: no restart spent), and otherwise stop before the script (exit 5).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic_hydra.agent.outcome import Status
from elastic_hydra.plan import NodeRange
from elastic_hydra.records.preflight import PreflightVerdict


class Next(enum.Enum):
    START = "start"  # start the workers
    REJOIN = "rejoin"  # a new round without the nodes that failed
    END = "end"  # this node's run ends here: `status`, `reason`


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    next: Next
    status: Status | None = None
    reason: str = ""


def decide(verdict: PreflightVerdict, node_rank: int, nodes: int, nnodes: NodeRange) -> Decision:
    """This node's next step after the round's verdict (`nodes`: in the round)."""
    if verdict.passed:
        return Decision(next=Next.START)
    if node_rank in verdict.bad_nodes:
        mine = [f.line for f in verdict.findings if f.fatal and f.node == node_rank]
        why = mine[0].removeprefix("preflight: ") if mine else "failed"
        return Decision(
            next=Next.END,
            status=Status.PREFLIGHT_FAILED,
            reason=f"this node failed its preflight: {why}",
        )
    remaining = nodes - len(verdict.bad_nodes)
    if remaining >= nnodes.min:
        return Decision(next=Next.REJOIN)
    failed = ", ".join(str(n) for n in verdict.bad_nodes)
    return Decision(
        next=Next.END,
        status=Status.PREFLIGHT_STOPPED,
        reason=(
            f"node(s) {failed} failed their preflight; {remaining} node(s) remain, fewer than "
            f"the nnodes minimum {nnodes.min} (nnodes={nnodes}). Replace or leave out the "
            "node(s) named above, or lower MIN in nnodes"
        ),
    )
