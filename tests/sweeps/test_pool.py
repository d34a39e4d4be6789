"""The pool launcher (`hydra/launcher=pool`): a sweep's jobs side by side, each in its own slot.

Slot planning is pure (an 8-GPU machine with two NUMA nodes, as in test_gpus). The dispatch
runs real processes, first bare ones driven by the test's own view (continuity, stop signals),
then whole sweeps through the CLI with plain-Python probe workers: fake GPUs (a fake
`nvidia-smi`), real CPU binding, failures, Ctrl-C, a job that hangs, the live table on a
terminal. Jobs that must overlap wait for each other's start markers, so concurrency is
proven by the sweep finishing at all, not by timing.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic_hydra.errors import ConfigError
from elastic_hydra.sweeps.pool import JobRow, PoolJob, State, run_pool
from elastic_hydra.sweeps.slots import Slot, plan_slots
from tests.conftest import wait_for
from tests.harness import launcher_env, on_a_terminal, run, started
from tests.resolve.test_gpus import GPUS, NO_NUMA, FakeSmi, cli_env, fake_smi, uuid

__all__ = ["fake_smi"]  # a fixture, used by name
pytestmark = pytest.mark.timeout(90)

NODE_CPUS = {0: tuple(range(32)), 1: tuple(range(32, 64))}
ALL_CPUS = tuple(range(64))


def node_cpus(node: int) -> tuple[int, ...]:
    return NODE_CPUS[node]


# ------------------------------------------------------------------------------ slot planning
def test_eight_gpus_two_per_job_make_four_disjoint_slots_near_their_gpus() -> None:
    slots = plan_slots(
        gpus=GPUS, cpus=ALL_CPUS, node_cpus=node_cpus, slots=None, gpus_per_job=2,
        cpus_per_job=None,
    )  # fmt: skip
    assert [[g.index for g in s.gpus] for s in slots] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert slots[0].env() == {"CUDA_VISIBLE_DEVICES": f"{uuid(0)},{uuid(1)}"}
    # Each slot's CPUs come from its GPUs' NUMA node, disjoint from every other slot's.
    assert [s.cpus for s in slots] == [
        tuple(range(16)), tuple(range(16, 32)), tuple(range(32, 48)), tuple(range(48, 64))
    ]  # fmt: skip


def test_default_is_one_gpu_per_job_where_gpus_are_visible() -> None:
    slots = plan_slots(
        gpus=NO_NUMA, cpus=ALL_CPUS, node_cpus=node_cpus, slots=None, gpus_per_job=None,
        cpus_per_job=4,
    )  # fmt: skip
    assert len(slots) == 8
    assert [s.cpus for s in slots][:2] == [(0, 1, 2, 3), (8, 9, 10, 11)]  # even shares, cut to 4
    assert all(len(s.gpus) == 1 for s in slots)


def test_cpu_jobs_hide_the_gpus_and_fit_by_cpus() -> None:
    slots = plan_slots(
        gpus=GPUS, cpus=(0, 1, 2, 3), node_cpus=node_cpus, slots=None, gpus_per_job=0,
        cpus_per_job=2,
    )  # fmt: skip
    assert [s.cpus for s in slots] == [(0, 1), (2, 3)]
    assert slots[0].env() == {"CUDA_VISIBLE_DEVICES": ""}


def test_without_gpus_one_slot_per_cpu_and_zero_means_unbound() -> None:
    cpu_only = plan_slots(
        gpus=(), cpus=(0, 1), node_cpus=node_cpus, slots=None, gpus_per_job=None,
        cpus_per_job=None,
    )  # fmt: skip
    assert [s.cpus for s in cpu_only] == [(0,), (1,)]
    assert cpu_only[0].env() == {}
    unbound = plan_slots(
        gpus=(), cpus=(0, 1), node_cpus=node_cpus, slots=3, gpus_per_job=0, cpus_per_job=0
    )
    assert [s.cpus for s in unbound] == [None, None, None]


@pytest.mark.parametrize(
    ("gpus_per_job", "cpus_per_job", "slots", "key", "words"),
    [
        (3, None, None, "hydra.launcher.gpus_per_job", "more GPUs than this machine has (2)"),
        (-1, None, None, "hydra.launcher.gpus_per_job", "not a number of GPUs"),
        (1, 3, None, "hydra.launcher.cpus_per_job", "more CPUs than this machine has (2)"),
        (1, None, 3, "hydra.launcher.slots", "3 GPUs needed, 2 GPUs and 2 CPUs here"),
        (1, None, 0, "hydra.launcher.slots", "expected 1 to 2"),
    ],
)
def test_what_does_not_fit_is_one_line_naming_the_key(
    gpus_per_job: int, cpus_per_job: int | None, slots: int | None, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_slots(
            gpus=GPUS[:2], cpus=(0, 1), node_cpus=node_cpus, slots=slots,
            gpus_per_job=gpus_per_job, cpus_per_job=cpus_per_job,
        )  # fmt: skip
    line = caught.value.line()
    assert line.startswith(key + ":") and words in line and "\n" not in line


# --------------------------------------------------------------------- dispatch, bare processes
WAITER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
open(sys.argv[1], "w").close()
deadline = time.monotonic() + 30
while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.02)
"""


