"""When a hang is found, and how long its workers take to stop.

`hang.timeout` means what it says: the first verdict can come max(hang.warmup, hang.timeout)
seconds after an attempt starts, and `--plan` and a notice at the start say when. Workers whose
stacks were just saved as stuck get `hang.grace` after SIGTERM, not the whole stop_grace.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path

import pytest

from elastic_hydra.agent.events import Finish, Hang, HangWatchStarted, Stopping, WorkersStarted
from elastic_hydra.agent.executor import Executor
from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.plan import HangAction, HangSpec
from elastic_hydra.records.hangs import HangRecord
from tests.agent.test_executor import FakeClock, harness, make_plan
from tests.conftest import WORKERS
from tests.harness import plan_of, run
from tests.launch.test_agent_real import read_events

pytestmark = pytest.mark.timeout(120)


def test_the_first_verdict_comes_after_the_longer_of_timeout_and_warmup() -> None:
    assert HangSpec(timeout=120.0).first_verdict == 120.0  # the default warm-up adds nothing
    assert HangSpec(timeout=120.0, warmup=300.0).first_verdict == 300.0
    assert HangSpec(timeout=None, warmup=300.0).first_verdict is None


class FakeWatch:
    """Finds a hang `after` seconds into each attempt (on the fake clock)."""

    def __init__(self, clock: FakeClock, after: float) -> None:
        self.clock, self.after, self.started = clock, after, 0.0

    def start(self, pids: list[int], node: NodeAssignment, attempt: int) -> None:
        self.started = self.clock.now

    def check(self, running: list[int]) -> HangRecord | None:
        if self.clock.now - self.started < self.after:
            return None
        return HangRecord(verdict="hang after 10 s without progress: ...", idle_s=10.0,
                          timeout_s=10.0, action=HangAction.FAIL, attempt=0, time=0.0)  # fmt: skip

    def last_progress(self) -> float | None:
        return self.started


@pytest.mark.parametrize(("stop_grace", "grace"), [(60.0, 5.0), (2.0, 2.0)])
def test_a_hung_group_is_stopped_with_hang_grace_at_most_stop_grace(
    stop_grace: float, grace: float
) -> None:
    spec = HangSpec(timeout=10.0, action=HangAction.FAIL)
    h = harness({}, plan=dataclasses.replace(make_plan(stop_grace=stop_grace), hang=spec))
    executor = Executor(
        h.plan, rendezvous=h.rdzv, workers=h.factory, clock=h.clock, observer=h.observer,
        stop=h.stop, read_failure=h.read_failure, hang=FakeWatch(h.clock, 10.0),
    )  # fmt: skip
    assert executor.run().exit_code == 1
    assert h.factory.groups[0].stops == [(int(signal.SIGTERM), grace)]
    (stopping,) = h.observer.of(Stopping)
    assert (stopping.hung, stopping.grace, stopping.workers) == (True, grace, 2)
    (watch,) = h.observer.of(HangWatchStarted)
    assert (watch.timeout, watch.warmup, watch.first_verdict) == (10.0, 0.0, 10.0)


def test_plan_says_when_the_first_verdict_can_come(tmp_path: Path) -> None:
    script = f"script={WORKERS / 'hang_probe.py'}"
    shown = {}
    for extra in ("hang.timeout=120", "hang.warmup=600", "hang.timeout=null", "hang.timeout=auto"):
        proc = run(script, extra, "hang.action=fail", "--plan", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        shown[extra] = " ".join(proc.stdout.split())  # the table may fold the row
    assert (
        "hangs first verdict 120 s after an attempt starts at the earliest (the longer of "
        "hang.timeout=120 and hang.warmup=0) a hang: no progress on any rank for 120 s "
        "(hang.timeout) then fail (hang.action); SIGKILL 5 s after SIGTERM (hang.grace)"
        in shown["hang.timeout=120"]
    )
    assert "hangs first verdict 600 s after" in shown["hang.warmup=600"]
    assert "hangs not watched (hang.timeout=null)" in shown["hang.timeout=null"]
    assert (  # the default
        "hangs first verdict 60 s after an attempt starts at the earliest (the longer of 60 s "
        "and hang.warmup=0) a hang: no progress on any rank for 5x the longest gap between the "
        "job's progress events, once 20 gaps were seen after the warm-up, at least 60 s and at "
        "most 300 s (300 s until then; hang.timeout=auto)" in shown["hang.timeout=auto"]
    )
    assert plan_of(script, "hang.timeout=120").hang.first_verdict == 120.0


def test_a_timeout_alone_is_the_time_to_the_first_verdict_and_the_start_says_so(
    tmp_path: Path,
) -> None:
    # Before: hang.warmup's default (300 s) held every verdict back to 300 s.
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    proc = run(
        f"script={WORKERS / 'hang_probe.py'}", "hang.timeout=2", "hang.action=fail",
        "stop_grace=3", f"logs.root={logs}", "--", "wait",
        cwd=tmp_path, env={"OUT_DIR": str(out)}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    run_dir = next(logs.rglob("summary.json")).parent
    timeline = read_events(run_dir)
    started = next(e for e in timeline if isinstance(e, WorkersStarted))
    (watch,) = [e for e in timeline if isinstance(e, HangWatchStarted)]
    (hang,) = [e for e in timeline if isinstance(e, Hang)]
    assert (watch.timeout, watch.warmup, watch.first_verdict) == (2.0, 0.0, 2.0)
    assert 2.0 <= hang.wall_time - started.wall_time < 2.0 + 5
    assert (
        "elastic-hydra: hang watch: 2 s without progress on any rank is a hang, the first "
        "verdict 2 s after the start at the earliest (hang.timeout=2, hang.warmup=0); then fail "
        "(hang.action)" in proc.stderr.splitlines()
    )


def test_hung_workers_that_ignore_sigterm_get_hang_grace_not_stop_grace(tmp_path: Path) -> None:
    # Before: a rank that ignores SIGTERM (as Lightning's handler, which logs and goes on) kept
    # the job for the whole stop_grace after the verdict.
    logs, ready = tmp_path / "logs", tmp_path / "ready"
    stop_grace = 60
    began = time.monotonic()
    proc = run(
        f"script={WORKERS / 'sleeper.py'}", "nproc_per_node=2", "hang.timeout=1",
        "hang.action=fail", "hang.grace=2", f"stop_grace={stop_grace}", "logs.tee=false",
        f"logs.root={logs}",
        "--", "--dir", str(ready), "--ignore-term", "all",
        cwd=tmp_path, timeout=stop_grace + 30,
    )  # fmt: skip
    took = time.monotonic() - began
    assert proc.returncode == 1, proc.stderr
    run_dir = next(logs.rglob("summary.json")).parent
    timeline = read_events(run_dir)
    (stopping,) = [e for e in timeline if isinstance(e, Stopping)]
    finish = next(e for e in timeline if isinstance(e, Finish))
    assert (stopping.hung, stopping.grace, stopping.workers) == (True, 2.0, 2)
    assert 2.0 <= finish.mono_time - stopping.mono_time < stop_grace / 3
    assert took < stop_grace, f"the job took {took:.1f} s"
    line = (
        "elastic-hydra: SIGTERM to the 2 hung worker(s), their stacks saved; SIGKILL after 2 s "
        "(hang.grace)"
    )
    assert line in proc.stderr.splitlines(), proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {e["returncode"] for e in summary["exits"]} == {-9}, summary["exits"]
