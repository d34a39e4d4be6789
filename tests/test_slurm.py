"""Slurm node lists and job variables, checked against what `scontrol show hostnames` prints."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from elastic_hydra.schedulers.slurm import (
    MAX_HOSTS,
    PORT_BASE,
    PORT_SPAN,
    SlurmJob,
    expand_nodelist,
    rdzv_port,
    slurm_job,
    step_dir_name,
)
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        (" a , b ,c ", ["a", "b", "c"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu-[1-3]", ["gpu-1", "gpu-2", "gpu-3"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[001-003]", ["n001", "n002", "n003"]),
        ("n[3-3]", ["n3"]),
        ("n[07]", ["n07"]),
        ("[7]", ["7"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("x[1,3]y[01-02]z", ["x1y01z", "x1y02z", "x3y01z", "x3y02z"]),
        ("gpu[1-2],cpu[10-11]", ["gpu1", "gpu2", "cpu10", "cpu11"]),
        ("b,a,b", ["b", "a", "b"]),
        ("n[2,1,2]", ["n2", "n1", "n2"]),
    ],
)
def test_expand_nodelist(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("", "empty host name"),
        ("a,,b", "empty host name"),
        ("a,", "empty host name"),
        (" , ", "empty host name"),
        ("node[1-3", "'node[1-3'"),
        ("node1-3]", "'node1-3]'"),
        ("node]1[", "'node]1['"),
        ("n[[1]]", "'n[[1]]'"),
        ("n[]", "empty brackets in 'n[]'"),
        ("n[5-3]", "reversed range '5-3'"),
        ("n[a-c]", "bad range 'a-c'"),
        ("n[1-x]", "bad range '1-x'"),
        ("n[1-]", "bad range '1-'"),
        ("n[-3]", "bad range '-3'"),
        ("n[1,,3]", "bad range ''"),
        ("n[1-2-3]", "bad range '1-2-3'"),
        ("n[1, 2]", "whitespace inside host name 'n[1, 2]'"),
        ("n[²]", "bad range '²'"),
        ("a b", "whitespace inside host name 'a b'"),
        ("n[0-65536]", f"more than {MAX_HOSTS} hosts"),
        ("a[0-999]b[0-999]", f"more than {MAX_HOSTS} hosts"),
    ],
)
def test_expand_nodelist_rejects_malformed(text: str, bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(bad)):
        expand_nodelist(text)


def test_expand_nodelist_allows_exactly_max_hosts() -> None:
    hosts = expand_nodelist(f"n[1-{MAX_HOSTS}]")
    assert len(hosts) == MAX_HOSTS
    assert (hosts[0], hosts[-1]) == ("n1", f"n{MAX_HOSTS}")


FULL = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[07-09]",
    "SLURM_NNODES": "3",
    "SLURM_NODEID": "1",
}


def test_no_job_id_means_not_in_slurm() -> None:
    assert slurm_job({}) is None
    # The other variables alone do not make a Slurm job.
    assert slurm_job({k: v for k, v in FULL.items() if k != "SLURM_JOB_ID"}) is None


def test_full_environment() -> None:
    job = slurm_job({**FULL, "HOME": "/root"})
    assert job == SlurmJob(
        job_id="4242",
        step_id=None,
        nodes=("gpu07", "gpu08", "gpu09"),
        nnodes=3,
        node_id=1,
        tasks=None,
    )
    assert job.run_id == "4242"


def test_slurm_job_is_frozen() -> None:
    job = slurm_job(FULL)
    assert job is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.node_id = 2  # type: ignore[misc]


def test_fallback_names() -> None:
    env = {
        "SLURM_JOBID": "77",
        "SLURM_NODELIST": "a,b",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": "0",
    }
    assert slurm_job(env) == SlurmJob(
        job_id="77", step_id=None, nodes=("a", "b"), nnodes=2, node_id=0, tasks=None
    )


STEP = {  # `srun -N2 -w gpu[08-09]` inside FULL's allocation: SLURM_NODEID counts in the step
    **FULL,
    "SLURM_STEP_ID": "3",
    "SLURM_STEP_NODELIST": "gpu[08-09]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NODEID": "1",
}


def test_inside_a_step_the_step_is_the_job() -> None:
    job = slurm_job(STEP)
    assert job == SlurmJob(
        job_id="4242", step_id=3, nodes=("gpu08", "gpu09"), nnodes=2, node_id=1, tasks=2
    )
    assert job.run_id == "4242.3"
    # The batch script has a step id of its own but no step node list: the allocation counts.
    batch = slurm_job({**FULL, "SLURM_STEP_ID": "4294967291"})
    assert batch is not None and (batch.step_id, batch.nnodes) == (None, 3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NODELIST='gpu[08-09]' names 2 nodes"),
        ({"SLURM_STEP_NUM_TASKS": "two"}, "SLURM_STEP_NUM_TASKS='two' is not a non-negative"),
        ({"SLURM_STEP_ID": "x"}, "SLURM_STEP_ID='x' is not a non-negative integer"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID='2' is not below SLURM_STEP_NUM_NODES='2'"),
    ],
)
def test_malformed_step(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        slurm_job({**STEP, **overrides})


def test_rdzv_port_separates_concurrent_jobs_and_steps() -> None:
    ports = {rdzv_port(str(job), step) for job in range(9000, 9150) for step in (None, 0, 1, 62)}
    assert len(ports) == 150 * 4  # neighbouring jobs, their batch scripts and steps never meet
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert PORT_BASE <= rdzv_port("123_4", None) < PORT_BASE + PORT_SPAN  # not a number: hashed


# What a node's launcher does: the port from its own environment, in its own interpreter.
NODE_PORT = (
    "import os; from elastic_hydra.schedulers.slurm import rdzv_port, slurm_job; "
    "job = slurm_job(os.environ); print(rdzv_port(job.job_id, job.step_id))"
)


@pytest.mark.parametrize(
    ("job_id", "port"),
    [
        ("4242", 21492),  # PORT_BASE + (4242 * 64 + 1 + 3) % PORT_SPAN: step 3 of job 4242
        ("4242_7", 27700),  # not a number (an array task): crc32, the same on every node
    ],
)
def test_every_node_of_a_step_computes_the_same_port(job_id: str, port: int) -> None:
    # Nothing of the node's process may enter the port: not its node id, not its hash seed.
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    found = []
    for node, seed in (("0", "1"), ("1", "2")):
        env = {**base, **STEP, "SLURM_JOB_ID": job_id, "SLURM_NODEID": node,
               "PYTHONHASHSEED": seed}  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", NODE_PORT], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        found.append(int(proc.stdout))
    assert found == [port, port]


def test_a_steps_nodes_agree_on_its_run_dir_name() -> None:
    assert step_dir_name(STEP) == step_dir_name({**STEP, "SLURM_NODEID": "0"}) == "slurm-4242.3"
    assert step_dir_name(FULL) is None  # the batch script: each launch its own dir, as usual
    assert step_dir_name({}) is None
    assert step_dir_name({**STEP, "SLURM_STEP_NUM_NODES": "x"}) is None  # resolution says why
    # Two launchers of one step on one node (refused by rdzv=slurm, fine for standalone).
    two = {**STEP, "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"}
    assert step_dir_name(two) == "slurm-4242.3-task3"


def test_primary_names_win_over_fallbacks() -> None:
    env = {
        **FULL,
        "SLURM_JOBID": "1",
        "SLURM_NODELIST": "other",
        "SLURM_JOB_NUM_NODES": "1",
    }
    assert slurm_job(env) == slurm_job(FULL)


def test_last_node() -> None:
    job = slurm_job({**FULL, "SLURM_NODEID": "2"})
    assert job is not None
    assert job.nodes[job.node_id] == "gpu09"


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST or SLURM_NODELIST is not set"),
        ("SLURM_NNODES", "SLURM_NNODES or SLURM_JOB_NUM_NODES is not set"),
        ("SLURM_NODEID", "SLURM_NODEID is not set"),
    ],
)
def test_missing_variable(missing: str, message: str) -> None:
    env = {k: v for k, v in FULL.items() if k != missing}
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        slurm_job(env)
    assert "SLURM_JOB_ID='4242'" in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID='' is empty"),
        ({"SLURM_JOB_ID": "  "}, "SLURM_JOB_ID='  ' is empty"),
        ({"SLURM_NNODES": "three"}, "SLURM_NNODES='three' is not a non-negative integer"),
        ({"SLURM_NNODES": "-3"}, "SLURM_NNODES='-3' is not a non-negative integer"),
        ({"SLURM_NNODES": "2.0"}, "SLURM_NNODES='2.0' is not a non-negative integer"),
        ({"SLURM_NNODES": "0"}, "SLURM_NNODES='0' must be a positive integer"),
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x' is not a non-negative integer"),
        ({"SLURM_NODEID": "-1"}, "SLURM_NODEID='-1' is not a non-negative integer"),
        ({"SLURM_NODEID": "3"}, "SLURM_NODEID='3' is not below SLURM_NNODES='3'"),
        (
            {"SLURM_JOB_NODELIST": "gpu[07-09"},
            "SLURM_JOB_NODELIST='gpu[07-09' is malformed: unbalanced",
        ),
        (
            {"SLURM_JOB_NODELIST": "gpu[9-7]"},
            "SLURM_JOB_NODELIST='gpu[9-7]' is malformed: reversed range '9-7'",
        ),
        (
            {"SLURM_JOB_NODELIST": "gpu[07-08]"},
            "SLURM_JOB_NODELIST='gpu[07-08]' names 2 nodes but SLURM_NNODES='3'",
        ),
    ],
)
def test_malformed_variable(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        slurm_job({**FULL, **overrides})


def test_malformed_fallback_is_named() -> None:
    env = {
        "SLURM_JOBID": "77",
        "SLURM_NODELIST": "a",
        "SLURM_JOB_NUM_NODES": "many",
        "SLURM_NODEID": "0",
    }
    with pytest.raises(ValueError, match="SLURM_JOB_NUM_NODES='many'"):
        slurm_job(env)
