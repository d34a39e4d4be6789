"""`hydra/launcher=pool`: a sweep's jobs side by side on this machine, each on its own GPUs/CPUs.

Hydra finds this plugin in the `hydra_plugins` namespace package. Each job's config is composed
here, as Hydra's basic launcher composes it, and the job runs with Hydra's `run_job` in a fork
of this process. Slots are `elastic_hydra.sweeps.slots`'s, dispatch and stop signals
`elastic_hydra.sweeps.pool`'s, the live view `elastic_hydra.sweeps.view`'s.
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module before it is in
# sys.modules, where dataclasses would look string annotations up.
import functools
import json
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

if TYPE_CHECKING:
    from elastic_hydra.sweeps import pool
    from elastic_hydra.sweeps.slots import Slot


@dataclass
class PoolLauncherConf:
    """`hydra.launcher` with `hydra/launcher=pool`."""

    _target_: str = "hydra_plugins.elastic_hydra_pool.pool_launcher.PoolLauncher"
    # Jobs at once; null: as many as fit (GPUs / gpus_per_job, CPUs / cpus_per_job).
    slots: int | None = None
    # GPUs each job owns (CUDA_VISIBLE_DEVICES by UUID); null: 1 where GPUs are visible, else 0.
    gpus_per_job: int | None = None
    # CPUs each job is bound to; null: an even share of this process's CPUs; 0: not bound.
    cpus_per_job: int | None = None
    # Seconds between two job starts (e.g. to spread data loading); 0: none.
    stagger: float = 0.0


ConfigStore.instance().store(
    group="hydra/launcher", name="pool", node=PoolLauncherConf, provider="elastic-hydra"
)


class PoolLauncher(Launcher):
    def __init__(
        self,
        slots: int | None = None,
        gpus_per_job: int | None = None,
        cpus_per_job: int | None = None,
        stagger: float = 0.0,
    ) -> None:
        self.slots, self.gpus_per_job, self.cpus_per_job = slots, gpus_per_job, cpus_per_job
        self.stagger = stagger
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        # Imported here: Hydra imports every plugin module at each start, for any launcher.
        from elastic_hydra import stopsignals
        from elastic_hydra.launch.job import SweepStopped
        from elastic_hydra.rundir import PRIVATE_DIR, SweepDir
        from elastic_hydra.sweeps import pool, view

        assert self.config is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        slots = self._slots()
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        jobs = [self._job(initial_job_idx + i, o, sweep_dir) for i, o in enumerate(job_overrides)]
        with view.view(jobs, slots, sweep_dir) as shown:
            outcome = pool.run_pool(
                jobs, slots, view=shown, stagger=self.stagger, signum=stopsignals.pending_signal()
            )
        _save(SweepDir(sweep_dir).pool, outcome.to_json())
        returns = [self._job_return(row) for row in outcome.rows if row.result is not None]
        if outcome.signum is not None:
            raise SweepStopped(128 + outcome.signum, [r.return_value for r in returns])
        return returns

    def _slots(self) -> "tuple[Slot, ...]":
        from elastic_hydra.resolve import machine
        from elastic_hydra.sweeps.slots import plan_slots

        return plan_slots(
            gpus=machine.visible_gpus(os.environ),
            cpus=machine.allowed_cpus(),
            node_cpus=machine.node_cpus,
            slots=self.slots,
            gpus_per_job=self.gpus_per_job,
            cpus_per_job=self.cpus_per_job,
        )

    def _job(self, number: int, overrides: Sequence[str], sweep_dir: Path) -> "pool.PoolJob":
        """The job's config, composed as Hydra's basic launcher composes it, its run dir fixed
        here (one `${now:}` for the whole sweep)."""
        from elastic_hydra.sweeps import pool

        assert self.hydra_context is not None and self.config is not None
        assert self.task_function is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = number
            config.hydra.job.num = number
            config.hydra.sweep.dir = str(sweep_dir)
            config.hydra.sweep.subdir = str(config.hydra.sweep.subdir)
        run = functools.partial(_run_job, self.hydra_context, self.task_function, config)
        return pool.PoolJob(
            number=number,
            overrides=tuple(overrides),
            run=run,
            run_dir=sweep_dir / str(config.hydra.sweep.subdir),
        )

    def _job_return(self, row: "pool.JobRow") -> JobReturn:
        """What the sweeper gets: the job's JobResult as its return value."""
        assert self.config is not None
        ret = JobReturn(
            overrides=list(row.job.overrides),
            working_dir=os.getcwd(),
            task_name=str(self.config.hydra.job.name),
            status=JobStatus.COMPLETED,
            _return_value=row.result,
        )
        runtime = {"runtime": {"output_dir": str(row.job.run_dir)}}
        ret.hydra_cfg = OmegaConf.create({"hydra": runtime})
        return ret


def _save(path: Path, record: dict[str, object]) -> None:
    from elastic_hydra.report.notices import warn
    from elastic_hydra.rundir import write_private

    try:
        write_private(path, json.dumps(record, indent=2) + "\n")
    except OSError as exc:  # a full disk: the jobs' own results still count
        warn(f"cannot write {path.name} ({exc.strerror}: {exc.filename})")


def _run_job(context: HydraContext, task: TaskFunction, config: DictConfig) -> int:
    """One job, in its forked process, as Hydra's basic launcher runs it: its exit code."""
    from elastic_hydra.errors import EXIT_BUG
    from elastic_hydra.launch.job import SweepStopped
    from elastic_hydra.records.summary import JobResult

    try:
        ret = run_job(
            hydra_context=context,
            task_function=task,
            config=config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    except SweepStopped as exc:  # stopped by a signal: its result is written
        return exc.exit_code
    if ret.status == JobStatus.FAILED:  # the task raised: a bug, its traceback in console.log
        traceback.print_exception(ret._return_value)
        return EXIT_BUG
    value = ret.return_value
    return value.exit_code if isinstance(value, JobResult) else 0
