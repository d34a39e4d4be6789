"""Preflight in real multi-node jobs on one host: agents as separate processes on 127.0.0.1 over a
real c10d store, probe workers running a real GEMM and gloo allreduces, then the job's workers.

A bad node is made for real: its agent runs in a mount namespace of its own where the job's
`preflight.paths` directory is a read-only bind mount (the namespace dies with the agent), or in a
cgroup v1 `cpu` group whose `cpu.cfs_quota_us` gives it a quarter of a CPU (removed after).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from elastic_hydra.errors import EXIT_PREFLIGHT_JOB, EXIT_PREFLIGHT_NODE
from elastic_hydra.quarantine.ledger import Ledger
from tests.conftest import free_port, wait_for
from tests.harness import ELASTIC_HYDRA
from tests.multinode import FAST, Job, job

AGENT_DEADLINE = 180.0  # agents, probes and workers each import torch: ~2 s of CPU on 2 cores
# This host's 2 cores are shared by every agent, probe and test running here: a worker's GEMM
# rate swings more than on a real node, so the jobs here fail a node below half the median.
QUICK = ("preflight=quick", "preflight.min_ratio=0.5", "preflight.gemm_seconds=0.3")
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller on this host
CPU_PERIOD_US = 10_000  # the throttled node's quota period (see cpu_cgroup)
READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


def verdict_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("preflight: ")]


def test_a_healthy_four_node_job_passes_preflight_then_trains(tmp_path: Path) -> None:
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        for _ in range(4):
            j.start("nnodes=4", *FAST, *QUICK)
        assert j.finish(AGENT_DEADLINE) == [0, 0, 0, 0], j.explain()
    records = j.world(4)
    assert [r["sum"] for r in records] == [10] * 4  # the job's own allreduce ran after
    lines = [verdict_lines(a.text()) for a in j.agents]
    assert all(found == lines[0] for found in lines)  # every node, the same verdict
    assert lines[0][-1].startswith("preflight: 4 node(s) passed: GEMM median ")
    assert "preflight: allreduce across 4 nodes at " in lines[0][0]
    for agent in j.agents:
        found = agent.summary()["preflight"]
        assert (found["mode"], found["nodes"], found["bad_nodes"]) == ("quick", 4, [])
        assert found["gemm_median"] > 0 and found["allreduce_busbw"] > 0
        (measured,) = agent.root.glob("**/preflight_*/0/measured.json")  # the probe's result
        assert measured.stat().st_mode & 0o777 == 0o600
    (summary,) = j.agents[0].root.glob("**/summary.json")
    report = subprocess.run(
        [*ELASTIC_HYDRA, "report", str(summary.parent)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert lines[0][-1] in report.stdout, report.stdout + report.stderr


def start_read_only(j: Job, data: Path, *overrides: str) -> None:
    """An agent whose `data` is read-only (a bind mount in its own mount namespace)."""
    root = j.tmp / f"agent{len(j.agents)}"
    cmd = j.command(*overrides, f"logs.root={root}")
    j.start(argv=["unshare", "-m", "--propagation", "private", "sh", "-c", READ_ONLY, str(data),
                  *cmd])  # fmt: skip


def test_a_fixed_size_job_with_a_read_only_path_on_one_node_stops_before_the_script(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ledger = tmp_path / "ledger.json"
    overrides = ("nnodes=2", *FAST, *QUICK, f"preflight.paths=[{data}]",
                 f"quarantine.ledger={ledger}")  # fmt: skip
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        j.start(*overrides)
        # The healthy node binds the store first (the c10d store lives in the agent that does):
        # the bad node's exit must not take it along before the healthy one reads the verdict.
        wait_for(lambda: "joining the rendezvous" in j.agents[0].text(), AGENT_DEADLINE,
                 "the healthy node to join", detail=j.explain)  # fmt: skip
        start_read_only(j, data, *overrides)
        codes = j.finish(AGENT_DEADLINE)
    assert codes == [EXIT_PREFLIGHT_JOB, EXIT_PREFLIGHT_NODE], j.explain()
    assert j.records() == []  # the script never ran
    named = f"preflight.paths {data} is read-only"
    for agent in j.agents:
        assert any(named in line for line in verdict_lines(agent.text())), agent.text()
    healthy, bad = (a.summary() for a in j.agents)
    assert bad["status"] == "preflight_failed" and named in bad["message"]
    assert healthy["status"] == "preflight_stopped"
    assert "fewer than the nnodes minimum 2" in healthy["message"]
    (finding,) = [f for f in healthy["preflight"]["findings"] if f["fatal"]]
    assert finding["check"] == "path" and finding["node"] == bad["preflight"]["bad_nodes"][0]
    # One verdict on both nodes; what is this node's own: its time, what it put into the ledger.
    own = ("seconds", "quarantined", "quarantined_until")
    assert healthy["preflight"] == bad["preflight"] | {k: healthy["preflight"][k] for k in own}
    assert (healthy["preflight"]["quarantined"], bad["preflight"]["quarantined"]) == (
        [],
        [socket.gethostname()],
    )
    # Writable here: the read-only bind mount lived and died in the bad node's mount namespace.
    assert data.stat().st_mode & stat.S_IWUSR and os.access(data, os.W_OK)  # root: not EROFS
    assert not os.statvfs(data).f_flag & os.ST_RDONLY
    assert not list(data.iterdir())  # and nothing left in it
    # The bad node, and it alone, put itself into the ledger and said so.
    (entry,) = Ledger(ledger).active(0)
    assert (entry.host, entry.gpu, entry.job) == (socket.gethostname(), None, j.run_id)
    assert named in entry.reason
    line = "elastic-hydra: quarantined "
    said = [[ln.startswith(line) for ln in a.text().splitlines()].count(True) for a in j.agents]
    assert said == [0, 1], j.explain()
    assert bad["preflight"]["quarantined_until"] == entry.until


@contextlib.contextmanager
def cpu_cgroup() -> Iterator[Path]:
    """A cgroup v1 `cpu` group (no quota yet) with a 10 ms quota period; removed at the end (the
    test stops its processes first).

    A short period, so that a throttled share holds over each GEMM window too: with the default
    100 ms, a 60 ms window can take one period's quota at its start and the next one's at its
    end, and measured a fifth of the full rate at a tenth of a CPU (82 % of a median pulled down
    by a busy core)."""
    group = CPU_CGROUPS / f"elastic-hydra-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        yield group
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().split(), 30,
                 "the throttled processes to end")  # fmt: skip
        group.rmdir()


def test_a_throttled_node_is_named_and_left_out_and_the_rest_trains_without_a_restart(
    tmp_path: Path,
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    # A last call long enough for all three to make the first round (the two others start
    # together once the store is up), and as short as that: the survivors' second round waits
    # all of it for a third node that never comes. The slow node is the
    # slowest of three, so the median is a healthy node's rate and a healthy node cannot fall
    # under 0.7 of it; the round of two carries that verdict over (it measures nothing).
    # The throttled node's probe loads torch at a tenth of a CPU (~25 s, more beside other
    # tests): its share of preflight.timeout (three quarters) must outlast that, or the node is
    # left out as "timed out" before its GEMM rate is measured.
    overrides = ("nnodes=2:3", *FAST, "rdzv.last_call_timeout=6", *QUICK,
                 "preflight.min_ratio=0.7", "preflight.timeout=160")  # fmt: skip
    with cpu_cgroup() as group, job(tmp_path, "c10d", endpoint) as j:
        j.start(*overrides)  # the store's host: it binds the endpoint first
        host, port = endpoint.split(":")
        wait_for(lambda: reachable(host, int(port)), 60, "the c10d store")
        root = j.tmp / f"agent{len(j.agents)}"
        cmd = j.command(*overrides, f"logs.root={root}")
        procs = str(group / "cgroup.procs")
        throttled = j.start(argv=["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *cmd])
        j.start(*overrides)
        # Once it is in the round (its probes are about to start, they load torch first),
        # the node gets a tenth of a CPU: a node that slows down, as a throttled one does.
        wait_for(lambda: re.search(r"node \d of 3,", throttled.text()), 120, "the first round")
        (group / "cpu.cfs_quota_us").write_text(str(CPU_PERIOD_US // 10))
        codes = j.finish(AGENT_DEADLINE)
    assert codes == [0, EXIT_PREFLIGHT_NODE, 0], j.explain()
    records = j.world(2)
    assert [r["sum"] for r in records] == [3, 3], j.records()  # trained on the two others
    assert not [r for r in j.records() if r["world_size"] == 3]  # never with the slow node
    bad = throttled.summary()
    assert bad["status"] == "preflight_failed" and "of the median GEMM rate" in bad["message"]
    (bad_node,) = bad["preflight"]["bad_nodes"]
    named = f"preflight: node {bad_node} ("
    measured = bad["preflight"]["round"]
    for agent in (j.agents[0], j.agents[2]):
        summary = agent.summary()
        assert (summary["status"], summary["restarts"]) == ("succeeded", 0)
        assert summary["preflight"]["nodes"] == 2 and summary["preflight"]["bad_nodes"] == []
        lines = verdict_lines(agent.text())
        assert any(ln.startswith(named) and "of the median GEMM rate" in ln for ln in lines)
        # The round of the two passed the battery a moment ago: it trains without another.
        assert summary["preflight"]["carried_from"] == measured, summary["preflight"]
        assert lines[-1] == (
            f"preflight: the 2 node(s) of this round passed round {measured}'s battery, "
            "with no restart since: not measured again"
        ), lines


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
