"""Stop signals: one recorded before the agent's flag took over is the agent's stop too."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from elastic_hydra import stopsignals
from elastic_hydra.agent.worker_env import to_workers
from elastic_hydra.stopsignals import HANDLED, SAVE_SIGNAL, STOP_SIGNALS, StopFlag, handle_signals


@pytest.fixture
def recorded() -> Iterator[list[int]]:
    """The early record of stop signals, emptied again after the test."""
    try:
        yield stopsignals._received
    finally:
        stopsignals._received.clear()


def test_a_signal_recorded_after_the_flag_was_made_still_stops_the_agent(
    recorded: list[int],
) -> None:
    # The agent makes its flag from the early record, sets up its files, cgroup and guard, then
    # routes the signals to the flag: a Ctrl-C in between was recorded, and must not be lost.
    flag = StopFlag(stopsignals.pending_signal())
    try:
        recorded.append(signal.SIGINT)
        with handle_signals(flag):
            assert flag.signum == signal.SIGINT
    finally:
        flag.close()


def test_a_flag_made_from_the_record_counts_it_once(recorded: list[int]) -> None:
    recorded.append(signal.SIGTERM)
    flag = StopFlag(stopsignals.pending_signal())
    try:
        with handle_signals(flag):
            assert (flag.signum, flag.count) == (signal.SIGTERM, 1)  # a second would hurry
    finally:
        flag.close()


def test_a_save_request_stops_the_workers_with_sigterm_and_every_other_signal_is_forwarded() -> (
    None
):
    assert to_workers(SAVE_SIGNAL) == signal.SIGTERM  # worker_env names SIGUSR1 for it
    assert [to_workers(s) for s in STOP_SIGNALS] == list(STOP_SIGNALS)
    assert SAVE_SIGNAL in HANDLED and SAVE_SIGNAL not in STOP_SIGNALS
