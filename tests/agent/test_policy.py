"""The restart policy: pure decisions on a fake clock (plain floats), no sleeps, no processes."""

from __future__ import annotations

import dataclasses
import itertools
import signal

import pytest

from elastic_hydra.agent.restart_policy import Decision, Failure, backoff_delay, decide
from elastic_hydra.plan import (
    DEFAULT_ON_CLASS,
    Action,
    Backoff,
    ClassAction,
    FailureClass,
    RestartSpec,
    RestartWindow,
)

RETRY, FAIL = Action.RETRY, Action.FAIL
SIGKILL = int(signal.SIGKILL)
SIGSEGV = int(signal.SIGSEGV)


def _decide(
    spec: RestartSpec,
    returncode: int = 1,
    *,
    runtime: float = 100.0,
    done: int = 0,
    times: tuple[float, ...] = (),
    now: float = 1000.0,
    u: float = 0.5,
) -> Decision:
    failure = Failure(returncode=returncode, attempt_runtime=runtime)
    return decide(spec, failure, restarts_done=done, restart_times=times, now=now, u=u)


# ------------------------------------------------------------------------------------ backoff
@pytest.mark.parametrize(
    ("k", "expected"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (5, 5.0)],
    ids=["k1", "k2", "k3", "k4-capped", "k5-capped"],
)
def test_backoff_sequence_doubles_up_to_the_maximum(k: int, expected: float) -> None:
    backoff = Backoff(initial=1.0, multiplier=2.0, maximum=5.0)
    assert backoff_delay(backoff, k, 0.5) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("u", "expected"),
    [(0.0, 4.0 * 0.75), (0.5, 4.0), (1.0 - 1e-12, 4.0 * 1.25)],
    ids=["u0-low-edge", "u-half-is-base", "u-below-1-high-edge"],
)
def test_jitter_bounds(u: float, expected: float) -> None:
    backoff = Backoff(initial=4.0, multiplier=2.0, maximum=60.0, jitter=0.25)
    assert backoff_delay(backoff, 1, u) == pytest.approx(expected)


@pytest.mark.parametrize(
    "backoff",
    [Backoff(), Backoff(initial=0.0, jitter=0.5), Backoff(initial=0.0, multiplier=3.0)],
    ids=["default", "zero-with-jitter", "zero-with-multiplier"],
)
def test_zero_initial_means_no_delay(backoff: Backoff) -> None:
    assert all(backoff_delay(backoff, k, 0.99) == 0.0 for k in range(1, 20))


@pytest.mark.parametrize(
    "backoff",
    [
        Backoff(initial=1.0, multiplier=2.0, maximum=5.0, jitter=0.0),
        Backoff(initial=0.5, multiplier=3.0, maximum=30.0, jitter=0.1),
        Backoff(initial=2.0, multiplier=1.0, maximum=2.0, jitter=0.99),
        Backoff(initial=10.0, multiplier=1.5, maximum=1.0, jitter=0.5),
        Backoff(initial=1.0, multiplier=10.0, maximum=60.0, jitter=0.3),
    ],
    ids=["plain", "small-jitter", "flat-big-jitter", "initial-above-max", "fast-growth"],
)
def test_delay_always_within_zero_and_jittered_maximum(backoff: Backoff) -> None:
    bound = backoff.maximum * (1 + backoff.jitter)
    samples = [i / 64 for i in range(64)] + [1.0 - 1e-12]
    # k up to 5000 also checks that multiplier**(k-1) overflowing a float does not raise.
    for k, u in itertools.product([*range(1, 50), 1000, 5000], samples):
        delay = backoff_delay(backoff, k, u)
        assert 0.0 <= delay <= bound * (1 + 1e-9), (k, u, delay)


@pytest.mark.parametrize(
    ("k", "u"), [(0, 0.5), (-1, 0.5), (1, 1.0), (1, -0.1)], ids=["k0", "k-neg", "u1", "u-neg"]
)
def test_backoff_rejects_bad_arguments(k: int, u: float) -> None:
    with pytest.raises(ValueError):
        backoff_delay(Backoff(initial=1.0), k, u)


# ------------------------------------------------------------------------------ restart budget
@pytest.mark.parametrize(
    ("max_restarts", "done", "action", "in_reason"),
    [
        (0, 0, FAIL, "restarts are off (restart.max_restarts=0)"),
        (1, 0, RETRY, "restart 1 of 1 after exit code 1"),
        (1, 1, FAIL, "restart budget spent: 1 of restart.max_restarts=1"),
        (3, 0, RETRY, "restart 1 of 3 after exit code 1"),
        (3, 2, RETRY, "restart 3 of 3 after exit code 1"),
        (3, 3, FAIL, "restart budget spent: 3 of restart.max_restarts=3"),
    ],
    ids=["max0-off", "max1-first", "max1-spent", "max3-first", "max3-last", "max3-spent"],
)
def test_restart_budget(max_restarts: int, done: int, action: Action, in_reason: str) -> None:
    decision = _decide(RestartSpec(max_restarts=max_restarts), done=done)
    assert decision.action is action
    assert in_reason in decision.reason


