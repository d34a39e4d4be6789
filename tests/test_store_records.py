"""Failure records read back from the rendezvous store are untrusted input: checked, never a crash,
only from the job's own nodes, and signed when the nodes share a secret."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from multinode import FAST, job, rdzv_server

from elastic_hydra.rendezvous.sealed_records import check, check_all, seal

SECRET = b"shared-by-the-agents"
NODE = "127.0.0.1 (agent pid 4242)"


def record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "rank": 3, "local_rank": 1, "host": "node1", "pid": 99, "attempt": 0, "restart_count": 0,
        "returncode": 1, "signal": None, "exit": "exit code 1", "time": 1700000000.5,
        "terminated_by_launcher": False, "source": "error_file", "message": "ValueError: boom",
        "traceback": [{"exc_type": "ValueError", "exc_value": "boom", "link": None,
                       "frames": [{"filename": "t.py", "lineno": 3, "name": "f", "line": "x"}]}],
        "error_file": None, "stderr_tail": ["boom"], "stdout_log": "o", "stderr_log": "e",
        "node_rank": 1, "rdzv_round": 0, "node": NODE,
    }  # fmt: skip
    return {**base, **changes}


def test_a_well_formed_record_passes_with_and_without_a_secret() -> None:
    assert check(seal(record(), None).encode(), secret=None) == record()
    assert check(seal(record(), SECRET).encode(), secret=SECRET) == record()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1, 2, 3]",
        b"null",
        json.dumps({k: v for k, v in record().items() if k != "rank"}).encode(),
        json.dumps(record(rank="3")).encode(),
        json.dumps(record(rank=True)).encode(),
        json.dumps(record(time="yesterday")).encode(),
        json.dumps(record(time=float("nan"))).encode(),
        json.dumps(record(host=["a"])).encode(),
        json.dumps(record(message="x" * 10_000_000)).encode(),
        json.dumps(record(stderr_tail=["x"] * 100_000)).encode(),
        json.dumps(record(traceback="a string")).encode(),
        json.dumps(record(traceback=[{"exc_type": "E", "exc_value": "v", "frames": [7]}])).encode(),
        json.dumps(record(terminated_by_launcher="no")).encode(),
        b"{" * 100_000,
    ],
)
def test_a_malformed_record_is_skipped_never_raised(raw: bytes) -> None:
    assert check(raw, secret=None) is None


def test_with_a_secret_unsigned_and_forged_records_are_rejected() -> None:
    unsigned = seal(record(), None).encode()
    forged = seal(record(), b"another secret").encode()
    tampered = json.loads(seal(record(), SECRET))
    tampered["record"] = tampered["record"].replace('"rank": 3', '"rank": 0')
    for raw in (unsigned, forged, json.dumps(tampered).encode()):
        assert check(raw, secret=SECRET) is None


def test_only_records_of_the_jobs_nodes_and_rounds_count() -> None:
    raws = [
        seal(record(), None).encode(),
        seal(record(node="10.6.6.6 (agent pid 1)"), None).encode(),  # no node of this job
        seal(record(rdzv_round=7), None).encode(),  # a round this agent never saw
        b"garbage",
    ]
    checked = check_all(raws, secret=None, nodes={NODE}, last_round=2)
    assert checked.records == [record()] and checked.ignored == 3
    legacy = check_all(raws, secret=None, nodes=None, last_round=2)  # legacy etcd: no participants
    assert len(legacy.records) == 2 and legacy.ignored == 2


def test_forged_and_malformed_records_in_a_real_store_change_nothing(tmp_path: Path) -> None:
    """A real c10d job where someone who reached the store wrote a forged "earliest failure" of a
    node that is not in the job, and a malformed record: both agents still name the real root
    cause, exit 1 (not 70), and say that records were ignored."""
    from torch.distributed import TCPStore

    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        key = f"elastic_hydra/{j.run_id}/failures"
        forged = record(rank=0, local_rank=0, node_rank=0, time=1.0, node="10.6.6.6 (agent pid 1)")
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
