"""The local agent: wires the executor to real processes, signals, files and the console."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import select
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from elastic_hydra import stopsignals
from elastic_hydra.agent.executor import Executor
from elastic_hydra.agent.outcome import RunOutcome, Status
from elastic_hydra.agent.seams import JobFailures, NodeExchange, Preflight, Rendezvous
from elastic_hydra.errors import EXIT_BUG, ConfigError
from elastic_hydra.failures import kernel
from elastic_hydra.failures.classify import Classifier
from elastic_hydra.hangs.watch import LocalHangWatch
from elastic_hydra.launch import observing
from elastic_hydra.launch.worker_factory import LocalWorkerFactory
from elastic_hydra.launch.worker_factory import host_name as _host
from elastic_hydra.plan import Dynamic, LaunchPlan, PreflightMode
from elastic_hydra.records.failures import FailureRecord, WorkerExit, job_root_cause
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.rendezvous.local import LocalRendezvous
from elastic_hydra.report import notices
from elastic_hydra.report.events_file import EventLog, disk_full
from elastic_hydra.report.failure_files import read_failure
from elastic_hydra.report.summary import (
    RESULT_ROOM,
    SUMMARY_ROOM,
    node_ledger,
    save_summary,
    summarize,
)
from elastic_hydra.rundir import PRIVATE_DIR, RunDir
from elastic_hydra.stopsignals import StopFlag, handle_signals
from elastic_hydra.stragglers.watch import LocalStragglerWatch
from elastic_hydra.workers.console import ConsoleSink
from elastic_hydra.workers.contain import Containment, become_subreaper
from elastic_hydra.workers.guard import GroupGuard

if TYPE_CHECKING:
    from elastic_hydra.checkpoint.buddy import Ring
    from elastic_hydra.checkpoint.keeper import Keeper
    from elastic_hydra.checkpoint.layout import Area
    from elastic_hydra.quarantine.gate import LedgerGate

CONSOLE_GRACE = 5.0  # seconds the final console output may wait for a stalled console


class RealClock:
    def __init__(self, flag: StopFlag) -> None:
        self.flag = flag

    def wall(self) -> float:
        return time.time()

    def mono(self) -> float:
        return time.monotonic()

    def random(self) -> float:
        return random.random()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.flag.signum is None and (left := deadline - time.monotonic()) > 0:
            select.select([self.flag.read_fd], [], [], left)
            self.flag.drain()


class NodesRendezvous(Rendezvous, NodeExchange, Protocol):
    """The rendezvous, and where the round's nodes swap the preflight's reports."""


def make_rendezvous(plan: LaunchPlan, flag: StopFlag) -> NodesRendezvous:
    if not isinstance(plan.rdzv, Dynamic):
        return LocalRendezvous(plan)
    from elastic_hydra.rendezvous.torch_backend import TorchRendezvous

    if plan.logs.quiet:
        return TorchRendezvous(plan, flag)
    return TorchRendezvous(plan, flag, notices.say, notices.status if notices.live() else None)


# How far back the kernel log is read for a failure: an OOM kill comes just before its exit, a GPU
# Xid may come minutes before the CUDA call that fails on it.
KERNEL_LOOKBACK = 600.0


def _read_failure(
    run: RunDir, tail_lines: int, classify: Classifier, exit: WorkerExit
) -> FailureRecord:
    """A failed worker's record, read from its files and classed with what the kernel log tells
    (the executor keeps it: read once)."""
    record = read_failure(run, exit, host=_host(), tail_lines=tail_lines)
    if record.terminated_by_launcher:
        return record
    return classify(record, kernel.since(exit.mono_time - KERNEL_LOOKBACK))


@contextmanager
def console_deadline(code: int, seconds: float) -> Iterator[None]:
    """Exit with `code` if the block still runs `seconds` from now: its console output is
    blocked on a terminal that stopped reading, and everything else is on disk already."""
    timer = threading.Timer(seconds, os._exit, (code,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _failed_elsewhere(
    outcome: RunOutcome, job_failures: Sequence[FailureRecord], last_round: int | None
) -> RunOutcome:
    """A node whose workers succeeded, in a round where another node's failed, ran a job that
    failed: it says so (exit 1), so that every node, and whoever reads node 0's result (a sweep
    on Slurm), tells the job's outcome rather than its own share of it."""
    if outcome.status is not Status.SUCCEEDED or last_round is None:
        return outcome
    cause = job_root_cause([r for r in job_failures if r.rdzv_round == last_round])
    if cause is None:
        return outcome
    where = cause.node or cause.host
    return dataclasses.replace(
        outcome,
        status=Status.FAILED,
        reason=f"this node's workers succeeded, but rank {cause.rank} on {where} failed",
    )


