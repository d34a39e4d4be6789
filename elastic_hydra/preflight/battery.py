"""The agent's side of the preflight (implements `agent.seams.Preflight`): start the probe group,
check the node meanwhile, swap reports with the round's other nodes, rate them all.

Everything is bounded by `preflight.timeout`: the probe group gets three quarters of it (then it
is stopped and the node fails as "timed out"), the exchange the rest. Every node rates every
node's report with the same pure `verdict.rate`, so every node prints and acts on the same
verdict without a coordinator.

A round whose nodes all passed the last battery, with no restart since (the round after a node
left or failed its preflight), measures nothing: its nodes agree on it first (`_carried`), and
the last verdict is carried over.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elastic_hydra import nvml
from elastic_hydra.agent.seams import NodeAssignment, NodeExchange, WorkerGroup
from elastic_hydra.plan import PreflightMode, PreflightSpec
from elastic_hydra.preflight import node_checks
from elastic_hydra.preflight.results import (
    MAX_REPORT,
    GpuThrottle,
    NodeProblem,
    NodeReport,
    WorkerResult,
    clip,
    read_report,
)
from elastic_hydra.preflight.verdict import Rating, rate
from elastic_hydra.records.preflight import PreflightVerdict

PROBE_SHARE = 0.75  # of preflight.timeout for the probe group; the rest for the exchange
STOP_GRACE = 2.0  # seconds a probe that ran out of time gets between SIGTERM and SIGKILL
MAX_RESULT = 16 << 10  # bytes of one probe worker's result file
CARRY_VOTE, CARRY = "preflight-carry-vote", "preflight-carry"  # the round's gather topics


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSetup:
    """What the battery checks on this node besides the probe."""

    host: str
    run_id: str
    nproc: int
    paths: tuple[tuple[str, str], ...]  # (where it comes from, directory)
    endpoint: tuple[str, int] | None  # the rendezvous endpoint to reach (None: one node)
    gpus: Callable[[], Sequence[int]] = tuple  # this node's GPU indices (NVML's)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """A battery this node ran: its verdict, the nodes that passed it (`NodeAssignment.members`'
    names), and the node's restart count then."""

    verdict: PreflightVerdict
    passed: frozenset[str]
    restarts: int


class ProbeStarter:
    """How the battery starts the probe group and finds its files (the worker factory's)."""

    def __init__(
        self,
        start: Callable[[NodeAssignment, tuple[int, int, int], str], WorkerGroup],
        result: Callable[[int, int], Path],
        stderr: Callable[[int, int], Path],
    ) -> None:
        self.start = start  # (node, (round, attempt, restart count), settings) -> the group
        self.result = result  # (round, local rank) -> its result file
        self.stderr = stderr


