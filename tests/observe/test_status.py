"""The status record: folded from the agent's events, and read back as untrusted input."""

from __future__ import annotations

import json

import pytest

from elastic_hydra.agent import events
from elastic_hydra.agent.events import ChangeKind
from elastic_hydra.agent.outcome import Status
from elastic_hydra.observe.snapshot import NodeView, Snapshot, snapshot
from elastic_hydra.observe.status import (
    MAX_BYTES,
    JobPhase,
    NodeStatus,
    Sample,
    StatusRecordError,
    Tracker,
    WorkerState,
    decode,
    encode,
)
from elastic_hydra.plan import HangAction

T = events.Stamp(wall_time=100.0, mono_time=1.0)


def tracker() -> Tracker:
    return Tracker(node="n1", nproc=2, agent_pid=42, period=2.0)


def started(t: Tracker, attempt: int = 0) -> None:
    t.emit(events.Joining(**T, attempt=attempt))
    t.emit(events.RendezvousRound(
        **T, attempt=attempt, node_rank=1, nodes=2, world_size=4, master="h:1", base_rank=2
    ))  # fmt: skip
    t.emit(events.WorkersStarted(**T, pids=(10 + attempt, 20 + attempt), attempt=attempt))


def states(record: NodeStatus) -> list[tuple[int, str]]:
    return [(w.rank, w.state.value) for w in record.workers]


def test_the_record_follows_the_events_through_a_failure_and_a_restart() -> None:
    t = tracker()
    t.emit(events.Joining(**T, attempt=0))
    assert t.record(now=1.0, samples={}, progress={}).phase is JobPhase.RENDEZVOUS
    started(t)
    running = t.record(now=101.0, samples={10: Sample(cpu_percent=50.0, rss_bytes=4096)},
                       progress={0: 99.0})  # fmt: skip
    assert running.phase is JobPhase.RUNNING and running.node_rank == 1
    assert states(running) == [(2, "running"), (3, "running")]
    assert running.workers[0].pid == 10 and running.workers[0].cpu_percent == 50.0
    assert running.workers[0].progress_age == 2.0 and running.workers[1].progress_age is None
    t.emit(events.WorkerExited(**T, rank=3, local_rank=1, pid=20, returncode=1, exit="1",
                               terminated_by_launcher=False, attempt=0))  # fmt: skip
    t.emit(events.WorkerExited(**T, rank=2, local_rank=0, pid=10, returncode=-15, exit="SIGTERM",
                               terminated_by_launcher=True, attempt=0))  # fmt: skip
    assert states(t.record(now=1, samples={}, progress={})) == [(2, "stopped"), (3, "failed")]
    t.emit(events.Restart(**T, reason="rank 3 exited", delay=0.0, restart=1, rank=3))
    record = t.record(now=1, samples={}, progress={})
    assert record.phase is JobPhase.RESTARTING and record.restarts == 1
    assert states(record) == [(2, "restarting"), (3, "restarting")]
    t.emit(events.Joining(**T, attempt=1))
    assert t.record(now=1, samples={}, progress={}).phase is JobPhase.RESTARTING
    started(t, attempt=1)
    record = t.record(now=1, samples={}, progress={})
    assert (record.phase, record.attempt, record.rounds) == (JobPhase.RUNNING, 1, 2)
    assert t.counts.restarts == {"failure": 1}


