"""torchrun's command line and its PET_* environment, read as elastic-hydra keys. Pure: stdlib only.

    elastic-hydra [--plan] [TORCHRUN FLAGS] [key=value ...] SCRIPT [SCRIPT ARGS ...]

A command is torchrun-style when it names a script (a bare word: neither a flag, a flag's value,
key=value nor a job file) or uses one of torchrun 2.13's flags. Then, as under torchrun:

- every flag in both spellings (`--nproc-per-node`, `--nproc_per_node`), as `--flag=value` or
  `--flag value` (`-r3`, `-t 3` too); the last of a repeated flag wins;
- a flag that is not given takes its value from `PET_<DEST>` (`PET_NNODES`, `PET_NODE_RANK`...),
  torchrun's `env`/`check_env` actions: the command line beats PET_*, `PET_<SWITCH>=0` clears a
  switch; an empty PET_* counts as unset;
- `-m` is torchrun's `--module` when the command names a script (Hydra's multirun otherwise);
- the words after the script are its argv, byte for byte.

`key=value` words before the script stay Hydra overrides: they beat PET_* and torchrun's
defaults; a flag and an override of the same key is refused. A flag whose meaning torchrun
ignores (e.g. `--node-rank` with c10d) becomes a note, never silence; one whose meaning cannot be
kept (`--virtual-local-rank`, a stdout-only redirect...) is refused in one line (`ConfigError`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastic_hydra.errors import ConfigError
from elastic_hydra.torchrun.logs import is_std_spec, logs
from elastic_hydra.torchrun.rdzv import Builder, Given, Setting, number, rendezvous


@dataclass(frozen=True, slots=True)
class Flag:
    """One of torchrun's flags: its argparse dest, whether it is a switch, its short option."""

    dest: str
    switch: bool = False
    short: str | None = None
    pet: bool = True  # read from PET_<DEST> (all but --logs-specs and --numa-binding)

    @property
    def options(self) -> tuple[str, ...]:
        dashed = "--" + self.dest.replace("_", "-")
        long = (dashed, "--" + self.dest) if "_" in self.dest else (dashed,)
        return (*long, *((self.short,) if self.short else ()))

    @property
    def pet_name(self) -> str:
        return "PET_" + self.dest.upper()


# torch 2.13's torch/distributed/run.py, in its order (a test compares with its parser).
FLAGS = (
    Flag("nnodes"), Flag("nproc_per_node"), Flag("rdzv_backend"), Flag("rdzv_endpoint"),
    Flag("rdzv_id"), Flag("rdzv_conf"), Flag("standalone", switch=True), Flag("max_restarts"),
    Flag("monitor_interval"), Flag("start_method"), Flag("event_log_handler"), Flag("role"),
    Flag("module", switch=True, short="-m"), Flag("no_python", switch=True),
    Flag("run_path", switch=True), Flag("log_dir"), Flag("redirects", short="-r"),
    Flag("tee", short="-t"), Flag("local_ranks_filter"), Flag("duplicate_stdout_filters"),
    Flag("duplicate_stderr_filters"), Flag("node_rank"), Flag("master_addr"),
    Flag("master_port"), Flag("local_addr"), Flag("logs_specs", pet=False),
    Flag("numa_binding", pet=False), Flag("signals_to_handle"), Flag("shutdown_timeout"),
    Flag("virtual_local_rank", switch=True),
)  # fmt: skip
_BY_OPTION = {option: flag for flag in FLAGS for option in flag.options}
ENTRYPOINT_KEYS = ("script", "module", "cmd")
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's, and our stop signals
_AFTER_SCRIPT = (
    "the script's own arguments go after the script path (elastic-hydra train.py --lr 0.1) "
    "or after -- (script=train.py -- --lr 0.1)"
)


# ------------------------------------------------------------------------------ the command line
def take_flag(argv: Sequence[str], i: int) -> tuple[str, Given, int] | None:
    """torchrun's flag at `argv[i]`: (dest, its value, the index of the next word), or None.

    `-m` is left to the caller (torchrun's --module or Hydra's multirun), and so is `-r` unless a
    redirect spec follows it (else it is Hydra's `-r/--run`).

    Raises:
        ConfigError: a flag without its value, or a switch given a value.
    """
    word = argv[i]
    name, eq, attached = word.partition("=")
    if name not in _BY_OPTION and word[:2] in ("-r", "-t") and len(word) > 2:
        name, eq, attached = word[:2], "=", word[2:]  # -r3, as argparse reads short options
    flag = _BY_OPTION.get(name)
    if flag is None or name == "-m":
        return None
    if flag.switch:
        if eq:
            raise ConfigError(name, "takes no value", word, f"expected {name} alone")
        return flag.dest, Given(name=name, value=True, shown=name, explicit=True), i + 1
    if eq:
        value, after = attached, i + 1
    elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
        value, after = argv[i + 1], i + 2
    elif name == "-r":
        return None
    else:
        raise ConfigError(name, "needs a value", word, f"expected {name}=VALUE")
    if name == "-r" and not is_std_spec(value):
        if value and set(value) <= set("0123456789:,"):  # meant as a spec: never a script name
            shown = argv[i] if eq else f"{name} {value}"
            raise ConfigError(name, "not a redirect spec", shown, "expected 0-3 or e.g. 0:3,1:0")
        return None
    return flag.dest, Given(name=name, value=value, shown=f"{name}={value}", explicit=True), after


