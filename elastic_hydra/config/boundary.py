"""The Hydra boundary: the one module that drives Hydra (and the only importer of its internals).

Every path composes a job here, on one search path (elastic-hydra's presets, then the job file's
directory, then the job's own `hydra.searchpath`): `--plan`, a launch, each job of a sweep and the
tests; `sweep_jobs` composes every job of a sweep as Hydra's basic sweeper and launcher will, for
`--plan` of a sweep. A plain launch composes once and runs Hydra's job runner itself; sweeps and
Hydra's own flags (`--cfg`, `--help`, `--info`, shell completion) go through Hydra's dispatcher
with the same search path. Hydra's errors reach the caller as exceptions (no multi-line report,
no exit 1): the patch that does it lasts only while Hydra runs.

hydra-core's internals are used only within the supported range; outside it, everything goes
through the public `hydra.main` (two compositions per launch, the same results).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import hydra
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from elastic_hydra.config.composed import Composed
from elastic_hydra.config.invocation import HydraFlags, Invocation, escape_interpolation
from elastic_hydra.config.resolvers import register
from elastic_hydra.config.schema import CONF_MODULE
from elastic_hydra.errors import ConfigError

CONF_PATH = "pkg://" + CONF_MODULE
# The hydra-core releases whose internals (below) this module was written and tested against.
SUPPORTED = ((1, 3, 2), (1, 4))  # [oldest, first unsupported)


def internals_supported(version: str = hydra.__version__) -> bool:
    """Whether `version` of hydra-core is one whose internals we may use."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) or "0"
        numbers.append(int(digits))
    return SUPPORTED[0] <= tuple(numbers) < SUPPORTED[1]


def hydra_version() -> str:
    """The installed hydra-core's version."""
    return str(hydra.__version__)


def hydra_flags() -> HydraFlags:
    """Hydra's own flags: how many values each takes, and its choices (from Hydra's parser)."""
    from hydra._internal.utils import get_args_parser

    flags: dict[str, tuple[str | int | None, Any]] = {}
    for action in get_args_parser()._actions:
        takes = 0 if action.nargs == 0 else action.nargs
        for opt in action.option_strings:
            flags[opt] = (takes, action.choices)
    return flags


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext:
    """What one job of a launch knows besides its config.

    Attributes:
        run_dir: the job's run dir (made by Hydra's launcher for a sweep, not yet for a run).
        overrides: the job's overrides, then `--` and the script's args if there were any.
        swept: one job of a sweep (`-m`, or a job that sets `hydra.mode: MULTIRUN`).
        hydra_cfg: the `hydra` node, unresolved, as `.hydra/hydra.yaml` holds it.
        launch_time: the instant a plain run's directory is named after (the workers' Hydra
            `${now:}`); None for a sweep's job, which starts when its launcher runs it.
    """

    run_dir: Path
    overrides: list[str]
    swept: bool
    hydra_cfg: dict[str, Any]
    launch_time: float | None = None


class JobRunner(Protocol):
    """What runs the jobs Hydra composes (see `job.JobRunner`)."""

    def prepare(self, cfg: Composed, ctx: JobContext) -> Any:
        """Check a plain run and make its run dir, before Hydra's job runner writes anything."""

    def __call__(self, cfg: Composed, ctx: JobContext, prepared: Any) -> Any:
        """Run one job; `prepared` is `prepare`'s value, or None for a sweep's job. What it
        returns reaches the submitting side in Hydra's JobReturn (see `run`)."""


