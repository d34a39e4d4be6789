"""Each attempt's workers on this node: their specs (argv, environment, files, console prefix,
CPUs) built from the plan and the rendezvous's assignment, then started by `workers.supervise`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from elastic_hydra.agent.seams import NodeAssignment, NodeExchange
from elastic_hydra.agent.worker_env import WorkerFiles, worker_env
from elastic_hydra.gpus import format_cpus  # the cpulist form: 0-3,5
from elastic_hydra.plan import LaunchPlan, PythonModule, PythonScript
from elastic_hydra.report import notices
from elastic_hydra.rundir import RunDir
from elastic_hydra.stopsignals import StopFlag
from elastic_hydra.workers.console import ConsoleSink
from elastic_hydra.workers.contain import Containment
from elastic_hydra.workers.guard import GroupGuard
from elastic_hydra.workers.notes import WorkerNotes
from elastic_hydra.workers.spawn import WorkerSpec
from elastic_hydra.workers.supervise import LocalWorkers

if TYPE_CHECKING:
    from elastic_hydra.checkpoint.keeper import Keeper
    from elastic_hydra.warm.pool import WarmPool

STORE_FD_ENV = (
    "ELASTIC_HYDRA_STORE_FD"  # bootstrap.STORE_FD_ENV (the bootstrap is run, not imported)
)
WARM_READY_WAIT = 300.0  # seconds the first attempt waits for the template's imports
PROBE_MODULE = "elastic_hydra.preflight.probe"  # run in the preflight's workers, never imported
_COLOURS = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94, 91)


@functools.cache
def host_name() -> str:
    """This machine's name (read once, at the first launch, not at import)."""
    return socket.gethostname()


class LocalWorkerFactory:
    """Builds each attempt's worker specs and starts them."""

    def __init__(
        self,
        plan: LaunchPlan,
        run: RunDir,
        flag: StopFlag,
        guard: GroupGuard,
        contain: Containment,
        *,
        launch_time: float | None = None,
        warm_fallback: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.guard = guard
        self.launch_time = launch_time  # every rank and attempt gets this one (a Hydra app's now)
        self.contain = contain
        self.plan = plan
        self.run = run
        self.flag = flag
        self.base_env = dict(os.environ)
        self.cwd = os.getcwd()
        quiet = plan.logs.quiet or not plan.logs.tee
        self.sink = None if quiet else ConsoleSink(merge=plan.logs.merge)
        self.colour = notices.colour(sys.stdout)  # rank prefixes: NO_COLOR turns them off
        self.argv = plan.argv
        # The snapshots of the workers (checkpoint/), and the nodes it agrees with on each
        # attempt's offer: set by the launch (None: none kept).
        self.keeper: Keeper | None = None
        self.exchange: NodeExchange | None = None
        self.store_fd: int | None = None  # standalone: rank 0's store listens on it
        # Started now: the template imports while the rendezvous runs (None: cold starts).
        self.warm: WarmPool | None = None
        if plan.warm.imports:
            from elastic_hydra.warm.pool import start_pool  # not a cost of every cold launch

            self.warm = start_pool(plan, self.base_env, self.cwd, warm_fallback)

    def __call__(self, node: NodeAssignment, attempt: int, restart_count: int) -> LocalWorkers:
        if self.keeper is not None and self.exchange is not None:
            self.keeper.offer(node, self.plan.nproc_per_node, self.exchange)
        specs = [
            self._spec(node, attempt, restart_count, lr) for lr in range(self.plan.nproc_per_node)
        ]
        if self.warm is not None:
            self.warm.wait_ready(WARM_READY_WAIT, self.flag.read_fd)
        return LocalWorkers(
            specs,
            self.sink,
            self.flag.read_fd,
            self.guard,
            self.contain,
            hurry=lambda: self.flag.count > 1,  # a second Ctrl-C kills at once
            spawner=self.warm,
            label=functools.partial(self._merged_prefix, node),
        )

    def persist(self) -> None:
        """Copy the workers' snapshots into the job's checkpoint home (their workers stopped)."""
        if self.keeper is not None:
            self.keeper.persist()

    def close(self) -> None:
        """End the warm template, if any, and give the snapshot area's memory back (every
        worker is stopped by then)."""
        if self.warm is not None:
            self.warm.close()
        if self.keeper is not None:
            self.keeper.close()

    def probe_group(
        self, node: NodeAssignment, *, round: int, attempt: int, restart_count: int, settings: str
    ) -> LocalWorkers:
        """The preflight's workers: the probe in each worker's place, with the environment the
        attempt's workers will get; their files under the run dir's preflight_<round>/."""
        entry = self.plan.entrypoint
        python = entry.python if isinstance(entry, PythonScript | PythonModule) else sys.executable
        specs = []
        for lr in range(self.plan.nproc_per_node):
            spec = self._spec(node, attempt, restart_count, lr)
            result = str(self.run.preflight_result(round, lr))
            specs.append(
                dataclasses.replace(
                    spec,
                    argv=(python, "-u", "-m", PROBE_MODULE, settings, result),
                    stdout=self.run.preflight_stdout(round, lr),
                    stderr=self.run.preflight_stderr(round, lr),
                    tee=False,
                    notes=None,
                )
            )
        return LocalWorkers(specs, None, self.flag.read_fd, self.guard, self.contain)

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
            collectives_file=str(self.run.collectives_file(attempt, local_rank)),
            arrivals_file=str(self.run.arrivals_file(attempt, local_rank)),
            snapshots=str(self.keeper.area.root) if self.keeper is not None else "",
            launch_time=self.launch_time,
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
            notes=WorkerNotes(
                fault=Path(files.fault_file),
                stacks=Path(files.stacks_file),
                progress=Path(files.progress_file),
            ),
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

    def _merged_prefix(self, node: NodeAssignment, local_ranks: Sequence[int]) -> bytes:
        """The prefix of a line several ranks printed: the rank fields as spans, `[default0-7]:`
        (no colour: it is no one rank's)."""
        spans = {
            "rank": format_cpus([node.base_rank + lr for lr in local_ranks]),
            "local_rank": format_cpus(local_ranks),
        }
        fields = {"role": self.plan.role, "host": host_name().split(".")[0]}
        try:
            text = self.plan.logs.prefix.format(node_rank=node.group_rank, **fields, **spans)
        except (ValueError, TypeError):  # a number format such as {rank:03d}: the plain form
            text = f"[{self.plan.role}{spans['local_rank']}]:"
        return text.encode()

    def _prefix(self, node: NodeAssignment, local_rank: int) -> bytes:
        text = self.plan.logs.prefix.format(
            role=self.plan.role,
            rank=node.base_rank + local_rank,
            local_rank=local_rank,
            host=host_name().split(".")[0],
            node_rank=node.group_rank,
        )
        rank = node.base_rank + local_rank
        if self.colour:
            text = f"\x1b[{_COLOURS[rank % len(_COLOURS)]}m{text}\x1b[0m"
        return text.encode()
