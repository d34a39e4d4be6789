"""The preflight battery wired to this node: the probe group from the worker factory, the run dir's
files, the rendezvous's exchange and the console."""

from __future__ import annotations

from elastic_hydra.agent.seams import NodeAssignment, NodeExchange
from elastic_hydra.health import PreflightMode
from elastic_hydra.launch.worker_factory import LocalWorkerFactory, host_name
from elastic_hydra.plan import Dynamic, LaunchPlan
from elastic_hydra.preflight.battery import Battery, NodeSetup, ProbeStarter
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
) -> Battery | None:
    """The battery of `plan.preflight`; None when it is off."""
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
    return Battery(
        spec, setup, probes, exchange, say=notices.say, stopped=lambda: flag.signum is not None
    )
