"""Failure records read back from the rendezvous store are untrusted input: checked, never a crash,
only from the job's own nodes, and signed when the nodes share a secret."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.plan import FailureClass
from elastic_hydra.records.failures import FailureRecord, FailureSource
from elastic_hydra.rendezvous.sealed_records import check, check_all, seal
from elastic_hydra.tracebacks import Frame, Stack
from tests.multinode import FAST, job, rdzv_server

SECRET = b"shared-by-the-agents"
NODE = "127.0.0.1 (agent pid 4242)"
# Every field away from its default: what a store round trip loses shows.
RECORD = FailureRecord(
    rank=3, local_rank=1, host="node1", pid=99, attempt=2, restart_count=1, returncode=-6,
    time=1700000000.5, terminated_by_launcher=True, after_node_loss=True,
    source=FailureSource.EXCEPTION, message="ValueError: boom",
    traceback=(
        Stack(exc_type="KeyError", exc_value="'k'", link="cause",
              frames=(Frame(filename="t.py", lineno=2, name="g", line="d['k']"),)),
        Stack(exc_type="ValueError", exc_value="boom",
              frames=(Frame(filename="t.py", lineno=3, name="f", line="x"),
                      Frame(filename="u.py", lineno=7, name="h"))),
    ),
    error_file="/run/attempt_2/1/error.json", stderr_tail=("a", "boom"), stdout_log="o",
    stderr_log="e", failure_class=FailureClass.USER_ERROR,
    evidence="the same ValueError at u.py:7 as attempt 1", repeat_of=1, node_rank=1,
    rdzv_round=0, node=NODE,
)  # fmt: skip


def record(**changes: Any) -> dict[str, Any]:
    """A stored record's JSON, with `changes`."""
    return {**RECORD.to_json(), **changes}


def sealed(secret: bytes | None = None, **changes: Any) -> bytes:
    return seal(dataclasses.replace(RECORD, **changes), secret).encode()


def test_a_record_round_trips_through_the_store_unchanged_every_field_included() -> None:
    defaults = [
        f.name
        for f in dataclasses.fields(FailureRecord)
        if f.init and getattr(RECORD, f.name) == f.default
    ]
    assert defaults == []  # the test covers every field
    for secret in (None, SECRET):
        assert check(sealed(secret), secret=secret) == RECORD
    assert RECORD.signal == "SIGABRT"  # derived from the return code, on every node alike
    stored = json.loads(seal(RECORD, None))
    assert set(stored) == {f.name for f in dataclasses.fields(FailureRecord)}


def test_a_record_is_read_as_a_failure_record_reads_it() -> None:
    # No node rank (a record of a node that did not say): accepted, as FailureRecord allows.
    without = {k: v for k, v in record().items() if k != "node_rank"}
    checked = check(json.dumps(without).encode(), secret=None)
    assert checked == dataclasses.replace(RECORD, node_rank=None)
    # Collateral of a node loss: kept as such (never a root cause), not dropped.
    collateral = check(sealed(after_node_loss=True, terminated_by_launcher=False), secret=None)
    assert collateral is not None and collateral.after_node_loss and not collateral.failed
    # What a record derives from its return code is derived again, not taken from the store.
    told = check(json.dumps(record(signal="SIGKILL", exit="a lie")).encode(), secret=None)
    assert told == RECORD


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1, 2, 3]",
        b"null",
        b"[" * 60_000,
        json.dumps({k: v for k, v in record().items() if k != "rank"}).encode(),
        json.dumps(record(rank="3")).encode(),
        json.dumps(record(rank=True)).encode(),
        json.dumps(record(rank=1 << 70)).encode(),
        json.dumps(record(time="yesterday")).encode(),
        json.dumps(record(time=float("nan"))).encode(),
        json.dumps(record(host=["a"])).encode(),
        json.dumps(record(source="a guess")).encode(),
        json.dumps(record(message="x" * 10_000_000)).encode(),
        json.dumps(record(message="x" * 5000)).encode(),
        json.dumps(record(stderr_tail=["x"] * 100_000)).encode(),
        json.dumps(record(stderr_tail=["x"] * 300)).encode(),
        json.dumps(record(traceback="a string")).encode(),
        json.dumps(record(traceback=[{"exc_type": "E", "exc_value": "v", "frames": [7]}])).encode(),
        json.dumps(record(traceback=[{"exc_type": "E", "frames": []}])).encode(),
        json.dumps(record(stderr_tail=[[[[[["deep"]]]]]])).encode(),
        json.dumps(record(terminated_by_launcher="no")).encode(),
        b"{" * 100_000,
    ],
)
def test_a_malformed_record_is_skipped_never_raised(raw: bytes) -> None:
    assert check(raw, secret=None) is None


def test_with_a_secret_unsigned_and_forged_records_are_rejected() -> None:
    unsigned = sealed(None)
    forged = sealed(b"another secret")
    tampered = json.loads(sealed(SECRET))
    tampered["record"] = tampered["record"].replace('"rank": 3', '"rank": 0')
    for raw in (unsigned, forged, json.dumps(tampered).encode()):
        assert check(raw, secret=SECRET) is None


def test_only_records_of_the_jobs_nodes_and_rounds_count() -> None:
    raws = [
        sealed(),
        sealed(node="10.6.6.6 (agent pid 1)"),  # no node of this job
        sealed(rdzv_round=7),  # a round this agent never saw
        sealed(node=None),  # names no node, or no round: from no member
        sealed(rdzv_round=None),
        b"garbage",
    ]
    checked = check_all(raws, secret=None, nodes={NODE}, last_round=2)
    assert checked.records == [RECORD] and checked.ignored == 5
    legacy = check_all(raws, secret=None, nodes=None, last_round=2)  # legacy etcd: no participants
    assert len(legacy.records) == 2 and legacy.ignored == 4


def test_forged_and_malformed_records_in_a_real_store_change_nothing(tmp_path: Path) -> None:
    """A real c10d job where someone who reached the store wrote a forged "earliest failure" of a
    node that is not in the job, and a malformed record: both agents still name the real root
    cause, exit 1 (not 70), and say that records were ignored."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]

    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        key = f"elastic_hydra/{j.run_id}/failures"
        forged = record(rank=0, local_rank=0, node_rank=0, time=1.0, node="10.6.6.6 (agent pid 1)",
                        terminated_by_launcher=False, after_node_loss=False)  # fmt: skip
        store.set(f"{key}/{store.add(f'{key}/count', 1)}", json.dumps(forged))
        store.set(f"{key}/{store.add(f'{key}/count', 1)}", "{not json")
        for _ in range(2):
            j.start("nnodes=2", "nproc_per_node=2", "rdzv.is_host=false", *FAST,
                    env={"FAIL_RANK": "3"})  # fmt: skip
        assert j.finish(150) == [1, 1], j.explain()
        del store
    for agent in j.agents:
        cause = agent.summary()["root_cause"]
        assert (cause["rank"], cause["message"]) == (3, "ValueError: boom from rank 3"), cause
        assert "2 failure record(s) in the rendezvous store were ignored" in agent.text()
        assert "internal error" not in agent.text()
