"""What happens after a worker-group failure: retry (after a delay) or fail, and why.

Pure: no I/O, no clock, no randomness of its own. The caller passes the monotonic times and a
uniform sample `u`, so every decision is reproducible in a test.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from elastic_hydra.plan import Action, Backoff, ClassAction, FailureClass, RestartSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """One failed attempt of the worker group."""

    returncode: int  # Popen-style: >0 exit code, <0 killed by signal -returncode
    attempt_runtime: float  # seconds from the attempt's start to the failure
    hung: bool = False  # a hang verdict (hang.action=restart), counted as exit code 1
    failure_class: FailureClass = FailureClass.UNKNOWN
    evidence: str = ""  # what decided the class
    repeat_of: int | None = None  # the earlier attempt that ended the same way


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The verdict on a failure."""

    action: Action  # Action.RETRY or Action.FAIL
    delay: float  # seconds to wait before restarting (0 for FAIL)
    reason: str  # one human sentence naming the config key that would change it
    exclude: bool = False  # FAIL because this node leaves the job (restart.on_class: exclude)


def backoff_delay(backoff: Backoff, restart_number: int, u: float) -> float:
    """The delay before restart `restart_number`, jittered by the uniform sample `u`.

    Args:
        backoff: The backoff settings.
        restart_number: Which restart this is, counting from 1.
        u: A uniform sample in [0, 1); 0.5 gives the un-jittered delay.

    Returns:
        `min(initial * multiplier**(k-1), maximum) * (1 + jitter*(2u-1))`, never negative.

    Raises:
        ValueError: `restart_number` is below 1 or `u` is outside [0, 1).
    """
    if restart_number < 1:
        raise ValueError(f"restart_number must be at least 1, got {restart_number}")
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    if backoff.initial <= 0:
        return 0.0
    try:
        grown = backoff.initial * backoff.multiplier ** (restart_number - 1)
    except OverflowError:  # float ** raises instead of returning inf; a long run can get here
        grown = math.inf
    base = min(grown, backoff.maximum)
    return max(0.0, base * (1.0 + backoff.jitter * (2.0 * u - 1.0)))


def decide(
    spec: RestartSpec,
    failure: Failure,
    *,
    restarts_done: int,
    restart_times: Sequence[float],
    now: float,
    u: float,
) -> Decision:
    """Decide whether to restart the worker group after `failure`.

    Checked in order: a per-signal / per-exit-code `fail` rule, fail-fast (unless a `retry` rule
    matched), the restart budget, the restart window; otherwise retry after the backoff delay.

    Args:
        spec: The restart policy.
        failure: The failure to decide on.
        restarts_done: Restarts already made in this run.
        restart_times: Monotonic times of the previous restarts.
        now: Monotonic time of this decision.
        u: A uniform sample in [0, 1) for the backoff jitter.

    Returns:
        The decision, with a one-sentence reason.
    """
    what = "a hang (counted as exit code 1)" if failure.hung else _describe(failure.returncode)
    rule, _ = _matching_rule(spec, failure.returncode)
    if rule is None and (by_class := _class_decision(spec, failure)) is not None:
        return by_class
    if failure.failure_class not in (FailureClass.UNKNOWN, FailureClass.HANG):
        what = f"{what} ({_classed(failure)})"
    refusal = _rule_refusal(spec, failure, what) or _limit_refusal(
        spec, what, restarts_done, restart_times, now
    )
    if refusal is not None:
        return Decision(action=Action.FAIL, delay=0.0, reason=refusal)
    delay = backoff_delay(spec.backoff, restarts_done + 1, u)
    reason = f"restart {restarts_done + 1} of {spec.max_restarts} after {what}, in {_secs(delay)} s"
    return Decision(action=Action.RETRY, delay=delay, reason=reason)


def _class_decision(spec: RestartSpec, failure: Failure) -> Decision | None:
    """Not retried for its class (`restart.on_class`), or None for the rest of the policy to
    decide. A rule for its exit code or signal wins over its class (the caller checks)."""
    found = failure.failure_class
    action = spec.class_action(found)
    key = f"restart.on_class.{found.value}={action.value}"
    why = failure.evidence or _describe(failure.returncode)
    repeated = action is ClassAction.ONCE and failure.repeat_of is not None
    if action is ClassAction.FAIL or repeated:
        return Decision(
            action=Action.FAIL, delay=0.0, reason=f"not retried: {why} ({found}; {key})"
        )
    if action is ClassAction.EXCLUDE:
        return Decision(
            action=Action.FAIL, delay=0.0, exclude=True,
            reason=f"this node leaves the job: {why} ({found}; {key})",
        )  # fmt: skip
    return None


def _classed(failure: Failure) -> str:
    """`user_error: ImportError at train.py:3`, or the class alone."""
    found = failure.failure_class.value
    return f"{found}: {failure.evidence}" if failure.evidence else found


def _rule_refusal(spec: RestartSpec, failure: Failure, what: str) -> str | None:
    """Why a per-code/per-signal `fail` rule or fail-fast stops the job; None if neither does."""
    rule, key = _matching_rule(spec, failure.returncode)
    if rule is Action.FAIL:
        return f"{what} is set to fail ({key})"
    fast = spec.fail_fast_seconds
    if fast > 0 and failure.attempt_runtime < fast and rule is not Action.RETRY:
        return (
            f"{what} came {failure.attempt_runtime:.3g} s after start, "
            f"within restart.fail_fast_seconds={fast:g}"
        )
    return None


def _limit_refusal(
    spec: RestartSpec, what: str, restarts_done: int, restart_times: Sequence[float], now: float
) -> str | None:
    """Why the restart budget or the restart window stops the job; None if neither does."""
    if spec.max_restarts == 0:
        return f"{what} and restarts are off (restart.max_restarts=0)"
    if restarts_done >= spec.max_restarts:
        return (
            f"{what} with the restart budget spent: "
            f"{restarts_done} of restart.max_restarts={spec.max_restarts}"
        )
    if (window := spec.window) is None:
        return None
    recent = sum(1 for t in restart_times if now - window.seconds < t <= now)
    if recent < window.max_restarts:
        return None
    return (
        f"{what} with {recent} restarts already in the last {window.seconds:g} s "
        f"(restart.window_restarts={window.max_restarts}, "
        f"restart.window_seconds={window.seconds:g})"
    )


def _matching_rule(spec: RestartSpec, returncode: int) -> tuple[Action | None, str]:
    """The first rule for this return code and the config key it came from, if any."""
    if returncode < 0:
        rules, key = spec.on_signal, "restart.on_signal"
    else:
        rules, key = spec.on_exit_code, "restart.on_exit_code"
    code = abs(returncode)
    return next((action for number, action in rules if number == code), None), key


def _describe(returncode: int) -> str:
    """`exit code 3` or `signal SIGKILL (9)`."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name} ({-returncode})"
    except ValueError:
        return f"signal {-returncode}"


def _secs(value: float) -> str:
    return f"{value:.1f}" if value == 0 or value >= 0.1 else f"{value:.3f}"
