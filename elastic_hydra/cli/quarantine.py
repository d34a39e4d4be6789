"""`elastic-hydra quarantine list|add|clear`: the quarantine ledger, read and edited by hand.

The ledger is `--ledger PATH`, or the `quarantine.ledger` of a job file and overrides, composed
as a launch composes them (`elastic-hydra quarantine list jobs/train.yaml`). Hydra is loaded only
for the latter. Bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from elastic_hydra.durations import DURATION_FORM, parse_duration, show_duration
from elastic_hydra.errors import ConfigError
from elastic_hydra.quarantine.gate import exclude_flag, stderr_warning
from elastic_hydra.quarantine.ledger import (
    CLI_JOB,
    MAX_GPU,
    Ledger,
    LedgerError,
    QuarantineEntry,
    one_line,
)

USAGE = """usage: elastic-hydra quarantine list  [--json] LEDGER
       elastic-hydra quarantine add   HOST [--gpu N] --reason TEXT [--cooldown DUR] LEDGER
       elastic-hydra quarantine clear (HOST [--gpu N] | --all) LEDGER

LEDGER is --ledger PATH, or a job file and overrides that set quarantine.ledger
(elastic-hydra quarantine list jobs/train.yaml). A quarantined host does not join a job that
reads the ledger; a quarantined GPU keeps its node out of a job whose workers would use it.
DUR: seconds or 30m, 24h, 7d (default: the job's quarantine.cooldown, else 24h)."""

_FLAGS_WITH_VALUE = ("--ledger", "--gpu", "--reason", "--cooldown")
_SWITCHES = ("--json", "--all")


@dataclass(slots=True)
class _Args:
    action: str
    host: str | None = None
    flags: dict[str, str] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)
    job: list[str] = field(default_factory=list)  # a job file and overrides