def test_retry_carries_the_backoff_delay_for_the_next_restart() -> None:
    spec = RestartSpec(max_restarts=5, backoff=Backoff(initial=1.0, multiplier=2.0, maximum=5.0))
    delays = [_decide(spec, done=done).delay for done in range(5)]
    assert delays == pytest.approx([1.0, 2.0, 4.0, 5.0, 5.0])
    assert _decide(spec, done=1).reason == "restart 2 of 5 after exit code 1, in 2.0 s"


# ------------------------------------------------------------------------------ restart window
WINDOWED = RestartSpec(max_restarts=10, window=RestartWindow(max_restarts=3, seconds=60.0))


@pytest.mark.parametrize(
    ("times", "now", "action"),
    [
        ((0.0, 10.0, 20.0), 30.0, FAIL),
        ((0.0, 10.0, 20.0), 61.0, RETRY),
        ((0.0, 10.0, 20.0), 60.0, RETRY),
        ((0.0, 10.0), 30.0, RETRY),
        ((), 30.0, RETRY),
        ((0.0, 70.0, 80.0, 90.0), 100.0, FAIL),
    ],
    ids=["3-in-60s", "oldest-fell-out", "oldest-on-the-edge", "2-in-60s", "none", "3-recent"],
)
def test_restart_window(times: tuple[float, ...], now: float, action: Action) -> None:
    decision = _decide(WINDOWED, done=len(times), times=times, now=now)
    assert decision.action is action
    if action is FAIL:
        assert "restart.window_restarts=3" in decision.reason
        assert "restart.window_seconds=60" in decision.reason


# ----------------------------------------------------------------- per-exit-code, per-signal rules
RULES = RestartSpec(
    max_restarts=3,
    on_exit_code=((3, FAIL), (4, RETRY)),
    on_signal=((SIGKILL, FAIL), (SIGSEGV, RETRY)),
)


@pytest.mark.parametrize(
    ("returncode", "action", "in_reason"),
    [
        (3, FAIL, "exit code 3 is set to fail (restart.on_exit_code)"),
        (4, RETRY, "restart 1 of 3 after exit code 4"),
        (1, RETRY, "restart 1 of 3 after exit code 1"),
        (-SIGKILL, FAIL, "signal SIGKILL (9) is set to fail (restart.on_signal)"),
        (-SIGSEGV, RETRY, "after signal SIGSEGV"),
        (-int(signal.SIGTERM), RETRY, "after signal SIGTERM"),
        (SIGKILL, RETRY, "after exit code 9"),
    ],
    ids=[
        "code-fail",
        "code-retry",
        "code-unlisted",
        "sigkill-fail",
        "sigsegv-retry",
        "signal-unlisted",
        "exit-9-is-not-sigkill",
    ],
)
def test_per_code_and_per_signal_rules(returncode: int, action: Action, in_reason: str) -> None:
    decision = _decide(RULES, returncode)
    assert decision.action is action
    assert in_reason in decision.reason


def test_a_retry_rule_does_not_lift_the_restart_budget() -> None:
    decision = _decide(RULES, 4, done=3)
    assert decision.action is FAIL
    assert "restart.max_restarts=3" in decision.reason


def test_a_fail_rule_wins_even_with_restarts_left() -> None:
    assert _decide(RULES, -SIGKILL, done=0).action is FAIL


def test_unknown_signal_number_is_described_by_number() -> None:
    assert "signal 200" in _decide(RestartSpec(), -200).reason


# ---------------------------------------------------------------------------------- fail fast
FAST = RestartSpec(max_restarts=3, fail_fast_seconds=10.0, on_exit_code=((4, RETRY), (3, FAIL)))


@pytest.mark.parametrize(
    ("returncode", "runtime", "action", "in_reason"),
    [
        (1, 0.4, FAIL, "0.4 s after start, within restart.fail_fast_seconds=10"),
        (1, 10.0, RETRY, "restart 1 of 3"),
        (1, 9.99, FAIL, "restart.fail_fast_seconds=10"),
        (4, 0.4, RETRY, "restart 1 of 3 after exit code 4"),
        (3, 0.4, FAIL, "restart.on_exit_code"),
        (-SIGKILL, 0.4, FAIL, "signal SIGKILL (9) came 0.4 s after start"),
    ],
    ids=[
        "early-fails",
        "at-limit-retries",
        "just-under-fails",
        "explicit-retry-rule-overrides",
        "explicit-fail-rule-named-first",
        "signal-early-fails",
    ],
)
def test_fail_fast(returncode: int, runtime: float, action: Action, in_reason: str) -> None:
    decision = _decide(FAST, returncode, runtime=runtime)
    assert decision.action is action
    assert in_reason in decision.reason


def test_fail_fast_off_by_default() -> None:
    assert _decide(RestartSpec(max_restarts=1), runtime=0.0).action is RETRY


def test_fail_fast_comes_before_the_budget() -> None:
    decision = _decide(FAST, runtime=0.1, done=3)
    assert "restart.fail_fast_seconds" in decision.reason


