"""The `elastic-hydra` command: exit codes and user-facing errors around the launch.

elastic-hydra [JOB.yaml] [-m] [--plan[=json|yaml]] [key=value ...] [-- SCRIPT ARGS ...]
elastic-hydra [--plan[=json|yaml]] [TORCHRUN FLAGS] [key=value ...] SCRIPT [ARGS ...]
elastic-hydra report [RUN_DIR | SWEEP_DIR]     (the latest run without one)
elastic-hydra stacks [RUN_DIR]                 (a running job's stacks; the latest without one)
elastic-hydra rdzv-server [--host H] [--port P]      (see rdzv_server.py)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

from elastic_hydra import stopsignals
from elastic_hydra.cli.argv import own_words, parse_argv
from elastic_hydra.config import boundary
from elastic_hydra.config.explain import explain
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.config.jobfile import check_job_file
from elastic_hydra.errors import (
    EXIT_BUG,
    EXIT_CONFIG,
    EXIT_WORKERS_FAILED,
    ConfigError,
    ElasticHydraError,
)
from elastic_hydra.launch import job
from elastic_hydra.plan import Dynamic, DynamicBackend, LaunchPlan
from elastic_hydra.records import JobResult, RunStatus, RunSummary
from elastic_hydra.rundir import LOGS_ROOT, RunDir, SweepDir, finished_runs

FULL_ERROR_ENV = "ELASTIC_HYDRA_FULL_ERROR"
T = TypeVar("T")
_WORLD_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}  # not the user's path: exit 1, not 2


# ------------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    if {"--version", "-V"} & set(own_words(args)):
        print(f"elastic-hydra {_version()} (hydra-core {boundary.hydra_version()})")
        sys.exit(0)
    args = _completion_args(args)
    inv: Invocation | None = None
    try:
        if args[:1] == ["report"]:
            sys.exit(_printing(report, args[1:]))
        if args[:1] == ["stacks"]:
            from elastic_hydra.cli import stacks

            sys.exit(_printing(stacks.main, args[1:]))
        inv = parse_argv(args, boundary.hydra_flags())
        for note in inv.notes:
            print(f"elastic-hydra: note: {note}", file=sys.stderr)
        if inv.job is not None:
            if not inv.job.is_file():
                raise ConfigError("job", "no such file", str(inv.job), "expected a job YAML file")
            check_job_file(str(inv.job))
        if inv.plan is not None:
            sys.exit(_printing(show_plan, inv))
        code = job.run_command(inv)
    except KeyboardInterrupt:  # Ctrl-C before the agent took over the signals
        sys.exit(130)
    except Exception as exc:
        _fail_for(exc, inv, args)
    if (signum := stopsignals.pending_signal()) is not None:
        sys.exit(128 + signum)
    sys.exit(code)


def _printing(command: Callable[[T], int], arg: T) -> int:
    """Run a command whose output is the point (`--plan`, `report`, `stacks`). A reader that
    stops early (`--plan | head`) ends it quietly, as SIGPIPE ends `cat`: 128 + SIGPIPE."""
    try:
        return command(arg)
    except BrokenPipeError:
        # Python flushes stdout again at exit: let that flush go nowhere instead of failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _fail_for(exc: Exception, inv: Invocation | None, args: Sequence[str]) -> NoReturn:
    """Bad input: one line, exit 2. The world's fault: its own line. Anything else is our bug."""
    if (line := explain(exc, job=None if inv is None else inv.job, args=args)) is not None:
        _fail(exc, line, EXIT_CONFIG)
    if isinstance(exc, ElasticHydraError):
        _fail(exc, str(exc), exc.exit_code)
    if isinstance(exc, OSError):  # a full disk, a path that cannot be: not a bug
        where = f" {exc.filename}" if exc.filename else ""
        code = EXIT_WORKERS_FAILED if exc.errno in _WORLD_FAULTS else EXIT_CONFIG
        _fail(exc, f"cannot write{where}: {exc.strerror or exc}", code)
    traceback.print_exception(exc)
    print(
        "elastic-hydra: internal error (a bug in elastic-hydra, not in your job); "
        "please report it with the traceback above.",
        file=sys.stderr,
    )
    sys.exit(EXIT_BUG)


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


# ----------------------------------------------------------------------------------------- report
REPORT_USAGE = f"""usage: elastic-hydra report [RUN_DIR | SWEEP_DIR]

Show a finished launch again: its summary, its timeline and, for a failure, the root cause.
Without a directory: the latest run under ./{LOGS_ROOT}. A sweep's directory shows its table.
Exits 0 for a run (or sweep) that succeeded, 1 for one that did not, 2 for bad input."""