def test_a_hang_marks_running_ranks_hung_until_they_progress_again() -> None:
    t = tracker()
    t.emit(events.HangWatchStarted(**T, timeout=5.0, warmup=0.0, first_verdict=5.0,
                                   action=HangAction.REPORT, learned=False))  # fmt: skip
    started(t)
    t.emit(events.Hang(**T, verdict="all in sleep", action=HangAction.REPORT, idle=6.0, attempt=0))
    hung = t.record(now=110.0, samples={}, progress={0: 100.0, 1: 100.0})
    assert states(hung) == [(2, "hung"), (3, "hung")]
    moving = t.record(now=110.0, samples={}, progress={0: 109.0, 1: 100.0})
    assert states(moving) == [(2, "running"), (3, "hung")]
    assert t.counts.hangs == {"report": 1}
    t.emit(events.MembershipChange(wall_time=1.0, mono_time=1.0, change=ChangeKind.LEFT,
                                   reason="gone", nodes=1))  # fmt: skip
    assert t.counts.membership == {"left": 1}
    t.emit(events.Finish(**T, status=Status.STOPPED, exit_code=143, reason="", attempts=1))
    done = t.record(now=111.0, samples={}, progress={})
    assert done.phase is JobPhase.DONE and done.status is Status.STOPPED
    assert states(done) == [(2, "stopped"), (3, "stopped")]
    assert not done.stale(now=10_000.0)  # an ended agent is never stale


def test_a_record_says_what_each_ranks_last_progress_was() -> None:
    t = tracker()
    started(t)
    record = t.record(now=110.0, samples={}, progress={0: 108.0, 1: 100.0},
                      how={0: "collective #12", 1: "output"})  # fmt: skip
    assert [(w.progress_age, w.progress_via) for w in record.workers] == [
        (2.0, "collective #12"),
        (10.0, "output"),
    ]
    assert decode(encode(record)) == record
    raw = encode(record).replace(b"collective #12", b"\\u001b[2J")
    with pytest.raises(StatusRecordError, match=r"workers\[0\]\.progress_via"):
        decode(raw)


def test_a_record_reads_back_as_itself_and_goes_stale() -> None:
    t = tracker()
    started(t)
    record = t.record(now=100.0, samples={}, progress={})
    assert decode(encode(record)) == record
    assert not record.stale(now=105.0) and record.stale(now=106.5)


def good() -> dict[str, object]:
    t = tracker()
    started(t)
    data: dict[str, object] = json.loads(encode(t.record(now=100.0, samples={}, progress={})))
    return data


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({"phase": "dancing"}, "phase"),
        ({"attempt": "1"}, "attempt"),
        ({"attempt": -1}, "attempt"),
        ({"time": float("nan")}, "time"),
        ({"period": 0}, "period"),
        ({"node": ""}, "node"),
        ({"node": "x\x1b[2J"}, "node"),
        ({"node": "x" * 300}, "node"),
        ({"format": 2}, "format 2"),
        ({"workers": [{"rank": 0}]}, "local_rank"),
        ({"workers": [{"rank": 0, "local_rank": 0, "pid": 1, "state": "zombie"}]}, "state"),
        ({"workers": [{"rank": 0, "local_rank": 0, "pid": 1, "state": "running"}] * 300},
         "more than"),
    ],
)  # fmt: skip
def test_a_malformed_record_is_refused_naming_its_fault(
    change: dict[str, object], fault: str
) -> None:
    with pytest.raises(StatusRecordError, match=fault):
        decode(json.dumps({**good(), **change}).encode())


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b"[" * 100_000, b"\xff\xfe"])
def test_what_is_not_a_record_at_all_is_refused(raw: bytes) -> None:
    with pytest.raises(StatusRecordError):
        decode(raw)


def test_an_oversized_record_is_refused_before_it_is_parsed() -> None:
    padded = json.dumps({**good(), "pad": "x" * MAX_BYTES}).encode()
    with pytest.raises(StatusRecordError, match="more than"):
        decode(padded)


def test_a_snapshot_keeps_the_good_records_counts_the_others_and_marks_stale_nodes() -> None:
    fresh = {**good(), "node": "a", "node_rank": 0, "time": 100.0}
    old = {**good(), "node": "b", "node_rank": 1, "time": 80.0}
    raws = [json.dumps(r).encode() for r in (old, fresh)] + [b"junk"]
    snap = snapshot(raws, now=101.0)
    assert [(n.record.node, n.stale) for n in snap.nodes] == [("a", False), ("b", True)]
    assert snap.ignored == 1 and "not JSON" in snap.why
    assert snap.phase is JobPhase.RUNNING
    out = snap.to_json()
    assert out["phase"] == "running" and out["nodes"][1]["stale"] is True
    assert [w["state"] for w in out["nodes"][0]["workers"]] == ["running", "running"]
    assert WorkerState.HUNG.value == "hung"