def unknown_flag(word: str) -> ConfigError:
    """The one line for a word that starts with `-` and is neither ours, Hydra's nor torchrun's."""
    name = word.partition("=")[0]
    near = sorted({f.options[0] for f in FLAGS for o in f.options if o.startswith(name)})
    hint = ""
    if name.startswith("--") and len(name) > 2 and len(near) == 1:
        hint = f"Did you mean {near[0]}? Abbreviated flags are not accepted."
    return ConfigError(name, "not an elastic-hydra or torchrun flag", word, _AFTER_SCRIPT, hint)


def with_environment(given: Mapping[str, Given], environ: Mapping[str, str]) -> dict[str, Given]:
    """The flags of the command line, and for each one not given its PET_* variable.

    Raises:
        ConfigError: a PET_* switch that is not an integer (torchrun: `bool(int(value))`).
    """
    values = dict(given)
    for flag in FLAGS:
        raw = environ.get(flag.pet_name, "")
        if flag.dest in values or not flag.pet or raw == "":
            continue
        shown = f"{flag.pet_name}={raw}"
        if flag.switch:
            try:
                if not int(raw):
                    continue
            except ValueError:
                raise ConfigError(
                    flag.pet_name, "is not 0 or 1", raw, f"expected {flag.pet_name}=1 or unset"
                ) from None
            values[flag.dest] = Given(name=flag.pet_name, value=True, shown=shown, explicit=False)
        else:
            values[flag.dest] = Given(name=flag.pet_name, value=raw, shown=shown, explicit=False)
    return values


def pet_in(environ: Mapping[str, str]) -> list[str]:
    """The PET_* variables of torchrun's flags that are set (non-empty) in `environ`."""
    return [f.pet_name for f in FLAGS if f.pet and environ.get(f.pet_name, "")]


# ----------------------------------------------------------------------------------- translation
@dataclass(frozen=True, slots=True, kw_only=True)
class Translation:
    """What a torchrun-style command means here: settings (key -> value) and notes to show."""

    settings: tuple[Setting, ...]
    notes: tuple[str, ...]


def translate(
    values: Mapping[str, Given],
    script: str | None,
    environ: Mapping[str, str],
    *,
    job: bool = False,
) -> Translation:
    """torchrun's flags (from `with_environment`) and its script, as elastic-hydra settings.

    Args:
        values: the flags by dest, PET_* included.
        script: the script (or module, or program) the command names, if any.
        environ: where torchrun's other variables are read (TORCH_ELASTIC_SHUTDOWN_TIMEOUT...).
        job: the command also names a job file (whose own entrypoint the script replaces).

    Raises:
        ConfigError: a flag elastic-hydra cannot honour, or a malformed value.
    """
    b = Builder()
    _refusals(values)
    _entrypoint(b, values, script, job)
    nproc = _size(b, values)
    rendezvous(b, values)
    _runtime(b, values, environ)
    _signals(b, values)
    logs(b, values, nproc, environ)
    return Translation(settings=tuple(b.settings), notes=tuple(b.notes))


def beside(settings: Sequence[Setting], overrides: Sequence[str]) -> list[Setting]:
    """The settings that the user's own `key=value` overrides leave standing.

    An override beats a setting from PET_* or one torchrun would infer; against a flag on the
    command line it is a conflict.

    Raises:
        ConfigError: a key given both as a torchrun flag and as an override.
    """
    given = {_base_key(o.partition("=")[0]): o for o in overrides if "=" in o}
    kept = []
    for s in settings:
        override = given.get(_base_key(s.key))
        if override is None:
            kept.append(s)
        elif s.source is not None and s.source.explicit:
            raise ConfigError(
                s.key, f"given twice, as {s.source.shown} and as an override", override,
                "keep one of them",
            )  # fmt: skip
    return kept


def _base_key(key: str) -> str:
    key = key.lstrip("+~").partition("@")[0]
    return "rdzv" if key == "rdzv.backend" else key


def _refusals(v: Mapping[str, Given]) -> None:
    """Flags with no equivalent here: one line each, naming what to do instead."""
    refused = {
        "virtual_local_rank": "devices=isolate gives each worker only its own GPU (cuda:0) but "
        "keeps LOCAL_RANK; index devices with cuda:0 there.",
        "duplicate_stdout_filters": "Every rank's output is in its log files in the run dir; grep "
        "those.",
        "logs_specs": "elastic-hydra writes its own layout: per-rank logs under logs.root.",
    }
    refused["duplicate_stderr_filters"] = refused["duplicate_stdout_filters"]
    for dest, instead in refused.items():
        if (g := v.get(dest)) is not None:
            raise ConfigError(g.name, "not supported by elastic-hydra", g.shown, "drop it", instead)
    if (g := v.get("event_log_handler")) is not None and g.value != "null":
        raise ConfigError(
            g.name, "not supported by elastic-hydra", g.shown, "drop it (or give null)",
            "Every run writes its events to events.jsonl in its run dir.",
        )  # fmt: skip