def report(args: Sequence[str]) -> int:
    """`elastic-hydra report [DIR]`: re-render a finished run's summary and timeline."""
    if list(args) in (["-h"], ["--help"]):
        print(REPORT_USAGE)
        return 0
    if len(args) > 1:
        raise ConfigError(
            "report", "takes one run dir", " ".join(args), "expected elastic-hydra report [RUN_DIR]"
        )
    where = Path(args[0]) if args else _latest_run(Path(LOGS_ROOT))
    run = RunDir(where)
    if not run.summary.exists() and (sweep := _sweep_results(where)):
        from elastic_hydra.report import render

        render.print_sweep(sweep)
        return 0 if all(r.exit_code == 0 for r in sweep) else 1
    try:
        summary = RunSummary.from_json(json.loads(run.summary.read_text()))
    except FileNotFoundError:
        raise ConfigError(
            "report",
            f"no {run.summary.name} in this directory",
            str(where),
            "expected the run dir of a launch (it is printed at the end of each run)",
        ) from None
    except ValueError as exc:
        raise ConfigError(
            "report",
            f"{run.summary.name} does not read as a run summary ({exc})",
            str(where),
            "expected a run dir written by elastic-hydra",
        ) from None
    events = []
    with contextlib.suppress(FileNotFoundError):
        for line in run.events.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line cut short by a killed agent
                events.append(json.loads(line))
    from elastic_hydra.report import render

    render.print_report(summary, events)
    return 0 if summary.status is RunStatus.SUCCEEDED else 1


def _latest_run(root: Path) -> Path:
    """The run dir under `root` whose summary was written last."""
    summaries = [run.summary for run in finished_runs(root)]
    if not summaries:
        raise ConfigError(
            "report", "no run found under", str(root),
            "run it from the directory you launched in, or give the run dir",
        )  # fmt: skip
    latest = max(summaries, key=lambda p: p.stat().st_mtime).parent
    print(f"elastic-hydra report: the latest run, {latest}", file=sys.stderr)
    return latest


def _sweep_results(sweep: Path) -> list[JobResult]:
    """The results of a sweep's jobs (`<sweep>/<job#>/result.json`, or a multi-node job's first
    node's), in job order; [] where `sweep` is no sweep."""
    results = []
    for found in SweepDir(sweep).job_results():
        for path in found:
            with contextlib.suppress(OSError, ValueError):
                results.append(JobResult.from_json(json.loads(path.read_text())))
                break
    return results


# ------------------------------------------------------------------------------------------- plan
def show_plan(inv: Invocation) -> int:
    """`--plan`: the launch minus the processes, printed; nothing is created."""
    if inv.multirun:
        raise ConfigError("--plan", "shows one launch", "-m", "drop -m, or pick one value per key")
    cfg, ctx = boundary.compose(inv)
    if ctx.swept:
        raise ConfigError(
            "--plan", "shows one launch", "hydra.mode=MULTIRUN",
            "the job sets hydra.mode: MULTIRUN; pick one value per key and add hydra.mode=RUN",
        )  # fmt: skip
    plan = job.plan_of(cfg, ctx)
    if inv.plan == "json":
        print(json.dumps(job.plan_dict(plan), indent=2))
        return 0
    from elastic_hydra.cli import jobyaml  # a small module: the YAML of a torchrun-style command

    if inv.plan == "yaml":
        print(jobyaml.job_yaml(inv, cfg, ctx), end="")
        return 0
    from elastic_hydra.report import render

    render.print_plan(plan, run_dir_hint=f"{ctx.run_dir} (created at launch)")
    _plan_notes(inv, plan, len(cfg.get("args") or []))
    if inv.torchrun:  # the command as a file to commit
        print(f"\n{YAML_HEADING}\n{jobyaml.job_yaml(inv, cfg, ctx)}", end="")
    return 0


YAML_HEADING = "equivalent job file (--plan=yaml prints it alone):"


def _plan_notes(inv: Invocation, plan: LaunchPlan, args: int) -> None:
    """What the plan's table does not say: an elastic job's store host, the job's own args."""
    rdzv, elastic = plan.rdzv, plan.nnodes.min != plan.nnodes.max
    if (
        elastic
        and isinstance(rdzv, Dynamic)
        and rdzv.backend is DynamicBackend.C10D
        and (rdzv.is_host is not False)
    ):
        print(
            f"note: nnodes={plan.nnodes} with the c10d store in an agent: losing the node that "
            "hosts it ends the job on every node; run the store apart (elastic-hydra "
            "rdzv-server, then rdzv.is_host=false) or use rdzv=etcd-v2"
        )
    own = args - len(inv.script_args or ())
    if inv.script_args and own > 0:
        where = "the script" if inv.torchrun else "--"
        print(
            f"note: the {len(inv.script_args)} word(s) after {where} follow the job's own {own} "
            "arg(s); to replace the job's args instead, write args=[...]"
        )


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