def test_a_worker_that_ended_has_no_progress_age() -> None:
    t = tracker()
    started(t)
    t.emit(events.WorkerExited(**T, rank=2, local_rank=0, pid=10, returncode=0, exit="0",
                               terminated_by_launcher=False, attempt=0))  # fmt: skip
    record = t.record(now=200.0, samples={}, progress={0: 100.0, 1: 150.0})
    assert [w.progress_age for w in record.workers] == [None, 50.0]


def verdict(passed: bool, bad: tuple[int, ...] = ()) -> events.Preflight:
    return events.Preflight(**T, passed=passed, nodes=3, bad_nodes=bad, seconds=2.0, attempt=0)


def test_the_phase_is_preflight_while_the_battery_runs_and_its_verdicts_are_counted() -> None:
    t = Tracker(node="n1", nproc=2, agent_pid=42, period=2.0, preflight=True)

    def phase() -> JobPhase:
        return t.record(now=1.0, samples={}, progress={}).phase

    t.emit(events.Joining(**T, attempt=0))
    t.emit(events.RendezvousRound(**T, attempt=0, node_rank=1, nodes=3, world_size=6,
                                  master="h:1", base_rank=2))  # fmt: skip
    assert phase() is JobPhase.PREFLIGHT
    t.emit(verdict(False, (2,)))  # another node failed: a new round without it
    assert phase() is JobPhase.RENDEZVOUS
    started(t)  # a round, its battery (no verdict yet), then the workers
    assert phase() is JobPhase.RUNNING
    t.emit(events.Restart(**T, reason="r", delay=0.0, restart=1, rank=3))
    t.emit(events.Joining(**T, attempt=1))
    t.emit(events.RendezvousRound(**T, attempt=1, node_rank=1, nodes=2, world_size=4,
                                  master="h:1", base_rank=2))  # fmt: skip
    assert phase() is JobPhase.PREFLIGHT
    t.emit(verdict(True))
    assert phase() is JobPhase.RESTARTING  # the restart goes on to its workers
    assert t.counts.preflight == {"failed": 1, "passed": 1}
    assert t.counts.preflight_failed_nodes == 1
    t.emit(events.Quarantined(**T, host="n1", gpus=(), evidence="e", until=5.0, attempt=1))
    assert t.counts.quarantine_refusals == 1
    off = tracker()  # preflight off: no such phase
    started(off)
    off.emit(events.Joining(**T, attempt=1))
    off.emit(events.RendezvousRound(**T, attempt=1, node_rank=1, nodes=2, world_size=4,
                                    master="h:1", base_rank=2))  # fmt: skip
    assert off.record(now=1.0, samples={}, progress={}).phase is JobPhase.RENDEZVOUS


def test_a_job_with_a_node_in_its_preflight_is_in_preflight() -> None:
    def view(phase: JobPhase) -> NodeView:
        record = NodeStatus(node="n", node_rank=0, nodes=2, phase=phase, attempt=0, restarts=0,
                            rounds=1, agent_pid=1, period=2.0, time=1.0)  # fmt: skip
        return NodeView(record=decode(encode(record)), age=0.0, stale=False)

    both = Snapshot(nodes=(view(JobPhase.PREFLIGHT), view(JobPhase.RUNNING)), time=1.0)
    assert both.phase is JobPhase.PREFLIGHT
    assert Snapshot(nodes=(view(JobPhase.PREFLIGHT),), time=1.0).phase is JobPhase.PREFLIGHT