# ------------------------------------------------------------------------------ decision shape
@pytest.mark.parametrize(
    ("spec", "done"),
    [(RestartSpec(), 0), (RULES, 3), (RULES, 0)],
    ids=["off", "spent", "retry"],
)
def test_fail_has_no_delay_and_reason_is_one_sentence(spec: RestartSpec, done: int) -> None:
    decision = _decide(spec, done=done)
    if decision.action is FAIL:
        assert decision.delay == 0.0
    assert decision.reason
    assert "\n" not in decision.reason


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (Decision(action=FAIL, delay=0.0, reason="x"), "delay"),
        (Failure(returncode=1, attempt_runtime=1.0), "returncode"),
    ],
    ids=["decision", "failure"],
)
def test_results_are_frozen(value: object, field: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, 5)
    assert not hasattr(value, "__dict__")  # slotted


def test_results_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Failure(1, 1.0)  # type: ignore[call-arg]


def test_a_hang_is_named_a_hang_and_ruled_as_exit_code_1() -> None:
    hung = Failure(returncode=1, attempt_runtime=100.0, hung=True)
    spec = RestartSpec(max_restarts=2)
    decision = decide(spec, hung, restarts_done=0, restart_times=(), now=1000.0, u=0.5)
    assert decision.action is RETRY
    assert "after a hang (counted as exit code 1)" in decision.reason
    ruled = dataclasses.replace(spec, on_exit_code=((1, FAIL),))
    decision = decide(ruled, hung, restarts_done=0, restart_times=(), now=1000.0, u=0.5)
    assert decision.action is FAIL and decision.reason.startswith("a hang (counted as exit code 1)")


# ------------------------------------------------------------------------------- failure classes
def _classed(
    spec: RestartSpec, found: FailureClass, *, repeat_of: int | None = None, returncode: int = 1
) -> Decision:
    failure = Failure(
        returncode=returncode, attempt_runtime=100.0, failure_class=found,
        evidence="ImportError at train.py:3", repeat_of=repeat_of,
    )  # fmt: skip
    return decide(spec, failure, restarts_done=0, restart_times=(), now=1000.0, u=0.5)


def test_a_user_error_is_retried_once_and_its_repeat_is_not() -> None:
    spec = RestartSpec(max_restarts=5)
    first = _classed(spec, FailureClass.USER_ERROR)
    assert first.action is RETRY and "(user_error: ImportError at train.py:3)" in first.reason
    again = _classed(spec, FailureClass.USER_ERROR, repeat_of=0)
    assert again.action is FAIL and not again.exclude
    assert again.reason == (
        "not retried: ImportError at train.py:3 (user_error; restart.on_class.user_error=once)"
    )


def test_every_class_has_its_default_and_unknown_is_the_policy_as_before() -> None:
    spec = RestartSpec(max_restarts=5)
    repeated = {c: _classed(spec, c, repeat_of=0).action for c in DEFAULT_ON_CLASS}
    assert repeated == {
        FailureClass.USER_ERROR: FAIL, FailureClass.OOM_HOST: FAIL, FailureClass.OOM_GPU: FAIL,
        FailureClass.INFRA: FAIL, FailureClass.HARDWARE: FAIL, FailureClass.COMM: RETRY,
        FailureClass.HANG: RETRY, FailureClass.UNKNOWN: RETRY,
    }  # fmt: skip
    assert _classed(spec, FailureClass.HARDWARE).exclude
    unknown = _classed(spec, FailureClass.UNKNOWN)
    assert unknown.reason == "restart 1 of 5 after exit code 1, in 0.0 s"  # no class to name


@pytest.mark.parametrize(
    ("on_class", "found", "action"),
    [
        ((FailureClass.USER_ERROR, ClassAction.FAIL), FailureClass.USER_ERROR, FAIL),
        ((FailureClass.USER_ERROR, ClassAction.RETRY), FailureClass.USER_ERROR, RETRY),
        ((FailureClass.HARDWARE, ClassAction.RETRY), FailureClass.HARDWARE, RETRY),
        ((FailureClass.COMM, ClassAction.FAIL), FailureClass.COMM, FAIL),
    ],
    ids=["user_error-fail", "user_error-retry", "hardware-retry", "comm-fail"],
)
def test_the_job_file_overrides_a_class(
    on_class: tuple[FailureClass, ClassAction], found: FailureClass, action: Action
) -> None:
    spec = RestartSpec(max_restarts=5, on_class=(*DEFAULT_ON_CLASS.items(), on_class))
    decided = _classed(spec, found, repeat_of=0)
    assert decided.action is action and not decided.exclude


def test_an_exit_code_or_signal_rule_wins_over_the_class() -> None:
    spec = RestartSpec(max_restarts=5, on_exit_code=((1, RETRY),), on_signal=((SIGKILL, FAIL),))
    assert _classed(spec, FailureClass.USER_ERROR, repeat_of=0).action is RETRY
    assert _classed(spec, FailureClass.HARDWARE).action is RETRY
    killed = _classed(spec, FailureClass.UNKNOWN, returncode=-SIGKILL)
    assert killed.action is FAIL and "restart.on_signal" in killed.reason