def compose(inv: Invocation) -> tuple[Composed, JobContext]:
    """The job's config and context exactly as a launch gets them, creating nothing.

    Raises:
        HydraException, OmegaConfBaseException: the job does not compose.
    """
    launched = time.time()
    register(launched)
    app = _app(inv.job_dir)
    try:
        with _errors_raised():
            cfg = _compose(app, inv, logging=False)
        return _job_view(cfg, inv, launched)
    finally:
        GlobalHydra.instance().clear()


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(inv: Invocation) -> list[tuple[Composed, JobContext]]:
    """The jobs of a sweep, each composed exactly as its launch will be, creating nothing: the
    grid Hydra's basic sweeper makes of the comma-separated values (and `hydra.sweeper.params`),
    in its order, each job in its own dir of the sweep dir.

    Raises:
        ConfigError: the job picks another sweeper (it chooses its jobs while it runs).
        HydraException, OmegaConfBaseException: the sweep does not compose.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not internals_supported():
        raise ConfigError(
            "--plan", "lists a sweep's jobs with the supported hydra-core releases only",
            hydra_version(), "plan one job: one value per key, without -m",
        )  # fmt: skip
    register(time.time())
    app = _app(inv.job_dir)
    try:
        with _errors_raised():
            master: DictConfig = app.compose_config(
                inv.config_name, list(inv.overrides), RunMode.MULTIRUN, with_log_configuration=False
            )
            HydraConfig.instance().set_config(master)
            sweeper = master.hydra.sweeper
            if sweeper.get("_target_") != BASIC_SWEEPER:
                raise ConfigError(
                    "hydra/sweeper", "--plan lists the jobs of Hydra's basic sweeper only",
                    str(sweeper.get("_target_")), "drop --plan, or plan one job with one value "
                    "per key and without -m",
                )  # fmt: skip
            params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
            parsed = OverridesParser.create(config_loader=app.config_loader).parse_overrides(
                [*params, *master.hydra.overrides.task]
            )
            grid = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
            # Resolved once, as the sweeper does: the jobs copy its ${now:} from the master.
            sweep_dir = os.path.abspath(str(master.hydra.sweep.dir))
            return [_sweep_job(app, master, (sweep_dir, num), job, inv) for num, job in
                    enumerate(grid)]  # fmt: skip
    finally:
        GlobalHydra.instance().clear()


def _sweep_job(
    app: Any, master: DictConfig, where: tuple[str, int], overrides: list[str], inv: Invocation
) -> tuple[Composed, JobContext]:
    """Job `num` of a sweep (`where`: the sweep dir and `num`), as Hydra's basic launcher
    composes it (`load_sweep_config`, the job number, the run dir `hydra.sweep.subdir` in the
    sweep dir)."""
    sweep_dir, num = where
    cfg = app.config_loader.load_sweep_config(master, list(overrides))
    with read_write(cfg.hydra), open_dict(cfg):
        cfg.hydra.job.id = num
        cfg.hydra.job.num = num
        cfg.hydra.mode = RunMode.MULTIRUN
    HydraConfig.instance().set_config(cfg)
    return _view_at(cfg, inv, os.path.join(sweep_dir, str(cfg.hydra.sweep.subdir)))


def run(inv: Invocation, runner: JobRunner) -> list[Any]:
    """Run the command: one launch, a sweep, or one of Hydra's own flags.

    Returns what a sweep's jobs returned, as Hydra's launcher brought it back: from the jobs
    that ran elsewhere (a Slurm node, a pool process), this is the only way home.
    """
    launched = time.time()
    register(launched)
    if not internals_supported():
        _via_hydra_main(inv, runner, launched)
        return []
    with _errors_raised():
        if inv.only_job_flags and not inv.multirun and _ran_once(inv, runner, launched):
            return []
        from hydra._internal.utils import _run_hydra, get_args_parser

        parser = get_args_parser()
        with _sweep_returns() as returns:
            _run_hydra(
                args=parser.parse_args(inv.hydra_argv),
                args_parser=parser,
                task_function=HydraTask(inv, runner, launched),
                config_path=CONF_PATH,
                config_name=inv.config_name,
            )
        return returns


@contextlib.contextmanager
def _sweep_returns() -> Iterator[list[Any]]:
    """The return values of the jobs of a sweep run meanwhile.

    Hydra's main drops what `Hydra.multirun` returns (the sweeper's JobReturns), so it is
    caught on the way out. Jobs that failed inside Hydra (an exception, not an exit code) stop
    the sweep before it returns anything.
    """
    from hydra._internal.hydra import Hydra
    from hydra.core.utils import JobReturn, JobStatus

    returns: list[Any] = []
    multirun = Hydra.multirun

    def collect(node: object) -> None:
        if isinstance(node, JobReturn):
            if node.status == JobStatus.COMPLETED:
                returns.append(node.return_value)
        elif isinstance(node, (list, tuple)):
            for item in node:
                collect(item)

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        ret = multirun(self, *args, **kwargs)
        collect(ret)
        return ret

    Hydra.multirun = recording  # type: ignore[method-assign]
    try:
        yield returns
    finally:
        Hydra.multirun = multirun  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------- composition
def search_path(job_dir: Path | None) -> ConfigSearchPath:
    """Hydra's search path for our presets plus the job's directory, as `--config-dir` adds it."""
    from hydra._internal.utils import create_config_search_path

    path = create_config_search_path(CONF_PATH)
    if job_dir is not None:
        path.prepend(
            provider="command-line",
            path=f"file://{job_dir}",
            anchor=SearchPathQuery(provider="schema"),
        )
    return path


def _app(job_dir: Path | None) -> Any:
    from hydra._internal.hydra import Hydra

    path = search_path(job_dir)
    return Hydra.create_main_hydra2(task_name="elastic-hydra", config_search_path=path)


def _compose(app: Any, inv: Invocation, *, logging: bool) -> DictConfig:
    cfg: DictConfig = app.compose_config(
        inv.config_name, list(inv.overrides), RunMode.RUN, with_log_configuration=logging
    )
    if cfg.hydra.mode is None:
        cfg.hydra.mode = RunMode.RUN
        cfg.hydra.overrides.hydra.append("hydra.mode=RUN")  # as Hydra's main records it
    return cfg


def _job_view(cfg: DictConfig, inv: Invocation, launched: float) -> tuple[Composed, JobContext]:
    """Split a composed config into the job's config and its context, as Hydra's job runner does.

    The run dir is computed (not created) from `hydra.run.dir`, with ${hydra:...} set up for it.
    """
    run_dir = os.path.abspath(str(OmegaConf.select(cfg, "hydra.run.dir")))
    return _view_at(cfg, inv, run_dir, launched)


def _view_at(
    cfg: DictConfig, inv: Invocation, run_dir: str, launched: float | None = None
) -> tuple[Composed, JobContext]:
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):  # as Hydra's run_job does
        cfg.hydra.runtime.output_dir = run_dir
    HydraConfig.instance().set_config(cfg)
    task_cfg = copy.deepcopy(cfg)
    with open_dict(task_cfg):
        del task_cfg["hydra"]
    context = _context(cfg.hydra, inv, Path(run_dir), launched)
    return Composed(_with_script_args(task_cfg, inv)), context


def _context(hc: Any, inv: Invocation, run_dir: Path, launched: float | None) -> JobContext:
    overrides = [str(o) for o in hc.overrides.task]
    if inv.script_args is not None:
        overrides += ["--", *inv.script_args]
    swept = hc.mode == RunMode.MULTIRUN
    return JobContext(
        run_dir=run_dir,
        overrides=overrides,
        swept=swept,
        hydra_cfg=OmegaConf.to_container(hc, resolve=False),  # type: ignore[arg-type]
        launch_time=None if swept else launched,
    )


def _with_script_args(cfg: DictConfig, inv: Invocation) -> DictConfig:
    """The words after `--` go after the job's own `args`, byte for byte (never interpolated)."""
    if inv.script_args:
        with open_dict(cfg):
            cfg.args = [*cfg.get("args", []), *map(escape_interpolation, inv.script_args)]
    return cfg


