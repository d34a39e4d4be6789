"""The preflight battery wired to this node: the probe group from the worker factory, the run dir's
files, the rendezvous's exchange and the console; with `quarantine.ledger` set, a node that fails
its preflight puts itself into the ledger (see `quarantine.from_verdict` for why itself)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from elastic_hydra.agent.seams import NodeAssignment, NodeExchange, Preflight
from elastic_hydra.launch.worker_factory import LocalWorkerFactory, host_name
from elastic_hydra.plan import Dynamic, LaunchPlan, PreflightMode, QuarantineSpec
from elastic_hydra.preflight.battery import Battery, NodeSetup, ProbeStarter
from elastic_hydra.quarantine.from_verdict import entries, quarantined_line
from elastic_hydra.quarantine.ledger import Ledger, LedgerError, QuarantineEntry
from elastic_hydra.records.preflight import PreflightVerdict
from elastic_hydra.report import notices
from elastic_hydra.rundir import RunDir
from elastic_hydra.stopsignals import StopFlag
from elastic_hydra.workers.supervise import LocalWorkers


def make_battery(
    plan: LaunchPlan,
    run: RunDir,
    exchange: NodeExchange,
    factory: LocalWorkerFactory,
    flag: StopFlag,
    *,
    environ: Mapping[str, str] = os.environ,
) -> Preflight | None:
    """The battery of `plan.preflight` (feeding `plan.quarantine`'s ledger); None when off."""
    spec = plan.preflight
    if spec.mode is PreflightMode.OFF:
        return None

    def start(node: NodeAssignment, counts: tuple[int, int, int], settings: str) -> LocalWorkers:
        rnd, attempt, restarts = counts
        return factory.probe_group(
            node, round=rnd, attempt=attempt, restart_count=restarts, settings=settings
        )

    rdzv = plan.rdzv
    gpus = sorted({d.own.index for d in plan.devices if d.own is not None})
    setup = NodeSetup(
        host=host_name(),
        run_id=plan.torch_run_id,
        nproc=plan.nproc_per_node,
        paths=(("logs.root", str(run.root)), *(("preflight.paths", p) for p in spec.paths)),
        endpoint=(rdzv.endpoint.host, rdzv.endpoint.port) if isinstance(rdzv, Dynamic) else None,
        gpus=lambda: gpus,
    )
    probes = ProbeStarter(start, run.preflight_result, run.preflight_stderr)
    battery = Battery(
        spec, setup, probes, exchange, say=notices.say, stopped=lambda: flag.signum is not None
    )
    if plan.quarantine is None:
        return battery
    name = environ.get("SLURMD_NODENAME") or setup.host  # the name `--exclude=` takes
    return Quarantining(battery, plan.quarantine, host=name, job=plan.torch_run_id)


class Quarantining:
    """seams.Preflight: the battery, then this node's own entries into the ledger when the
    verdict names it. A ledger that cannot be written costs one warning, never the job."""

    def __init__(
        self,
        battery: Preflight,
        spec: QuarantineSpec,
        *,
        host: str,
        job: str,
        say: Callable[[str], None] = notices.say,
        warn: Callable[[str], None] = notices.warn,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.battery = battery
        self.spec = spec
        self.host = host
        self.job = job
        self.say = say
        self.warn = warn
        self.clock = clock

    def check(self, node: NodeAssignment, attempt: int, restart_count: int) -> PreflightVerdict:
        """The battery's verdict; on the node it names, with what this node put into the ledger
        (`summary.json` says so, not only the console)."""
        verdict = self.battery.check(node, attempt, restart_count)
        added = self.quarantine(verdict, node.group_rank)
        if not added:
            return verdict
        return dataclasses.replace(
            verdict,
            quarantined=tuple(e.target for e in added),
            quarantined_until=max(e.until for e in added),
        )

    def quarantine(self, verdict: PreflightVerdict, node_rank: int) -> list[QuarantineEntry]:
        """This node's entries after `verdict`, written to the ledger; [] when none were."""
        ledger, cooldown = self.spec.ledger, self.spec.cooldown
        try:
            added = entries(
                verdict, node_rank=node_rank, host=self.host, job=self.job,
                now=self.clock(), cooldown=cooldown,
            )  # fmt: skip
            if added:
                Ledger(Path(ledger), warn=self.warn, clock=self.clock).add(added)
        except (LedgerError, ValueError) as exc:
            self.warn(f"this node failed its preflight but was not quarantined: {exc}")
            return []
        if added:
            self.say(quarantined_line(added, ledger=ledger, cooldown=cooldown))
        return added
