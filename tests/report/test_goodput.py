"""The goodput ledger from synthetic timelines: each phase boundary, lost work, sums."""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from pathlib import Path

import pytest

from elastic_hydra.agent import events as ev
from elastic_hydra.agent.events import ChangeKind
from elastic_hydra.agent.outcome import Status
from elastic_hydra.gpus import Gpu, WorkerDevices
from elastic_hydra.plan import HangAction
from elastic_hydra.records.goodput import Ledger, Phase
from elastic_hydra.records.summary import RunSummary
from elastic_hydra.report import goodput
from elastic_hydra.report.summary import node_ledger
from tests.conftest import WORKERS
from tests.harness import plan_of, run

WALL = 1_000_000.0  # wall clock = monotonic + WALL in these timelines


def at(t: float) -> ev.Stamp:
    return ev.Stamp(wall_time=WALL + t, mono_time=t)


def started(t: float, attempt: int, n: int = 2) -> ev.WorkersStarted:
    return ev.WorkersStarted(**at(t), pids=tuple(range(100, 100 + n)), attempt=attempt)


def exited(
    t: float,
    rank: int,
    code: int,
    attempt: int,
    *,
    by_us: bool = False,
    progress: float | None = None,
) -> ev.WorkerExited:
    return ev.WorkerExited(
        **at(t), rank=rank, local_rank=rank, pid=100 + rank, returncode=code,
        exit=f"exited with code {code}", terminated_by_launcher=by_us, attempt=attempt,
        last_progress=None if progress is None else WALL + progress,
    )  # fmt: skip


def rdzv(t: float, attempt: int) -> list[ev.Event]:
    return [
        ev.Joining(**at(t), attempt=attempt),
        ev.RendezvousRound(
            **at(t + 0.5), attempt=attempt, node_rank=0, nodes=1, world_size=2, master="h:1"
        ),
    ]


def finish(t: float, status: Status = Status.SUCCEEDED, attempts: int = 1) -> ev.Finish:
    code = 0 if status is Status.SUCCEEDED else 1
    return ev.Finish(**at(t), status=status, exit_code=code, reason="r", attempts=attempts)


def secs(led: Ledger) -> dict[Phase, float]:
    return {p.phase: round(p.wall_s, 6) for p in led.phases if p.wall_s}


def test_a_clean_run_is_startup_rendezvous_running_and_stopping() -> None:
    timeline = [
        *rdzv(1.0, 0), started(2.0, 0),
        exited(10.0, 0, 0, 0), exited(12.0, 1, 0, 0), finish(12.5),
    ]  # fmt: skip
    led = goodput.ledger(timeline, node="h", start=0.0, end=13.0, gpus=2)
    assert secs(led) == {
        Phase.STARTUP: 1.0 + 0.5, Phase.RENDEZVOUS: 0.5, Phase.RUNNING: 10.0, Phase.STOPPING: 1.0
    }  # fmt: skip
    assert led.wall_s == 13.0 and goodput.attributed_fraction(led) == 1.0
    assert {p.phase: p.gpu_s for p in led.phases}[Phase.RUNNING] == 20.0
    assert led.lost == ()


def checked(t: float, seconds: float, attempt: int, *, passed: bool = True) -> ev.Preflight:
    return ev.Preflight(
        **at(t), passed=passed, nodes=2, bad_nodes=() if passed else (1,), seconds=seconds,
        attempt=attempt,
    )  # fmt: skip


def test_the_preflight_is_its_battery_cut_out_of_the_start_up_it_ran_in() -> None:
    timeline = [
        *rdzv(1.0, 0), checked(4.5, 2.5, 0), started(5.0, 0),
        exited(10.0, 0, 0, 0), exited(10.0, 1, 0, 0), finish(10.5),
    ]  # fmt: skip
    led = goodput.ledger(timeline, node="h", start=0.0, end=11.0)
    assert secs(led) == {
        Phase.STARTUP: 1.0 + 0.5 + 0.5, Phase.RENDEZVOUS: 0.5, Phase.PREFLIGHT: 2.5,
        Phase.RUNNING: 5.0, Phase.STOPPING: 1.0,
    }  # fmt: skip
    assert goodput.attributed_fraction(led) == 1.0