def _job_failures(ended: JobFailures) -> list[FailureRecord]:
    """Every node's records; those that failed the store's checks are said to be ignored."""
    if ended.ignored:
        notices.warn(
            f"{ended.ignored} failure record(s) in the rendezvous store were ignored "
            "(malformed, unsigned or from no node of this job)"
        )
    return list(ended.records)


def _report(
    plan: LaunchPlan, outcome: RunOutcome, summary: RunSummary, sink: ConsoleSink | None
) -> None:
    """The console's last words. Everything is on disk already: a console that stopped reading
    may delay the end, not hold it."""
    with console_deadline(outcome.exit_code, CONSOLE_GRACE):
        if sink is not None:
            sink.close(timeout=CONSOLE_GRACE)
        if outcome.status is not Status.SUCCEEDED:
            from elastic_hydra.report import render  # rich, only for a report that needs it

            render.print_failure(summary)
        elif not plan.logs.quiet:
            notices.succeeded(summary)
        if outcome.status is Status.SUCCEEDED and summary.message != outcome.reason:
            notices.warn(summary.message)  # what went wrong on the way: a full disk


def _execute(
    plan: LaunchPlan,
    *,
    run_dir: RunDir,
    rdzv: NodesRendezvous,
    factory: LocalWorkerFactory,
    flag: StopFlag,
    events: EventLog,
) -> tuple[RunOutcome, observing.Observers]:
    """The agent loop on this node's seams, to the outcome of this node's workers; the observer
    that saw it (the timeline and the status publisher, which the caller closes)."""
    hang = LocalHangWatch(plan, run_dir, _host(), job=rdzv.job_share())
    straggler = LocalStragglerWatch(plan, run_dir, job=rdzv.job_share())
    observer = observing.start(plan, run_dir, _host(), hang, events, stragglers=straggler)
    try:
        outcome = Executor(
            plan,
            rendezvous=rdzv,
            workers=factory,
            clock=RealClock(flag),
            observer=observer,
            stop=flag,
            hang=hang,
            straggler=straggler,
            read_failure=functools.partial(
                _read_failure, run_dir, plan.logs.tail_lines, Classifier()
            ),
            admission=quarantine_gate(plan, os.environ),
            preflight=_battery(plan, run_dir, rdzv, factory, flag),
            saver=factory.keeper,
        ).run()
    except BaseException:
        observer.close()
        raise
    return outcome, observer


def _battery(
    plan: LaunchPlan,
    run_dir: RunDir,
    rdzv: NodesRendezvous,
    factory: LocalWorkerFactory,
    flag: StopFlag,
) -> Preflight | None:
    """The preflight battery, or None when it is off (`preflight=off`, the default): its
    modules, and the ledger's, load only for a job that runs it."""
    if plan.preflight.mode is PreflightMode.OFF:
        return None
    from elastic_hydra.launch.preflight import make_battery

    return make_battery(plan, run_dir, rdzv, factory, flag)


def quarantine_gate(plan: LaunchPlan, environ: Mapping[str, str]) -> LedgerGate | None:
    """The check of the quarantine ledger before each round, or None (no ledger). This node is
    known by its Slurm node name and its host name; its workers' GPUs by their indices, or, where
    the launcher leaves the devices to the workers, by torchrun's convention (local rank i uses
    GPU i): a worker must not run on a quarantined GPU because nobody said which one it takes."""
    if plan.quarantine is None:
        return None
    from elastic_hydra.quarantine.gate import LedgerGate

    used = {g.index for worker in plan.devices for g in (worker.gpus or ())}
    if not plan.devices:
        used = set(range(plan.nproc_per_node))
    return LedgerGate(
        Path(plan.quarantine.ledger),
        names=(environ.get("SLURMD_NODENAME", ""), _host()),
        gpus=frozenset(used),
        slurm=bool(environ.get("SLURM_JOB_ID")),
        warn=notices.warn,
        cooldown=plan.quarantine.cooldown,
        job=plan.torch_run_id,
    )


def _keeper(plan: LaunchPlan, flag: StopFlag) -> Keeper | None:
    """The node's snapshot area and the job's checkpoint home (`checkpoint.*`), or None: no
    plan for them, or no memory file system to keep them in (said in one line)."""
    if plan.checkpoint is None:
        return None
    from elastic_hydra.checkpoint.keeper import Keeper, open_area

    try:
        area = open_area(Path(plan.checkpoint.memory))
    except OSError as exc:
        notices.warn(
            f"checkpoint.memory={plan.checkpoint.memory}: {exc.strerror or exc}; the workers'"
            " snapshots are not kept (ckpt.snapshot does nothing)"
        )
        return None
    return Keeper(
        plan.checkpoint,
        area,
        say=_say_checkpoint,
        hurry=lambda: flag.count > 1,  # a second Ctrl-C stops at once
        ring=_ring(plan, area, _say_checkpoint),
    )


