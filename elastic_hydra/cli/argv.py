"""Our command line, split into what Hydra reads and what we keep.

    elastic-hydra [JOB.yaml] [-m] [--plan[=json|yaml]] [key=value ...] [-- SCRIPT ARGS ...]
    elastic-hydra [--plan[=json|yaml]] [TORCHRUN FLAGS] [key=value ...] [--] SCRIPT [ARGS ...]

A job file becomes Hydra's `--config-dir/--config-name`; `--plan` is ours; the words after `--`
(or after the script, in torchrun's form) are the script's own arguments, appended to the job's
`args` after composition (so they are never read by Hydra's override grammar). A command that
names its script or uses torchrun's flags is torchrun-style: `torchrun_cli` turns its flags and
the PET_* variables into overrides, placed before the user's own `key=value` words.

`elastic_hydra.torchrun` loads only for a command that may be torchrun's (a word that starts with
`-`, a script named, a PET_* variable set): a plain `key=value` launch does not pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from elastic_hydra.config.invocation import (
    HydraFlags,
    Invocation,
    job_flags,
    keep_as_typed,
    quote_arg,
)
from elastic_hydra.errors import ConfigError

if TYPE_CHECKING:  # torchrun/ loads for a torchrun-style command only (see the docstring)
    from elastic_hydra.torchrun.rdzv import Given, Setting

PLAN_FORMATS = ("text", "json", "yaml", "jobset", "trainjob")
_CONFIG_NAME = ("-cn", "--config-name")  # Hydra's own way to name a job file


@dataclass(slots=True)
class _Words:
    """The words of a command line, sorted as `_scan` reads them."""

    flags: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    given: dict[str, Given] = field(default_factory=dict)  # torchrun's flags, by dest
    plan: str | None = None
    job: Path | None = None
    script: str | None = None
    script_args: tuple[str, ...] | None = None
    short_m: bool = False  # torchrun's --module, or Hydra's --multirun: the script decides


def parse_argv(
    argv: Sequence[str], hydra_flags: HydraFlags, environ: Mapping[str, str] | None = None
) -> Invocation:
    """Split our argv: Hydra's flags and overrides, `--plan`, the job file, the script's args;
    a torchrun-style command's flags and PET_* variables become overrides (see torchrun_cli).

    Args:
        argv: the words after the program name.
        hydra_flags: Hydra's own flags, with how many values each takes and its choices.
        environ: where PET_* are read (default: this process's environment).

    Raises:
        ConfigError: a word that is neither ours, Hydra's nor torchrun's, or a torchrun flag
            that elastic-hydra cannot honour.
    """
    w = _scan(list(argv), hydra_flags)
    environ = os.environ if environ is None else environ
    torchrun = w.script is not None or bool(w.given)
    if w.short_m and w.script is not None:  # torchrun's -m: the script is a module's name
        from elastic_hydra.torchrun.rdzv import Given

        w.given["module"] = Given(name="-m", value=True, shown="-m", explicit=True)
    elif w.short_m:
        w.flags.append("-m")
    overrides, notes = _torchrun_overrides(w, environ) if torchrun else (w.overrides, [])
    if w.script is not None and w.plan is None:
        theirs = next((a for a in w.script_args or () if a.split("=", 1)[0] == "--plan"), None)
        if theirs is not None:
            notes.append(
                f"{theirs} comes after the script {w.script}, so it goes to the script and this "
                f"launches the job; to see the plan, put it before the script: "
                f"elastic-hydra {theirs} ... {w.script}"
            )
    reads_pet = {"rdzv=kubeflow", "rdzv=auto"} & set(w.overrides)  # those presets read them
    if not torchrun and not reads_pet and (names := _pet_set(environ)):
        notes.append(
            f"{', '.join(names)} set: torchrun's variables apply to a torchrun-style command "
            "(one that names its script, e.g. elastic-hydra train.py), not to this one; "
            "rdzv=kubeflow reads them in a job"
        )
    return Invocation(
        flags=tuple(w.flags),
        overrides=tuple(overrides),
        script_args=w.script_args,
        plan=w.plan,
        multirun=bool({"-m", "--multirun"} & set(w.flags)),
        job=w.job,
        torchrun=torchrun,
        notes=tuple(notes),
        words=tuple(argv),
    )


def _torchrun_overrides(w: _Words, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The overrides of a torchrun-style command (its flags' first, then the user's own) and its
    notes."""
    from elastic_hydra.torchrun.flags import beside, translate, with_environment

    values = with_environment(w.given, environ)
    translation = translate(values, w.script, environ, job=w.job is not None)
    kept = beside(translation.settings, w.overrides)
    return [_override(s) for s in kept] + w.overrides, list(translation.notes)


def _pet_set(environ: Mapping[str, str]) -> list[str]:
    """The PET_* variables of torchrun's flags set in `environ` (`flags.pet_in`); with no PET_*
    name at all, as in most environments, without loading torchrun's flags to say so."""
    if not any(name.startswith("PET_") for name in environ):
        return []
    from elastic_hydra.torchrun.flags import pet_in

    return pet_in(environ)


def _torchrun_flag(argv: Sequence[str], i: int) -> tuple[str, Given, int] | None:
    """`flags.take_flag` for a word that starts with `-` (every torchrun flag does)."""
    from elastic_hydra.torchrun.flags import take_flag

    return take_flag(argv, i)


def _scan(argv: list[str], hydra_flags: HydraFlags) -> _Words:
    """Read the words up to `--` or the script; what follows is the script's, byte for byte."""
    w = _Words()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest = argv[i + 1 :]
            if _script_after_dashes(w, rest):  # torchrun's `--nproc-per-node=2 -- train.py`
                w.script, w.script_args = rest[0], tuple(rest[1:])
            else:
                w.script_args = tuple(rest)
            break
        if arg == "--plan" or arg.startswith("--plan="):
            w.plan, i = _plan_format(arg), i + 1
        elif arg == "-m":
            w.short_m, i = True, i + 1
        elif arg.startswith("-") and (hit := _torchrun_flag(argv, i)) is not None:
            dest, w.given[dest], i = hit
        elif arg.startswith("-") and arg.split("=", 1)[0] in hydra_flags:
            i = _hydra_flag(argv, i, hydra_flags, w.flags)
        elif "=" not in arg and arg.endswith((".yaml", ".yml")):
            if w.job is not None:
                raise ConfigError("job", "a second job file", arg, f"expected one, got {w.job}")
            w.job, i = Path(arg), i + 1
            w.flags += job_flags(w.job)
        elif arg.startswith("-"):
            from elastic_hydra.torchrun.flags import unknown_flag  # it names torchrun's flags

            raise unknown_flag(arg)
        elif "=" in arg or arg.startswith("~"):
            w.overrides.append(keep_as_typed(arg))
            i += 1
        else:
            if not w.short_m and "module" not in w.given:  # else a module's dotted name
                _refuse_key_without_value(arg)
            w.script, w.script_args = arg, tuple(argv[i + 1 :])
            break
    return w


def _refuse_key_without_value(word: str) -> None:
    """`env.BAR` or `+hp.lr` without `=`: a key of the job, not a script named so (which would
    fail later as "script: no such file"). A file of that name is still a script."""
    from elastic_hydra.config.schema import top_level_keys  # hydra is loaded by then anyway

    name = word.lstrip("+")
    if "/" in name or name.endswith((".py", ".sh")) or os.path.exists(word):
        return  # a script's name, even a missing one
    if name.split(".", 1)[0] in top_level_keys():
        raise ConfigError(
            name, "a key without a value", word, f"expected {name}=VALUE",
            "A script's own arguments go after --.",
        )  # fmt: skip


def _script_after_dashes(w: _Words, rest: list[str]) -> bool:
    """torchrun reads the first word after `--` as its script. So does a command with torchrun's
    flags that names no entrypoint otherwise (no job file, no script=/module=/cmd=); in any other
    command, the words after `--` are the script's arguments."""
    if not w.given or not rest or rest[0][:1] == "-":
        return False
    from elastic_hydra.torchrun.flags import ENTRYPOINT_KEYS  # loaded already: w.given's flags

    named = any(o.split("=", 1)[0].lstrip("+~") in ENTRYPOINT_KEYS for o in w.overrides)
    job = w.job is not None or any(f.split("=", 1)[0] in _CONFIG_NAME for f in w.flags)
    return not job and not named


def own_words(argv: Sequence[str]) -> list[str]:
    """The words before `--` or the script (a bare word): a script's own `--version` or
    `--help` is never read as ours."""
    for i, arg in enumerate(argv):
        if arg == "--" or not (
            arg.startswith(("-", "~")) or "=" in arg or arg.endswith((".yaml", ".yml"))
        ):
            return list(argv[:i])
    return list(argv)


def _hydra_flag(argv: list[str], i: int, hydra_flags: HydraFlags, flags: list[str]) -> int:
    """Hydra's flag at argv[i], with its value if it takes one; returns the next index."""
    arg = argv[i]
    flags.append(arg)
    i += 1
    takes, choices = hydra_flags[arg.split("=", 1)[0]]
    optional = takes == "?" and i < len(argv) and argv[i] in (choices or ())
    if "=" not in arg and (takes is None or optional) and i < len(argv):
        flags.append(argv[i])
        i += 1
    return i


def _override(s: Setting) -> str:
    """A torchrun flag's setting as a Hydra override that keeps its value and type."""
    value = s.value
    if s.group:
        text = str(value)
    elif value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, int | float):
        text = repr(value)
    elif isinstance(value, list):
        text = "[" + ",".join(str(v) for v in value) + "]"
    else:
        text = quote_arg(str(value))
    return f"{s.key}={text}"


def _plan_format(arg: str) -> str:
    fmt = arg.partition("=")[2] or "text"
    if fmt not in PLAN_FORMATS:
        raise ConfigError(
            "--plan",
            "unknown format",
            fmt,
            "expected --plan, --plan=json, --plan=yaml, --plan=jobset or --plan=trainjob",
        )
    return fmt