def test_a_failed_preflight_is_preflight_then_stopping_and_a_rejoin_is_rendezvous() -> None:
    failed = [*rdzv(1.0, 0), checked(4.0, 2.0, 0, passed=False),
              finish(4.0, Status.PREFLIGHT_FAILED, 0)]  # fmt: skip
    led = goodput.ledger(failed, node="h", start=0.0, end=5.0)
    assert secs(led) == {
        Phase.STARTUP: 1.0 + 0.5, Phase.RENDEZVOUS: 0.5, Phase.PREFLIGHT: 2.0, Phase.STOPPING: 1.0
    }  # fmt: skip
    # Another node failed, enough remain: a new round (rendezvous), its preflight, the workers.
    rejoined = [*rdzv(1.0, 0), checked(4.0, 2.0, 0, passed=False), *rdzv(4.0, 0),
                checked(6.5, 2.0, 0), started(7.0, 0), exited(8.0, 0, 0, 0), exited(8.0, 1, 0, 0),
                finish(8.0)]  # fmt: skip
    led = goodput.ledger(rejoined, node="h", start=0.0, end=8.0)
    assert secs(led) == {
        Phase.STARTUP: 1.0 + 0.5 + 0.5, Phase.RENDEZVOUS: 0.5 + 0.5,
        Phase.PREFLIGHT: 4.0, Phase.RUNNING: 1.0,
    }  # fmt: skip


def test_a_preflight_after_a_restart_is_cut_out_of_the_restart_gap() -> None:
    timeline = [
        *rdzv(0.0, 0), started(1.0, 0), exited(5.0, 1, 1, 0),
        ev.Restart(**at(5.3), reason="r", delay=1.0, restart=1, rank=1),
        *rdzv(6.3, 1), checked(8.8, 2.0, 1), started(9.0, 1),
        exited(11.0, 0, 0, 1), exited(11.0, 1, 0, 1), finish(11.0, attempts=2),
    ]  # fmt: skip
    led = goodput.ledger(timeline, node="h", start=0.0, end=11.0)
    assert secs(led) == {
        Phase.RENDEZVOUS: 0.5, Phase.STARTUP: 0.5, Phase.RUNNING: 4.0 + 2.0,
        Phase.RESTART: 4.0 - 2.0, Phase.PREFLIGHT: 2.0,
    }  # fmt: skip


def test_a_failure_then_a_restart_is_a_restart_gap_with_the_work_lost() -> None:
    timeline = [
        *rdzv(0.0, 0), started(1.0, 0),
        exited(5.0, 1, 1, 0, progress=4.5), exited(5.2, 0, -15, 0, by_us=True),
        ev.Restart(**at(5.3), reason="r", delay=1.0, restart=1, rank=1),
        *rdzv(6.3, 1), started(7.0, 1),
        exited(9.0, 0, 0, 1), exited(9.0, 1, 0, 1), finish(9.1, attempts=2),
    ]  # fmt: skip
    led = goodput.ledger(timeline, node="h", start=0.0, end=9.5)
    assert secs(led) == {
        Phase.RENDEZVOUS: 0.5, Phase.STARTUP: 0.5, Phase.RUNNING: 4.0 + 2.0,
        Phase.RESTART: 2.0, Phase.STOPPING: 0.5,
    }  # fmt: skip
    assert [(w.attempt, w.cause, w.at_s, w.lost_s) for w in led.lost] == [
        (0, "rank 1 exited with code 1", 5.0, 0.5)
    ]
    assert all(p.gpu_s == 0 for p in led.phases)  # no GPU held


def test_a_final_failure_is_stopping_and_lost_work_unknown_without_a_hang_watch() -> None:
    timeline = [*rdzv(0.0, 0), started(1.0, 0), exited(3.0, 0, 2, 0), finish(3.5, Status.FAILED)]
    led = goodput.ledger(timeline, node="h", start=0.0, end=4.0)
    assert secs(led)[Phase.STOPPING] == 1.0 and Phase.RESTART not in secs(led)
    assert led.lost[0].lost_s is None


