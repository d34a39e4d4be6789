"""What a scheduler's environment says about this node, and how a wrong variable is named.

Pure: every reader takes the environment as a mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_DIGITS = re.compile(r"[0-9]+")
_HOST = re.compile(r"[A-Za-z0-9_.:-]{1,253}")


class SchedulerError(ValueError):
    """A scheduler variable is missing, malformed or contradicts another one.

    Rendered as `<VARIABLE>: <problem>; <fix>` so that the user's one line names it.
    """

    def __init__(self, variable: str, problem: str, fix: str) -> None:
        self.variable = variable
        self.problem = problem
        self.fix = fix
        super().__init__(f"{variable} {problem}; {fix}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerNode:
    """This node as its scheduler placed it: enough for a c10d rendezvous at node 0."""

    scheduler: str  # the preset's name: kubeflow, jobset, skypilot, dstack
    flavour: str  # which form of it, in words (e.g. "Trainer v2")
    node_rank: int
    nnodes: int | None  # None: the scheduler does not say (JobSet: the job file's nnodes)
    nnodes_variable: str = ""  # the variable that says nnodes
    rank_variable: str = ""  # the variable that says node_rank
    master: str  # the host of node 0, which hosts the c10d store
    port: int | None  # None: the scheduler names no port (rdzv.endpoint=:PORT, else 29400)
    run_id: str  # the same on every node of the job
    gpus_per_node: int | None = None
    variables: tuple[tuple[str, str], ...] = ()  # (name, value) of what was read, in order

    def describe(self) -> str:
        """`--plan`'s line: which scheduler, and the variables that said so."""
        said = ", ".join(f"{k}={v!r}" if "\n" in v else f"{k}={v}" for k, v in self.variables)
        return f"{self.scheduler} ({self.flavour}, node {self.node_rank}) from {said}"


def require(environ: Mapping[str, str], name: str, fix: str) -> str:
    """The value of `name`, which must be set and not empty."""
    value = environ.get(name)
    if value is None:
        raise SchedulerError(name, "is not set", fix)
    if not value.strip():
        raise SchedulerError(name, "is empty", fix)
    return value.strip()


def count(environ: Mapping[str, str], name: str, fix: str, *, least: int = 0) -> int:
    """`name` as a decimal integer >= `least` (node ranks from 0, node counts from 1)."""
    value = require(environ, name, fix)
    if not _DIGITS.fullmatch(value) or int(value) < least:
        what = "a positive integer" if least else "a non-negative integer"
        raise SchedulerError(name, f"is not {what} (got {value!r})", fix)
    return int(value)


def port(environ: Mapping[str, str], name: str, fix: str) -> int:
    """`name` as a TCP port."""
    number = count(environ, name, fix, least=1)
    if number > 65535:
        raise SchedulerError(name, f"is not a port in 1..65535 (got {number})", fix)
    return number


def host(environ: Mapping[str, str], name: str, fix: str) -> str:
    """`name` as a host name or address (no spaces, no URL)."""
    value = require(environ, name, fix)
    if not _HOST.fullmatch(value):
        raise SchedulerError(name, f"is not a host name or address (got {value!r})", fix)
    return value


def below(rank_name: str, rank: int, count_name: str, nodes: int, fix: str) -> None:
    """A node rank must name one of the nodes."""
    if rank >= nodes:
        raise SchedulerError(rank_name, f"is {rank}, not below {count_name}={nodes}", fix)


def node_ips(environ: Mapping[str, str], name: str, fix: str) -> tuple[str, ...]:
    """A newline-separated list of node addresses (SkyPilot's and dstack's form), in rank order."""
    value = require(environ, name, fix)
    ips = tuple(line.strip() for line in value.splitlines() if line.strip())
    for ip in ips:
        if not _HOST.fullmatch(ip):
            raise SchedulerError(name, f"names {ip!r}, which is not an address", fix)
    return ips