# ---------------------------------------------------------------------------------------- runs
def _ran_once(inv: Invocation, runner: JobRunner, launched: float) -> bool:
    """A plain launch with a single composition (Hydra's main composes twice: once only to read
    `hydra.mode`). The job is checked and its run dir made before Hydra's job runner starts, so
    bad input creates nothing. False for a job that sets `hydra.mode: MULTIRUN` and when the
    composition fails: Hydra's dispatcher then decides, and reports exactly as it always does."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job

    app = _app(inv.job_dir)
    try:
        try:
            cfg = _compose(app, inv, logging=True)
        except ConfigCompositionException:
            return False  # e.g. sweep values in a job that sets MULTIRUN: Hydra's main decides
        if cfg.hydra.mode == RunMode.MULTIRUN:
            return False
        task_cfg, ctx = _job_view(cfg, inv, launched)
        prepared = runner.prepare(task_cfg, ctx)
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=inv.config_name)
        ret = run_job(
            hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
            task_function=lambda _cfg: runner(task_cfg, ctx, prepared),
            config=cfg,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
        )
        callbacks.on_run_end(config=cfg, config_name=inv.config_name, job_return=ret)
        _ = ret.return_value  # raises the task's exception, as Hydra.run does
    finally:
        GlobalHydra.instance().clear()
    return True


@dataclass(frozen=True, slots=True)
class HydraTask:
    """The task function Hydra's launchers call, once per job of a sweep.

    A plain picklable object, so launchers that run jobs in other processes (the pool, submitit)
    carry it there with the standard pickle.
    """

    inv: Invocation
    runner: JobRunner
    launched: float  # the instant `register` named a plain run's directory after

    def __call__(self, cfg: DictConfig) -> Any:
        hc = HydraConfig.get()
        ctx = _context(hc, self.inv, Path(hc.runtime.output_dir), self.launched)
        return self.runner(Composed(_with_script_args(cfg, self.inv)), ctx, None)


def _via_hydra_main(inv: Invocation, runner: JobRunner, launched: float) -> None:
    """Outside the supported hydra-core range: the public entry point, argv swapped meanwhile."""
    job = HydraTask(inv, runner, launched)

    def elastic_hydra_job(cfg: DictConfig) -> Any:  # hydra.main inspects a function's source
        return job(cfg)

    task = hydra.main(version_base="1.3", config_path=CONF_PATH, config_name="config")(
        elastic_hydra_job
    )
    saved = sys.argv
    sys.argv = [saved[0] if saved else "elastic-hydra", *inv.hydra_argv]
    try:
        with _errors_raised():
            task()
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _errors_raised() -> Iterator[None]:
    """Let Hydra's exceptions reach our `main` (one line, exit 2) instead of Hydra's report.

    Hydra's dispatcher looks `run_and_report` up at call time; a hydra-core without it (outside
    the supported range) reports in its own way.
    """
    try:
        from hydra._internal import utils
    except ImportError:
        utils = None  # type: ignore[assignment]
    saved = getattr(utils, "run_and_report", None)
    if saved is None:
        yield
        return
    setattr(utils, "run_and_report", _call)  # noqa: B010
    try:
        yield
    finally:
        setattr(utils, "run_and_report", saved)  # noqa: B010


def _call(func: Callable[[], Any]) -> Any:
    return func()