def bare_job(tmp_path: Path, number: int, wait_for_file: Path | None = None) -> PoolJob:
    marker = tmp_path / f"started-{number}"
    argv = [sys.executable, "-c", WAITER, str(marker)] + (
        [str(wait_for_file)] if wait_for_file else []
    )
    return PoolJob(
        number=number,
        overrides=(f"+n={number}",),
        run=lambda: os.execv(argv[0], argv),
        run_dir=tmp_path / "sweep" / str(number),
    )


class Recorder:
    """A view that records the order of starts and ends, and may act on them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.on_start: Any = None
        self.on_end: Any = None

    def started(self, row: JobRow) -> None:
        self.events.append(("start", row.job.number))
        if self.on_start:
            self.on_start(row)

    def ended(self, row: JobRow) -> None:
        self.events.append(("end", row.job.number))
        if self.on_end:
            self.on_end(row)

    def tick(self, rows: Sequence[JobRow], now: float) -> None:
        pass


def test_a_job_starts_as_soon_as_a_slot_frees_not_in_batches(tmp_path: Path) -> None:
    release = tmp_path / "release"
    jobs = [bare_job(tmp_path, 0, release), *(bare_job(tmp_path, n) for n in range(1, 6))]
    view = Recorder()
    # Job 0 holds its slot until the other five have run, one after another, in the other slot:
    # a batch-synchronous launcher would wait for job 0 and never get there (job 0 exits 3).
    view.on_end = lambda row: release.touch() if len(view.events) >= 10 else None
    slots = (Slot(index=0), Slot(index=1))
    outcome = run_pool(jobs, slots, view=view)
    assert outcome.signum is None
    assert [r.state for r in outcome.rows] == [State.SUCCEEDED] * 6
    assert view.events[-1] == ("end", 0)
    assert [n for kind, n in view.events if kind == "start"] == [0, 1, 2, 3, 4, 5]
    assert {r.slot.index for r in outcome.rows[1:] if r.slot} == {1}
    assert all((tmp_path / f"started-{n}").exists() for n in range(6))


def test_a_stop_signal_reaches_every_running_job_and_starts_no_other(tmp_path: Path) -> None:
    never = tmp_path / "never"
    jobs = [bare_job(tmp_path, n, never) for n in range(3)]
    view = Recorder()

    def interrupt_when_both_run(row: JobRow) -> None:
        if len(view.events) == 2:
            wait_for(
                lambda: all((tmp_path / f"started-{n}").exists() for n in (0, 1)), 20,
                "both jobs to install their handler",
            )  # fmt: skip
            os.kill(os.getpid(), signal.SIGINT)  # the pool's handler takes it, not pytest's

    view.on_start = interrupt_when_both_run
    outcome = run_pool(jobs, (Slot(index=0), Slot(index=1)), view=view)
    assert outcome.signum == signal.SIGINT
    states = [r.state for r in outcome.rows]
    assert states == [State.STOPPED, State.STOPPED, State.QUEUED]
    assert [r.result.exit_code for r in outcome.rows[:2] if r.result] == [130, 130]
    assert not (tmp_path / "started-2").exists()


def test_stagger_spaces_the_starts(tmp_path: Path) -> None:
    jobs = [bare_job(tmp_path, n) for n in range(3)]
    outcome = run_pool(jobs, (Slot(index=0), Slot(index=1), Slot(index=2)), view=Recorder(),
                       stagger=0.3)  # fmt: skip
    starts = [r.started for r in outcome.rows if r.started is not None]
    assert len(starts) == 3
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(starts))
    record: dict[str, Any] = outcome.to_json()
    assert record["slots"] == 3 and record["signal"] is None
    assert [j["slot"] for j in record["jobs"]] == [0, 1, 2]


def test_a_signal_before_the_pool_starts_starts_nothing(tmp_path: Path) -> None:
    outcome = run_pool([bare_job(tmp_path, 0)], (Slot(index=0),), view=Recorder(), signum=15)
    assert outcome.signum == 15 and outcome.rows[0].state is State.QUEUED
    assert not (tmp_path / "started-0").exists()


# ---------------------------------------------------------------------------- whole sweeps
PROBE = """
import json, os, sys, time
out, tag, need, code = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if os.environ.get("LOCAL_RANK", "0") == "0":
    record = {
        "tag": tag,
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "affinity": sorted(os.sched_getaffinity(0)),
        "local_world_size": os.environ["LOCAL_WORLD_SIZE"],
        "start": time.time(),
        "pids": [os.getpid(), os.getppid()],  # the worker and its agent
    }
    part = os.path.join(out, tag + ".part")
    with open(part, "w") as f:
        json.dump(record, f)
    os.replace(part, os.path.join(out, tag + ".json"))  # the test reads it whole or not at all
