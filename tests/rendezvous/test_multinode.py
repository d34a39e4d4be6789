"""Multi-node jobs on one host: real agents (separate processes), torch's rendezvous handlers over a
real c10d store or a real etcd server, workers running gloo collectives.

Node loss is a `kill -9` of a whole agent; its workers die with it (PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic_hydra.agent.events import ChangeKind, Event, ExitBarrier, Joining, MembershipChange
from tests.conftest import WORKERS, free_port, wait_for
from tests.harness import ELASTIC_HYDRA, launcher_env, on_a_terminal
from tests.multinode import FAST, Agent, Job, job, rdzv_server
from tests.servers import EtcdServer, etcd_server

AGENT_DEADLINE = 90.0  # under the 120 s test timeout, so a stuck job explains itself; ~15 s here


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path / "etcd-data") as server:
        yield server


def check_allreduce(records: list[dict[str, object]], world: int) -> None:
    assert [r["rank"] for r in records] == list(range(world))
    for record in records:
        assert record["sum"] == record["expected"] == world * (world + 1) // 2, record
        assert record["world_size"] == world, record


def membership(agent_events: list[Event], change: ChangeKind) -> list[MembershipChange]:
    return [e for e in agent_events if isinstance(e, MembershipChange) and e.change is change]


# ------------------------------------------------------------------------------ fixed size jobs
@pytest.mark.parametrize("backend", ["c10d", "etcd-v2", "etcd"])
def test_two_nodes_of_two_workers(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "c10d":
        endpoint = f"127.0.0.1:{free_port()}"
    else:
        endpoint = request.getfixturevalue("etcd").endpoint
    with job(tmp_path, backend, endpoint, gloo=True) as j:  # the workers' gloo on each backend
        for _ in range(2):
            j.start("nnodes=2", "nproc_per_node=2", *FAST)
        assert j.finish(AGENT_DEADLINE) == [0, 0], j.explain()

    records = j.world(4)
    check_allreduce(records, 4)
    assert sorted(r["group_rank"] for r in records) == [0, 0, 1, 1]
    for record in records:
        assert record["group_rank"] == record["rank"] // 2  # contiguous ranks per node
    for agent in j.agents:  # torch's own INFO logging stays out of the console
        assert not [ln for ln in agent.text().splitlines() if ln.startswith("INFO ")], agent.text()
        assert record["group_world_size"] == 2
        assert record["run_id"] == j.run_id
        assert record["restart_count"] == 0
    assert len({r["master"] for r in records}) == 1  # one MASTER_ADDR:PORT for the whole job
    for agent in j.agents:
        summary = agent.summary()
        assert (summary["status"], summary["attempts"], summary["run_id"]) == (
            "succeeded",
            1,
            j.run_id,
        )
        barrier = [e for e in agent.events() if isinstance(e, ExitBarrier)]
        assert barrier and barrier[0].completed is True


# ---------------------------------------------------------------------------------- elasticity
def test_a_node_joining_mid_run_grows_the_world_without_a_restart(tmp_path: Path) -> None:
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        env = {"EXIT_AT_WORLD": "3"}
        # 2:3, not 1:3: the first two nodes start together, but on a loaded host the second can
        # join more than rdzv.last_call_timeout (1 s) after the first, which would run a round
        # of its own first (one more attempt than the count below).
        for _ in range(2):
            j.start("nnodes=2:3", "nproc_per_node=1", *FAST, env=env)
        j.wait_world(2, AGENT_DEADLINE)
        j.start("nnodes=2:3", "nproc_per_node=1", *FAST, env=env)
        assert j.finish(AGENT_DEADLINE) == [0, 0, 0], j.explain()

    check_allreduce(j.world(3), 3)
    assert {r["restart_count"] for r in j.records()} == {0}  # no restart was spent, anywhere
    # The first two nodes' workers of the 3-node world are their second attempt: they read 1 and
    # log to attempt_1/ (they read the restart count, 0, before); the third node's, its first.
    assert sorted((r["attempt"], r["log_dir"]) for r in j.world(3)) == [
        (0, "attempt_0"), (1, "attempt_1"), (1, "attempt_1"),
    ]  # fmt: skip
    first, second, _ = j.agents
    for agent in (first, second):
        joined = membership(agent.events(), ChangeKind.JOINED)
        assert joined and joined[0].reason == "1 new node(s) waiting to join", joined
        assert joined[0].nodes == 1, joined
        summary = agent.summary()
        # The group started again when the third node joined: one more attempt, no restart.
        assert (summary["attempts"], summary["restarts"]) == (2, 0), summary


@pytest.mark.parametrize("store", ["etcd-v2", "c10d-rdzv-server"])
def test_survivors_of_a_killed_node_continue_with_a_smaller_world(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    with store_for(tmp_path, store, request) as (backend, endpoint):
        with job(tmp_path, backend, endpoint) as j:
            release = tmp_path / "release"
            env = {"EXIT_AT_WORLD": "2", "RELEASE": str(release)}
            # A last call long enough for all three to make the first round however slowly the
            # third starts on a loaded host (it would join at the next round otherwise, and the
            # survivors would have restarted for it); the smaller round after the loss waits it.
            overrides: tuple[str, ...] = (
                "nnodes=2:3", "nproc_per_node=1", *FAST, "rdzv.last_call_timeout=10",
            )  # fmt: skip
            if backend == "c10d":
                overrides += ("rdzv.is_host=false",)  # the store lives in the rdzv-server
            for _ in range(3):
                j.start(*overrides, env=env)
            big = j.wait_world(3, AGENT_DEADLINE)
            release.touch()  # from now on a world of 2 may finish
            victim = j.agents[2]
            killed_at = time.time()
            os.kill(victim.proc.pid, signal.SIGKILL)
            codes = j.finish(AGENT_DEADLINE)
            assert codes == [0, 0, -signal.SIGKILL], j.explain()

        check_allreduce(j.world(2), 2)
        assert {r["restart_count"] for r in j.records()} == {0}
        # The victim's worker died with its agent; the survivors' old workers were stopped.
        wait_for(lambda: not any(psutil.pid_exists(r["pid"]) for r in big), 10, "old workers")
        bound = 1 * 3  # keep_alive_interval x keep_alive_max_attempt
        survivors = j.agents[:2]
        # Every survivor names the killed agent as the node that left, though the first to
        # notice re-joins before the other notices: that one restarted nothing.
        gone = f"(agent pid {victim.proc.pid}) left the job (no heartbeat for 3 s)"
        for agent in survivors:
            changes = [e for e in agent.events() if isinstance(e, MembershipChange)]
            assert [(e.change, e.nodes) for e in changes] == [(ChangeKind.LEFT, 2)], changes
            assert gone in changes[0].reason, changes
            (line,) = [ln for ln in agent.text().splitlines() if "left the job" in ln]
            assert line.endswith(gone), line
            assert "restarted its workers" not in agent.text(), agent.text()
            noticed = changes[0].wall_time - killed_at
            # Within the bound, plus up to one heartbeat period and two reads of torch's state,
            # cached 1 s each (a departure counts when a second read confirms it), and load.
            assert noticed < bound + 1 + 2 + 2, noticed
            assert agent.summary()["status"] == "succeeded"


def test_a_quarantined_node_that_starts_leaves_the_others_training(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    added = subprocess.run(
        [*ELASTIC_HYDRA, "quarantine", "add", "node-9", "--reason", "ECC errors", "--ledger",
         str(ledger)],
        capture_output=True, text=True, env=launcher_env(), check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        overrides = ("nnodes=2:3", "nproc_per_node=1", "rdzv.is_host=false",
                     f"quarantine.ledger={ledger}", *FAST)  # fmt: skip
        refused = j.start(*overrides, env={"SLURMD_NODENAME": "node-9"})
        assert refused.proc.wait(timeout=AGENT_DEADLINE) == 6, refused.text()
        for n in range(2):  # it closed nothing: the others meet and train
            j.start(*overrides, env={"SLURMD_NODENAME": f"node-{n}", "EXIT_AT_WORLD": "2"})
        assert j.finish(AGENT_DEADLINE) == [6, 0, 0], j.explain()
    check_allreduce(j.world(2), 2)


def test_a_node_whose_gpu_fails_leaves_for_the_ledger_and_the_rest_train_on(tmp_path: Path) -> None:
    # A hardware failure (restart.on_class.hardware=exclude): its node leaves the job (exit 4)
    # into the quarantine ledger; the others lose a peer, spend no restart, and go on as 2.
    ledger = tmp_path / "ledger.json"
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        release = tmp_path / "release"
        env = {"EXIT_AT_WORLD": "2", "RELEASE": str(release), "LOOP": "1"}
        overrides = ("nnodes=2:3", "nproc_per_node=1", "rdzv.is_host=false",
                     "restart.max_restarts=3", f"quarantine.ledger={ledger}", *FAST)  # fmt: skip
        for n in range(3):  # one machine: each node its own name, as the ledger knows nodes
            named = env | {"SLURMD_NODENAME": f"node-{n}"}
            j.start(*overrides, env=named | ({"HARDWARE": "1"} if n == 2 else {}))
        j.wait_world(3, AGENT_DEADLINE)
        release.touch()
        assert j.finish(AGENT_DEADLINE) == [0, 0, 4], j.explain()

    check_allreduce(j.world(2), 2)
    bad = j.agents[2].summary()
    assert (bad["status"], bad["failure_class"], bad["restarts"]) == ("excluded", "hardware", 0)
    assert "this node leaves the job: RuntimeError: CUDA error: uncorrectable ECC error" in (
        j.agents[2].text()
    )
    (entry,) = json.loads(ledger.read_text())["entries"]
    assert (entry["host"], entry["gpu"]) == ("node-2", None)
    assert entry["reason"].startswith("hardware: RuntimeError: CUDA")
    for agent in j.agents[:2]:
        summary = agent.summary()
        assert (summary["status"], summary["restarts"]) == ("succeeded", 0), summary


def test_survivors_whose_collectives_a_dead_node_broke_spend_no_restart(tmp_path: Path) -> None:
    # Workers in a collective loop fail the moment a peer dies, before the heartbeats tell: in
    # an elastic job those failures are the lost node's collateral, not a failure of the job.
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        release = tmp_path / "release"
        env = {"EXIT_AT_WORLD": "2", "RELEASE": str(release), "LOOP": "1"}
        overrides = ("nnodes=2:3", "nproc_per_node=1", "rdzv.is_host=false", *FAST)
        for _ in range(3):
            j.start(*overrides, "restart.max_restarts=0", env=env)
        j.wait_world(3, AGENT_DEADLINE)
        release.touch()
        os.kill(j.agents[2].proc.pid, signal.SIGKILL)
        assert j.finish(AGENT_DEADLINE) == [0, 0, -signal.SIGKILL], j.explain()

    check_allreduce(j.world(2), 2)
    for agent in j.agents[:2]:
        summary = agent.summary()
        assert (summary["status"], summary["restarts"]) == ("succeeded", 0), summary
        broken = [e for e in summary["exits"]
                  if e["returncode"] != 0 and not e["terminated_by_launcher"]]  # fmt: skip
        assert broken and all(e["after_node_loss"] for e in broken), summary["exits"]


# --------------------------------------------------------------------------------- failures
def test_a_worker_failure_on_one_node_restarts_the_job_on_every_node(tmp_path: Path) -> None:
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        for _ in range(2):
            j.start("nnodes=2", "nproc_per_node=2", "restart.max_restarts=1", *FAST,
                    env={"FAIL_RANK": "3"})  # fmt: skip
        assert j.finish(AGENT_DEADLINE) == [0, 0], j.explain()

    records = j.records()
    assert len(records) == 8  # every rank of both nodes ran twice
    first_pids = {r["pid"] for r in records[:4]}
    check_allreduce(j.world(4), 4)
    assert not first_pids & {r["pid"] for r in j.world(4)}  # all new processes, on both nodes
    # Both nodes started their workers twice; the failing node spent a restart, the other
    # re-joined for free.
    assert [a.summary()["attempts"] for a in j.agents] == [2, 2]
    assert sorted(a.summary()["restarts"] for a in j.agents) == [0, 1]
    # The other node says what happened: a peer restarted, not a new node joining.
    (other,) = [a for a in j.agents if a.summary()["restarts"] == 0]
    joined = membership(other.events(), ChangeKind.JOINED)
    assert joined and joined[0].reason.endswith(
        "restarted its workers: a new round for every node"
    ), joined
    # `report` of each node: every attempt has its row and says how it ended (the other node's
    # first ended in the membership change), the failing node's recovered failure its traceback.
    for agent in j.agents:
        (summary_path,) = agent.root.glob("**/summary.json")
        report = subprocess.run(
            [*ELASTIC_HYDRA, "report", str(summary_path.parent)],
            env=launcher_env(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert report.returncode == 0, report.stderr
        lines = [ln.strip() for ln in report.stdout.splitlines()]
        rows = lines[lines.index("attempts") + 2 : lines.index("attempts") + 4]
        assert [r.split()[0] for r in rows] == ["0", "1"], report.stdout
        if agent is other:
            assert "restarted its workers" in rows[0] and "membership" in rows[0], rows
            assert "recovered failures" not in report.stdout
        else:
            assert rows[0].endswith("rank 3 exit code 1"), rows
            recovered = report.stdout[report.stdout.index("recovered failures") :]
            assert "ValueError: boom from rank 3" in recovered, report.stdout


# A launcher that counts the agent's reads of its workers' stderr logs, one path a line.
COUNTING_AGENT = """
import sys
from pathlib import Path

