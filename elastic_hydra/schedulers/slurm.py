"""Slurm's hostlist syntax and the job facts Slurm puts in the environment.

Pure: no I/O and no process state; the caller passes the environment as a mapping.
`expand_nodelist` gives the host names `scontrol show hostnames` prints, in the same order;
`slurm_job` reads where this process runs (a step of a job, or a job's batch script).
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

# A guard against a typo such as n[0-99999999] filling memory; Slurm's own limit is similar.
MAX_HOSTS = 65536

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_DIGITS = re.compile(r"[0-9]+")


def expand_nodelist(text: str) -> list[str]:
    """The host names of a Slurm node list such as `gpu[01-03,07],login1`, in order.

    Raises:
        ValueError: The list is malformed; the message names the offending part.
    """
    hosts: list[str] = []
    for item in _split_items(text):
        hosts.extend(_expand_item(item.strip(), text))
    return hosts


def _split_items(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    items: list[str] = []
    depth = start = 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _expand_item(item: str, text: str) -> list[str]:
    """The names of one item: the cartesian product of its bracket groups, rightmost fastest."""
    if not item:
        raise ValueError(f"empty host name in node list {text!r}")
    if any(ch.isspace() for ch in item):
        raise ValueError(f"whitespace inside host name {item!r}")
    pieces = _GROUP.split(item)  # literal, group body, literal, ..., literal
    if any("[" in p or "]" in p for p in pieces[0::2]):
        raise ValueError(f"unbalanced or nested brackets in {item!r}")
    choices = [[p] if k % 2 == 0 else _expand_group(p, item) for k, p in enumerate(pieces)]
    if math.prod(len(c) for c in choices) > MAX_HOSTS:
        raise ValueError(f"{item!r} names more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_group(body: str, item: str) -> list[str]:
    """The numbers of one bracket group such as `01-03,07`, keeping the zero padding."""
    if not body:
        raise ValueError(f"empty brackets in {item!r}")
    numbers: list[str] = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if not _DIGITS.fullmatch(lo) or (dash and not _DIGITS.fullmatch(hi)):
            raise ValueError(f"bad range {part!r} in {item!r}: expected N or N-M in digits")
        if not dash:
            numbers.append(lo)
            continue
        first, last = int(lo), int(hi)
        if last < first:
            raise ValueError(f"reversed range {part!r} in {item!r}")
        if last - first + len(numbers) >= MAX_HOSTS:
            raise ValueError(f"{item!r} names more than {MAX_HOSTS} hosts")
        numbers.extend(f"{n:0{len(lo)}d}" for n in range(first, last + 1))
    return numbers


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmJob:
    """Where this process runs in Slurm: inside a job step (srun), the step's nodes and tasks;
    in the batch script or an salloc shell (no step), the whole allocation."""

    job_id: str
    step_id: int | None  # None: not inside a step
    nodes: tuple[str, ...]  # the step's nodes (else the allocation's), in Slurm's order
    nnodes: int
    node_id: int  # this node's index in `nodes` (SLURM_NODEID)
    tasks: int | None  # the step's task count; None outside a step

    @property
    def run_id(self) -> str:
        """Slurm's own name: JOBID for the allocation, JOBID.STEPID for a step."""
        return self.job_id if self.step_id is None else f"{self.job_id}.{self.step_id}"


# Ports of the c10d store the first node of a step hosts: concurrent jobs and steps that share a
# first node must not meet in one store.
PORT_BASE, PORT_SPAN, STEPS_PER_JOB = 20000, 10000, 64


def rdzv_port(job_id: str, step_id: int | None) -> int:
    """A port in [20000, 30000) from the job and step ids: distinct for jobs whose ids are less
    than 156 apart and, within a job, for the batch script and the first 63 steps."""
    number = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    offset = 0 if step_id is None else 1 + step_id % (STEPS_PER_JOB - 1)
    return PORT_BASE + (number * STEPS_PER_JOB + offset) % PORT_SPAN


def slurm_job(environ: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job described by `environ`, or None outside a Slurm job.

    Raises:
        ValueError: A Slurm variable is missing or malformed; the message names it and its value.
    """
    found = _lookup(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    if found is None:
        return None
    id_name, job_id = found
    if not job_id.strip():
        raise ValueError(f"{id_name}={job_id!r} is empty")
    context = f"{id_name}={job_id!r}"
    step = _lookup(environ, "SLURM_STEP_ID", "SLURM_STEPID")
    # The batch script is a step to Slurm too (SLURM_STEP_ID may be set there), but it runs on
    # one node only and has no SLURM_STEP_NODELIST.
    in_step = step is not None and "SLURM_STEP_NODELIST" in environ
    if in_step:
        assert step is not None
        list_name, nodelist = _require(environ, context, "SLURM_STEP_NODELIST")
        count_name, count = _require(environ, context, "SLURM_STEP_NUM_NODES")
        tasks_name, tasks = _require(environ, context, "SLURM_STEP_NUM_TASKS")
        step_id: int | None = _parse_int(*step)
        ntasks: int | None = _parse_int(tasks_name, tasks)
    else:
        list_name, nodelist = _require(environ, context, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        count_name, count = _require(environ, context, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        step_id = ntasks = None
    node_name, node = _require(environ, context, "SLURM_NODEID")

    nnodes = _parse_int(count_name, count)
    if nnodes < 1:
        raise ValueError(f"{count_name}={count!r} must be a positive integer")
    node_id = _parse_int(node_name, node)
    if node_id >= nnodes:
        raise ValueError(f"{node_name}={node!r} is not below {count_name}={count!r}")
    try:
        nodes = tuple(expand_nodelist(nodelist))
    except ValueError as exc:
        raise ValueError(f"{list_name}={nodelist!r} is malformed: {exc}") from exc
    if len(nodes) != nnodes:
        raise ValueError(
            f"{list_name}={nodelist!r} names {len(nodes)} nodes but {count_name}={count!r}"
        )
    return SlurmJob(
        job_id=job_id.strip(),
        step_id=step_id,
        nodes=nodes,
        nnodes=nnodes,
        node_id=node_id,
        tasks=ntasks,
    )


def _lookup(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of `names` set in `environ`, with its value."""
    for name in names:
        if name in environ:
            return name, environ[name]
    return None


def _require(environ: Mapping[str, str], context: str, *names: str) -> tuple[str, str]:
    """Like `_lookup`, but a missing variable is an error."""
    found = _lookup(environ, *names)
    if found is None:
        raise ValueError(f"{' or '.join(names)} is not set although {context} is")
    return found


def _parse_int(name: str, value: str) -> int:
    """`value` as a non-negative decimal integer."""
    if not _DIGITS.fullmatch(value.strip()):
        raise ValueError(f"{name}={value!r} is not a non-negative integer")
    return int(value)


def step_dir_name(environ: Mapping[str, str]) -> str | None:
    """The run directory name every node of a Slurm step agrees on, `slurm-JOBID.STEPID`, or None
    outside a step (or where the variables are malformed: resolution reports that). Two launchers
    of one step on one node are told apart by their task id."""
    try:
        job = slurm_job(environ)
    except ValueError:
        return None
    if job is None or job.step_id is None:
        return None
    name = f"slurm-{job.run_id}"
    if job.tasks is not None and job.tasks > job.nnodes:
        name += f"-task{environ.get('SLURM_PROCID', '0')}"
    return name if re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name) else None
