"""The `elastic-hydra` command: argv sugar around Hydra, exit codes, and user-facing errors.

elastic-hydra [JOB.yaml] [-m] [--plan] [key=value ...] [-- SCRIPT ARGS ...]
elastic-hydra report RUN_DIR
elastic-hydra rdzv-server [--port P]      (see rdzv_server.py)
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import json
import os
import re
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import hydra
import yaml  # type: ignore[import-untyped]
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra._internal import utils as hydra_utils
from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Quote, QuotedString
from hydra.core.utils import run_job
from hydra.errors import ConfigCompositionException, HydraException
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from elastic_hydra import entry, schema
from elastic_hydra.config_errors import explain
from elastic_hydra.errors import EXIT_CONFIG, EXIT_WORKERS_FAILED, ConfigError, ElasticHydraError
from elastic_hydra.jobfile import check_job_file
from elastic_hydra.notices import warn
from elastic_hydra.plan import LaunchPlan, to_dict
from elastic_hydra.redact import redact, redact_env
from elastic_hydra.resolve import resolve_config
from elastic_hydra.rundir import PRIVATE_DIR, RunDir, write_private

CONF_MODULE = "elastic_hydra.conf"
PRESET_GROUPS = ("rdzv", "restart", "logs")
FULL_ERROR_ENV = "ELASTIC_HYDRA_FULL_ERROR"
_WORLD_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}  # not the user's path: exit 1, not 2

schema.register()
OmegaConf.register_new_resolver("eh.host", socket.gethostname, use_cache=True, replace=True)


@dataclass(slots=True)
class JobResult:
    """What one launch of a (multi)run ended with."""

    overrides: list[str]
    exit_code: int
    run_dir: str
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    swept: bool = False  # one launch of a sweep (-m, or a job that sets hydra.mode: MULTIRUN)


_results: list[JobResult] = []


# ------------------------------------------------------------------------------------------- argv
@dataclass(frozen=True, slots=True)
class Invocation:
    flags: list[str]
    overrides: list[str]
    plan_only: bool
    multirun: bool
    job: Path | None

    @property
    def hydra_argv(self) -> list[str]:
        return [*self.flags, *self.overrides]

    @property
    def config_name(self) -> str:
        return "config" if self.job is None else self.job.stem

    @property
    def plain_run(self) -> bool:
        """No Hydra flag but the job file's, no -m: a launch that `_run_once` can run."""
        job_flags = [] if self.job is None else _job_flags(self.job)
        return not self.multirun and self.flags == job_flags


def _job_flags(job: Path) -> list[str]:
    """The Hydra flags that stand for a job file."""
    return ["--config-dir", str(job.resolve().parent), "--config-name", job.stem]


def _hydra_flags() -> dict[str, tuple[str | int | None, Sequence[str] | None]]:
    """Hydra's own flags: how many values each takes, and its choices (from Hydra's parser)."""
    flags: dict[str, tuple[str | int | None, Sequence[str] | None]] = {}
    for action in hydra_utils.get_args_parser()._actions:
        takes = 0 if action.nargs == 0 else action.nargs
        for opt in action.option_strings:
            flags[opt] = (takes, action.choices)  # type: ignore[assignment]
    return flags


def quote_arg(arg: str) -> str:
    """Quote one script argument so Hydra's override grammar keeps it byte for byte."""
    # Escape `${` (no interpolation) and double the backslashes in front of it, which the
    # grammar would otherwise read as escapes of the `\${`.
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", arg)
    return QuotedString(text=text, quote=Quote.single).with_quotes()


# Values Hydra's grammar reads as a bool, number or null (`true`, `1e3`, `0x1`, `inf`...).
_LITERAL = re.compile(
    r"(?i)(true|false|null|[+-]?(inf|nan)|[+-]?(\d[\d_]*)?\.?\d[\d_]*(e[+-]?\d+)?|0x[\da-f]+)\Z"
)


def keep_as_typed(override: str) -> str:
    """Quote a literal-looking value of a text key, so `cmd=true` stays the program `true` and
    `env.X=1e3` reaches the workers as `1e3` (Hydra would make them `True` and `1000.0`)."""
    key, sep, value = override.partition("=")
    name = key.lstrip("+~")
    if not sep or not _LITERAL.match(value):
        return override
    kind = schema.field_type(name)
    text_key = name.startswith("env.") or kind is str or (kind == (str | None) and value != "null")
    return f"{key}={quote_arg(value)}" if text_key else override


