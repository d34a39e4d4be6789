"""What runs around the workers: the restart policy, the console and log files, hang detection,
the extra environment, the role name, and durations in seconds.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import string
from collections.abc import Callable, Mapping
from typing import Any

from elastic_hydra.config.schema import HangConf, LogsConf, MetricsConf, RestartConf, StragglerConf
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import (
    DEFAULT_ON_CLASS,
    DEFAULT_PREFIX,
    LEARNED,
    MULTINODE_PREFIX,
    Action,
    Backoff,
    ClassAction,
    FailureClass,
    HangAction,
    HangSpec,
    LogSpec,
    MetricsSpec,
    RestartSpec,
    RestartWindow,
    StragglerAction,
    StragglerSpec,
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ROLE = re.compile(r"[\w.-]{1,64}\Z")
_PREFIX_SPEC = re.compile(r"[<>^]?(1[0-6]|[1-9])?\Z")


def resolve_restart(r: RestartConf) -> RestartSpec:
    if r.max_restarts < 0:
        raise ConfigError(
            "restart.max_restarts", "is negative", r.max_restarts, "expected 0 (never) or more"
        )
    b = r.backoff
    seconds("restart.backoff.initial", b.initial, allow_zero=True)
    seconds("restart.backoff.max", b.max, allow_zero=True)
    if b.multiplier < 1:
        raise ConfigError("restart.backoff.multiplier", "below 1", b.multiplier, "expected >= 1")
    if not 0 <= b.jitter < 1:
        raise ConfigError(
            "restart.backoff.jitter", "out of range", b.jitter, "expected a fraction in [0, 1)"
        )
    window = None
    if (r.window_restarts is None) != (r.window_seconds is None):
        raise ConfigError(
            "restart.window_seconds" if r.window_restarts is None else "restart.window_restarts",
            "set without its pair",
            r.window_seconds if r.window_restarts is None else r.window_restarts,
            "expected both restart.window_restarts and restart.window_seconds, or neither",
        )
    if r.window_restarts is not None and r.window_seconds is not None:
        if r.window_restarts < 1:
            raise ConfigError(
                "restart.window_restarts", "must be at least 1", r.window_restarts, "e.g. 5"
            )
        window = RestartWindow(
            max_restarts=r.window_restarts,
            seconds=seconds("restart.window_seconds", r.window_seconds),
        )
    on_exit_code = _rules("restart.on_exit_code", r.on_exit_code, _exit_code)
    on_signal = _rules("restart.on_signal", r.on_signal, _signal_number)
    return RestartSpec(
        max_restarts=r.max_restarts,
        backoff=Backoff(initial=b.initial, maximum=b.max, multiplier=b.multiplier, jitter=b.jitter),
        window=window,
        on_exit_code=on_exit_code,
        on_signal=on_signal,
        fail_fast_seconds=seconds("restart.fail_fast_seconds", r.fail_fast_seconds, True),
        on_class=_on_class(r.on_class),
    )


def _on_class(rules: Mapping[Any, str]) -> tuple[tuple[FailureClass, ClassAction], ...]:
    """The defaults (plan.DEFAULT_ON_CLASS), then each `restart.on_class.NAME=ACTION`."""
    out = dict(DEFAULT_ON_CLASS)
    known = ", ".join(c.value for c in out)
    for name, action in rules.items():
        key = f"restart.on_class.{name}"
        try:
            found = FailureClass(str(name).strip().lower())
        except ValueError:
            raise ConfigError(
                key, "not a failure class", name, f"expected one of {known}"
            ) from None
        if found not in out:
            raise ConfigError(
                key, "the restart policy never sees this class", name,
                f"it ends a run whatever the policy says; expected one of {known}",
            )  # fmt: skip
        try:
            out[found] = ClassAction(str(action).strip().lower())
        except ValueError:
            raise ConfigError(
                key, "unknown action", action, "expected retry, once, fail or exclude"
            ) from None
    return tuple(out.items())


def _rules(
    key: str, rules: Mapping[Any, str], parse: Callable[[object], int]
) -> tuple[tuple[int, Action], ...]:
    out: dict[int, Action] = {}
    for name, action in rules.items():
        number = parse(name)
        if number in out:
            raise ConfigError(f"{key}.{name}", "a second rule for the same code", name, "keep one")
        out[number] = _action(f"{key}.{name}", action)
    return tuple(out.items())


def _exit_code(key: object) -> int:
    text = str(key).strip()
    if not text.isdigit() or not 0 < int(text) < 256:
        raise ConfigError(
            f"restart.on_exit_code.{key}",
            "not an exit code",
            key,
            "expected 1..255, e.g. {3: fail}",
        )
    return int(text)


def _signal_number(key: object) -> int:
    name = str(key).strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ConfigError(
            f"restart.on_signal.{key}", "unknown signal", key, "expected a name, e.g. SIGKILL"
        ) from None


def _action(key: str, value: str) -> Action:
    try:
        return Action(value.strip().lower())
    except ValueError:
        raise ConfigError(key, "unknown action", value, "expected retry or fail") from None


PREFIX_FIELDS = ("role", "rank", "local_rank", "host", "node_rank")
MAX_MERGE = 60.0  # seconds: a console line held longer than this is no longer live output


def resolve_logs(logs: LogsConf, nproc: int, *, several_nodes: bool) -> LogSpec:
    """The log settings; on several nodes the default prefix also names the host."""
    ranks = None
    if logs.ranks is not None:
        bad = [r for r in logs.ranks if not 0 <= r < nproc]
        if bad:
            raise ConfigError(
                "logs.ranks",
                f"no such local rank with nproc_per_node={nproc}",
                bad[0],
                f"expected local ranks in 0..{nproc - 1}",
            )
        ranks = frozenset(logs.ranks)
    prefix = _prefix(logs.prefix)
    if several_nodes and prefix == DEFAULT_PREFIX:
        prefix = MULTINODE_PREFIX
    if logs.tail_lines < 0:
        raise ConfigError("logs.tail_lines", "is negative", logs.tail_lines, "expected 0 or more")
    if not 0 <= logs.merge <= MAX_MERGE:  # also NaN
        raise ConfigError(
            "logs.merge", "is out of range", logs.merge,
            f"expected seconds from 0 (off) to {MAX_MERGE:g}, e.g. logs.merge=1",
        )  # fmt: skip
    return LogSpec(
        tee=logs.tee and not logs.quiet,
        quiet=logs.quiet,
        console_ranks=ranks,
        prefix=prefix,
        tail_lines=logs.tail_lines,
        merge=logs.merge,
    )


def resolve_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigError(
                f"env.{name}",
                "not a valid variable name",
                name,
                "expected letters, digits and _ (no leading digit), e.g. env.NCCL_DEBUG=INFO",
            )
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"env.{name}",
                "not a plain value",
                "<a mapping>",
                "expected text, e.g. env.NAME=value",
            )
        if "\0" in str(value):
            raise ConfigError(f"env.{name}", "contains a NUL byte", value, "expected plain text")
    return tuple((str(k), str(v)) for k, v in env.items())


def seconds(key: str, value: float, allow_zero: bool = False) -> float:
    """A duration in seconds: positive, or also zero where `allow_zero`."""
    if value < 0 or (value == 0 and not allow_zero):
        if allow_zero:
            raise ConfigError(key, "is negative", value, "expected seconds >= 0")
        raise ConfigError(key, "must be positive", value, "expected seconds > 0")
    return float(value)


def resolve_role(value: str) -> str:
    """ROLE_NAME and the console prefix: a name, not text that moves the cursor."""
    if not _ROLE.match(value):
        raise ConfigError(
            "role", "not a role name", value,
            "expected 1-64 letters, digits, '_', '-' or '.', e.g. role=trainer",
        )  # fmt: skip
    return value


def _prefix(value: str) -> str:
    """The console prefix: only the fields PREFIX_FIELDS, a bounded width, no control bytes."""
    form = "expected text with {role}, {rank}, {local_rank}, {host} or {node_rank}, e.g. " + (
        "'[{role}{local_rank}]:'"
    )
    if len(value) > 64 or any(not ch.isprintable() for ch in value):
        raise ConfigError("logs.prefix", "too long or holds control characters", value, form)
    try:
        fields = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise ConfigError("logs.prefix", f"bad format ({exc})", value, form) from None
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in PREFIX_FIELDS or conversion or "{" in (spec or ""):
            raise ConfigError("logs.prefix", f"bad format field {{{name}}}", value, form)
        if spec and not _PREFIX_SPEC.match(spec):
            raise ConfigError(
                "logs.prefix", f"bad width {spec!r}", value, "expected e.g. {rank:>3} (width <= 16)"
            )
    return value


def resolve_hang(h: HangConf) -> HangSpec:
    try:
        action = HangAction(str(h.action).strip().lower())
    except ValueError:
        raise ConfigError(
            "hang.action", "not a hang action", h.action, "expected report, restart or fail"
        ) from None
    learned, timeout = _hang_timeout(h.timeout)
    return HangSpec(
        timeout=timeout,
        learned=learned,
        warmup=seconds("hang.warmup", h.warmup, True),
        action=action,
        grace=seconds("hang.grace", h.grace, True),
    )


def resolve_straggler(s: StragglerConf) -> StragglerSpec:
    try:
        action = StragglerAction(str(s.action).strip().lower())
    except ValueError:
        raise ConfigError(
            "straggler.action", "not a straggler action", s.action, "expected report, fail or off"
        ) from None
    if isinstance(s.window, bool) or not 2 <= s.window <= 1000:
        raise ConfigError(
            "straggler.window", "out of range", s.window, "expected 2 to 1000 collectives"
        )
    return StragglerSpec(
        action=action, window=s.window, behind=seconds("straggler.behind", s.behind, True)
    )


def _hang_timeout(value: object) -> tuple[bool, float | None]:
    """hang.timeout: (learned, the timeout or, learned, its cap); auto, seconds or null."""
    if value is None:
        return False, None
    if isinstance(value, str) and value.strip().lower() == "auto":
        return True, LEARNED.timeout
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None or not math.isfinite(number):
        raise ConfigError(
            "hang.timeout", "not a timeout", value, "expected seconds > 0, auto or null"
        )
    return False, seconds("hang.timeout", number)


def resolve_metrics(m: MetricsConf) -> MetricsSpec:
    """metrics.port: a port or 0; metrics.textfile: a file path (relative: to the directory the
    launch runs in)."""
    port = m.port
    if port is not None and (type(port) is not int or not 0 <= port <= 65535):
        raise ConfigError(
            "metrics.port", "not a port", port, "expected 1..65535, 0 for a free one, or null"
        )
    textfile = m.textfile
    if textfile is not None and (not str(textfile).strip() or str(textfile).endswith("/")):
        raise ConfigError(
            "metrics.textfile", "not a file path", textfile,
            "expected e.g. /var/lib/node_exporter/textfile/elastic_hydra.prom",
        )  # fmt: skip
    return MetricsSpec(port=port, textfile=textfile)
