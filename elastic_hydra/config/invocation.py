"""One command line, parsed, as the Hydra side reads it: the `Invocation`, the job file's
flags, and the quoting that keeps a value byte for byte through Hydra's override grammar.

`elastic_hydra.cli.argv` makes an `Invocation` from the words a user typed; the boundary composes
from it and a launch carries it. It lives here, beside the boundary, because both sides read it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.types import Quote, QuotedString

from elastic_hydra.config import schema


@dataclass(frozen=True, slots=True, kw_only=True)
class Invocation:
    """One command line, parsed.

    Attributes:
        flags: Hydra's flags (the job file's `--config-dir/--config-name` included).
        overrides: Hydra overrides, literal-looking values of text keys already quoted.
        script_args: the words after `--` (or after the script), byte for byte; None when
            there was neither.
        plan: None for a launch, else how to print the plan ("text", "json" or "yaml").
        multirun: `-m`/`--multirun` was given (in a plain command).
        job: the job file, if any.
        torchrun: the command is torchrun-style (it names its script, or uses torchrun's flags).
        notes: lines to show before the launch (a torchrun flag ignored as torchrun ignores it).
        words: the command line as given (for the job file `--plan` writes).
    """

    flags: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    script_args: tuple[str, ...] | None = None
    plan: str | None = None
    multirun: bool = False
    job: Path | None = None
    torchrun: bool = False
    notes: tuple[str, ...] = ()
    words: tuple[str, ...] = ()

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


HydraFlags = Mapping[str, tuple[str | int | None, Sequence[str] | None]]