def test_a_hang_is_hung_from_its_last_progress_then_a_restart() -> None:
    timeline = [
        *rdzv(0.0, 0), started(1.0, 0),
        ev.Hang(**at(10.0), verdict="v", action=HangAction.RESTART, idle=3.0, attempt=0),
        ev.Stopping(**at(10.0), signal="SIGTERM", workers=2, grace=1.0, hung=True),
        exited(10.5, 0, -15, 0, by_us=True), exited(10.5, 1, -15, 0, by_us=True),
        ev.Restart(**at(10.6), reason="r", delay=0.0, restart=1, rank=None),
        *rdzv(10.6, 1), started(11.5, 1), exited(12.0, 0, 0, 1), exited(12.5, 1, 0, 1),
        finish(12.5, attempts=2),
    ]  # fmt: skip
    led = goodput.ledger(timeline, node="h", start=0.0, end=13.0)
    assert secs(led) == {
        Phase.RENDEZVOUS: 0.5, Phase.STARTUP: 0.5, Phase.RUNNING: 6.0 + 1.0,
        Phase.HUNG: 3.0, Phase.RESTART: 1.5, Phase.STOPPING: 0.5,
    }  # fmt: skip
    assert [(w.cause, w.lost_s) for w in led.lost] == [("hang", 3.0)]


def test_a_reported_hang_keeps_the_workers_running_after_the_verdict() -> None:
    timeline = [
        *rdzv(0.0, 0), started(1.0, 0),
        ev.Hang(**at(5.0), verdict="v", action=HangAction.REPORT, idle=2.0, attempt=0),
        exited(8.0, 0, 0, 0), exited(8.0, 1, 0, 0), finish(8.0),
    ]  # fmt: skip
    led = goodput.ledger(timeline, node="h", start=0.0, end=8.0)
    assert secs(led)[Phase.HUNG] == 2.0 and secs(led)[Phase.RUNNING] == 5.0


def test_a_membership_change_is_re_rendezvous_not_a_restart() -> None:
    change = ev.MembershipChange(**at(4.0), change=ChangeKind.JOINED, reason="a node", nodes=2)
    timeline = [
        *rdzv(0.0, 0), started(1.0, 0), change,
        exited(4.2, 0, -15, 0, by_us=True), exited(4.2, 1, -15, 0, by_us=True),
        *rdzv(4.5, 1), started(6.0, 1), exited(7.0, 0, 0, 1), exited(7.0, 1, 0, 1),
        finish(7.0, attempts=2),
    ]  # fmt: skip
    led = goodput.ledger(timeline, node="h", start=0.0, end=7.0)
    assert secs(led) == {
        Phase.RENDEZVOUS: 0.5 + 2.0, Phase.STARTUP: 0.5, Phase.RUNNING: 3.0 + 1.0
    }  # fmt: skip


def test_a_stop_signal_is_stopping_and_a_failed_rendezvous_too() -> None:
    timeline = [*rdzv(0.0, 0), started(1.0, 0), ev.SignalReceived(**at(3.0), signal="SIGTERM")]
    led = goodput.ledger([*timeline, finish(4.0, Status.STOPPED)], node="h", start=0, end=5)
    assert secs(led)[Phase.STOPPING] == 2.0
    joined = ev.Joining(**at(0.2), attempt=0)
    failed: list[ev.Event] = [joined, finish(3.0, Status.RENDEZVOUS_FAILED, 0)]
    led = goodput.ledger(failed, node="h", start=0.0, end=3.5)
    assert secs(led) == {Phase.STARTUP: 0.2, Phase.RENDEZVOUS: 2.8, Phase.STOPPING: 0.5}


def test_a_timeline_that_stops_early_leaves_the_rest_unattributed() -> None:
    timeline = [*rdzv(0.0, 0), started(1.0, 0), exited(2.0, 0, 0, 0)]
    led = goodput.ledger(timeline, node="h", start=0.0, end=10.0)
    assert secs(led)[Phase.UNATTRIBUTED] == 8.0
    assert goodput.attributed_fraction(led) == 0.2


def test_spans_cover_the_run_without_gaps() -> None:
    timeline = [*rdzv(0.0, 0), started(1.0, 0), exited(3.0, 0, 1, 0), finish(3.5, Status.FAILED)]
    cut = goodput.spans(timeline, start=-1.0, end=4.0)
    assert cut[0].start == -1.0 and cut[-1].end == 4.0
    assert all(a.end == b.start for a, b in itertools.pairwise(cut))
    assert [s.phase for s in cut] == [
        Phase.STARTUP, Phase.RENDEZVOUS, Phase.STARTUP, Phase.RUNNING, Phase.STOPPING
    ]  # fmt: skip