def main(argv: Sequence[str]) -> int:
    """Run `elastic-hydra quarantine ARGV`; returns the exit code (one line and 2 for bad
    input)."""
    if {"-h", "--help"} & set(argv):
        print(USAGE)
        return 0
    try:
        args = _parse(list(argv))
        ledger, cooldown = _ledger(args)
        if args.action == "list":
            return _list(ledger, json_out="--json" in args.switches)
        if args.action == "add":
            return _add(ledger, args, cooldown)
        return _clear(ledger, args)
    except LedgerError as exc:
        print(f"elastic-hydra: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `list | head`: ends quietly, as SIGPIPE ends `cat`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:  # a ConfigError, or composition's own: as a launch shows them
        from elastic_hydra.cli import run

        run._fail_for(exc, None, argv)  # exits


def _parse(argv: list[str]) -> _Args:
    action = argv.pop(0) if argv else "<nothing>"
    if action not in ("list", "add", "clear"):
        raise ConfigError(
            "quarantine", "unknown action", action, "expected list, add or clear",
            "See elastic-hydra quarantine -h.",
        )  # fmt: skip
    args = _Args(action=action)
    while argv:
        word = argv.pop(0)
        name, eq, value = word.partition("=")
        if name in _FLAGS_WITH_VALUE:
            if not eq:
                if not argv:
                    raise ConfigError(name, "needs a value", word, f"expected {name} VALUE")
                value = argv.pop(0)
            args.flags[name] = value
        elif word in _SWITCHES:
            args.switches.add(word)
        elif word.startswith("-"):
            raise ConfigError("quarantine", "unknown flag", word, USAGE.splitlines()[0])
        elif "=" in word or word.endswith((".yaml", ".yml")):
            args.job.append(word)
        elif args.host is None and action != "list":
            args.host = word
        else:
            raise ConfigError(
                "quarantine", "an extra word", word, "see elastic-hydra quarantine -h"
            )
    return args


def _ledger(args: _Args) -> tuple[Ledger, float | None]:
    """The ledger the command edits, and the job's cooldown if a job named it."""
    if "--ledger" in args.flags:
        if args.job:
            raise ConfigError(
                "--ledger", "given with a job file or overrides", " ".join(args.job),
                "expected --ledger PATH, or a job file that sets quarantine.ledger",
            )  # fmt: skip
        given = args.flags["--ledger"]
        path = Path(given)
        if not given or not path.name or path.is_dir():
            raise ConfigError(
                "--ledger", "is a directory", given, "expected the path of the ledger file"
            )
        return Ledger(path, warn=stderr_warning), None
    if not args.job:
        raise ConfigError(
            "--ledger", "no ledger given", "<nothing>",
            "expected --ledger PATH, or a job file / quarantine.ledger=PATH that names one",
        )  # fmt: skip
    from elastic_hydra.cli.argv import parse_argv
    from elastic_hydra.config import boundary
    from elastic_hydra.launch import job

    inv = parse_argv(args.job, boundary.hydra_flags())
    if inv.job is not None and not inv.job.is_file():
        raise ConfigError("job", "no such file", str(inv.job), "expected a job YAML file")
    cfg, _ = boundary.compose(inv)
    spec = job.quarantine_of(cfg.job())
    if spec is None:
        raise ConfigError(
            "quarantine.ledger", "not set by this job", None,
            "expected quarantine.ledger=PATH in the job file or on the command line",
        )  # fmt: skip
    return Ledger(Path(spec.ledger), warn=stderr_warning), spec.cooldown


def _list(ledger: Ledger, *, json_out: bool) -> int:
    now = time.time()
    try:
        active = ledger.active(now)
    except OSError as exc:  # it exists but cannot be read (add and clear say so themselves)
        raise LedgerError(
            f"quarantine ledger {ledger.path}: cannot be read ({exc.strerror or exc})"
        ) from None
    if json_out:
        rows = [{**e.to_json(), "left_s": round(e.until - now, 1)} for e in active]
        print(json.dumps({"ledger": str(ledger.path), "entries": rows}, indent=2))
        return 0
    if not active:
        print(f"no host or GPU is quarantined in {ledger.path}")
        return 0
    table = [("HOST", "GPU", "UNTIL (UTC)", "LEFT", "ADDED BY", "REASON")]
    for e in active:
        until = datetime.fromtimestamp(e.until, UTC).strftime("%Y-%m-%d %H:%M")
        gpu = "-" if e.gpu is None else str(e.gpu)
        table.append((e.host, gpu, until, show_duration(e.until - now), e.job, e.reason))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        print("  ".join(f"{v:<{w}}" for v, w in zip(row[:5], widths, strict=True)) + "  " + row[5])
    print(f"{len(active)} entr{'y' if len(active) == 1 else 'ies'} in {ledger.path}; "
          f"under Slurm: {exclude_flag(active)}")  # fmt: skip
    return 0


def _add(ledger: Ledger, args: _Args, job_cooldown: float | None) -> int:
    if args.host is None:
        raise ConfigError("quarantine add", "no host given", "<nothing>", "expected add HOST")
    reason = one_line(args.flags.get("--reason", ""))
    if not reason:
        raise ConfigError(
            "--reason", "missing", "<nothing>", 'expected --reason "why", e.g. the evidence'
        )
    cooldown = job_cooldown or 86400.0
    if "--cooldown" in args.flags:
        try:
            cooldown = parse_duration(args.flags["--cooldown"])
        except ValueError:
            raise ConfigError(
                "--cooldown", "not a duration", args.flags["--cooldown"], DURATION_FORM
            ) from None
    now = time.time()
    try:
        entry = QuarantineEntry(
            host=args.host, gpu=_gpu(args), reason=reason, added=now, until=now + cooldown,
            job=CLI_JOB,
        )  # fmt: skip
    except ValueError as exc:
        key, _, problem = str(exc).partition(": ")
        raise ConfigError(key, problem.split(" (")[0], args.host, "expected a host name") from None
    ledger.add([entry])
    until = datetime.fromtimestamp(entry.until, UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"quarantined {entry.target} until {until} in {ledger.path}")
    return 0


def _clear(ledger: Ledger, args: _Args) -> int:
    every = "--all" in args.switches
    if every == (args.host is not None):
        raise ConfigError(
            "quarantine clear", "give a host or --all (not both)", args.host or "<nothing>",
            "expected clear HOST [--gpu N], or clear --all",
        )  # fmt: skip
    gpu = _gpu(args)
    if every and gpu is not None:
        raise ConfigError("--gpu", "given with --all", gpu, "expected clear HOST --gpu N")
    removed = ledger.clear(host=args.host, gpu=gpu)
    what = "every host" if every else args.host if gpu is None else f"{args.host} gpu {gpu}"
    print(f"cleared {removed} entr{'y' if removed == 1 else 'ies'} ({what}) in {ledger.path}")
    return 0


def _gpu(args: _Args) -> int | None:
    text = args.flags.get("--gpu")
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) > MAX_GPU:
        raise ConfigError("--gpu", "not a GPU index", text, f"expected 0..{MAX_GPU}")
    return int(text)