def _signals(b: Builder, v: Mapping[str, Given]) -> None:
    """--signals-to-handle: the four stop signals are always handled; a subset gets a note."""
    if (g := v.get("signals_to_handle")) is None:
        return
    names = {s.strip() for s in str(g.value).split(",") if s.strip()}
    if not names <= set(DEFAULT_SIGNALS):
        raise ConfigError(
            g.name, "elastic-hydra stops on SIGTERM, SIGINT, SIGHUP and SIGQUIT only, "
            "forwarding the signal to the workers", g.shown, "drop it, or name only those",
            "For Slurm's warning before the time limit use srun --signal=TERM@120.",
        )  # fmt: skip
    if names != set(DEFAULT_SIGNALS):
        b.note(
            f"{g.shown}: elastic-hydra stops on SIGTERM, SIGINT, SIGHUP and SIGQUIT alike, "
            "forwarding the signal to the workers (TORCHELASTIC_SIGNALS_TO_HANDLE names all four)"
        )


def _entrypoint(b: Builder, v: Mapping[str, Given], script: str | None, job: bool) -> None:
    """The positional script as script=, module= (-m) or cmd= (--no-python)."""
    module, no_python, run_path = v.get("module"), v.get("no_python"), v.get("run_path")
    method = v.get("start_method")
    if method is not None and method.value not in ("spawn", "fork", "forkserver"):
        raise ConfigError(method.name, "not a start method", method.shown, "expected spawn")
    if module is not None and (run_path or no_python):
        other = run_path or no_python
        assert other is not None
        raise ConfigError(
            module.name, f"cannot be combined with {other.name}", other.shown, "drop one of them"
        )
    if run_path is not None:
        if method is not None and method.value != "spawn":
            raise ConfigError(
                method.name, "elastic-hydra starts every worker as a fresh interpreter (spawn)",
                method.shown, "drop it, or give spawn",
            )  # fmt: skip
        if no_python is not None:
            b.note(f"{no_python.shown} is ignored with --run-path, as torchrun ignores it")
        no_python = None
    elif method is not None and method.value != "spawn":
        b.note(f"{method.shown} only matters to torchrun's --run-path; scripts start as fresh "
               "processes either way")  # fmt: skip
    if script is None:
        if given := (module or no_python or run_path):
            raise ConfigError(
                given.name, "names no program", given.shown,
                "expected the script or module after the flags, e.g. -m pkg.train",
            )  # fmt: skip
        return
    key = "module" if module else "cmd" if no_python else "script"
    source = Given(name=key, value=script, shown=script, explicit=True)
    b.set(key, shlex.quote(script) if key == "cmd" else script, source)
    for entry in ENTRYPOINT_KEYS if job else ():  # the job's own entrypoint goes
        if entry != key:
            b.set(entry, None, source)


def _size(b: Builder, v: Mapping[str, Given]) -> int | None:
    """nnodes and nproc_per_node; returns the worker count when it is a number."""
    if (g := v.get("nnodes")) is not None:
        text = str(g.value).strip()
        b.set("nnodes", int(text) if text.isdigit() else text, g)
    g = v.get("nproc_per_node")
    if g is None:
        return None
    text = str(g.value).strip()
    if text in ("gpu", "cpu", "auto"):
        b.set("nproc_per_node", text, g)
        return None
    try:
        count = int(text)
    except ValueError:
        hint = "elastic-hydra counts NVIDIA GPUs only." if text == "xpu" else ""
        raise ConfigError(
            g.name, "not a worker count", g.shown, "expected a number, gpu, cpu or auto", hint
        ) from None
    b.set("nproc_per_node", count, g)
    return count


def _runtime(b: Builder, v: Mapping[str, Given], environ: Mapping[str, str]) -> None:
    """Restarts, the monitor interval, the role and the stop grace."""
    if (g := v.get("max_restarts")) is not None:
        b.set("restart.max_restarts", number(g, int, "3"), g)
    if (g := v.get("monitor_interval")) is not None:
        b.set("monitor_interval", number(g, float, "0.1"), g)
    if (g := v.get("role")) is not None:
        b.set("role", str(g.value), g)
    g = v.get("shutdown_timeout")
    fallback = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "")
    if g is None and fallback:  # torchrun's own fallback for --shutdown-timeout
        name = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
        g = Given(name=name, value=fallback, shown=f"{name}={fallback}", explicit=False)
    if g is not None:
        b.set("stop_grace", number(g, int, "30"), g)
    if (g := v.get("numa_binding")) is not None:
        if g.value != "exclusive":
            raise ConfigError(
                g.name, "only exclusive has an equivalent here", g.shown,
                "expected exclusive, or drop it",
                "cpu_bind=true gives each worker its own CPUs of its GPU's NUMA node.",
            )  # fmt: skip
        b.set("cpu_bind", True, g)
