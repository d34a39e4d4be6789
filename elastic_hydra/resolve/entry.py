"""The entrypoint: `script=`, `module=` or `cmd=`, its arguments and the Python that runs it.

Whether a file exists or a program is on PATH is asked of the `HostFacts`, so a test resolves
against the machine it describes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from elastic_hydra.config.schema import ElasticHydraConf
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import Command, Entrypoint, PythonModule, PythonScript, WarmSpec

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
# The bootstrap is run (as a file), not imported: it lives with the worker processes.
BOOTSTRAP = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "bootstrap.py"
)


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _which(program: str, path: str | None) -> str | None:
    return shutil.which(program, path=path)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFacts:
    """The files and programs of the machine, as resolution sees them; tests pass their own."""

    cwd: str
    environ: Mapping[str, str]
    is_file: Callable[[str], bool] = os.path.isfile
    is_dir: Callable[[str], bool] = os.path.isdir
    is_executable: Callable[[str], bool] = _executable
    which: Callable[[str, str | None], str | None] = _which


def resolve_entrypoint(conf: ElasticHydraConf, host: HostFacts) -> Entrypoint:
    """The one entrypoint the job names, checked against the host.

    Raises:
        ConfigError: none or several given, a missing script, a bad module name, a program that
            is not on PATH.
    """
    given = {k: v for k, v in (("script", conf.script), ("module", conf.module), ("cmd", conf.cmd))}
    chosen = [k for k, v in given.items() if v not in (None, "")]
    form = "expected exactly one of script=train.py, module=pkg.train or cmd=./program"
    if not chosen:
        raise ConfigError("script", "no entrypoint given", "<nothing>", form)
    if len(chosen) > 1:
        shown = ", ".join(f"{k}={given[k]}" for k in chosen)
        raise ConfigError(chosen[1], "more than one entrypoint", f"<{shown}>", form)
    python = host.environ.get("PYTHON_EXEC") or sys.executable
    args = tuple(conf.args)
    boot = BOOTSTRAP if conf.bootstrap else None
    if conf.script:
        path = _script_path(conf.script, host)
        return PythonScript(path=path, python=python, args=args, bootstrap=boot)
    if conf.module:
        if not _MODULE_NAME.match(conf.module):
            raise ConfigError("module", "not a module name", conf.module, "expected e.g. pkg.train")
        return PythonModule(name=conf.module, python=python, args=args, bootstrap=boot)
    assert conf.cmd is not None
    return _command(conf.cmd, args, host)


def _script_path(script: str, host: HostFacts) -> str:
    path = os.path.join(host.cwd, os.path.expanduser(script))
    form = "expected the path of a Python file, relative to the current directory"
    if host.is_dir(path):
        raise ConfigError(
            "script", "is a directory", script, form, "Use module=NAME for a package."
        )
    if not host.is_file(path):
        raise ConfigError("script", f"no such file in {host.cwd}", script, form)
    return os.path.abspath(path)


def _command(cmd: str, args: tuple[str, ...], host: HostFacts) -> Command:
    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        raise ConfigError(
            "cmd", f"cannot be split into words ({exc})", cmd, "check its quotes"
        ) from None
    if not words:
        raise ConfigError("cmd", "is empty", cmd, "expected a program, e.g. cmd=./bin/train")
    program = words[0]
    if os.sep in program:
        ok = host.is_executable(os.path.join(host.cwd, os.path.expanduser(program)))
    else:
        ok = bool(host.which(program, host.environ.get("PATH")))
    if not ok:
        raise ConfigError(
            "cmd", "program not found or not executable", program, "expected a program on PATH"
        )
    return Command(program=program, args=(*words[1:], *args))


def resolve_warm(imports: object, entry: Entrypoint) -> WarmSpec:
    """The modules of warm starts (`warm.imports`), checked; () where workers start cold:
    `cmd=` programs and `bootstrap=false` (a fork becomes the user's script through the
    bootstrap, so only a bootstrapped Python worker can be forked warm).

    Raises:
        ConfigError: an entry that is not a module name.
    """
    names: list[str] = []
    for name in imports if isinstance(imports, list | tuple) else [imports]:
        if not isinstance(name, str) or not _MODULE_NAME.match(name):
            raise ConfigError(
                "warm.imports",
                "not a module name",
                name,
                "expected a list of importable modules, e.g. warm.imports=[torch]",
            )
        if name not in names:
            names.append(name)
    if isinstance(entry, Command) or entry.bootstrap is None:
        return WarmSpec()
    return WarmSpec(imports=tuple(names))
