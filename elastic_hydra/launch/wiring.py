"""The local agent: wires the executor to real processes, signals, files and the console."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from elastic_hydra import stopsignals
from elastic_hydra.agent.events import Event, EventKind
from elastic_hydra.agent.executor import Executor
from elastic_hydra.agent.outcome import RunOutcome, Status, WorkerExit, WorkerFailure
from elastic_hydra.agent.seams import JobFailures, NodeAssignment, Rendezvous
from elastic_hydra.agent.worker_env import WorkerFiles, worker_env
from elastic_hydra.errors import EXIT_BUG, ConfigError
from elastic_hydra.hangs.watch import JobShare, LocalHangWatch
from elastic_hydra.plan import Dynamic, LaunchPlan
from elastic_hydra.records import FailureRecord, RunStatus, RunSummary, job_root_cause
from elastic_hydra.redact import redact
from elastic_hydra.rendezvous.local import LocalRendezvous
from elastic_hydra.report import notices
from elastic_hydra.report.failure_files import read_failure
from elastic_hydra.report.summary import failure_record, summarize
from elastic_hydra.rundir import PRIVATE_DIR, RunDir, open_private, write_private
from elastic_hydra.stopsignals import StopFlag, handle_signals
from elastic_hydra.workers.console import ConsoleSink
from elastic_hydra.workers.contain import Containment, become_subreaper
from elastic_hydra.workers.supervise import GroupGuard, LocalWorkers, WorkerSpec

STORE_FD_ENV = (
    "ELASTIC_HYDRA_STORE_FD"  # bootstrap.STORE_FD_ENV (the bootstrap is run, not imported)
)
CONSOLE_GRACE = 5.0  # seconds the final console output may wait for a stalled console
_COLOURS = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94, 91)


@functools.cache
def _host() -> str:
    """This machine's name (read once, at the first launch, not at import)."""
    return socket.gethostname()


class RealClock:
    def __init__(self, flag: StopFlag) -> None:
        self.flag = flag

    def mono(self) -> float:
        return time.monotonic()

    def random(self) -> float:
        return random.random()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.flag.signum is None and (left := deadline - time.monotonic()) > 0:
            select.select([self.flag.read_fd], [], [], left)
            self.flag.drain()


