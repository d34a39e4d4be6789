"""The run's timeline as typed events: each kind to its line of events.jsonl and back, the format
version, and the one reader's way with lines it cannot read (cut short, garbled, newer)."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from elastic_hydra.agent.events import (
    FORMAT,
    ChangeKind,
    Event,
    EventLineError,
    ExitBarrier,
    Finish,
    Hang,
    HangWatchStarted,
    Joining,
    MembershipChange,
    NewerFormatError,
    Preflight,
    Quarantined,
    RendezvousRound,
    Restart,
    SignalReceived,
    Stamp,
    Stop,
    Stopping,
    Straggler,
    UnknownEventKindError,
    WarmFallback,
    WorkerExited,
    WorkersStarted,
    event_from_json,
)
from elastic_hydra.agent.outcome import Status
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import FailureClass, HangAction, StragglerAction
from elastic_hydra.report import notices
from elastic_hydra.report.events_file import last_start, read_events

AT = Stamp(wall_time=1700000000.25, mono_time=512.5)
STAMP = '"time": 1700000000.25, "monotonic": 512.5'
# One event of each kind, and its line as the launcher wrote it before the format version (the
# keys and their order are what readers of events.jsonl depend on).
SAMPLES: list[tuple[Event, str]] = [
    (Joining(**AT, attempt=0), '{"event": "joining", %s, "attempt": 0}'),
    (
        RendezvousRound(
            **AT, attempt=1, node_rank=0, nodes=2, world_size=4, master="10.0.0.1:29500"
        ),
        '{"event": "rendezvous", %s, "attempt": 1, "node_rank": 0, "nodes": 2, '
        '"world_size": 4, "master": "10.0.0.1:29500"}',
    ),
    (
        WorkersStarted(**AT, pids=(101, 102), attempt=0),
        '{"event": "workers_started", %s, "pids": [101, 102], "attempt": 0}',
    ),
    (
        WorkerExited(
            **AT, rank=1, local_rank=1, pid=102, returncode=-15, exit="killed by SIGTERM",
            terminated_by_launcher=True, attempt=0,
        ),
        '{"event": "worker_exited", %s, "rank": 1, "local_rank": 1, "pid": 102, '
        '"returncode": -15, "exit": "killed by SIGTERM", "terminated_by_launcher": true, '
        '"attempt": 0}',
    ),
    (
        Restart(**AT, reason="restart 1 of 3 after exit code 1, in 2 s", delay=2.0, restart=1,
                rank=None),
        '{"event": "restart", %s, "reason": "restart 1 of 3 after exit code 1, in 2 s", '
        '"delay": 2.0, "restart": 1, "rank": null}',
    ),
    (
        MembershipChange(**AT, change=ChangeKind.LEFT, reason="node b left the job", nodes=1),
        '{"event": "membership", %s, "change": "left", "reason": "node b left the job", '
        '"nodes": 1}',
    ),
    (
        MembershipChange(**AT, change=ChangeKind.JOINED, reason="r", nodes=0, collateral=(2, 3)),
        '{"event": "membership", %s, "change": "joined", "reason": "r", "nodes": 0, '
        '"collateral": [2, 3]}',
    ),
    (
        ExitBarrier(**AT, waited=None, completed=False),
        '{"event": "exit_barrier", %s, "waited": null, "completed": false}',
    ),
    (SignalReceived(**AT, signal="SIGINT"), '{"event": "signal", %s, "signal": "SIGINT"}'),
    (
        Stopping(**AT, signal="SIGTERM", workers=2, grace=30.0),
        '{"event": "stopping", %s, "signal": "SIGTERM", "workers": 2, "grace": 30.0}',
    ),
    (
        Stopping(**AT, signal="SIGTERM", workers=3, grace=5.0, hung=True),
        '{"event": "stopping", %s, "signal": "SIGTERM", "workers": 3, "grace": 5.0, '
        '"hung": true}',
    ),
    (
        Stop(**AT, reason="rank 1 exit code 1", signal="SIGTERM", stopped_ranks=(0,),
             paused_ranks=(), stuck_pids=(7,)),
        '{"event": "stop", %s, "reason": "rank 1 exit code 1", "signal": "SIGTERM", '
        '"stopped_ranks": [0], "paused_ranks": [], "stuck_pids": [7]}',
    ),
    (
        HangWatchStarted(**AT, timeout=120.0, warmup=0.0, first_verdict=120.0,
                         action=HangAction.REPORT),
        '{"event": "hang_watch", %s, "timeout": 120.0, "warmup": 0.0, "first_verdict": 120.0, '
        '"action": "report"}',
    ),
    (
        Hang(**AT, verdict="all ranks wait in all_reduce", action=HangAction.RESTART, idle=61.5,
             attempt=2),
        '{"event": "hang", %s, "verdict": "all ranks wait in all_reduce", "action": "restart", '
        '"idle": 61.5, "attempt": 2}',
    ),
    (
        Straggler(**AT, rank=5, named=True, last=46, of=50, behind=0.18, op="gloo:all_reduce",
                  threshold=0.02, action=StragglerAction.REPORT, attempt=0),
        '{"event": "straggler", %s, "rank": 5, "named": true, "last": 46, "of": 50, '
        '"behind": 0.18, "op": "gloo:all_reduce", "threshold": 0.02, "action": "report", '
        '"attempt": 0}',
    ),
    (
        Quarantined(**AT, host="node-3", gpus=(5,), evidence="preflight: slow", until=1.8e9,
                    attempt=0),
        '{"event": "quarantined", %s, "host": "node-3", "gpus": [5], '
        '"evidence": "preflight: slow", "until": 1800000000.0, "attempt": 0}',
    ),
    (
        WarmFallback(**AT, reason="cannot import torch: ModuleNotFoundError"),
        '{"event": "warm_fallback", %s, "reason": "cannot import torch: ModuleNotFoundError"}',
    ),
    (
        Preflight(**AT, passed=False, nodes=4, bad_nodes=(2,), seconds=3.25, attempt=0),
        '{"event": "preflight", %s, "passed": false, "nodes": 4, "bad_nodes": [2], '
        '"seconds": 3.25, "attempt": 0}',
    ),
    (
        Finish(**AT, status=Status.RENDEZVOUS_FAILED, exit_code=3, reason="no quorum",
               attempts=0),
        '{"event": "finish", %s, "status": "rendezvous_failed", "exit_code": 3, '
        '"reason": "no quorum", "attempts": 0}',
    ),
    (
        Restart(**AT, reason="restart 1 of 3 after exit code 1 (user_error: ImportError at "
                "train.py:3), in 0.0 s", delay=0.0, restart=1, rank=2,
                failure_class=FailureClass.USER_ERROR),
        '{"event": "restart", %s, "reason": "restart 1 of 3 after exit code 1 (user_error: '
        'ImportError at train.py:3), in 0.0 s", "delay": 0.0, "restart": 1, "rank": 2, '
        '"failure_class": "user_error"}',
    ),
    (
        Finish(**AT, status=Status.FAILED, exit_code=1, reason="not retried", attempts=2,
               failure_class=FailureClass.OOM_HOST),
        '{"event": "finish", %s, "status": "failed", "exit_code": 1, '
        '"reason": "not retried", "attempts": 2, "failure_class": "oom_host"}',
    ),
]  # fmt: skip
EVENTS = [event for event, _ in SAMPLES]
IDS = [type(event).__name__ for event in EVENTS]


def unversioned(template: str) -> str:
    return template % STAMP


def test_the_samples_cover_every_kind() -> None:
    assert {type(e) for e in EVENTS} == set(typing.get_args(Event))


@pytest.mark.parametrize("event", EVENTS, ids=IDS)
def test_every_kind_round_trips_through_its_json_line(event: Event) -> None:
    line = json.dumps(event.to_json())
    assert event_from_json(json.loads(line)) == event


@pytest.mark.parametrize(("event", "old"), SAMPLES, ids=IDS)
def test_a_line_is_the_previous_line_plus_the_format(event: Event, old: str) -> None:
    line = json.dumps(event.to_json())
    assert line == unversioned(old)[:-1] + f', "format": {FORMAT}}}'


@pytest.mark.parametrize(("event", "old"), SAMPLES, ids=IDS)
def test_a_line_without_a_format_reads_as_it_was_written(event: Event, old: str) -> None:
    assert event_from_json(json.loads(unversioned(old))) == event


def test_before_attempt_the_count_was_round() -> None:
    old = {"event": "workers_started", "time": 1.0, "monotonic": 2.0, "pids": [5], "round": 3}
    assert event_from_json(old) == WorkersStarted(
        wall_time=1.0, mono_time=2.0, pids=(5,), attempt=3
    )
    with pytest.raises(EventLineError, match=r"workers_started\.attempt: missing"):
        event_from_json({**old, "format": 1})  # a versioned line never says round


def test_a_newer_format_is_refused_and_a_bad_one_is_no_event() -> None:
    line = {**EVENTS[0].to_json(), "format": FORMAT + 1}
    with pytest.raises(NewerFormatError, match=f"format {FORMAT + 1}, newer than format {FORMAT}"):
        event_from_json(line)
    for bad in ("1", True, -1, 1.0):
        with pytest.raises(EventLineError, match="format: expected a whole number"):
            event_from_json({**line, "format": bad})


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], r"expected a JSON object, got list"),
        ({"time": 1.0}, r"event: expected the event's kind"),
        ({**EVENTS[0].to_json(), "attempt": "0"}, r"joining\.attempt: expected integer, got '0'"),
        ({**EVENTS[0].to_json(), "attempt": True}, r"joining\.attempt: expected integer"),
        ({**EVENTS[0].to_json(), "time": None}, r"joining\.time: expected number"),
        ({k: v for k, v in EVENTS[0].to_json().items() if k != "monotonic"},
         r"joining\.monotonic: missing"),
        ({**EVENTS[2].to_json(), "pids": [1, "2"]},
         r"workers_started\.pids\[1\]: expected integer"),
        ({**EVENTS[2].to_json(), "pids": 1}, r"workers_started\.pids: expected list"),
        ({**EVENTS[4].to_json(), "rank": "0"}, r"restart\.rank: expected integer or null"),
        ({**EVENTS[5].to_json(), "change": "grew"},
         r"membership\.change: expected one of joined, left, closed, got 'grew'"),
        ({**EVENTS[-1].to_json(), "status": "ok"}, r"finish\.status: expected one of succeeded"),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_type_is_named(obj: object, message: str) -> None:
    with pytest.raises(EventLineError, match=message):
        event_from_json(obj)


def test_an_unknown_kind_is_its_own_error_and_unknown_keys_are_ignored() -> None:
    with pytest.raises(UnknownEventKindError, match="unknown kind 'from_the_future'"):
        event_from_json({"event": "from_the_future", "time": 1.0, "monotonic": 1.0, "format": 1})
    newer = {**EVENTS[0].to_json(), "host": "n1"}  # a key added later: no new format
    assert event_from_json(newer) == EVENTS[0]


# ------------------------------------------------------------------------------------ the reader
def write_lines(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def line(event: Event) -> bytes:
    return json.dumps(event.to_json()).encode() + b"\n"


def test_the_reader_reads_a_whole_file_in_order(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "events.jsonl", *map(line, EVENTS))
    read = read_events(path)
    assert read.events == tuple(EVENTS)
    assert (read.unknown, read.unreadable, read.skipped()) == (0, 0, None)
    assert last_start(read.events) == EVENTS[2]


def test_the_previous_releases_file_reads(tmp_path: Path) -> None:
    old = [unversioned(template).encode() + b"\n" for _, template in SAMPLES]
    assert read_events(write_lines(tmp_path / "events.jsonl", *old)).events == tuple(EVENTS)


def test_a_torn_last_line_and_garbled_ones_are_skipped_and_counted(tmp_path: Path) -> None:
    whole = line(EVENTS[0])
    path = write_lines(
        tmp_path / "events.jsonl",
        whole,
        b"not json\n",
        b"[1, 2]\n",
        b"\n",  # a blank line is no event and no loss
        b'{"event": "joining", "time": "\xff\xfe"}\n',  # not UTF-8
        json.dumps({**EVENTS[0].to_json(), "attempt": None}).encode() + b"\n",
        json.dumps({"event": "from_the_future", "time": 1.0, "monotonic": 1.0}).encode() + b"\n",
        line(EVENTS[1]),
        whole[: len(whole) // 2],  # the agent was killed mid-write
    )
    read = read_events(path)
    assert read.events == (EVENTS[0], EVENTS[1])
    assert (read.unknown, read.unreadable) == (1, 5)
    assert read.skipped() == (
        "6 line(s) of events.jsonl skipped: 1 of a kind this elastic-hydra does not know, "
        "5 that did not read as an event (cut short?)"
    )


def test_a_file_with_a_newer_line_is_refused_in_one_line(tmp_path: Path) -> None:
    newer = json.dumps({**EVENTS[0].to_json(), "format": FORMAT + 1}).encode() + b"\n"
    path = write_lines(tmp_path / "events.jsonl", line(EVENTS[0]), newer)
    with pytest.raises(ConfigError) as caught:
        read_events(path)
    message = caught.value.line()
    assert message.startswith(f"events.jsonl: written in format {FORMAT + 1}, newer than")
    assert str(path) in message and "\n" not in message


def test_a_missing_file_is_the_callers_to_judge(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_events(tmp_path / "events.jsonl")


# ------------------------------------------------------------------------------ console lines
def test_progress_lines_read_the_typed_events(capsys: pytest.CaptureFixture[str]) -> None:
    for event in EVENTS:
        notices.progress(event, multi_node=False)
    single = capsys.readouterr().err.splitlines()
    assert single == [
        "elastic-hydra: the workers hung: restart 1 of 3 after exit code 1, in 2 s",
        "elastic-hydra: SIGTERM: stopping 2 worker(s), up to 30 s (stop_grace); Ctrl-C again to "
        "kill them now",
        "elastic-hydra: SIGTERM to the 3 hung worker(s), their stacks saved; SIGKILL after 5 s "
        "(hang.grace)",
        "elastic-hydra: hang watch: 120 s without progress on any rank is a hang, the first "
        "verdict 120 s after the start at the earliest (hang.timeout=120, hang.warmup=0); then "
        "report (hang.action)",
        "elastic-hydra: all ranks wait in all_reduce. Every rank's stacks: attempt_2/*/stacks.txt;"
        " stopping them (a failure) (hang.action=restart)",
        "elastic-hydra: straggler: rank 5 arrives last at 46 of the last 50 collectives"
        " (gloo:all_reduce), median 180 ms behind; nothing stopped (straggler.action=report)",
        "elastic-hydra: warm starts off (warm.imports), cold starts: cannot import torch: "
        "ModuleNotFoundError",
        "elastic-hydra: rank 2 failed: restart 1 of 3 after exit code 1 (user_error: ImportError "
        "at train.py:3), in 0.0 s",
    ]
    for event in EVENTS:
        notices.progress(event, multi_node=True)
    multi = capsys.readouterr().err.splitlines()
    assert [ln for ln in multi if ln not in single] == [
        "elastic-hydra: joining the rendezvous (attempt 0)",
        "elastic-hydra: node 0 of 2, world size 4, master 10.0.0.1:29500",
        "elastic-hydra: node b left the job",
        "elastic-hydra: r; rank(s) 2,3 here failed with it (collateral, not this node's failure)",
    ]


def test_a_round_carries_its_base_rank_when_it_knows_it() -> None:
    # `elastic-hydra top` names each worker's global rank from it (observe.status).
    event = RendezvousRound(
        **AT, attempt=0, node_rank=1, nodes=2, world_size=4, master="h:1", base_rank=2
    )
    line = event.to_json()
    assert line["base_rank"] == 2 and list(line)[-2:] == ["base_rank", "format"]
    assert event_from_json(json.loads(json.dumps(line))) == event
