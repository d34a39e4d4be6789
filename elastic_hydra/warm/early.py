"""The template process, started from the plan or at the agent's very first instant.

The template's imports (`import torch`: over a second of CPU) are the critical path of a warm
launch, and before the plan exists the agent spends a few hundred milliseconds of its own:
Hydra's import and composition, the resolver, the run directory. So when the command line
already says what the template needs, the entry point starts it before any of that (`begin`),
on the second core while the agent composes; the launch then adopts it (`claim`) when its plan
asks for exactly the same template: interpreter, bootstrap, imports, working directory, first
`sys.path` entry and environment, compared as a whole. Any difference stops it and the launch
starts its own from the plan, as it always can (`spawn`).

What the command line must say (`guess`), as plain `key=value` words or at the top level of the
job file: `warm.imports` and `script` or `module`; `nproc_per_node` and `env.*` refine the
environment (`inherit.inherited_env`, without the job's devices). A flag (`-m`, `--plan`, a
torchrun flag: anything Hydra or we would have to read first), a `hydra.*` override or an
interpolation in one of those values leaves the start to the plan.

This module runs before the agent imports anything else of the package: the standard library
and `inherit` only (and yaml, which the composition imports anyway, for a job file).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from elastic_hydra.agent.inherit import CONTRACT, inherited_env

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template.py")
# As resolve.entry.BOOTSTRAP (the claim compares them): the worker's bootstrap, run by path.
BOOTSTRAP = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "bootstrap.py"
)
_BUFFER = 8 << 20  # socket buffers: one request (argv + environment) must fit in one message
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_KEYS = ("warm.imports", "script", "module", "cmd", "nproc_per_node", "bootstrap")


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateArgs:
    """Everything that makes one template: two templates with equal args are the same."""

    python: str
    bootstrap: str
    imports: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    path0: str  # sys.path[0] of the script: its directory, or the cwd for -m


@dataclass(frozen=True, slots=True)
class Template:
    """A started template: its process and the agent's end of its channel."""

    args: TemplateArgs
    proc: subprocess.Popen[bytes]
    chan: socket.socket

    def stop(self) -> None:
        """Close the channel (the template exits at its end of file) and reap it."""
        self.chan.close()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spawn(args: TemplateArgs) -> Template:
    """Start a template (`template.py`, by path, with the job's interpreter).

    Raises:
        OSError: the interpreter cannot be started.
    """
    chan, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (chan, theirs):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
    try:
        proc = subprocess.Popen(
            [args.python, "-u", TEMPLATE, str(os.getpid()), args.bootstrap, args.path0,
             *args.imports],
            stdin=theirs.fileno(),
            stdout=subprocess.DEVNULL,  # the template prints nothing; import warnings: stderr
            env=dict(args.env),
            cwd=args.cwd,
            start_new_session=True,  # a Ctrl-C at the terminal is the agent's to forward
        )  # fmt: skip
    except OSError:
        chan.close()
        raise
    finally:
        theirs.close()
    return Template(args, proc, chan)


_early: Template | None = None


def begin(argv: Sequence[str]) -> None:
    """At the agent's first instant: start the template the command line asks for, if it says
    enough (`guess`). Never fails: a template that cannot start is left to the plan."""
    global _early
    args = guess(argv, os.getcwd(), os.environ, _read_text)
    if args is not None:
        with contextlib.suppress(OSError):
            _early = spawn(args)


def claim(args: TemplateArgs) -> Template | None:
    """The template started at the first instant, when it is the one `args` describes; else
    None (and a different one is stopped)."""
    global _early
    early, _early = _early, None
    if early is None:
        return None
    if early.args == args:
        return early
    early.stop()
    return None


def discard() -> None:
    """Stop a template that no launch claimed (a configuration error, another entrypoint)."""
    global _early
    early, _early = _early, None
    if early is not None:
        early.proc.kill()  # it may be importing: no end of file would be read before it is done
        early.chan.close()
        early.proc.wait()


def guess(
    argv: Sequence[str],
    cwd: str,
    environ: Mapping[str, str],
    read_text: Callable[[str], str | None],
) -> TemplateArgs | None:
    """The template the command line asks for, or None when it does not say it plainly."""
    values: dict[str, object] = {}
    env: dict[str, str] = {}
    words = list(argv[: argv.index("--")] if "--" in argv else argv)
    for i, word in enumerate(words):
        key, eq, value = word.lstrip("+").partition("=")
        if word.startswith(("-", "~")) or key.startswith(("hydra.", "hydra/")):
            return None
        if not eq:
            if i or not word.endswith((".yaml", ".yml")):
                return None  # torchrun's form (a script named first), or not ours to read
            job = _job_file(os.path.join(cwd, word), read_text)
            if job is None:
                return None
            values, env = job
        elif key in _KEYS:
            values[key] = _list(value) if key == "warm.imports" else value
        elif key.startswith("env."):
            env[key[4:]] = value
    return _args(values, env, cwd, environ)


def _args(
    values: Mapping[str, object], env: Mapping[str, str], cwd: str, environ: Mapping[str, str]
) -> TemplateArgs | None:
    imports = values.get("warm.imports")
    if not isinstance(imports, tuple) or not imports or values.get("cmd"):
        return None
    if str(values.get("bootstrap", True)).lower() == "false":
        return None
    script, module = values.get("script"), values.get("module")
    if isinstance(script, str) and script and not module:
        path = os.path.join(cwd, os.path.expanduser(script))
        if not os.path.isfile(path):
            return None
        path0 = os.path.dirname(os.path.realpath(path))
    elif isinstance(module, str) and module and not script:
        path0 = cwd
    else:
        return None
    if any("${" in str(v) for v in (*values.values(), *env.values())):
        return None
    nproc = str(values.get("nproc_per_node", 1))
    inherited = inherited_env(
        environ, env, nproc_per_node=int(nproc) if nproc.isdigit() else os.cpu_count() or 2
    )
    return TemplateArgs(
        python=environ.get("PYTHON_EXEC") or sys.executable,
        bootstrap=BOOTSTRAP,
        imports=imports,
        env={k: v for k, v in inherited.items() if k not in CONTRACT},
        cwd=cwd,
        path0=path0,
    )


def _list(value: str) -> tuple[str, ...] | None:
    """`[torch]`, `[torch, 'transformers']` as Hydra's override grammar writes a list of names."""
    value = value.strip()
    if not (value.startswith("[") and value.endswith("]")):
        return None
    names = tuple(n.strip().strip("'\"") for n in value[1:-1].split(",") if n.strip())
    return names if all(_MODULE.match(n) for n in names) else None


def _job_file(
    path: str, read_text: Callable[[str], str | None]
) -> tuple[dict[str, object], dict[str, str]] | None:
    """The keys `guess` reads from a job file's top level, and its `env` mapping."""
    text = read_text(path)
    if text is None:
        return None
    import yaml  # type: ignore[import-untyped]  # the composition imports it next anyway

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(data, dict):
        return None
    values: dict[str, object] = {k: data[k] for k in _KEYS if k in data}
    warm = data.get("warm")
    if isinstance(warm, dict) and isinstance(warm.get("imports"), list):
        names = tuple(str(n) for n in warm["imports"])
        values["warm.imports"] = names if all(_MODULE.match(n) for n in names) else None
    env = data.get("env") or {}
    if not isinstance(env, dict):
        return None
    return values, {str(k): str(v) for k, v in env.items()}


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(1 << 20)
    except (OSError, UnicodeDecodeError):
        return None