def _say_checkpoint(line: str) -> None:
    notices.say(f"elastic-hydra: {line}")


def _ring(plan: LaunchPlan, area: Area, say: Callable[[str], None]) -> Ring | None:
    """The node's place in the buddy ring (`checkpoint.buddy` on several nodes that share a
    store), listening on the job's address; None where there is none (said when it cannot
    listen)."""
    spec = plan.checkpoint
    if spec is None or not spec.buddy or plan.nnodes.max < 2 or not isinstance(plan.rdzv, Dynamic):
        return None
    from elastic_hydra.checkpoint.buddy import Ring
    from elastic_hydra.rendezvous.sealed_records import SECRET_ENV

    host = observing.job_address(plan)
    secret = os.environ.get(SECRET_ENV)
    try:
        return Ring(area, job=spec.job, host=host, secret=secret.encode() if secret else None,
                    limit=spec.max_memory, say=say)  # fmt: skip
    except OSError as exc:
        notices.warn(
            f"checkpoint.buddy: cannot listen on {host} ({exc.strerror or exc}); no copy of "
            "this node's snapshots is kept on another node"
        )
        return None


def _save_error(run_dir: RunDir, exc: BaseException) -> None:
    """The summary of a launch that raised: a ConfigError found only now (e.g. torch missing
    for a torch rendezvous), or a bug in the launcher (exit 70). No result.json follows."""
    if isinstance(exc, ConfigError):
        error = RunSummary(
            status=RunStatus.CONFIG_ERROR, exit_code=exc.exit_code, message=exc.line()
        )
    else:
        error = RunSummary(
            status=RunStatus.ERROR, exit_code=EXIT_BUG, message=f"{type(exc).__name__}: {exc}"
        )
    save_summary(run_dir, error)
    run_dir.release_end()


def run(plan: LaunchPlan) -> tuple[int, RunSummary]:
    """Run the plan to its end on this node; returns the exit code and the summary written."""
    run_dir = RunDir(Path(plan.run_dir))
    run_dir.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    run_dir.reserve_end(SUMMARY_ROOM, RESULT_ROOM)
    started, started_at = time.monotonic(), time.time()
    flag = StopFlag(stopsignals.pending_signal())
    events = EventLog(
        run_dir.events, echo=not plan.logs.quiet, multi_node=isinstance(plan.rdzv, Dynamic)
    )
    rdzv: NodesRendezvous | None = None
    outcome: RunOutcome | None = None
    job_failures: list[FailureRecord] = []
    become_subreaper()
    contain = Containment(str(run_dir.root))
    guard = GroupGuard(contain)
    factory = LocalWorkerFactory(
        plan, run_dir, flag, guard, contain, warm_fallback=events.cold,
        launch_time=plan.launch_time or started_at,
    )  # fmt: skip
    factory.keeper = _keeper(plan, flag)
    try:
        with handle_signals(flag):
            rdzv = make_rendezvous(plan, flag)
            if isinstance(rdzv, LocalRendezvous):
                factory.store_fd = rdzv.store_fd
            factory.exchange = rdzv
            outcome, observer = _execute(
                plan, run_dir=run_dir, rdzv=rdzv, factory=factory, flag=flag, events=events
            )
            factory.persist()  # before the end's barrier: the workers are stopped
            try:
                ended = rdzv.end(outcome.status, observer)
            finally:
                observer.close()  # its last record: done, not stale
            job_failures = _job_failures(ended)
            outcome = _failed_elsewhere(outcome, job_failures, ended.last_round)
    except BaseException as exc:  # a config error found only now, or a bug: leave a summary
        _save_error(run_dir, exc)
        raise
    finally:
        factory.close()
        contain.kill_all(keep=[guard.pid])  # what left the workers' groups: daemons, setsid
        contain.close()
        guard.close()
        if rdzv is not None:
            rdzv.close()
        events.close()
        flag.close()
    ended_at = time.monotonic()
    ledger = node_ledger(plan, events.events, host=_host(), start=started, end=ended_at)
    summary = summarize(
        plan,
        outcome,
        host=_host(),
        started=started_at,
        duration=ended_at - started,
        job_failures=job_failures,
        ledger=ledger,
    )
    summary = save_summary(run_dir, summary, disk_full(events))
    _report(plan, outcome, summary, factory.sink)
    return outcome.exit_code, summary
