"""Hydra's, OmegaConf's and YAML's errors as elastic-hydra's one line: key, value, fix.

Each pattern parsed here is pinned by a test that holds the upstream message it reads.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import yaml  # type: ignore[import-untyped]
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from elastic_hydra.config import schema
from elastic_hydra.config.jobfile import locate_key
from elastic_hydra.config.schema import CONF_MODULE
from elastic_hydra.errors import ConfigError

PRESET_GROUPS = ("rdzv", "restart", "logs")


def explain(exc: BaseException, job: Path | None = None, args: Sequence[str] = ()) -> str | None:
    """One line for bad input (ours, Hydra's, OmegaConf's, YAML's); None for any other error.

    An error in the job file (a typo, a wrong type) names the file and line of the key too.
    `args` is the command line, for Hydra's usage errors that do not name the override.
    """
    if (ours := _ours(exc)) is not None:  # raised by us, maybe inside one of our resolvers
        return ours.line()
    if isinstance(exc, yaml.YAMLError):
        return f"job: not valid YAML ({' '.join(str(exc).split())})"
    if isinstance(exc, ValueError) and _raised_in_hydra(exc):
        return _usage_line(exc, args)
    if not isinstance(exc, HydraException | OmegaConfBaseException):
        return None
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        group, _, option = exc.missing_cfg_file.rpartition("/")
        choices = ", ".join(exc.options or [])
        if group:
            return ConfigError(group, "no such preset", option, f"expected one of {choices}").line()
        return ConfigError("job", "config not found", exc.missing_cfg_file, "check the path").line()
    if isinstance(exc, OverrideParseException):
        first = str(exc).strip().splitlines()[0]
        text = getattr(exc, "override", None) or first
        return (
            f"overrides: cannot parse {text!r} ({first}); expected key=value. "
            "Quote values with spaces or special characters."
        )
    # Hydra wraps OmegaConf's error, sometimes only as the implicit context.
    cause = (exc.__cause__ or exc.__context__) if isinstance(exc, HydraException) else exc
    if isinstance(cause, OmegaConfBaseException):
        error = from_omegaconf(cause)
        where = None if job is None else locate_key(job, error.key)
        if where is not None:
            error.problem += f" in {job}:{where}"
        return error.line()
    return " ".join(str(exc).split())


def _ours(exc: BaseException | None) -> ConfigError | None:
    """Our own error, also where Hydra or OmegaConf wrapped it (a resolver of ours raised it)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ConfigError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


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


def from_omegaconf(exc: OmegaConfBaseException) -> ConfigError:
    key = str(getattr(exc, "full_key", "") or getattr(exc, "key", "") or "config")
    msg = str(getattr(exc, "msg", "") or exc).strip().splitlines()[0]
    if key.startswith("env.") and "not a subclass of str" not in msg:
        return ConfigError(
            key, "not a plain value", "<invalid>", "expected text, e.g. env.NAME=value"
        )
    if re.match(r"Key '.*' not in", msg) or (isinstance(exc, ConfigKeyError) and "not in" in msg):
        return unknown_key(key)
    if "Missing mandatory value" in msg:
        return ConfigError(key, "required value is missing", "???", f"set it: {key}=...")
    expected = schema.describe(schema.field_type(key))
    found = re.search(r"Value '(.*)' of type '(\w+)'", msg)
    if found and "could not be converted" in msg:  # "... could not be converted to Float"
        return ConfigError(key, f"not {expected}", found.group(1), f"expected {expected}")
    value: object = found.group(1) if found else "<invalid>"
    return ConfigError(key, msg.rstrip("."), value, f"expected {expected}")


def unknown_key(key: str) -> ConfigError:
    known = schema.schema_keys()
    last = key.rsplit(".", 1)[-1]
    near = (
        difflib.get_close_matches(key, known, n=1)
        or [
            k for k in known if difflib.get_close_matches(last, [k.rsplit(".", 1)[-1]], cutoff=0.75)
        ][:1]
    )
    hint = f"Did you mean {near[0]}?" if near else "See elastic-hydra --help for the keys."
    return ConfigError(key, "unknown key", key, "expected a key of the job schema", hint)