from elastic_hydra.report import failure_files

log = Path(sys.argv.pop(1))
read_tail = failure_files.read_tail


def counted(path, *args, **kwargs):
    if path.name == "stderr.log":
        with log.open("a") as out:
            out.write(f"{path}\\n")
    return read_tail(path, *args, **kwargs)


failure_files.read_tail = counted
from elastic_hydra.cli.entry import main

main()
"""


def test_every_node_names_the_job_wide_root_cause_reading_each_failed_workers_files_once(
    tmp_path: Path,
) -> None:
    """Every node names the rank that failed first, the other node from the store. On each node
    a failure is checked (a lost peer, or a fault of its own?), published to the store and
    summarised: one read of its files serves all three."""
    agent = tmp_path / "counting_agent.py"
    agent.write_text(COUNTING_AGENT)
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        for i in range(2):
            overrides = ("nnodes=2", "nproc_per_node=2", "rdzv.is_host=false", *FAST,
                         f"logs.root={tmp_path / f'agent{i}'}")  # fmt: skip
            command = j.command(*overrides)[len(ELASTIC_HYDRA) :]
            log = tmp_path / f"reads{i}.txt"
            j.start(argv=[sys.executable, str(agent), str(log), *command], env={"FAIL_RANK": "3"})
        assert j.finish(AGENT_DEADLINE) == [1, 1], j.explain()

    summaries = [a.summary() for a in j.agents]
    failing = next(s for s in summaries if any(f["rank"] == 3 for f in s["failures"]))
    other = next(s for s in summaries if s is not failing)
    for summary in summaries:
        cause = summary["root_cause"]
        assert cause is not None, summary
        assert (cause["rank"], cause["local_rank"], cause["node_rank"]) == (3, 1, 1)
        assert cause["message"] == "ValueError: boom from rank 3"
        assert cause["host"] == failing["host"]
    # The other node's own ranks did not fail: it learned the cause from the store.
    assert not [f for f in other["failures"] if not f["terminated_by_launcher"]]
    assert "another node ended the job" in other["message"]
    text = next(a for a in j.agents if a.summary() is not None and a.summary() == other).text()
    assert "root cause  rank 3 (local rank 1) on" in text and "(node 1)" in text, text
    for i in range(2):
        reads = Counter((tmp_path / f"reads{i}.txt").read_text().splitlines())
        # Every failed worker of the node (its own failure, or its rank stopped by the launcher
        # when the job ended) is read, and once.
        assert reads and set(reads.values()) == {1}, reads


# ------------------------------------------------------------------------ rendezvous problems
def test_a_rendezvous_that_never_completes_fails_at_join_timeout(tmp_path: Path) -> None:
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        j.start("nnodes=2", "nproc_per_node=1", "rdzv.join_timeout=2", *FAST)
        assert j.finish(60) == [3], j.explain()
    agent = j.agents[0]
    lines = [line for line in agent.text().splitlines() if "error" in line or "rendezvous" in line]
    assert any(
        "did not complete within rdzv.join_timeout=2 s" in line and "nnodes=2" in line
        for line in lines
    ), agent.text()
    assert "Traceback" not in agent.text()
    assert agent.summary()["status"] == "rendezvous_failed"
    assert not j.records()  # no worker ever started


def test_a_closed_rendezvous_and_an_unreachable_store_are_one_line_each(tmp_path: Path) -> None:
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        fast = ("nproc_per_node=1", "rdzv.is_host=false", *FAST)
        j.start("nnodes=2", "rdzv.join_timeout=1", *fast)
        assert j.finish(60) == [3], j.explain()
        j.start("nnodes=1", *fast)  # same run id: the job above closed it
        assert j.finish(60) == [3, 3], j.explain()
    assert "is closed: this job already ended on another node" in j.agents[1].text()

    # A host name that does not resolve is named at once, not after rdzv.read_timeout.
    with job(tmp_path / "nxdomain", "c10d", "no-such-host.invalid:29400") as j:
        (tmp_path / "nxdomain").mkdir()
        j.start("nnodes=1", "nproc_per_node=1", "rdzv.read_timeout=600")
        assert j.finish(60) == [3], j.explain()
    (line,) = [ln for ln in j.agents[0].text().splitlines() if "does not resolve" in ln]
    assert "'no-such-host.invalid'" in line and "rdzv.endpoint" in line, line
    assert line.startswith("elastic-hydra: rendezvous failed: "), line  # words, not a field name


def test_a_store_that_refuses_connections_is_one_line_soon_naming_the_bound_it_used(
    tmp_path: Path,
) -> None:
    # A wrong port, nobody listening: torch's client would retry for rdzv.read_timeout per try,
    # then blame "the connection" and name a bound it did not use. Both other bounds are set far
    # past the one that must end the wait (connect_timeout, 2 s), so the margin below holds an
    # agent's start and torch's import on a loaded host (21 s seen under load) and still fails
    # an agent that waits for either of them.
    endpoint = f"127.0.0.1:{free_port()}"
    with job(tmp_path, "c10d", endpoint) as j:
        started = time.monotonic()
        j.start("nnodes=2", "nproc_per_node=1", "rdzv.is_host=false", "rdzv.join_timeout=150",
                "rdzv.read_timeout=150", "rdzv.connect_timeout=2")  # fmt: skip
        assert j.finish(100) == [3], j.explain()
        took = time.monotonic() - started
    text = j.agents[0].text()
    assert took < 90, (took, text)  # neither join_timeout nor read_timeout (150 s) was waited
    (line,) = [ln for ln in text.splitlines() if "rendezvous failed" in ln]
    assert line.startswith(
        f"elastic-hydra: rendezvous failed: cannot connect to the rendezvous store at {endpoint} "
        "(connection refused; retried for rdzv.connect_timeout=2 s): start the store (an agent "
        "with rdzv.is_host=true, or `elastic-hydra rdzv-server`) there first, or fix "
        "rdzv.endpoint ("
    ), text
    assert "join_timeout" not in text and "read_timeout" not in text, text
    assert "Traceback" not in text
    assert j.agents[0].summary()["status"] == "rendezvous_failed"


def test_losing_an_rdzv_server_points_at_it(tmp_path: Path) -> None:
    with rdzv_server(tmp_path) as (port, server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        idle = j.command(
            "nnodes=1", "nproc_per_node=1", "rdzv.is_host=false", *FAST,
            f"logs.root={tmp_path / 'agent0'}", script=WORKERS / "idle.py",
        )  # fmt: skip
        j.start(argv=idle)
        wait_for(lambda: "node 0 of 1" in j.agents[0].text(), 60, "the round to complete")
        server.kill()
        assert j.finish(AGENT_DEADLINE) == [3], j.explain()
    (line,) = [ln for ln in j.agents[0].text().splitlines() if "lost the c10d" in ln]
    assert f"Check the store's process at 127.0.0.1:{port}" in line, line
    assert "run the store apart" not in line  # it is apart already


def test_a_join_that_waits_says_for_what_and_how_long(tmp_path: Path) -> None:
    port = free_port()
    with job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        j.start("nnodes=2", "nproc_per_node=1", "rdzv.join_timeout=7", *FAST)
        assert j.finish(AGENT_DEADLINE) == [3], j.explain()
    (line,) = [ln for ln in j.agents[0].text().splitlines() if "joined the" in ln]
    assert line.startswith("elastic-hydra: 1 of 2 node(s) joined the c10d rendezvous"), line
    assert re.search(r"; [5-7] s of rdzv.join_timeout=7 s$", line), line


def test_a_join_with_the_minimum_says_it_waits_for_more_and_how_long(tmp_path: Path) -> None:
    # Both nodes are there: what the round waits for now is the last call for nodes 3 and 4
    # (long enough for the notice 30 s into the join). Once both have said so, nodes 3 and 4
    # come: the round is full and starts at once, rather than at the end of the last call.
    overrides = ("nnodes=2:4", "nproc_per_node=1", "rdzv.last_call_timeout=40",
                 "rdzv.keep_alive_interval=1", "rdzv.keep_alive_max_attempt=3")  # fmt: skip

    def last_call(agent: Agent) -> list[str]:
        return [ln for ln in agent.text().splitlines() if "last call" in ln]

    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        first = [j.start(*overrides) for _ in range(2)]
        wait_for(lambda: all(last_call(a) for a in first), AGENT_DEADLINE, "the last call lines",
                 detail=j.explain)  # fmt: skip
        lines = [ln for a in first for ln in last_call(a)]  # what two nodes said, not three
        for _ in range(2):
            j.start(*overrides)
        assert j.finish(AGENT_DEADLINE) == [0, 0, 0, 0], j.explain()
    assert len(j.world(4)) == 4, j.records()  # the round the last call waited for
    assert lines, j.explain()
    for line in lines:
        assert line.startswith("elastic-hydra: 2 of 4 node(s) joined the c10d rendezvous"), line
        left = re.search(
            r"; last call for more: (\d+) s left \(rdzv.last_call_timeout=40 s\)$", line
        )
        assert left and int(left.group(1)) < 40, line
    assert "waiting for 2 node(s)" not in j.explain()  # what it waits for now: more nodes


def test_on_a_terminal_the_wait_is_one_status_line_updated_every_second(tmp_path: Path) -> None:
    args = [
        f"script={WORKERS / 'idle.py'}", "rdzv=c10d", "nnodes=2",
        f"rdzv.endpoint=127.0.0.1:{free_port()}", "rdzv.id=wait", "rdzv.join_timeout=8",
    ]  # fmt: skip
    env = {**launcher_env(), "TERM": "xterm"}
    code, output = on_a_terminal(*args, cwd=tmp_path, env=env, stream="stderr")
    assert code == 3
    text = output.decode(errors="replace")
    updates = re.findall(r"\r\x1b\[2Kelastic-hydra: 1 of 2 node\(s\) joined.*?; (\d+) s of", text)
    assert len(updates) >= 2 and updates == sorted(updates, key=int), text  # rewritten in place
    assert re.search(r"\r\x1b\[2K(?!elastic-hydra: 1 of 2)", text), text  # cleared at the end


def test_nodes_that_resolved_different_jobs_refuse_to_start(tmp_path: Path) -> None:
    # The nodes of a job agree on its program and arguments: a ${now:} in args, or overrides
    # that differ between nodes, would give the ranks different jobs.
    port = free_port()
    with job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        for lr in ("0.1", "0.2"):
            j.start("nnodes=2", "nproc_per_node=1", f"+hp.lr={lr}", *FAST)
        assert j.finish(AGENT_DEADLINE) == [3, 3], j.explain()
    for agent in j.agents:
        (line,) = [ln for ln in agent.text().splitlines() if "resolved a different config" in ln]
        assert "same job file and overrides" in line, line
    assert not j.records()  # no worker ever started


def test_without_torch_a_torch_backend_is_one_line_naming_the_install(tmp_path: Path) -> None:
    shadow = tmp_path / "no-torch" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    with job(tmp_path, "c10d", "127.0.0.1:29400") as j:
        j.start("nnodes=2", env={"PYTHONPATH": str(shadow.parent)})
        assert j.finish(30) == [2], j.explain()
    lines = j.agents[0].text().strip().splitlines()
    assert lines[-1].startswith("elastic-hydra: error: rdzv.backend: needs PyTorch"), lines
    assert "pip install torch" in lines[-1]
    assert j.agents[0].summary()["status"] == "config_error"


def test_a_signal_during_the_rendezvous_stops_the_agent_at_once(tmp_path: Path) -> None:
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        agent = j.start("nnodes=2", "nproc_per_node=1", *FAST)  # the second node never comes
        wait_for(lambda: [e for e in agent.events() if isinstance(e, Joining)], 60, "the join")
        agent.proc.send_signal(signal.SIGTERM)
        assert j.finish(10) == [128 + signal.SIGTERM], j.explain()
    summary = agent.summary()
    assert (summary["status"], summary["signal"]) == ("stopped", "SIGTERM")
    assert not j.records()


# --------------------------------------------------------------------------------------- slurm
def test_slurm_preset_fills_nodes_endpoint_and_run_id(tmp_path: Path) -> None:
    port = free_port()
    slurm = {  # step 0 of job 77123, one task per node
        "SLURM_JOB_ID": "77123",
        "SLURM_JOB_NODELIST": "localhost,127.0.0.1",
        "SLURM_NNODES": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "localhost,127.0.0.1",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
    }
    with job(tmp_path, "slurm", f":{port}") as j:
        for node_id in (1, 0):  # node 1 first: torch alone would rank it 0 (same host, lower pid)
            argv = [a for a in j.command("nproc_per_node=1", *FAST) if "rdzv.id" not in a]
            argv += [f"logs.root={tmp_path / f'agent{node_id}'}"]
            j.start(argv=argv, env=slurm | {"SLURM_NODEID": str(node_id)})
        assert j.finish(AGENT_DEADLINE) == [0, 0], j.explain()
    records = j.world(2)
    check_allreduce(records, 2)
    assert {r["run_id"] for r in records} == {"77123.0"}
    assert [(r["group_rank"], r["slurm_node_id"]) for r in records] == [(0, "0"), (1, "1")]
    assert j.agents[0].summary()["run_id"] == "77123.0"


# ------------------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def store_for(tmp: Path, store: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    if store == "etcd-v2":
        yield "etcd-v2", request.getfixturevalue("etcd").endpoint
        return
    with rdzv_server(tmp) as (port, _server):
        yield "c10d", f"127.0.0.1:{port}"


# ------------------------------------------------------------------------------------- interop
def test_an_elastic_hydra_agent_and_a_torchrun_agent_form_one_job(tmp_path: Path) -> None:
    port = free_port()
    with job(tmp_path, "c10d", f"127.0.0.1:{port}", gloo=True) as j:
        j.start("nnodes=2", "nproc_per_node=2", *FAST)
        torchrun = [
            str(Path(sys.executable).with_name("torchrun")),
            "--nnodes=2",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={j.run_id}",
            "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3",
            "--local-addr=127.0.0.1",
            str(WORKERS / "elastic.py"),
        ]
        j.start(argv=torchrun)
        assert j.finish(AGENT_DEADLINE) == [0, 0], j.explain()

    records = j.world(4)
    check_allreduce(records, 4)
    assert {r["run_id"] for r in records} == {j.run_id}
    assert len({r["master"] for r in records}) == 1
    ours = j.agents[0].summary()
    assert ours["status"] == "succeeded"
    # Both agents leave through the same exit barrier: neither waits for a timeout.
    barrier = [e for e in j.agents[0].events() if isinstance(e, ExitBarrier)]
    assert barrier and barrier[0].completed is True


def test_a_torchrun_agent_on_torchs_heartbeats_is_not_dropped_by_ours(tmp_path: Path) -> None:
    # Our defaults beat every second and drop a node after 3 s; torchrun's beat every 5 s. A
    # torchrun agent on its defaults is judged at torch's bound, 15 s: 8 s of gloo steps (more
    # than one of its 5 s gaps) pass with no membership change.
    port = free_port()
    steps = ["--", "40", "0.2", "0", "0", "0"]  # straggle.py: 40 steps of 0.2 s, none slowed
    with job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        ours = j.start(argv=[*j.command("nnodes=2", "nproc_per_node=1",
                                        f"logs.root={tmp_path / 'agent0'}",
                                        script=WORKERS / "straggle.py"), *steps])  # fmt: skip
        j.start(argv=[
            str(Path(sys.executable).with_name("torchrun")), "--nnodes=2", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={j.run_id}",
            "--local-addr=127.0.0.1", str(WORKERS / "straggle.py"), *steps[1:],
        ])  # fmt: skip
        assert j.finish(AGENT_DEADLINE) == [0, 0], j.explain()
    assert not [e for e in ours.events() if isinstance(e, MembershipChange)], ours.text()
    assert ours.summary()["status"] == "succeeded"
    assert (
        "elastic-hydra: torchrun agents are in this job: they are judged gone after 15 s without "
        "a heartbeat (torch's default), elastic-hydra agents after 3 s"
    ) in ours.text()
    assert len((j.out / "arrived_0").read_text().split()) == 40  # every step ran


def torchrun_argv(j: Job, port: int, *extra: str) -> list[str]:
    return [
        str(Path(sys.executable).with_name("torchrun")), "--nnodes=2", "--nproc-per-node=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={j.run_id}",
        "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3",
        "--local-addr=127.0.0.1", *extra, str(WORKERS / "elastic.py"),
    ]  # fmt: skip


NO_SHARING = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "FAIL_RANK": "0"}


@pytest.mark.parametrize("first", ["elastic-hydra", "torchrun"])
def test_a_mixed_job_restarts_in_either_start_order_without_store_sharing(
    tmp_path: Path, first: str
) -> None:
    # Rank 0 fails once; both agents restart into a new round. The first agent to start hosts
    # the c10d store (node 0), so both orders put the other launcher's agent on node 1.
    port = free_port()
    with job(tmp_path, "c10d", f"127.0.0.1:{port}", gloo=True) as j:
        ours = ("nnodes=2", "nproc_per_node=1", "restart.max_restarts=2", *FAST)
        theirs = torchrun_argv(j, port, "--max-restarts=2")
        for n in range(2):
            if (n == 0) == (first == "elastic-hydra"):
                j.start(*ours, env=NO_SHARING)
            else:
                j.start(argv=theirs, env=NO_SHARING)
            wait_for(
                lambda: listening(port),
                30,
                "the first agent to host the store",
                interval=0.05,
                detail=j.explain,
            )
        assert j.finish(AGENT_DEADLINE) == [0, 0], j.explain()
    assert (tmp_path / "out" / "failed").exists()  # rank 0 did fail once
    records = j.records()
    assert len(records) == 4, records  # two rounds of two ranks
    check_allreduce(j.world(2), 2)
    assert records[-1]["master"] == records[-2]["master"]  # one store for the new round


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def test_a_mixed_job_with_store_sharing_stops_at_its_first_restart_and_says_why(
    tmp_path: Path,
) -> None:
    # torch 2.13's agents keep their first round's worker store; a restart would then hang on
    # stale keys. Our agent says so in one line instead of waiting on the store for a minute.
    port = free_port()
    with job(tmp_path, "c10d", f"127.0.0.1:{port}", gloo=True) as j:
        j.start(argv=torchrun_argv(j, port, "--max-restarts=2"), env={"FAIL_RANK": "0"})
        ours = j.start("nnodes=2", "nproc_per_node=1", "restart.max_restarts=2", *FAST,
                       env={"FAIL_RANK": "0"})  # fmt: skip
        wait_for(lambda: ours.proc.poll() is not None, 60, "our agent to stop", interval=0.1)
        j.stop()
    assert ours.proc.returncode == 3, ours.text()
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node" in ours.text()
    assert "torchrun agents are in this job" in ours.text()  # warned in the first round


def test_a_torchrun_node_that_restarts_is_named_and_our_broken_ranks_are_its_collateral(
    tmp_path: Path,
) -> None:
    # torchrun's rank 0 fails once; our rank 1, in a collective loop with it, breaks ("Connection
    # closed by peer"). torchrun leaves no failure record, but its agent re-joins the rendezvous:
    # our node names it, marks its own failure collateral and spends no restart (it has none).
    port = free_port()
    env = {**NO_SHARING, "LOOP": "1"}
    with job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        j.start(argv=torchrun_argv(j, port, "--max-restarts=1"), env=env)
        wait_for(
            lambda: listening(port),
            30,
            "torchrun to host the store",
            interval=0.05,
            detail=j.explain,
        )
        ours = j.start("nnodes=2", "nproc_per_node=1", "restart.max_restarts=0", *FAST, env=env)
        assert j.finish(AGENT_DEADLINE) == [0, 0], j.explain()
    check_allreduce(j.world(2), 2)
    summary = ours.summary()
    assert (summary["status"], summary["attempts"], summary["restarts"]) == ("succeeded", 2, 0)
    # Our rank broke (collateral), or, when our node saw the restart first, was stopped.
    assert not_blamed(summary), summary["exits"]
    (peer,) = summary["peer_failures"]
    assert (peer["node_rank"], peer["ranks"], peer["what"], peer["launcher"]) == (
        0, "0", "restarted its workers", "torchrun",
    )  # fmt: skip
    said = "node 0 (torchrun agent on 127.0.0.1, pid "
    assert f"{said}{peer['node'].split(', pid ')[1]}; ranks 0) restarted its" in ours.text()
    run_dir = Path(summary["run_dir"])
    report = subprocess.run(
        [*ELASTIC_HYDRA, "report", str(run_dir)],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert report.returncode == 0 and "torchrun nodes (their tracebacks" in report.stdout
    assert f"round 0: {said}{peer['node'].split(', pid ')[1]}; ranks 0) restarted" in report.stdout


def test_a_job_a_torchrun_node_ended_names_it_and_blames_none_of_ours(tmp_path: Path) -> None:
    # torchrun's rank 0 fails with no restart left: its agent closes the rendezvous (on an rdzv
    # server, so the store outlives it). Our broken rank is not the root cause; the node is named.
    env = {**NO_SHARING, "LOOP": "1"}
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        theirs = [
            f"{a},is_host=false" if a.startswith("--rdzv-conf") else a
            for a in torchrun_argv(j, port, "--max-restarts=0")
        ]
        j.start(argv=theirs, env=env)
        ours = j.start("nnodes=2", "nproc_per_node=1", "rdzv.is_host=false", *FAST, env=env)
        assert j.finish(AGENT_DEADLINE) == [1, 1], j.explain()
    summary = ours.summary()
    assert summary["status"] == "failed" and summary["root_cause"] is None
    assert summary["message"].startswith(
        "another node ended the job; if it is node 0 (torchrun agent on 127.0.0.1, pid "
    )
    assert not_blamed(summary), summary["exits"]


def not_blamed(summary: dict[str, Any]) -> bool:
    """Every worker of ours that did not exit 0 is marked: another node's collateral, or
    stopped by our agent (when it saw the other node's restart or end before its rank broke)."""
    ended = [e for e in summary["exits"] if e["returncode"] != 0]
    return bool(ended) and all(e["after_node_loss"] or e["terminated_by_launcher"] for e in ended)


def test_the_rdzv_server_stopped_by_a_signal_exits_128_plus_its_number(tmp_path: Path) -> None:
    with rdzv_server(tmp_path) as (_port, server):
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 143
    assert "rdzv-server: SIGTERM, stopping" in (tmp_path / "rdzv-server.out").read_text()