class EventLog:
    """Appends each event to events.jsonl as it happens (flushed: nothing lost if killed).

    `echo` also shows restarts on the console and, with `multi_node`, the membership story
    (joining, nodes joining or leaving).
    """

    def __init__(self, path: Path, echo: bool = False, multi_node: bool = False) -> None:
        self.file: IO[str] | None = os.fdopen(open_private(path), "a", buffering=1)
        self.name = path.name
        self.events: list[Event] = []
        self.echo = echo
        self.multi_node = multi_node

    def emit(self, kind: EventKind, **data: Any) -> None:
        event = Event(kind=kind, wall_time=time.time(), mono_time=time.monotonic(), data=data)
        self.events.append(event)
        if self.file is not None:
            try:
                self.file.write(event.to_json() + "\n")
            except OSError as exc:  # a full disk: the job goes on, the timeline stops here
                notices.warn(f"cannot write {self.name} ({exc.strerror}); no more events saved")
                self._close_file()
        if self.echo:
            notices.progress(event, multi_node=self.multi_node)

    def _close_file(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None

    def close(self) -> None:
        self._close_file()


class LocalWorkerFactory:
    """Builds each attempt's worker specs and starts them."""

    def __init__(
        self, plan: LaunchPlan, run: RunDir, flag: StopFlag, guard: GroupGuard, contain: Containment
    ) -> None:
        self.guard = guard
        self.contain = contain
        self.plan = plan
        self.run = run
        self.flag = flag
        self.base_env = dict(os.environ)
        self.cwd = os.getcwd()
        self.sink = None if plan.logs.quiet or not plan.logs.tee else ConsoleSink()
        self.colour = notices.colour(sys.stdout)  # rank prefixes: NO_COLOR turns them off
        self.argv = plan.argv
        self.store_fd: int | None = None  # standalone: rank 0's store listens on it

    def __call__(self, node: NodeAssignment, attempt: int, restart_count: int) -> LocalWorkers:
        specs = [
            self._spec(node, attempt, restart_count, lr) for lr in range(self.plan.nproc_per_node)
        ]
        return LocalWorkers(
            specs,
            self.sink,
            self.flag.read_fd,
            self.guard,
            self.contain,
            hurry=lambda: self.flag.count > 1,  # a second Ctrl-C kills at once
        )

    def _spec(
        self, node: NodeAssignment, attempt: int, restart_count: int, local_rank: int
    ) -> WorkerSpec:
        files = WorkerFiles(
            run_dir=str(self.run.root),
            plan_path=str(self.run.plan),
            config_path=str(self.run.config),
            error_file=str(self.run.error_file(attempt, local_rank)),
            fault_file=str(self.run.fault_file(attempt, local_rank)),
            stacks_file=str(self.run.stacks_file(attempt, local_rank)),
            progress_file=str(self.run.progress_file(attempt, local_rank)),
        )
        rank = node.base_rank + local_rank
        ranks = self.plan.logs.console_ranks
        return WorkerSpec(
            local_rank=local_rank,
            rank=rank,
            argv=self.argv,
            env=self._env(node, local_rank, files, attempt=attempt, restart_count=restart_count),
            cwd=self.cwd,
            stdout=self.run.stdout(attempt, local_rank),
            stderr=self.run.stderr(attempt, local_rank),
            tee=self.sink is not None and (ranks is None or local_rank in ranks),
            prefix=self._prefix(node, local_rank),
            cpus=self.plan.devices[local_rank].cpus if self.plan.devices else None,
            pass_fds=(self.store_fd,) if rank == 0 and self.store_fd is not None else (),
        )

    def _env(
        self,
        node: NodeAssignment,
        local_rank: int,
        files: WorkerFiles,
        *,
        attempt: int,
        restart_count: int,
    ) -> dict[str, str]:
        env = worker_env(
            self.plan,
            self.base_env,
            node,
            local_rank=local_rank,
            attempt=attempt,
            restart_count=restart_count,
            files=files,
        )
        if node.base_rank + local_rank == 0 and self.store_fd is not None:
            env[STORE_FD_ENV] = str(self.store_fd)  # the bootstrap takes it out again
        return env

    def _prefix(self, node: NodeAssignment, local_rank: int) -> bytes:
        text = self.plan.logs.prefix.format(
            role=self.plan.role,
            rank=node.base_rank + local_rank,
            local_rank=local_rank,
            host=_host().split(".")[0],
            node_rank=node.group_rank,
        )
        rank = node.base_rank + local_rank
        if self.colour:
            text = f"\x1b[{_COLOURS[rank % len(_COLOURS)]}m{text}\x1b[0m"
        return text.encode()


def make_rendezvous(plan: LaunchPlan, flag: StopFlag, run: RunDir) -> Rendezvous:
    if not isinstance(plan.rdzv, Dynamic):
        return LocalRendezvous(plan)
    from elastic_hydra.rendezvous.torch_backend import TorchRendezvous

    def describe(exit: WorkerExit, node: NodeAssignment) -> dict[str, Any]:
        detail = read_failure(run, exit, plan.logs.tail_lines)
        record = failure_record(WorkerFailure(exit=exit, detail=detail, host=_host()))
        return {**record.to_json(), "node_rank": node.group_rank}

    if plan.logs.quiet:
        return TorchRendezvous(plan, flag, describe)
    return TorchRendezvous(
        plan, flag, describe, notices.say, notices.status if notices.live() else None
    )


def _job_share(rdzv: Rendezvous) -> JobShare | None:
    """The store other nodes share hangs through (a torch rendezvous's); None on one node."""
    from elastic_hydra.rendezvous.torch_backend import TorchRendezvous

    return rdzv if isinstance(rdzv, TorchRendezvous) else None


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


def save_summary(run: RunDir, summary: RunSummary) -> None:
    """summary.json, or the same JSON on stderr when it cannot be written (the run dir was
    removed, the disk is full): the job's outcome and exit code stay what they are."""
    text = json.dumps(redact(summary.to_json()), indent=2, default=str) + "\n"
    try:
        write_private(run.summary, text)
    except OSError as exc:
        notices.warn(f"cannot write {run.summary} ({exc.strerror}); the summary follows")
        with contextlib.suppress(OSError):
            sys.stderr.write(text)
            sys.stderr.flush()


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


def _failure_text(run: RunDir, exit: WorkerExit, tail_lines: int) -> str:
    """A failed worker's error (else its last lines of stderr: a C++ abort leaves no error
    file), to tell a lost peer from a fault of its own."""
    detail = read_failure(run, exit, tail_lines)
    return detail.message or "\n".join(detail.stderr_tail[-3:])


def _job_failures(ended: JobFailures) -> list[FailureRecord]:
    """The other nodes' records, typed; a record that does not read as one is ignored, and so
    said, like one that failed the store's checks."""
    records, ignored = [], ended.ignored
    for raw in ended.records:
        try:
            records.append(FailureRecord.from_json(raw))
        except ValueError:
            ignored += 1
    if ignored:
        notices.warn(
            f"{ignored} failure record(s) in the rendezvous store were ignored "
            "(malformed, unsigned or from no node of this job)"
        )
    return records


def _summary(
    plan: LaunchPlan,
    *,
    outcome: RunOutcome,
    run_dir: RunDir,
    job_failures: list[FailureRecord],
    started_at: float,
    started: float,
) -> RunSummary:
    failures = [
        WorkerFailure(exit=e, detail=read_failure(run_dir, e, plan.logs.tail_lines), host=_host())
        for e in outcome.exits
        if e.returncode != 0
    ]
    return summarize(
        plan,
        outcome,
        failures,
        host=_host(),
        started=started_at,
        duration=time.monotonic() - started,
        job_failures=job_failures,
    )


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


def run(plan: LaunchPlan) -> tuple[int, RunSummary]:
    """Run the plan to its end on this node; returns the exit code and the summary written."""
    run_dir = RunDir(Path(plan.run_dir))
    run_dir.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    started, started_at = time.monotonic(), time.time()
    flag = StopFlag(stopsignals.pending_signal())
    events = EventLog(
        run_dir.events, echo=not plan.logs.quiet, multi_node=isinstance(plan.rdzv, Dynamic)
    )
    rdzv: Rendezvous | None = None
    outcome: RunOutcome | None = None
    job_failures: list[FailureRecord] = []
    become_subreaper()
    contain = Containment(str(run_dir.root))
    guard = GroupGuard(contain)
    factory = LocalWorkerFactory(plan, run_dir, flag, guard, contain)
    try:
        with handle_signals(flag):
            rdzv = make_rendezvous(plan, flag, run_dir)
            if isinstance(rdzv, LocalRendezvous):
                factory.store_fd = rdzv.store_fd
            outcome = Executor(
                plan,
                rendezvous=rdzv,
                workers=factory,
                clock=RealClock(flag),
                observer=events,
                stop=flag,
                hang=LocalHangWatch(plan, run_dir, _host(), job=_job_share(rdzv)),
                failure_text=lambda e: _failure_text(run_dir, e, plan.logs.tail_lines),
            ).run()
            ended = rdzv.end(outcome.status, events)
            job_failures = _job_failures(ended)
            outcome = _failed_elsewhere(outcome, job_failures, ended.last_round)
    except ConfigError as exc:  # found only now, e.g. torch missing for a torch rendezvous
        error = RunSummary(
            status=RunStatus.CONFIG_ERROR, exit_code=exc.exit_code, message=exc.line()
        )
        save_summary(run_dir, error)
        raise
    except BaseException as exc:  # a bug in the launcher: still leave a summary behind
        error = RunSummary(
            status=RunStatus.ERROR, exit_code=EXIT_BUG, message=f"{type(exc).__name__}: {exc}"
        )
        save_summary(run_dir, error)
        raise
    finally:
        contain.kill_all()  # what left the workers' groups: daemons, setsid children
        contain.close()
        guard.close()
        if rdzv is not None:
            rdzv.close()
        events.close()
        flag.close()
    summary = _summary(
        plan,
        outcome=outcome,
        run_dir=run_dir,
        job_failures=job_failures,
        started_at=started_at,
        started=started,
    )
    save_summary(run_dir, summary)
    _report(plan, outcome, summary, factory.sink)
    return outcome.exit_code, summary