# torchrun's flags and the key each one is spelled as here.
_TORCHRUN_KEYS = {
    "nproc-per-node": "nproc_per_node", "nnodes": "nnodes", "node-rank": "node_rank",
    "max-restarts": "restart.max_restarts", "rdzv-backend": "rdzv", "rdzv-endpoint":
    "rdzv.endpoint", "rdzv-id": "rdzv.id", "master-addr": "master_addr", "master-port":
    "master_port", "monitor-interval": "monitor_interval", "role": "role", "local-addr":
    "local_addr", "log-dir": "logs.root", "module": "module", "no-python": "cmd",
}  # fmt: skip
_AFTER_DASHES = "the script's own arguments go after --, e.g. script=train.py -- --lr 0.1"


def _refuse_torchrun_habit(arg: str) -> None:
    """A word that is neither key=value nor ours: say how it is spelled here, in one line."""
    if ("=" in arg.lstrip("-") and not arg.startswith("-")) or arg.startswith("~"):
        return
    if arg == "--standalone":
        raise ConfigError(arg, "is torchrun's flag", arg, "write rdzv=standalone (the default)")
    flag, _, value = arg.lstrip("-").partition("=")
    key = _TORCHRUN_KEYS.get(flag.replace("_", "-"))
    if arg.startswith("-") and key is not None:
        spelled = f"{key}={value}" if value else f"{key}=VALUE"
        hint = _AFTER_DASHES[0].upper() + _AFTER_DASHES[1:] + "."
        raise ConfigError(flag, "is torchrun's flag", arg, f"write {spelled}", hint)
    if arg.startswith("-"):
        raise ConfigError(arg, "not an elastic-hydra flag", arg, _AFTER_DASHES)
    if arg.endswith(".py"):
        raise ConfigError(
            "script", "a bare script path is torchrun's form", arg, f"write script={arg}",
            "Its arguments go after --.",
        )  # fmt: skip
    expected = f"expected overrides like nproc_per_node=2; {_AFTER_DASHES}"
    raise ConfigError(arg, "not key=value", arg, expected)


def parse_argv(argv: Sequence[str]) -> Invocation:
    """Split our argv into Hydra's: job file -> -cd/-cn, `-- args` -> one args=[...] override."""
    argv = list(argv)
    script_args: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1 :]
    flags, overrides = [], []
    plan_only = multirun = False
    job: Path | None = None
    known = _hydra_flags()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--plan":
            plan_only = True
        elif arg.startswith("-") and arg.split("=", 1)[0] in known:
            multirun |= arg in ("-m", "--multirun")
            flags.append(arg)
            takes, choices = known[arg.split("=", 1)[0]]
            optional = takes == "?" and i < len(argv) and argv[i] in (choices or ())
            wants_value = takes is None or optional
            if "=" not in arg and wants_value and i < len(argv):
                flags.append(argv[i])
                i += 1
        elif job is None and "=" not in arg and arg.endswith((".yaml", ".yml")):
            job = Path(arg)
            flags += _job_flags(job)
        else:
            _refuse_torchrun_habit(arg)
            overrides.append(keep_as_typed(arg))
    if script_args is not None:
        overrides.append("args=[" + ",".join(quote_arg(a) for a in script_args) + "]")
    return Invocation(flags, overrides, plan_only, multirun, job)


