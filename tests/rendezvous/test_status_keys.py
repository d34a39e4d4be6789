"""Status records in the c10d store: every node's, read by `elastic-hydra top --endpoint` from
another process, read-only (a real two-node job on 127.0.0.1, plain-Python workers)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from elastic_hydra.plan import Endpoint
from elastic_hydra.rendezvous import status_keys
from tests.conftest import WORKERS, wait_for
from tests.harness import run
from tests.multinode import FAST, job, rdzv_server
from tests.servers import etcd_server


def top(endpoint: str, run_id: str, cwd: Path) -> tuple[dict[str, Any], str]:
    shown = run("top", "--endpoint", endpoint, "--id", run_id, "--once", "--json", cwd=cwd,
                timeout=60)  # fmt: skip
    assert shown.returncode in (0, 1), shown.stderr
    data: dict[str, Any] = json.loads(shown.stdout)
    return data, shown.stderr


def by_node(snap: dict[str, Any]) -> dict[int, list[tuple[int, str]]]:
    return {
        n["node_rank"]: [(w["rank"], w["state"]) for w in n["workers"]]
        for n in snap["nodes"]
        if n["node_rank"] is not None
    }


def test_top_reads_every_nodes_ranks_from_the_store_and_shows_a_killed_node_stale(
    tmp_path: Path,
) -> None:
    with rdzv_server(tmp_path) as (port, _), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        endpoint = f"127.0.0.1:{port}"
        script = (f"script={WORKERS / 'hang_probe.py'}", "nnodes=2", "nproc_per_node=2")
        for _ in range(2):
            j.start(*script, *FAST, "args=[sleep,sleep]")
        running = [(0, "running"), (1, "running")], [(2, "running"), (3, "running")]

        def both_running() -> dict[str, Any] | None:
            snap, _ = top(endpoint, j.run_id, tmp_path)
            found = by_node(snap)
            return snap if (found.get(0), found.get(1)) == running else None

        snap = wait_for(both_running, 90, "both nodes' ranks running", detail=j.explain)
        assert snap is not None
        assert snap["phase"] == "running" and snap["ignored"] == 0
        assert not any(n["stale"] for n in snap["nodes"])
        # A rank counts as running once started, maybe before its script wrote its pid.
        wait_for(lambda: len(list(j.out.glob("*.ready"))) == 4, 60, "four ranks' pids")
        pids = {p.read_text() for p in j.out.glob("*.ready")}
        assert {str(w["pid"]) for n in snap["nodes"] for w in n["workers"]} == pids

        # Someone who reaches the store writes nonsense into a slot: left out, one warning.
        store = status_keys.connect(Endpoint(host="127.0.0.1", port=port))
        slot = store.add(f"elastic_hydra/{j.run_id}/status/count", 1)
        store.set(f"elastic_hydra/{j.run_id}/status/{slot}", b'{"format": 1, "node": [1]}')
        snap, err = top(endpoint, j.run_id, tmp_path)
        assert snap["ignored"] == 1 and err.count("warning") == 1 and "ignored" in err
        assert len(snap["nodes"]) == 2

        # SIGKILL one agent: its record ages and the view says the node is stale.
        victim = next(n for n in snap["nodes"] if n["node_rank"] == 1)
        os.kill(victim["agent_pid"], signal.SIGKILL)

        def stale() -> dict[str, Any] | None:
            snap, _ = top(endpoint, j.run_id, tmp_path)
            stale = {n["agent_pid"]: n["stale"] for n in snap["nodes"]}
            others = [s for pid, s in stale.items() if pid != victim["agent_pid"]]
            return snap if stale.get(victim["agent_pid"]) and others == [False] else None

        wait_for(stale, 60, "the killed node to show as stale", detail=j.explain)


def test_top_of_a_store_nobody_serves_says_so_in_one_line(tmp_path: Path) -> None:
    from tests.conftest import free_port

    shown = run("top", "--endpoint", f"127.0.0.1:{free_port()}", "--id", "x", "--once",
                cwd=tmp_path, timeout=60)  # fmt: skip
    assert shown.returncode == 2 and "cannot reach the store" in shown.stderr
    assert shown.stderr.count("\n") == 1


def test_an_agent_whose_store_is_gone_loses_records_without_waiting_on_it_each_time() -> None:
    import torch.distributed  # noqa: F401  (loaded before the clock starts: seconds of CPU)

    from tests.conftest import free_port

    now = [0.0]
    sink = status_keys.StoreSink(Endpoint(host="127.0.0.1", port=free_port()), "x",
                                 clock=lambda: now[0])  # fmt: skip
    started = time.monotonic()
    sink(b"{}")  # refused: one bounded try (bounded, not fast: a loaded host stretches it)
    assert time.monotonic() - started < status_keys.TIMEOUT + 15 and sink.store is None
    started = time.monotonic()
    for _ in range(100):  # within RETRY: no new connection
        sink(b"{}")
    assert time.monotonic() - started < 0.5
    now[0] = status_keys.RETRY + 1
    assert sink.failed_at == 0.0


def test_top_reads_an_etcd_jobs_nodes_from_the_etcd_server(tmp_path: Path) -> None:
    with (
        etcd_server(tmp_path / "etcd-data") as server,
        job(tmp_path, "etcd-v2", server.endpoint) as j,
    ):
        script = (f"script={WORKERS / 'hang_probe.py'}", "nnodes=2", "nproc_per_node=1")
        for _ in range(2):
            j.start(*script, *FAST, "args=[sleep]")

        def both_running() -> dict[int, list[tuple[int, str]]] | None:
            shown = run("top", "--endpoint", server.endpoint, "--id", j.run_id, "--backend",
                        "etcd-v2", "--once", "--json", cwd=tmp_path, timeout=60)  # fmt: skip
            assert shown.returncode in (0, 1), shown.stderr
            found = by_node(json.loads(shown.stdout))
            return found if found == {0: [(0, "running")], 1: [(1, "running")]} else None

        wait_for(both_running, 120, "both etcd nodes' ranks running", detail=j.explain)


class FakeStore:
    """A store that holds bytes and fails the test on any write."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values
        self.asked = 0

    def check(self, keys: list[str]) -> bool:
        self.asked += 1
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]

    def add(self, key: str, amount: int) -> int:
        raise AssertionError("top must not write to the store")

    def set(self, key: str, value: bytes) -> None:
        raise AssertionError("top must not write to the store")


def test_reading_records_writes_nothing_and_caps_a_forged_count() -> None:
    prefix = status_keys.STATUS.format(run_id="r")
    assert status_keys.read_records(FakeStore({}), "r") == []
    forged = FakeStore({f"{prefix}count": b"99999999", f"{prefix}2": b"{}"})
    assert status_keys.read_records(forged, "r") == [b"{}"]
    assert forged.asked == 1 + status_keys.MAX_NODES  # the count, then each slot up to the cap