class Battery:
    def __init__(
        self,
        spec: PreflightSpec,
        setup: NodeSetup,
        probes: ProbeStarter,
        exchange: NodeExchange,
        *,
        say: Callable[[str], None],
        stopped: Callable[[], bool],
    ) -> None:
        self.spec = spec
        self.setup = setup
        self.probes = probes
        self.exchange = exchange
        self.say = say
        self.stopped = stopped
        self._last: Measured | None = None  # the last battery this node ran

    def check(self, node: NodeAssignment, attempt: int, restart_count: int) -> PreflightVerdict:
        """seams.Preflight: this node's share of the round's battery, and the verdict (the last
        battery's, carried over, when the round's nodes agree it measured them all)."""
        began = time.monotonic()
        verdict = self._carried(node, restart_count, began) or self._battery(
            node, attempt, restart_count, began
        )
        for line in verdict.lines():
            self.say(line)
        return verdict

    def _carried(
        self, node: NodeAssignment, restart_count: int, began: float
    ) -> PreflightVerdict | None:
        """The last battery's verdict for this round, when every node of it passed that battery
        and no node restarted its workers since: a round that only lost nodes (one left, or
        failed a preflight) trains without measuring the others again. None: run the battery.

        Every node votes on what it knows (each knows the batteries it ran), then the first node
        to count the votes decides for all (`first`): a vote that came too late to count makes
        every node run the battery, never some of them."""
        if not node.members:
            return None
        last = self._last
        mine = (
            last is not None and last.restarts == restart_count and set(node.members) <= last.passed
        )
        wait = self.spec.timeout * (1 - PROBE_SHARE)
        votes = self.exchange.gather(CARRY_VOTE, b"1" if mine else b"0", limit=1, timeout=wait)
        agreed = b"1" if all(v == b"1" for v in votes) else b"0"
        if self.exchange.first(CARRY, agreed, limit=1, timeout=wait) != b"1" or last is None:
            return None
        return dataclasses.replace(
            last.verdict,
            round=self.exchange.round,
            nodes=node.group_world_size,
            findings=(),
            bad_nodes=(),
            bad_hosts=(),
            bad_gpus=(),
            quarantined=(),
            quarantined_until=None,
            seconds=round(time.monotonic() - began, 3),
            carried_from=last.verdict.round,
        )

    def _battery(
        self, node: NodeAssignment, attempt: int, restart_count: int, began: float
    ) -> PreflightVerdict:
        spec, rnd = self.spec, self.exchange.round
        probe_deadline = began + spec.timeout * PROBE_SHARE
        group = self.probes.start(node, (rnd, attempt, restart_count), self._settings(rnd))
        problems, throttled = self._node_checks()
        error = self._wait(group, probe_deadline)
        report = NodeReport(
            node=node.group_rank,
            host=self.setup.host,
            workers=tuple(self._results(rnd)) if not error else (),
            problems=tuple(problems),
            throttled=tuple(throttled),
            error=error,
        )
        left = max(0.0, began + spec.timeout - time.monotonic())
        raws = self.exchange.gather("preflight", report.encode(), limit=MAX_REPORT, timeout=left)
        nodes, nproc = node.group_world_size, self.setup.nproc
        reports = [read_report(raw, i, nproc, nodes) for i, raw in enumerate(raws)]
        verdict = rate(reports, Rating(mode=spec.mode, min_ratio=spec.min_ratio, round=rnd))
        verdict = dataclasses.replace(verdict, seconds=round(time.monotonic() - began, 3))
        if len(node.members) == verdict.nodes:
            passed = {m for n, m in enumerate(node.members) if n not in verdict.bad_nodes}
            self._last = Measured(verdict=verdict, passed=frozenset(passed), restarts=restart_count)
        return verdict

    def _settings(self, rnd: int) -> str:
        spec = self.spec
        return json.dumps(
            {
                "key": f"{self.setup.run_id}/{rnd}",
                "gemm_size": spec.gemm_size,
                "gemm_seconds": spec.gemm_seconds,
                "allreduce_bytes": spec.allreduce_bytes,
                "allreduce_reps": spec.allreduce_reps,
                "timeout": max(1.0, spec.timeout * PROBE_SHARE),
                "pairs": spec.mode is PreflightMode.FULL,
            }
        )

    def _node_checks(self) -> tuple[list[NodeProblem], list[GpuThrottle]]:
        problems = node_checks.check_paths(self.setup.paths, self.spec.min_free_bytes)
        if self.setup.endpoint is not None:
            problems += node_checks.check_endpoint(*self.setup.endpoint)
        throttled: list[GpuThrottle] = []
        gpus = list(self.setup.gpus())
        if gpus and (pynvml := nvml.load()) is not None:
            sick, throttled = node_checks.check_gpus(pynvml, gpus)
            problems += sick
        return problems, throttled

    def _wait(self, group: WorkerGroup, deadline: float) -> str:
        """Wait for the probe group; why it failed as a whole ("" when every probe ended)."""
        try:
            while group.running() and not self.stopped():
                left = deadline - time.monotonic()
                if left <= 0:
                    group.stop(signal.SIGTERM, STOP_GRACE)
                    return f"probe timed out after {self.spec.timeout * PROBE_SHARE:.0f} s"
                group.wait(left)
            if group.running():
                group.stop(signal.SIGTERM, STOP_GRACE)
                return "stopped by a signal"
            return ""
        finally:
            group.close()

    def _results(self, rnd: int) -> list[WorkerResult]:
        return [self._result(rnd, lr) for lr in range(self.setup.nproc)]

    def _result(self, rnd: int, local_rank: int) -> WorkerResult:
        path = self.probes.result(rnd, local_rank)
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_RESULT + 1)
            if len(raw) > MAX_RESULT:
                raise ValueError(f"{len(raw)} bytes or more")
            result = WorkerResult.from_json(json.loads(raw))
            if result.local_rank != local_rank:
                raise ValueError(f"written for local rank {result.local_rank}")
            return result
        except (OSError, ValueError) as exc:
            why = f"wrote no result ({clip(str(exc))}); {self._last_error(rnd, local_rank)}"
            return WorkerResult(local_rank=local_rank, rank=-1, device="?", error=why)

    def _last_error(self, rnd: int, local_rank: int) -> str:
        path = self.probes.stderr(rnd, local_rank)
        try:
            with path.open("rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4096))
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return f"see {path}"
        return f"{clip(lines[-1])} (see {path})" if lines else f"see {path}"
