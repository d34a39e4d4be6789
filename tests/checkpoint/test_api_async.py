"""`ckpt.snapshot` writes a copy of the state on a thread of its own: what the training thread
changes after the call never reaches the snapshot, `save_requested` waits for the step asked,
a normal exit for the write in flight, and the states it cannot copy are written as before.

The torch scenarios run in a process of their own (tests/scripts/snapshots_async.py): the
codec uses torch wherever the process imported it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.agent.inherit import SNAPSHOT_LIMIT, SNAPSHOTS
from elastic_hydra.checkpoint import api, codec
from elastic_hydra.checkpoint.keeper import open_area
from elastic_hydra.checkpoint.layout import Area
from tests.conftest import WORKERS

SCENARIOS = WORKERS / "snapshots_async.py"


def scenario(name: str, area: Area, **env: str) -> subprocess.CompletedProcess[str]:
    """Run one scenario as rank 0 of `area`; it must print "ok" and exit 0."""
    environ = {**os.environ, SNAPSHOTS: str(area.root), "RANK": "0", **env}
    done = subprocess.run(
        [sys.executable, str(SCENARIOS), name],
        env=environ, capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stdout + done.stderr
    return done


@pytest.fixture
def area(tmp_path: Path) -> Area:
    return open_area(tmp_path)


def test_a_tensor_changed_in_place_while_its_write_is_in_flight_never_reaches_the_snapshot(
    area: Area,
) -> None:
    scenario("in_place", area)
    assert area.steps(0) == [1]
    assert not [p for p in area.rank_dir(0).iterdir() if p.name.endswith(".part")]


def test_save_requested_waits_for_the_write_of_the_step_asked_and_no_other(area: Area) -> None:
    scenario("save_requested", area)
    assert area.steps(0) == [3, 4]


def test_a_normal_exit_waits_for_the_write_in_flight_so_the_last_step_is_kept(
    area: Area,
) -> None:
    done = scenario("at_exit", area)
    assert "Traceback" not in done.stderr, done.stderr  # the atexit hook's asserts held
    assert area.steps(0) == [7, 8]
    read = (  # torch's file, read where torch may be imported
        "import sys, torch; from pathlib import Path; from elastic_hydra.checkpoint import codec;"
        f" w = codec.read(Path({str(area.snapshot(0, 7))!r}))['w'];"
        " sys.exit(0 if torch.equal(w, torch.full((1000,), 7.0)) else 1)"
    )
    assert subprocess.run([sys.executable, "-c", read], timeout=110, check=False).returncode == 0


def test_states_it_cannot_copy_are_written_before_snapshot_returns(area: Area) -> None:
    done = scenario("as_is", area)
    assert area.steps(0) == [3, 5]  # step 4's lambda is skipped; the newest two are kept
    assert done.stderr.count("the snapshot is skipped: state['fn'] (function) cannot be") == 1


def test_what_the_writer_finds_wrong_is_one_line_and_the_floors_snapshots_are_kept(
    area: Area,
) -> None:
    done = scenario("errors", area, **{SNAPSHOT_LIMIT: str(512 * 1024)})
    lines = done.stderr.splitlines()
    too_big = [line for line in lines if "the snapshot of step 2 is skipped: " in line]
    assert len(too_big) == 1 and "checkpoint.max_memory (524288)" in too_big[0], done.stderr
    full = f"the snapshot of step 3 is skipped: No space left on device in {area.root}"
    assert lines.count(f"elastic-hydra: {full}") == 1, done.stderr
    # From the floor (step 3) on, at most eight: steps 0 and 1 are gone, 2 and 3 never were.
    assert area.steps(0) == list(range(4, 12))


def test_a_plain_state_is_written_before_snapshot_returns(
    area: Area, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No torch here (or no tensor in the state): pickled on the training thread, as before."""
    monkeypatch.setenv(SNAPSHOTS, str(area.root))
    monkeypatch.setenv("RANK", "0")
    threads: list[threading.Thread] = []
    real = codec.write

    def recorded(state: Mapping[str, Any], path: Path) -> int:
        threads.append(threading.current_thread())
        return real(state, path)

    monkeypatch.setattr(codec, "write", recorded)
    area.save_request.write_text('{"step": 1}')
    assert api.snapshot({"total": [0], "lr": 0.1}, step=0) and area.steps(0) == [0]
    assert not api.save_requested()
    assert api.snapshot({"total": [0, 1], "lr": 0.1}, step=1) and area.steps(0) == [0, 1]
    assert api.save_requested()
    assert threads == [threading.current_thread()] * 2
    assert codec.read(area.snapshot(0, 1)) == {"total": [0, 1], "lr": 0.1}
