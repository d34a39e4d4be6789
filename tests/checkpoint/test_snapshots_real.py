"""Snapshots with real agents and workers: a crash, a SIGKILL in the middle of a snapshot, a
preemption's SIGTERM, a relaunch, a corrupt copy, two nodes that must resume the same step."""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path

import pytest

from elastic_hydra.checkpoint.layout import AREA_PREFIX, Home
from elastic_hydra.errors import EXIT_PREEMPTED_SAVED
from tests.conftest import REPO, WORKERS, free_port, wait_for
from tests.harness import run, started
from tests.multinode import FAST, job, rdzv_server

DDP = REPO / "examples" / "ddp_snapshots.py"
PLAIN = WORKERS / "snapshots_plain.py"


def weights(path: Path) -> object:
    """The final weights, as the example writes them (JSON: every float exact)."""
    return json.loads(path.read_text())


def areas_of(pid: int) -> list[Path]:
    return list(Path("/dev/shm").glob(f"{AREA_PREFIX}{pid}-*"))


def ddp(tmp_path: Path, logs: str, *args: str) -> list[str]:
    return [f"script={DDP}", "nproc_per_node=2", f"logs.root={tmp_path / logs}", "--", *args]


STEPS = "30"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> object:
    """The final weights of the example trained STEPS steps without a failure, the reference of
    every test here (one run for the module: its tests share an xdist group)."""
    tmp = tmp_path_factory.mktemp("clean")
    done = run(*ddp(tmp, "clean", "--steps", STEPS, "--out", "clean.json"), cwd=tmp)
    assert done.returncode == 0, done.stderr
    return weights(tmp / "clean.json")


def test_a_crash_loses_at_most_the_step_in_flight_and_ends_with_the_uninterrupted_weights(
    tmp_path: Path, clean: object
) -> None:
    crash = run(
        "restart=on_failure",
        *ddp(tmp_path, "crash", "--steps", STEPS, "--crash-at-step", "7", "--out", "crash.json"),
        cwd=tmp_path,
    )
    assert crash.returncode == 0, crash.stderr
    # Both ranks resume after the newest step every rank holds: step 6, which rank 1 finished
    # before it crashed, or step 5 where the agent stopped rank 0 before its snapshot of step 6
    # was written. At most that one step is trained again, by both ranks alike.
    assert resumed_steps(crash.stdout, attempt=1) in (["6", "6"], ["5", "5"]), crash.stdout
    assert weights(tmp_path / "crash.json") == clean