deadline = time.monotonic() + 30
while len([n for n in os.listdir(out) if n.endswith(".json")]) < need:
    if time.monotonic() > deadline:
        sys.exit(3)  # the jobs it waits for never ran beside it
    time.sleep(0.02)
if code:
    raise ValueError(f"job {tag} fails on purpose")
"""


def sweep(tmp_path: Path, jobs: Sequence[tuple[str, int, int]]) -> tuple[Path, list[str]]:
    """The probe script, its output dir and the `args=` sweep of (tag, need, exit code)."""
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    values = ",".join(f"[{out},{tag},{need},{code}]" for tag, need, code in jobs)
    return out, ["-m", "hydra/launcher=pool", "script=probe.py", f"args={values}",
                 f"logs.root={tmp_path / 'logs'}"]  # fmt: skip


def records(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_eight_fake_gpus_two_per_job_each_job_sees_only_its_own(
    tmp_path: Path, fake_smi: FakeSmi
) -> None:
    # Jobs 0-3 each wait until four jobs have started, jobs 4-7 until all eight have: the sweep
    # ends only if four jobs ran at once, on all eight GPUs.
    out, args = sweep(tmp_path, [(f"j{n}", 4 if n < 4 else 8, 0) for n in range(8)])
    proc = run(
        *args, "hydra.launcher.gpus_per_job=2", "nproc_per_node=gpu", cwd=tmp_path,
        env=cli_env(path_first=fake_smi.bin_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 job(s), 4 at once" in proc.stdout
    seen = records(out)
    assert sorted(seen) == [f"j{n}" for n in range(8)]
    for wave in (range(4), range(4, 8)):
        sets = [set(seen[f"j{n}"]["cuda"].split(",")) for n in wave]
        assert all(len(s) == 2 for s in sets)
        assert set().union(*sets) == {uuid(i) for i in range(8)}  # disjoint, all eight busy
    assert {r["local_world_size"] for r in seen.values()} == {"2"}  # nproc_per_node=gpu: its 2


def test_cpu_jobs_on_two_slots_bound_to_their_cpu_and_a_failure_among_them(
    tmp_path: Path,
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    out, args = sweep(tmp_path, [("a", 2, 0), ("b", 2, 1), ("c", 4, 0), ("d", 4, 0)])
    proc = run(*args, "hydra.launcher.slots=2", "hydra.launcher.cpus_per_job=1", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    seen = records(out)
    assert sorted(seen) == ["a", "b", "c", "d"]  # b's failure stopped nothing
    assert {tuple(seen[t]["affinity"]) for t in ("a", "b")} == {(cpus[0],), (cpus[1],)}
    assert {tuple(seen[t]["affinity"]) for t in ("c", "d")} == {(cpus[0],), (cpus[1],)}
    assert all(r["cuda"] is None for r in seen.values())  # no GPU here: nothing to hide
    failed = [line for line in proc.stdout.splitlines() if "#1 failed" in line]
    assert len(failed) == 1 and "rank 0: ValueError: job b fails on purpose (probe.py:" in failed[0]
    table = [line for line in proc.stdout.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert "ok" in table[0] and "failed" in table[1]
    sweep_dir = next((tmp_path / "logs" / "multirun").glob("*/*"))
    assert json.loads((sweep_dir / "1" / "result.json").read_text())["exit_code"] == 1
    pool_record = json.loads((sweep_dir / "pool.json").read_text())
    assert [j["exit_code"] for j in pool_record["jobs"]] == [0, 1, 0, 0]
    assert {j["slot"] for j in pool_record["jobs"]} == {0, 1}
    report = run("report", str(sweep_dir), cwd=tmp_path)
    assert report.returncode == 1 and "failed" in report.stdout


def test_a_job_that_hangs_does_not_hold_up_the_others(tmp_path: Path) -> None:
    # Job h waits for five records: its own, the three others', and one the test writes once it
    # has seen the others finish while h still runs.
    out, args = sweep(tmp_path, [("h", 5, 0), ("q1", 1, 0), ("q2", 1, 0), ("q3", 1, 0)])
    with started(*args, "hydra.launcher.slots=2", "hydra.launcher.cpus_per_job=0",
                 cwd=tmp_path) as pool:  # fmt: skip
        wait_for(lambda: len(list((tmp_path / "logs").rglob("result.json"))) == 3, 60,
                 "the three quick jobs to finish beside the stuck one")  # fmt: skip
        assert pool.poll() is None
        (out / "release.json").write_text("{}")
        stdout, stderr = pool.communicate(timeout=60)
    assert pool.returncode == 0, stdout + stderr
    assert stdout.decode().index("#0 succeeded") > stdout.decode().index("#3 succeeded")


def test_ctrl_c_stops_every_running_job_and_starts_no_other(tmp_path: Path) -> None:
    out, args = sweep(tmp_path, [("a", 9, 0), ("b", 9, 0), ("c", 9, 0)])
    with started(*args, "hydra.launcher.slots=2", "hydra.launcher.cpus_per_job=0",
                 cwd=tmp_path) as pool:  # fmt: skip
        wait_for(lambda: len(records(out)) == 2, 60, "two jobs to run")
        pool.send_signal(signal.SIGINT)
        stdout, stderr = pool.communicate(timeout=60)
    assert pool.returncode == 130, stdout + stderr
    assert sorted(records(out)) == ["a", "b"]
    results = sorted((tmp_path / "logs").rglob("result.json"))
    assert [json.loads(p.read_text())["exit_code"] for p in results] == [130, 130]
    text = stdout.decode()
    assert "#0 stopped" in text and "#1 stopped" in text and "#2" not in text


def test_jobs_die_cleanly_with_a_killed_pool(tmp_path: Path) -> None:
    out, args = sweep(tmp_path, [("a", 9, 0), ("b", 9, 0)])
    with started(*args, "hydra.launcher.slots=2", "hydra.launcher.cpus_per_job=0",
                 cwd=tmp_path) as pool:  # fmt: skip
        wait_for(lambda: len(records(out)) == 2, 60, "two jobs to run")
        pool.kill()
        pool.communicate(timeout=10)
    pids = [pid for r in records(out).values() for pid in r["pids"]]
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 30, "the jobs to end")
    # Their death signal was SIGTERM: each agent stopped its workers and wrote its result.
    results = sorted((tmp_path / "logs").rglob("result.json"))
    assert [json.loads(p.read_text())["exit_code"] for p in results] == [143, 143]


def test_gpus_per_job_without_gpus_is_one_line(tmp_path: Path) -> None:
    _, args = sweep(tmp_path, [("a", 1, 0)])
    proc = run(*args, "hydra.launcher.gpus_per_job=2", cwd=tmp_path, env=cli_env(path_first=None))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "elastic-hydra: error: hydra.launcher.gpus_per_job: more GPUs than this machine has (0) "
        "(got 2); expected at most 0."
    ]
    assert not (tmp_path / "out" / "a.json").exists()


def test_on_a_terminal_the_jobs_are_a_live_table(tmp_path: Path) -> None:
    _, args = sweep(tmp_path, [("a", 2, 0), ("b", 2, 0)])
    env = launcher_env(TERM="xterm", COLUMNS="160", LINES="40")
    code, output = on_a_terminal(*args, "hydra.launcher.slots=2", cwd=tmp_path, env=env,
                                 stream="stdout")  # fmt: skip
    text = output.decode(errors="replace")
    assert code == 0, text
    assert "elastic-hydra pool" in text and "running" in text  # the live table, while they ran
    assert "[pool]" not in text  # no plain lines on a terminal
    assert "elastic-hydra sweep" in text  # the final table
    # Each job wrote plain lines to its own console.log, not through the live display.
    log = next((tmp_path / "logs").rglob("0/console.log")).read_text()
    assert "elastic-hydra pool" not in log and "\x1b[" not in log
    done = [line for line in log.splitlines() if line.startswith("elastic-hydra: succeeded")]
    assert len(done) == 1 and done[0].endswith("/0"), (
        log
    )  # whole, not folded at the terminal's width
