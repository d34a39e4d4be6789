"""The `elastic-hydra` command: a launch, and the exit codes and user errors of every subcommand.

elastic-hydra [JOB.yaml] [-m] [--plan[=json|yaml]] [key=value ...] [-- SCRIPT ARGS ...]
elastic-hydra [--plan[=json|yaml]] [TORCHRUN FLAGS] [key=value ...] SCRIPT [ARGS ...]
elastic-hydra report [RUN_DIR | SWEEP_DIR]     (the latest run without one; see report.py)
elastic-hydra stacks [RUN_DIR]                 (a running job's stacks; the latest without one)
elastic-hydra save [RUN_DIR]                   (save the snapshots and stop: exit 75; see save.py)
elastic-hydra rdzv-server [--host H] [--port P]      (see rdzv_server.py)
elastic-hydra quarantine list|add|clear ...          (the quarantine ledger; see quarantine.py)

Every outcome becomes an exit code here (0, 1, 2, 128+N, 70 for a bug of ours), and a user's
mistake one line (its traceback with ELASTIC_HYDRA_FULL_ERROR=1).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from elastic_hydra import stopsignals
from elastic_hydra.cli.argv import own_words, parse_argv
from elastic_hydra.cli.completion import completion_args
from elastic_hydra.config import boundary
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.errors import (
    EXIT_BUG,
    EXIT_CONFIG,
    EXIT_WORKERS_FAILED,
    ConfigError,
    ElasticHydraError,
)
from elastic_hydra.launch import job
from elastic_hydra.report import notices

FULL_ERROR_ENV = "ELASTIC_HYDRA_FULL_ERROR"
T = TypeVar("T")
_WORLD_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}  # not the user's path: exit 1, not 2


# ------------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Run `elastic-hydra ARGV` (default: this process's arguments) and exit with its code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if {"--version", "-V"} & set(own_words(args)):
        print(f"elastic-hydra {_version()} (hydra-core {boundary.hydra_version()})")
        sys.exit(0)
    args = completion_args(args)
    inv: Invocation | None = None
    try:
        # Each subcommand's modules load when it runs: a launch does not pay for them.
        if args[:1] == ["report"]:
            from elastic_hydra.cli.report import report

            sys.exit(_printing(report, args[1:]))
        if args[:1] == ["stacks"]:
            from elastic_hydra.cli import stacks

            sys.exit(_printing(stacks.main, args[1:]))
        if args[:1] == ["save"]:
            from elastic_hydra.cli import save

            sys.exit(_printing(save.main, args[1:]))
        inv = parse_argv(args, boundary.hydra_flags())
        for note in inv.notes:
            print(f"elastic-hydra: note: {note}", file=sys.stderr)
        if inv.job is not None:
            if not inv.job.is_file():
                raise ConfigError("job", "no such file", str(inv.job), "expected a job YAML file")
            from elastic_hydra.config.jobfile import check_job_file

            check_job_file(str(inv.job))
        if inv.plan is not None:
            from elastic_hydra.cli.plan import show_plan

            sys.exit(_printing(show_plan, inv))
        notices.console_may_close()  # `| head`: the job goes on to its own end
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
    from elastic_hydra.config.explain import explain

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