def test_the_job_ledger_sums_its_nodes_and_summary_json_keeps_a_ledger() -> None:
    one = [*rdzv(0.0, 0), started(1.0, 0), exited(3.0, 0, 0, 0), exited(3, 1, 0, 0), finish(3)]
    a = goodput.ledger(one, node="a", start=0.0, end=4.0, gpus=1)
    b = goodput.ledger(one, node="b", start=0.0, end=5.0, gpus=2)
    job = goodput.job_ledger([a, b])
    assert job is not None and job.nodes == ("a", "b") and job.wall_s == 9.0 and job.gpus == 3
    assert job.seconds(Phase.RUNNING) == 4.0
    assert {p.phase: p.gpu_s for p in job.phases}[Phase.RUNNING] == 2.0 + 4.0
    assert goodput.job_ledger([]) is None
    summary = RunSummary.from_json({"status": "succeeded", "exit_code": 0, "ledger": a.to_json()})
    assert summary.ledger == a


def test_a_failing_exit_reads_back_with_its_last_progress() -> None:
    line = exited(5.0, 1, 1, 0, progress=4.5).to_json()
    assert line["last_progress"] == WALL + 4.5
    assert ev.event_from_json(line) == exited(5.0, 1, 1, 0, progress=4.5)
    assert "last_progress" not in exited(5.0, 1, 0, 0).to_json()  # left out when None


def test_a_real_run_with_a_restart_and_a_hang_adds_up_to_its_wall_time(tmp_path: Path) -> None:
    # Attempt 0: rank 1 fails after 1 s of work; attempt 1 hangs after 1 s (hang.timeout=1,
    # restart); attempt 2 works 1 s and succeeds.
    logs = tmp_path / "logs"
    began = time.monotonic()
    proc = run(
        f"script={WORKERS / 'goodput.py'}", "nproc_per_node=2", "hang.timeout=1",
        "hang.warmup=0", "hang.action=restart", "restart=on_failure", "logs.quiet=true",
        f"logs.root={logs}", "--", "1", "fail", "hang", "ok", cwd=tmp_path, timeout=90,
    )  # fmt: skip
    outside = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    run_dir = next(logs.rglob("summary.json")).parent
    summary = RunSummary.from_json(json.loads((run_dir / "summary.json").read_text()))
    led = summary.ledger
    assert led is not None and summary.attempts == 3
    assert led.wall_s == pytest.approx(summary.duration_s, abs=1e-5) and led.wall_s < outside
    assert sum(p.wall_s for p in led.phases) == pytest.approx(led.wall_s, rel=0.01)
    assert led.seconds(Phase.UNATTRIBUTED) < 0.01 * led.wall_s
    assert goodput.attributed_fraction(led) > 0.99
    assert 2.9 < led.seconds(Phase.RUNNING) < led.wall_s  # three attempts of 1 s of work
    assert 1.0 <= led.seconds(Phase.HUNG) < 3.0  # hang.timeout, a look's lag and the load
    assert led.seconds(Phase.RESTART) > 0 and led.seconds(Phase.STARTUP) > 0
    assert led.gpus == 0 and all(p.gpu_s == 0 for p in led.phases)
    failed, hung = led.lost
    assert (failed.attempt, failed.cause) == (0, "rank 1 exit code 1")
    assert failed.lost_s is not None and failed.lost_s < 1.0  # it computed until it raised
    assert (hung.attempt, hung.cause, hung.lost_s) == (1, "hang", led.seconds(Phase.HUNG))
    shown = run("report", str(run_dir), cwd=tmp_path)
    assert "goodput ledger: node" in shown.stdout
    assert "lost: attempt 1, hang" in shown.stdout and "hung" in shown.stdout


def test_gpu_seconds_count_the_distinct_gpus_the_plan_gives_the_workers() -> None:
    a, b = Gpu(index=0, uuid="GPU-a"), Gpu(index=1, uuid="GPU-b")
    one = [*rdzv(0.0, 0), started(1.0, 0), exited(3.0, 0, 0, 0), exited(3, 1, 0, 0), finish(3)]
    plan = plan_of(f"script={WORKERS / 'idle.py'}", "nproc_per_node=2")
    for devices, held in [
        ((), 0),  # devices left alone (a CPU job): no GPU counted
        ((WorkerDevices(gpus=(a,), own=a), WorkerDevices(gpus=(b,), own=b)), 2),  # isolate
        ((WorkerDevices(gpus=(a, b), own=a), WorkerDevices(gpus=(a, b), own=b)), 2),  # visible
    ]:
        gpu_plan = dataclasses.replace(plan, devices=devices)
        led = node_ledger(gpu_plan, one, host="h", start=0.0, end=4.0)
        assert led.gpus == held
        assert {p.phase: p.gpu_s for p in led.phases}[Phase.RUNNING] == 2.0 * held