# ------------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    if {"--version", "-V"} & set(args[: args.index("--") if "--" in args else len(args)]):
        print(f"elastic-hydra {_version()} (hydra-core {hydra.__version__})")
        sys.exit(0)
    args = _completion_args(args)
    inv: Invocation | None = None
    try:
        if args[:1] == ["report"]:
            sys.exit(report(args[1:]))
        inv = parse_argv(args)
        if inv.job is not None:
            if not inv.job.is_file():
                raise ConfigError("job", "no such file", str(inv.job), "expected a job YAML file")
            check_job_file(str(inv.job))
        if inv.plan_only:
            sys.exit(_print_plan(inv))
        code = _run_hydra(inv)
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        _fail(exc, explain(exc, job=inv.job if inv is not None else None), EXIT_CONFIG)
    except ElasticHydraError as exc:
        _fail(exc, str(exc), exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before the agent took over the signals
        sys.exit(130)
    except yaml.YAMLError as exc:
        _fail(exc, f"job: not valid YAML ({' '.join(str(exc).split())})", EXIT_CONFIG)
    except OSError as exc:  # the world's fault (a full disk, a path that cannot be), not a bug
        where = f" {exc.filename}" if exc.filename else ""
        code = EXIT_WORKERS_FAILED if exc.errno in _WORLD_FAULTS else EXIT_CONFIG
        _fail(exc, f"cannot write{where}: {exc.strerror or exc}", code)
    except Exception as exc:  # a bug in the launcher, not the user's fault
        if isinstance(exc, ValueError) and _raised_in_hydra(exc):
            _fail(exc, _usage_line(exc, args), EXIT_CONFIG)
        traceback.print_exc()
        print(
            "elastic-hydra: internal error (a bug in elastic-hydra, not in your job); "
            "please report it with the traceback above.",
            file=sys.stderr,
        )
        sys.exit(70)
    if (signum := entry.pending_signal()) is not None:
        sys.exit(128 + signum)
    sys.exit(code)


def _usage_line(exc: ValueError, args: Sequence[str]) -> str:
    for arg in args:
        key, _, value = arg.partition("=")
        group = key.lstrip("+~")
        if group in PRESET_GROUPS and value and not value[0].isalpha():
            names = sorted(
                p.name.rsplit(".", 1)[0]
                for p in resources.files(CONF_MODULE).joinpath(group).iterdir()
                if p.name.endswith(".yaml")
            )
            return ConfigError(
                key, "not a preset name", value, f"expected one of {', '.join(names)}"
            ).line()
    return f"overrides: {exc}"


def _raised_in_hydra(exc: BaseException) -> bool:
    """Hydra reports some usage errors (flag clashes, odd override values) as ValueError."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}hydra{os.sep}" in tb.tb_frame.f_code.co_filename


def _fail(exc: BaseException, line: str, code: int) -> NoReturn:
    if os.environ.get(FULL_ERROR_ENV) == "1":
        traceback.print_exception(exc)
    print(f"elastic-hydra: error: {line}", file=sys.stderr)
    sys.exit(code)


def _version() -> str:
    from importlib import metadata  # ~25 ms: only for --version

    try:
        return metadata.version("elastic-hydra")
    except metadata.PackageNotFoundError:
        return "unknown"


def _run_hydra(inv: Invocation) -> int:
    # Let Hydra's exceptions reach `main`, which prints them as one line with exit code 2, instead
    # of Hydra's multi-line report with exit code 1. `_run_hydra` looks the name up at call time.
    hydra_utils.run_and_report = _reraise
    _results.clear()
    saved = sys.argv
    sys.argv = [saved[0] if saved else "elastic-hydra", *inv.hydra_argv]
    stopped: int | None = None
    try:
        if not _run_once(inv):
            _hydra_entry()
    except _SweepStopped as exc:
        stopped = exc.exit_code
    finally:
        sys.argv = saved
    if inv.multirun or any(r.swept for r in _results):
        from elastic_hydra import render

        render.print_sweep(_results)
        if stopped is not None:
            return stopped
        return 0 if all(r.exit_code == 0 for r in _results) else 1
    if stopped is not None:
        return stopped
    return _results[-1].exit_code if _results else 0


class _SweepStopped(BaseException):
    """A signal stopped a launch: the rest of the sweep must not start.

    A BaseException, so that Hydra's job runner, which records an Exception and moves on to the
    next job, lets it through.
    """

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


def _reraise(func: Callable[[], Any]) -> Any:
    return func()


def _run_once(inv: Invocation) -> bool:
    """Run a plain launch with one composition; False if it needs Hydra's own main instead.

    For a run, `hydra.main` composes the config twice: once only to read `hydra.mode`, then again
    to run (about 0.07 s each). This is its run path (`Hydra.run`) with a single composition. Any
    other Hydra flag, a sweep, a job that sets `hydra.mode: MULTIRUN` and a composition error go
    to Hydra's main, which then decides and reports exactly as it always does. The job is resolved
    and its run dir made before Hydra's job runner starts: bad input creates nothing.
    """
    if not inv.plain_run:
        return False
    search_path = hydra_utils.create_config_search_path("pkg://" + CONF_MODULE)
    if inv.job is not None:  # what Hydra does with --config-dir
        search_path.prepend(
            provider="command-line",
            path=f"file://{inv.job.resolve().parent}",
            anchor=SearchPathQuery(provider="schema"),
        )
    app = Hydra.create_main_hydra2(task_name="elastic-hydra", config_search_path=search_path)
    try:
        try:
            cfg = app.compose_config(
                inv.config_name, list(inv.overrides), RunMode.RUN, with_log_configuration=True
            )
        except ConfigCompositionException:
            return False
        if cfg.hydra.mode == RunMode.MULTIRUN:
            return False
        if cfg.hydra.mode is None:
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.overrides.hydra.append("hydra.mode=RUN")  # as Hydra's main records it
        prepared = _prepare(cfg)
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=inv.config_name)
        ret = run_job(
            hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
            task_function=functools.partial(_task, prepared=prepared),
            config=cfg,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
        )
        callbacks.on_run_end(config=cfg, config_name=inv.config_name, job_return=ret)
        _ = ret.return_value  # raises the task's exception, as Hydra.run does
    finally:
        GlobalHydra.instance().clear()
    return True


def _prepare(cfg: DictConfig) -> tuple[LaunchPlan, RunDir]:
    """Resolve a composed run and make its private run dir, before anything else is written.

    Raises:
        ConfigError: bad input, or a `logs.root` where no run dir can be made; nothing is left.
    """
    if "logs" not in cfg:
        resolve_config(cfg)  # raises: the job does not include elastic_hydra_base
    run_dir = os.path.abspath(str(OmegaConf.select(cfg, "hydra.run.dir")))
    with open_dict(cfg.hydra.runtime):  # as Hydra's job runner sets it, for ${hydra:...} values
        cfg.hydra.runtime.output_dir = run_dir
    HydraConfig.instance().set_config(cfg)
    task_cfg = copy.deepcopy(cfg)
    with open_dict(task_cfg):
        del task_cfg["hydra"]
    plan = resolve_config(task_cfg, run_dir=run_dir)
    try:
        run = RunDir.create(Path(run_dir), logs_root=Path(str(cfg.logs.root)))
    except OSError as exc:
        raise ConfigError(
            "logs.root",
            f"cannot make the run directory {exc.filename or run_dir} ({exc.strerror})",
            cfg.logs.root,
            "expected a writable directory, e.g. logs.root=$HOME/eh_logs",
        ) from None
    return plan, run


def _task(cfg: DictConfig, prepared: tuple[LaunchPlan, RunDir] | None = None) -> None:
    hc = HydraConfig.get()
    overrides = list(OmegaConf.to_container(hc.overrides.task, resolve=False))  # type: ignore[arg-type]
    swept = hc.mode == RunMode.MULTIRUN
    if prepared is None:  # a sweep's job, in the dir Hydra's launcher made
        run = RunDir(Path(hc.runtime.output_dir))
        run.make_private()
        try:
            plan = resolve_config(cfg, run_dir=str(run.root))
        except ConfigError as exc:
            # Reported here, not raised: Hydra would add its own line, and a sweep must go on.
            print(f"elastic-hydra: error: {exc.line()}", file=sys.stderr)
            _save_config(run, cfg, overrides)
            _record(JobResult(overrides, EXIT_CONFIG, str(run.root), exc.line(), swept=swept))
            return
    else:
        plan, run = prepared
    _save_config(run, cfg, overrides, plan)
    if (signum := entry.pending_signal()) is not None:  # stopped before anything started
        stopped = "stopped before the launch"
        _record(JobResult(overrides, 128 + signum, plan.run_dir, stopped, swept=swept))
        raise _SweepStopped(128 + signum)
    result = launch(plan, overrides, swept=swept)
    _record(result)
    if result.exit_code > 128 and swept:
        raise _SweepStopped(result.exit_code)


def _save_config(
    run: RunDir, cfg: DictConfig, overrides: list[str], plan: LaunchPlan | None = None
) -> None:
    """Hydra's saved config (.hydra/), the plan and the config resolved once, secrets masked.

    Resolved once here, so workers that use Hydra see one set of values (e.g. one ${now:}).
    """
    run.hydra_dir.mkdir(mode=PRIVATE_DIR, exist_ok=True)
    hydra_cfg = OmegaConf.to_container(HydraConfig.instance().cfg, resolve=False)
    saved = {
        run.saved_config: OmegaConf.to_container(cfg, resolve=False),
        run.saved_hydra: hydra_cfg,
        run.saved_overrides: overrides,
    }
    if plan is not None:
        saved[run.config] = OmegaConf.to_container(cfg, resolve=True)
    for path, data in saved.items():
        write_private(path, OmegaConf.to_yaml(OmegaConf.create(redact(data))))
    if plan is not None:
        write_private(run.plan, json.dumps(plan_dict(plan), indent=2) + "\n")


_hydra_entry = hydra.main(
    version_base="1.3", config_path="pkg://" + CONF_MODULE, config_name="config"
)(_task)


def launch(plan: LaunchPlan, overrides: list[str], *, swept: bool) -> JobResult:
    """Run one planned job to its end (the local agent)."""
    from elastic_hydra import agent

    code, details = agent.run(plan)
    return JobResult(overrides, code, plan.run_dir, details.get("message", ""), details, swept)


def plan_dict(plan: LaunchPlan) -> dict[str, Any]:
    """plan.json's content: the plan, secret values of its extra environment masked."""
    return {**to_dict(plan), "env": redact_env(plan.env)}


def _record(result: JobResult) -> None:
    _results.append(result)
    payload = {"overrides": result.overrides, "exit_code": result.exit_code, **result.details}
    try:
        write_private(
            RunDir(Path(result.run_dir)).result,
            json.dumps(redact(payload), indent=2, default=str) + "\n",
        )
    except OSError as exc:  # the run dir was removed or the disk is full: the code still counts
        warn(f"cannot write result.json ({exc.strerror}: {exc.filename})")


# ----------------------------------------------------------------------------------------- report
def report(args: Sequence[str]) -> int:
    """`elastic-hydra report RUN_DIR`: re-render a finished run's summary and timeline."""
    if len(args) != 1:
        raise ConfigError(
            "report",
            "needs one run dir",
            " ".join(args) or "<nothing>",
            "expected elastic-hydra report RUN_DIR",
        )
    run = RunDir(Path(args[0]))
    try:
        summary = json.loads(run.summary.read_text())
    except FileNotFoundError:
        raise ConfigError(
            "report",
            "no summary.json in this directory",
            args[0],
            "expected the run dir of a launch (it is printed at the end of each run)",
        ) from None
    except ValueError as exc:
        raise ConfigError(
            "report",
            f"summary.json is not JSON ({exc})",
            args[0],
            "expected a run dir written by elastic-hydra",
        ) from None
    events = []
    with contextlib.suppress(FileNotFoundError):
        for line in run.events.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line cut short by a killed agent
                events.append(json.loads(line))
    from elastic_hydra import render

    render.print_report(summary, events)
    return 0


# ------------------------------------------------------------------------------------------- plan
def compose_job(inv: Invocation) -> DictConfig:
    """Compose the job exactly as a launch would, without creating anything."""
    overrides = inv.overrides
    if inv.job is not None:
        with initialize_config_dir(str(inv.job.resolve().parent), version_base="1.3"):
            return compose(inv.job.stem, [*overrides, f"hydra.searchpath=[pkg://{CONF_MODULE}]"])
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        return compose("config", overrides)


def _print_plan(inv: Invocation) -> int:
    if inv.multirun:
        raise ConfigError("--plan", "shows one launch", "-m", "drop -m, or pick one value per key")
    cfg = compose_job(inv)
    root = cfg.logs.root if "logs" in cfg else "eh_logs"
    plan = resolve_config(cfg, run_dir="")
    from elastic_hydra import render

    render.print_plan(plan, run_dir_hint=f"{root}/<date>/<time>_<host> (created at launch)")
    return 0


def _completion_args(args: list[str]) -> list[str]:
    """Completion re-reads COMP_LINE itself: rewrite its job file, and load that job."""
    line = os.environ.get("COMP_LINE")
    if line is None or not ({"-sc", "--shell-completion"} & set(args)):
        return args
    words = line.split(" ")
    jobs = [w for w in words if w.endswith((".yaml", ".yml")) and "=" not in w]
    if not jobs:
        return args
    job = Path(jobs[0])
    flags = ["--config-dir", str(job.resolve().parent), "--config-name", job.stem]
    os.environ["COMP_LINE"] = " ".join(" ".join(flags) if w == jobs[0] else w for w in words)
    return [*flags, *args]