def test_a_preemption_loses_no_step_and_the_relaunch_ends_with_the_uninterrupted_weights(
    tmp_path: Path, clean: object
) -> None:
    """SIGTERM to the agent mid-run: it stops the workers and keeps their last snapshots in the
    job's checkpoint home; the same command again resumes from there."""
    args = ddp(tmp_path, "preempted", "--steps", STEPS, "--step-time", "0.2", "--out", "pre.json")
    with started(*args, cwd=tmp_path) as agent:
        home = Home(tmp_path / "preempted" / "checkpoints" / "ddp_snapshots")
        wait_for(lambda: areas_of(agent.pid) and step_files(areas_of(agent.pid)[0]) >= 6, 60,
                 "six snapshots in the agent's memory")  # fmt: skip
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=60)
    assert agent.returncode == EXIT_PREEMPTED_SAVED, err  # preempted, saved: run it again
    kept = re.search(rb"checkpoint: step (\d+) of ranks 0-1 kept in (\S+)", err)
    assert kept is not None, err
    stopped = re.findall(rb"rank (\d): stopping after step (\d+), kept by the agent", out)
    assert sorted(stopped) == [(b"0", kept.group(1)), (b"1", kept.group(1))], out  # the same
    assert not areas_of(agent.pid)  # the memory is the machine's again
    assert Path(kept.group(2).decode()) == home.copy_dir(int(kept.group(1)))
    again = run(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    resumed = re.findall(r"resumed after step (\d+) \(attempt 0\)", again.stdout)
    assert resumed == [kept.group(1).decode()] * 2, again.stdout
    assert weights(tmp_path / "pre.json") == clean


def resumed_steps(out: str, *, attempt: int) -> list[str]:
    return re.findall(rf"resumed after step (\d+) \(attempt {attempt}\)", out)


def step_files(area: Path) -> int:
    return len(list(area.glob("rank-0/step-*.snap"))) and max(
        int(p.stem.removeprefix("step-")) for p in area.glob("rank-0/step-*.snap")
    )


def test_a_snapshot_cut_by_sigkill_is_never_resumed_and_bad_states_cost_one_line(
    tmp_path: Path,
) -> None:
    env = {"OUT_DIR": str(tmp_path), "KILL_AT": "3", "UNCOPYABLE_AT": "1", "BIG_AT": "4"}
    args = [f"script={PLAIN}", "restart=on_failure", f"logs.root={tmp_path / 'logs'}",
            "checkpoint.max_memory=512KiB"]  # fmt: skip
    first = run(*args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    # Step 3's snapshot was cut by the SIGKILL: the restart resumes after step 2, complete.
    assert "resumed after step 2" in first.stdout, first.stdout
    assert (tmp_path / "steps-0.txt").read_text().split() == ["0", "1", "2", "3", "3", "4", "5"]
    lines = first.stdout + first.stderr
    assert lines.count("the snapshot is skipped: state['fn'] (function) cannot be copied") == 1
    assert "the snapshot of step 4 is skipped: " in lines and "max_memory (524288)" in lines
    home = Home(tmp_path / "logs" / "checkpoints" / "snapshots_plain")
    assert home.copies() == [3, 5]  # the newest two: step 4's was too large

    part = home.part(5, 0)  # a bit flipped on the disk: the copy is refused, the older one used
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    again = run(*args, cwd=tmp_path, env={"OUT_DIR": str(tmp_path), "STEPS": "7"})
    assert again.returncode == 0, again.stderr
    assert "resumed after step 3" in again.stdout, again.stdout
    assert (
        "checkpoint: the copy of step 5 is not resumed: rank-0.snap does not match its digest"
        in again.stderr
    )
    fresh = run(*args, "checkpoint.resume=false", cwd=tmp_path, env={"OUT_DIR": str(tmp_path)})
    assert "fresh start" in fresh.stdout, fresh.stdout


@pytest.mark.timeout(120)
def test_two_nodes_resume_the_same_step_after_a_crash_on_one(tmp_path: Path) -> None:
    home = tmp_path / "home"  # a file system both nodes see
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        for logs in ("node0", "node1"):
            cmd = j.command("nnodes=2", "nproc_per_node=1", "restart=on_failure", *FAST,
                            f"checkpoint.home={home}", script=DDP)  # fmt: skip
            args = ["--steps", "16", "--crash-at-step", "5", "--out", str(tmp_path / "final.json")]
            j.start(argv=[*cmd, f"logs.root={tmp_path / logs}", "--", *args])
        assert j.finish(90) == [0, 0], j.explain()
    said = [re.findall(r"resumed after step (\d+)", a.text()) for a in j.agents]
    # Step 4, or step 3 where node 0's worker was stopped before its snapshot of step 4.
    assert said in ([["4"], ["4"]], [["3"], ["3"]]), j.explain()
    # One copy of each step kept: both nodes' parts, each node's manifest.
    assert Home(home).copies() == [14, 15] and len(Home(home).manifests(15)) == 2
    assert weights(tmp_path / "final.json")


def test_a_node_lost_with_its_memory_and_disk_resumes_from_the_copy_on_its_buddy(
    tmp_path: Path, clean: object
) -> None:
    """Two nodes, each with its own memory and its own disk (no home they share). Node 1's
    agent is SIGKILLed and its memory and disk removed; a fresh agent takes its place. Both
    ranks resume after the same step, the lost node's rank from the survivor's copy of its
    snapshot (checkpoint.buddy), and the job ends with the weights of an uninterrupted run."""
    args = ["--steps", STEPS, "--step-time", "0.25", "--out", str(tmp_path / "final.json")]
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:

        def start(name: str) -> Path:
            memory = tmp_path / f"shm-{name}"  # this node's memory, and its disk below
            memory.mkdir()
            cmd = j.command("nnodes=2", "nproc_per_node=1", "rdzv.is_host=false",
                            "rdzv.await_replacement=true", "restart=on_failure", *FAST,
                            f"checkpoint.memory={memory}",
                            f"checkpoint.home={tmp_path / f'disk-{name}'}", script=DDP)  # fmt: skip
            j.start(argv=[*cmd, f"logs.root={tmp_path / f'disk-{name}' / 'logs'}", "--", *args])
            return memory

        memories = [start("0"), start("1")]

        def newest_copy(memory: Path) -> int:  # of the other node's snapshots, on this node
            found = memory.glob(f"{AREA_PREFIX}*/buddy/rank-*/step-*.snap")
            return max((int(p.stem.removeprefix("step-")) for p in found), default=-1)

        wait_for(lambda: all(newest_copy(m) >= 5 for m in memories), 120,
                 "each node's copy of the other's step 5", detail=j.explain)  # fmt: skip
        lost = j.agents[1]
        lost.proc.kill()
        lost.proc.wait(timeout=30)
        shutil.rmtree(memories[1])  # the node is gone with its memory and its disk
        shutil.rmtree(tmp_path / "disk-1")
        # Below nnodes' MIN, the survivor waits for a node to take the lost one's place.
        wait_for(lambda: "joining the rendezvous (attempt 1)" in j.agents[0].text(), 60,
                 "the survivor to wait for a replacement", detail=j.explain)  # fmt: skip
        start("2")
        codes = j.finish(180)
    assert codes[0] == 0 and codes[2] == 0, j.explain()
    survivor, new = j.agents[0].text(), j.agents[2].text()
    taken = re.findall(r"rank (\d)'s snapshot of step (\d+) came from node \d \(\S+, \d+ bytes\): "
                       r"no read of the checkpoint home", new)  # fmt: skip
    assert len(taken) == 1, new  # the new node's rank, from the survivor's memory
    step = taken[0][1]
    # Its copy of step 5 was on the survivor, which keeps its own ranks' from there on.
    assert int(step) >= 5, new
    resumed = re.findall(r"rank (\d): resumed after step (\d+)", survivor + new)
    assert sorted(resumed) == [("0", step), ("1", step)], survivor + new
    assert weights(tmp_path / "final.json") == clean


def test_elastic_hydra_save_asks_every_rank_to_stop_after_one_step_and_keeps_it(
    tmp_path: Path,
) -> None:
    """`elastic-hydra save RUN_DIR` (SIGUSR1 to the agent, as Slurm's --signal=USR1 sends):
    both ranks stop after the same step, that step is kept, the agent exits 75; a relaunch
    resumes there. Without a live agent the command says so (exit 1)."""
    env = {"OUT_DIR": str(tmp_path), "STEPS": "100000", "STEP_TIME": "0.05"}
    args = [f"script={PLAIN}", "nproc_per_node=2", f"logs.root={tmp_path / 'eh_logs'}"]
    with started(*args, cwd=tmp_path, env=env) as agent:
        wait_for(lambda: areas_of(agent.pid) and step_files(areas_of(agent.pid)[0]) >= 3, 60,
                 "three snapshots in the agent's memory")  # fmt: skip
        asked = run("save", cwd=tmp_path, timeout=60)  # the newest live run in ./eh_logs
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert f"asked the agent (pid {agent.pid}) of " in asked.stdout, asked.stdout
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == EXIT_PREEMPTED_SAVED, err
    kept = re.search(r"checkpoint: step (\d+) of ranks 0-1 kept in ", err.decode())
    assert kept is not None, err
    (summary,) = (tmp_path / "eh_logs").glob("**/summary.json")
    for rank in (0, 1):  # each rank's own log: the console merges equal lines
        log = (summary.parent / f"attempt_0/{rank}/stdout.log").read_text()
        assert re.findall(r"stopping after step (\d+)", log) == [kept.group(1)], log
    again = run("save", str(summary.parent), cwd=tmp_path)
    assert again.returncode == 1 and "no agent of " in again.stdout, again.stdout
    resumed = run(*args, cwd=tmp_path, env={"OUT_DIR": str(tmp_path), "STEPS": "1"})
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed after step {kept.group(1)}" in resumed.stdout, resumed.stdout
