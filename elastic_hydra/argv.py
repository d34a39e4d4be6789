"""Our command line, split into what Hydra reads and what we keep.

    elastic-hydra [JOB.yaml] [-m] [--plan[=json]] [key=value ...] [-- SCRIPT ARGS ...]

A job file becomes Hydra's `--config-dir/--config-name`; `--plan` is ours; the words after `--`
are the script's own arguments, appended to the job's `args` after composition (so they are never
read by Hydra's override grammar). Words that are neither `key=value` nor a Hydra flag get a
one-line hint, most often the elastic-hydra spelling of a torchrun flag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.types import Quote, QuotedString

from elastic_hydra import schema
from elastic_hydra.errors import ConfigError

PLAN_FORMATS = ("text", "json")


@dataclass(frozen=True, slots=True, kw_only=True)
class Invocation:
    """One command line, parsed.

    Attributes:
        flags: Hydra's flags (the job file's `--config-dir/--config-name` included).
        overrides: Hydra overrides, literal-looking values of text keys already quoted.
        script_args: the words after `--`, byte for byte; None when there was no `--`.
        plan: None for a launch, else how to print the plan ("text" or "json").
        multirun: `-m`/`--multirun` was given.
        job: the job file, if any.
    """

    flags: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    script_args: tuple[str, ...] | None = None
    plan: str | None = None
    multirun: bool = False
    job: Path | None = None

    @property
    def hydra_argv(self) -> list[str]:
        return [*self.flags, *self.overrides]

    @property
    def config_name(self) -> str:
        return "config" if self.job is None else self.job.stem

    @property
    def job_dir(self) -> Path | None:
        return None if self.job is None else self.job.resolve().parent

    @property
    def only_job_flags(self) -> bool:
        """No Hydra flag but the job file's: a run or, if the job says so, a sweep."""
        return list(self.flags) == job_flags(self.job)


def job_flags(job: Path | None) -> list[str]:
    """The Hydra flags that stand for a job file."""
    if job is None:
        return []
    return ["--config-dir", str(job.resolve().parent), "--config-name", job.stem]


def escape_interpolation(text: str) -> str:
    """Make `${` literal for OmegaConf, doubling the backslashes in front of it."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)


def quote_arg(arg: str) -> str:
    """Quote one value so Hydra's override grammar keeps it byte for byte."""
    return QuotedString(text=escape_interpolation(arg), quote=Quote.single).with_quotes()


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


def refuse_torchrun_habit(arg: str) -> None:
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


HydraFlags = Mapping[str, tuple[str | int | None, Sequence[str] | None]]


def parse_argv(argv: Sequence[str], hydra_flags: HydraFlags) -> Invocation:
    """Split our argv: Hydra's flags and overrides, `--plan`, the job file, the script's args.

    Args:
        argv: the words after the program name.
        hydra_flags: Hydra's own flags, with how many values each takes and its choices.

    Raises:
        ConfigError: a word that is neither ours nor Hydra's (with the right spelling).
    """
    argv = list(argv)
    script_args: tuple[str, ...] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], tuple(argv[cut + 1 :])
    flags: list[str] = []
    overrides: list[str] = []
    plan: str | None = None
    multirun = False
    job: Path | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--plan" or arg.startswith("--plan="):
            plan = _plan_format(arg)
        elif arg.startswith("-") and arg.split("=", 1)[0] in hydra_flags:
            multirun |= arg in ("-m", "--multirun")
            flags.append(arg)
            takes, choices = hydra_flags[arg.split("=", 1)[0]]
            optional = takes == "?" and i < len(argv) and argv[i] in (choices or ())
            if "=" not in arg and (takes is None or optional) and i < len(argv):
                flags.append(argv[i])
                i += 1
        elif job is None and "=" not in arg and arg.endswith((".yaml", ".yml")):
            job = Path(arg)
            flags += job_flags(job)
        else:
            refuse_torchrun_habit(arg)
            overrides.append(keep_as_typed(arg))
    return Invocation(
        flags=tuple(flags),
        overrides=tuple(overrides),
        script_args=script_args,
        plan=plan,
        multirun=multirun,
        job=job,
    )


def _plan_format(arg: str) -> str:
    fmt = arg.partition("=")[2] or "text"
    if fmt not in PLAN_FORMATS:
        raise ConfigError("--plan", "unknown format", fmt, "expected --plan or --plan=json")
    return fmt
