"""Hangs: progress without code changes, every rank's stack before any kill, one verdict.

Pure parts first (the progress rule, dump parsing, the verdict), then the executor with a fake
watch (what each `hang.action` does), then real launches: three gloo ranks with one late for
the all_reduce (each action, timed from the hang's onset), plain-Python ranks blocked in a read,
in a C call holding the GIL, SIGSTOPped, not run through the bootstrap, and computing for three
times the timeout (never flagged).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.agent.events import Hang, WorkersStarted
from elastic_hydra.hangs import verdict
from elastic_hydra.hangs.watch import LocalHangWatch
from elastic_hydra.records.hangs import GroupState, HangRank, RankState
from elastic_hydra.rendezvous import hang_share as share
from elastic_hydra.rundir import RunDir
from elastic_hydra.tracebacks import parse_threads
from tests.conftest import WORKERS, free_port, wait_for
from tests.harness import run, started
from tests.launch.test_agent_real import read_events
from tests.multinode import FAST, job

pytestmark = pytest.mark.timeout(120)

DUMP = """main thread 0x00007f0000000001
Thread 0x00007f00000000aa (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/e/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2 in all_reduce
  File "/e/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 8 in wrapper
  File "/home/u/train.py", line 42 in step
  File "/home/u/train.py", line 60 in <module>
"""
PY_SPY = """Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4250 (idle): "Thread-1"
    wait (threading.py:324)
Thread 4242 (idle): "MainThread"
    load (data.py:88)
    main (train.py:12)
"""


# ------------------------------------------------------------------------------------ pure
def notes(**fields: Any) -> verdict.Notes:
    return verdict.Notes(**fields)


def test_progress_is_a_stack_change_or_cpu_time() -> None:
    p = verdict.RankProgress(last_progress=100.0)
    p.observe(now=101.0, notes=notes(), cpu=5.0)  # the first look: a baseline
    assert p.last_progress == 100.0
    p.observe(now=102.0, notes=notes(), cpu=5.01)  # 1% of a core: waiting
    assert p.last_progress == 100.0
    p.observe(now=103.0, notes=notes(stack_moved=102.5), cpu=5.02)  # its main thread moved
    assert (p.last_progress, p.how) == (102.5, "python")
    p.observe(now=104.0, notes=notes(stack_moved=102.5), cpu=5.9)  # 88% of a core: computing
    assert (p.last_progress, p.how) == (104.0, "cpu")
    assert verdict.idle_for([p, verdict.RankProgress(last_progress=90.0)], now=110.0) == 6.0


def test_a_collective_output_python_in_the_users_frame_or_progress_call_is_progress() -> None:
    # The loop that was called hung: all_reduce, print, sleep 0.5, on one line each; every look
    # finds the same stack (the sleep) and no CPU time.
    p = verdict.RankProgress(last_progress=100.0)
    p.observe(now=101.0, notes=notes(collectives=7), cpu=1.0, output=10)  # baselines
    assert (p.last_progress, p.how) == (100.0, "started")
    p.observe(now=102.0, notes=notes(collectives=9), cpu=1.0, output=10)
    assert (p.last_progress, p.how) == (102.0, "collective #9")
    p.observe(now=103.0, notes=notes(collectives=9), cpu=1.0, output=30)
    assert (p.last_progress, p.how) == (103.0, "output")
    p.observe(now=104.0, notes=notes(collectives=9, user_ran=103.9), cpu=1.0, output=30)
    assert (p.last_progress, p.how) == (103.9, "python")
    p.observe(now=105.0, notes=notes(collectives=9, script_said=104.5), cpu=1.0, output=30)
    assert (p.last_progress, p.how) == (104.5, "progress()")
    # Nothing new: not even Python code that ran outside the user's frame (a data loader's
    # own wait loop) or a time from the future.
    p.observe(now=106.0, notes=notes(collectives=9, ran=105.9), cpu=1.0, output=30)
    p.observe(now=107.0, notes=notes(collectives=9, user_ran=104.0), cpu=1.0, output=30)
    assert p.last_progress == 104.5
    p.observe(now=108.0, notes=notes(collectives=9, script_said=900.0), cpu=1.0, output=30)
    assert (p.last_progress, p.how) == (108.0, "progress()")  # at most the look's own time


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", verdict.Notes()),
        (
            b"12.5" + b" " * 16 + b"\n" + b"\x00" * 42 + b"%-20d\n" % 41,
            verdict.Notes(stack_moved=12.5, collectives=41),
        ),
        (b"nan" + b" " * 17 + b"\n" + b"-3" + b" " * 18 + b"\n1e99", verdict.Notes()),
        (b"12.", verdict.Notes(stack_moved=12.0)),
        (b"\xff" * 5000, verdict.Notes()),
    ],
)
def test_a_progress_note_is_read_as_untrusted_fixed_width_lines(
    data: bytes, expected: verdict.Notes
) -> None:
    assert verdict.Notes.parse(data) == expected


def group(issued: int, completed: int | None = None, op: str = "gloo:all_reduce") -> GroupState:
    return GroupState(group="0", issued=issued, completed=completed, op=op, sizes="[[2]]")


def hang_rank(rank: int, *groups: GroupState, where: str = "train.py") -> HangRank:
    return HangRank(rank=rank, local_rank=rank, pid=100 + rank, state=RankState.DUMPED,
                    file=where, line=7, call="torch.distributed.distributed_c10d.all_reduce",
                    groups=groups)  # fmt: skip


def test_the_collective_names_the_rank_that_never_entered_it_when_the_stacks_cannot() -> None:
    # Every rank in the same all_reduce call on the same line: the stacks cannot tell. Rank 2
    # issued one collective fewer: it is the one the others wait for.
    ranks = [hang_rank(0, group(5, 4)), hang_rank(1, group(5, 4)), hang_rank(2, group(4, 4))]
    text, odd = verdict.verdict(ranks, idle=12.0)
    assert odd == {2}
    assert "cannot tell" not in text
    assert text.endswith(
        "; collective #5 gloo:all_reduce of group 0 (sizes [[2]]): ranks 0,1 in it,"
        " rank 2 never entered it (at #4)"
    )
    # Every rank in it: the collective adds the place, but no rank to blame.
    text, odd = verdict.verdict([hang_rank(0, group(5, 4)), hang_rank(1, group(5, 4))], 12.0)
    assert odd == frozenset() and "cannot tell which rank" in text
    assert "ranks 0,1 in it" in text and "never entered" not in text
    # A rank that did not tell its collectives: the sequence numbers alone blame no one.
    silent = [hang_rank(0, group(5, 4)), hang_rank(1, group(4, 4)), hang_rank(2)]
    assert verdict.collectives(silent)[1] == frozenset()
    assert verdict.no_collectives([replace(silent[2], no_groups="no answer within 3 s")]) == (
        "no collectives from rank 2: no answer within 3 s"
    )
    # One number, two ops: the rank in a broadcast while the others all_reduce is the odd one.
    other = [hang_rank(0, group(5, 4)), hang_rank(1, group(5, 4)),
             hang_rank(2, group(5, 4, op="gloo:broadcast"))]  # fmt: skip
    assert verdict.collectives(other) == (
        "collective #5 of group 0: ranks 0,1 in gloo:all_reduce, rank 2 in gloo:broadcast"
        " (not the same collective)",
        frozenset({2}),
    )
    assert verdict.collectives(other[1:])[1] == frozenset()  # one against one: cannot tell
    # Finished collectives on every rank: nothing to say.
    assert verdict.collectives([hang_rank(0, group(5, 5)), hang_rank(1, group(5, 5))]) == (
        "",
        frozenset(),
    )


@pytest.mark.parametrize(
    ("data", "groups", "why"),
    [
        (
            b'{"groups": {"0": {"issued": 3, "completed": "2", "op": "gloo:barrier", '
            b'"sizes": [[1]]}}, "missing": ""}',
            (GroupState(group="0", issued=3, completed=2, op="gloo:barrier", sizes="[[1]]"),),
            "",
        ),
        (
            b'{"missing": "torch.distributed is not imported"}',
            (),
            "torch.distributed is not imported",
        ),
        (b"[1, 2", (), "its collectives file does not read as JSON"),
        (b"[" * 100_000, (), "its collectives file does not read as JSON"),
        (
            b'{"groups": {"0": {"issued": -1}, "1": {"issued": true}, "2": 5, '
            b'"\\u001b[2J": {"issued": 1, "op": 7, "sizes": "x"}}}',
            (GroupState(group="?[2J", issued=1),),
            "",
        ),
    ],
)
def test_a_collectives_file_is_read_as_untrusted(
    data: bytes, groups: tuple[GroupState, ...], why: str
) -> None:
    assert verdict.parse_groups(data) == (groups, why)


def test_a_gpu_ranks_cpu_time_counts_only_while_its_main_thread_runs_python() -> None:
    # Measured on an H100: a main thread blocked in `.item()` behind a 75 s kernel used a whole
    # core all along. A healthy loop's main thread also spends most of its time there, but runs
    # Python between its calls.
    p = verdict.RankProgress(last_progress=100.0, gpu=True)
    p.observe(now=101.0, notes=notes(ran=100.9), cpu=5.0)
    p.observe(now=102.0, notes=notes(ran=101.5), cpu=6.0)  # a core, and Python ran
    assert p.last_progress == 102.0
    p.observe(now=103.0, notes=notes(ran=101.5), cpu=7.0)  # one look's lag is allowed
    assert p.last_progress == 103.0
    p.observe(now=104.0, notes=notes(ran=101.5), cpu=8.0)  # a core, in one C call
    p.observe(now=105.0, notes=notes(ran=0.0), cpu=9.0)  # (or never ran Python)
    assert p.last_progress == 103.0
    p.observe(now=106.0, notes=notes(), cpu=10.0)  # no probe: CPU time counts
    assert p.last_progress == 106.0


def test_the_bootstrap_notes_when_the_main_thread_runs_python_and_not_in_a_c_call(
    tmp_path: Path,
) -> None:
    from elastic_hydra.workers import bootstrap

    progress, out = tmp_path / "progress", tmp_path / "out"
    env = {**os.environ, "ELASTIC_HYDRA_PROGRESS_FILE": str(progress),
           "ELASTIC_HYDRA_PROGRESS_EVERY": "0.1"}  # fmt: skip
    worker = WORKERS / "probe_ran.py"
    subprocess.run(
        [sys.executable, bootstrap.__file__, str(worker), str(progress), str(out)],
        env=env, check=True, timeout=30,
    )  # fmt: skip
    seen = {k: float(v) for k, v in (line.split() for line in out.read_text().splitlines())}
    assert 0 < seen["loop1"] < seen["loop2"]  # noted at the looks while it looped in Python
    assert seen["loop2"] < seen["block1"] == seen["block2"]  # not once during the C call


def test_a_process_with_a_gpu_device_open_uses_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver's /dev/nvidia* files stand in as a file the child holds open.
    from elastic_hydra.hangs import watch

    device = tmp_path / "nvidia0"
    device.write_text("")
    monkeypatch.setattr(watch, "GPU_DEVICES", str(tmp_path / "nvidia"))
    code = "import sys; f = open(sys.argv[1]); print('open', flush=True); sys.stdin.read()"
    with subprocess.Popen(
        [sys.executable, "-c", code, str(device)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        assert watch.uses_gpu(holder.pid)
        assert not watch.uses_gpu(os.getpid())
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    assert not watch.uses_gpu(holder.pid)  # gone


def test_a_faulthandler_dump_reads_as_threads() -> None:
    threads = parse_threads(DUMP)
    assert [t.thread_id for t in threads] == [0x7F00000000AA, 0x7F0000000001]
    main = threads[1]
    assert [f.name for f in main.frames] == ["<module>", "step", "wrapper", "all_reduce"]
    user, call = verdict.locate(main.frames)
    assert user is not None and (user.filename, user.lineno) == ("/home/u/train.py", 42)
    assert call is not None
    assert verdict.library_call(call) == "torch.distributed.distributed_c10d.all_reduce"


def test_py_spy_output_reads_as_threads_main_first() -> None:
    threads = verdict.parse_py_spy(PY_SPY)
    assert [t.thread_id for t in threads] == [4242, 4250]
    assert [(f.filename, f.lineno) for f in threads[0].frames] == [
        ("train.py", 12),
        ("data.py", 88),
    ]


def rank(r: int, **kw: Any) -> HangRank:
    return HangRank(rank=r, local_rank=r, pid=100 + r, **{"state": RankState.DUMPED, **kw})


def test_the_verdict_leads_with_the_odd_group_out() -> None:
    waiting = {"file": "/u/train.py", "line": 42, "call": "torch.distributed.all_reduce"}
    ranks = [rank(0, **waiting), rank(1, **waiting), rank(3, **waiting),
             rank(2, file="/u/data.py", line=88, code="time.sleep(60)")]  # fmt: skip
    text, odd = verdict.verdict(ranks, 120.4)
    assert odd == {2}
    assert text == (
        "hang after 120 s without progress: rank 2 at data.py:88 (time.sleep(60)) (stuck here); "
        "ranks 0,1,3 in torch.distributed.all_reduce called from train.py:42"
    )


def test_ranks_all_in_one_place_have_no_odd_one_and_states_are_named() -> None:
    text, odd = verdict.verdict(
        [rank(0, file="/u/t.py", line=3), rank(1, file="/u/t.py", line=3)], 5
    )
    assert odd == frozenset() and "(stuck here)" not in text and "ranks 0,1 at t.py:3" in text
    waiting = {"file": "/u/t.py", "line": 3, "call": "torch.distributed.barrier"}
    text, odd = verdict.verdict([rank(0, state=RankState.STOPPED), rank(1, **waiting),
                               rank(2, **waiting)], 5)  # fmt: skip
    assert odd == {0}
    assert text.endswith("rank 0 stopped (stuck here); ranks 1,2 in torch.distributed.barrier "
                         "called from t.py:3")  # fmt: skip


# ----------------------------------------------------------------------------- real launches
def launch(
    tmp_path: Path, *overrides: str, script_args: tuple[str, ...] = ()
) -> tuple[int, str, dict[str, Any], Path]:
    """A launch to its end: exit code, stderr, summary.json and the run dir."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    logs = tmp_path / "logs"
    common = ("hang.warmup=0", "logs.quiet=true", "stop_grace=3", f"logs.root={logs}")
    proc = run(
        *common, *overrides, "--", *script_args, cwd=tmp_path, env={"OUT_DIR": str(out)}, timeout=90
    )
    run_dir = next(logs.rglob("summary.json")).parent
    return proc.returncode, proc.stderr, json.loads((run_dir / "summary.json").read_text()), run_dir


def hang_events(run_dir: Path) -> list[Hang]:
    return [e for e in read_events(run_dir) if isinstance(e, Hang)]


GLOO = f"script={WORKERS / 'hang_gloo.py'}"


@pytest.mark.parametrize("action", ["fail", "restart", "report"])
def test_a_rank_late_for_all_reduce_is_named_within_the_timeout(
    tmp_path: Path, action: str
) -> None:
    # Rank 2 sleeps 25 s before the all_reduce in the first attempt: "fail" ends the job,
    # "restart" runs it again (and the late rank is on time), "report" waits for it.
    seconds = "8" if action == "report" else "25"
    code, stderr, summary, run_dir = launch(
        tmp_path, GLOO, "nproc_per_node=3", "hang.timeout=2", f"hang.action={action}",
        "restart.max_restarts=1", script_args=("2", seconds, "1"),
    )  # fmt: skip
    assert code == (1 if action == "fail" else 0), stderr
    hang = summary["hang"]
    assert hang["verdict"].startswith("hang after ")
    assert "rank 2 at hang_gloo.py:26 (time.sleep(seconds)) (stuck here)" in hang["verdict"]
    assert "ranks 0,1 in torch.distributed.distributed_c10d.all_reduce called from " \
           "hang_gloo.py:36" in hang["verdict"]  # fmt: skip
    assert [r["odd"] for r in hang["ranks"]] == [False, False, True]
    # The collective the others wait in, from their own sequence numbers and Flight Recorder.
    assert hang["verdict"].endswith(
        "; collective #1 gloo:all_reduce of group 0 (sizes [[2]]): ranks 0,1 in it,"
        " rank 2 never entered it (at #0)"
    )
    main = next(t for t in hang["ranks"][2]["threads"] if t["main"])
    assert main["frames"][-1]["name"] == "load_batch"
    # Every rank's stacks were written before any signal stopped it, in the attempt's dir.
    for local_rank in range(3):
        assert (
            "most recent call first" in (run_dir / f"attempt_0/{local_rank}/stacks.txt").read_text()
        )
    onset = float((tmp_path / "out" / "stuck_at").read_text())
    (event,) = hang_events(run_dir)
    assert event.wall_time - onset <= 2 + 5, "the verdict came later than hang.timeout + 5 s"
    assert summary["attempts"] == (2 if action == "restart" else 1)
    if action == "fail":
        assert summary["message"] == hang["verdict"]
        assert hang["verdict"] in stderr  # the closing report leads with it
    shown = run("report", str(run_dir), cwd=tmp_path)  # later, from the files
    assert (
        hang["verdict"] in shown.stdout and 'hang_gloo.py", line 26, in load_batch' in shown.stdout
    )
    if action == "fail":  # torch's own analyser reads the dumps and agrees
        assert "torchfrtrace attempt_0 --prefix flight_recorder_rank_" in shown.stdout
        frtrace = subprocess.run(
            [Path(sys.executable).parent / "torchfrtrace", str(run_dir / "attempt_0"),
             "--prefix", "flight_recorder_rank_"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        said = frtrace.stdout + frtrace.stderr  # it logs to stderr
        assert "missing ranks: {2}" in said and "collective: gloo:all_reduce" in said


def probe(
    tmp_path: Path, *modes: str, extra: tuple[str, ...] = ()
) -> tuple[int, str, dict[str, Any], Path]:
    return launch(
        tmp_path, f"script={WORKERS / 'hang_probe.py'}", f"nproc_per_node={len(modes)}",
        "hang.timeout=1", "hang.action=fail", *extra, script_args=modes,
    )  # fmt: skip


def test_a_rank_holding_the_gil_in_a_c_call_is_still_dumped(tmp_path: Path) -> None:
    code, _, summary, _ = probe(tmp_path, "wait", "gil")
    assert code == 1
    ranks = summary["hang"]["ranks"]
    assert [r["state"] for r in ranks] == ["dumped", "dumped"]
    assert ranks[1]["code"] == "ctypes.PyDLL(None).sleep(600)"
    assert ranks[0]["code"] == "os.read(read_end, 1)"


def test_a_stopped_rank_is_named_as_stopped_and_the_exited_one_is_not(tmp_path: Path) -> None:
    # Before: "rank 0 exited (stuck here); rank 1 stopped".
    code, _, summary, _ = probe(tmp_path, "exit", "stop")
    assert code == 1
    assert summary["hang"]["verdict"].endswith("rank 1 stopped (stuck here); rank 0 exited")


def test_a_rank_without_the_bootstrap_is_named(tmp_path: Path) -> None:
    code, _, summary, _ = probe(tmp_path, "sleep", "sleep", extra=("bootstrap=false",))
    assert code == 1
    states = {r["state"] for r in summary["hang"]["ranks"]}
    assert states <= {"no_dump", "dumped"}  # dumped only where py-spy is installed


def test_computing_for_three_times_the_timeout_is_never_a_hang(tmp_path: Path) -> None:
    code, stderr, summary, run_dir = probe(tmp_path, "compute:3", "cmp-c:3")
    assert code == 0, stderr
    assert summary["hang"] is None and hang_events(run_dir) == []


@pytest.mark.parametrize("mode", ["torch", "quiet", "said"])
def test_a_loop_that_sleeps_on_one_line_runs_to_its_end(tmp_path: Path, mode: str) -> None:
    # Every look of the watch (each 0.4 s, as the loop's period) finds the main thread in the
    # same sleep: the stack never changes and no CPU time is used. Before, the watch called this
    # a hang after hang.timeout and stopped both ranks.
    code, stderr, summary, run_dir = launch(
        tmp_path, f"script={WORKERS / 'steady_loop.py'}", "nproc_per_node=2",
        "hang.timeout=2", "hang.action=fail", script_args=(mode, "12", "0.4"),
    )  # fmt: skip
    assert code == 0, stderr
    assert summary["hang"] is None and hang_events(run_dir) == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["done.0", "done.1"]


def test_warmup_holds_the_verdict_back(tmp_path: Path) -> None:
    started = time.time()
    code, _, _, run_dir = probe(tmp_path, "wait", extra=("hang.warmup=3",))
    assert code == 1
    (event,) = hang_events(run_dir)
    workers = next(e for e in read_events(run_dir) if isinstance(e, WorkersStarted))
    assert event.wall_time - workers.wall_time >= 3.0
    assert time.time() - started < 30


def test_hang_keys_are_checked() -> None:
    from tests.harness import plan_of

    with pytest.raises(Exception, match=r"hang\.action: not a hang action"):
        plan_of(f"script={WORKERS / 'hang_probe.py'}", "hang.action=kill")
    script = f"script={WORKERS / 'hang_probe.py'}"
    assert plan_of(script, "hang.timeout=null").hang.timeout is None
    default = plan_of(script).hang
    assert (default.learned, default.timeout, default.first_verdict) == (True, 300.0, 60.0)
    for given in ("90", "'90'", "90.0"):
        fixed = plan_of(script, f"hang.timeout={given}").hang
        assert (fixed.learned, fixed.timeout, fixed.first_verdict) == (False, 90.0, 90.0)
    for bad, why in (("soon", "not a timeout"), ("true", "not a timeout"),
                     ("nan", "is not a finite number"), ("-3", "must be positive")):  # fmt: skip
        with pytest.raises(Exception, match=rf"hang\.timeout: {why}"):
            plan_of(script, f"hang.timeout={bad}")


def test_the_learned_timeout_is_five_times_the_longest_gap_between_60_and_the_cap() -> None:
    rhythm, now = verdict.Rhythm(), 100.0
    for _ in range(7):  # progress between every two looks (1 s apart): 6 gaps of ~1 s
        rhythm.see(0.3, now)
        now += 1.0
    assert (rhythm.gaps, rhythm.timeout(300.0)) == (6, 300.0)  # too few seen: the cap
    assert rhythm.longest == pytest.approx(1.0)
    for idle in range(1, 15):  # a 14 s evaluation: no progress at these looks, no gap
        rhythm.see(idle + 0.3, now)
        now += 1.0
    assert rhythm.gaps == 6
    for _ in range(14):  # steps again: the gap that ends first is the evaluation's, 15 s
        rhythm.see(0.3, now)
        now += 1.0
    assert rhythm.gaps >= 20 and rhythm.longest == pytest.approx(15.0)
    assert rhythm.timeout(300.0) == pytest.approx(75.0)
    assert rhythm.timeout(50.0) == 50.0  # never above the cap
    short = verdict.Rhythm(longest=1.0, gaps=20)
    assert short.timeout(300.0) == 60.0  # never below the floor
    long = verdict.Rhythm(longest=120.0, gaps=20)
    assert long.timeout(300.0) == 300.0


def test_stacks_shows_a_live_jobs_ranks_grouped_without_stopping_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "eh_logs"
    script = f"script={WORKERS / 'hang_probe.py'}"
    args = (script, "nproc_per_node=3", "logs.quiet=true", f"logs.root={logs}", "--")
    with started(*args, "wait", "wait", "sleep", cwd=tmp_path, env={"OUT_DIR": str(out)}) as job:
        wait_for(lambda: len(list(out.glob("*.ready"))) == 3, 30, "three ranks to start")
        shown = run("stacks", cwd=tmp_path)  # no directory: the running job under ./eh_logs
        again = run("stacks", str(next(logs.rglob("events.jsonl")).parent), cwd=tmp_path)
        assert job.poll() is None  # asked twice, still running
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=30)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].endswith("attempt 0, 3 rank(s)")
    assert "rank 2 at hang_probe.py:" in shown.stdout and "(time.sleep(600))" in shown.stdout
    assert (
        "ranks 0,1 at hang_probe.py:" in shown.stdout and "(os.read(read_end, 1))" in shown.stdout
    )
    assert shown.stdout.index("rank 2 at") < shown.stdout.index("ranks 0,1 at")  # odd one first
    assert "in main" in shown.stdout and "bootstrap.py" not in shown.stdout
    assert again.returncode == 0 and again.stdout.count("hang_probe.py:") >= 2


def test_two_nodes_both_name_the_stuck_rank_on_the_other_node(tmp_path: Path) -> None:
    # One worker per node over c10d: global rank 1 sleeps before the all_reduce, on whichever
    # node it is; rank 0's node finds no progress on any rank of the job and names rank 1 too.
    with job(tmp_path, "c10d", f"127.0.0.1:{free_port()}") as j:
        for n in range(2):
            overrides = ("nnodes=2", "nproc_per_node=1", "hang.timeout=2", "hang.warmup=0",
                         "hang.action=fail", "stop_grace=3", *FAST)  # fmt: skip
            root = f"logs.root={j.tmp / f'agent{n}'}"
            script = WORKERS / "hang_gloo.py"
            j.start(argv=[*j.command(*overrides, root, script=script), "--", "1", "30"])
        codes = j.finish(120)
    assert codes == [1, 1], j.explain()
    verdicts = [a.summary()["hang"]["verdict"] for a in j.agents]
    for text in verdicts:
        assert "rank 1 at hang_gloo.py:26 (time.sleep(seconds)) (stuck here)" in text, text
        assert "rank 0 in torch.distributed.distributed_c10d.all_reduce" in text, text
    ranks = [[r["rank"] for r in a.summary()["hang"]["ranks"]] for a in j.agents]
    assert ranks == [[0, 1], [0, 1]]


class FlakyStore:
    """An in-memory store whose first `failures` reads raise, as a loaded TCPStore may."""

    def __init__(self, failures: int = 0) -> None:
        self.data: dict[str, bytes] = {}
        self.failures = failures

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys: list[str]) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("Socket Timeout")
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value


class NodesShare:
    """seams.JobShare of a job whose other node's ranks are 1 (in `data.py`) and 2 (in an
    all_reduce), or whose other node said nothing."""

    def __init__(self, missing: int) -> None:
        self.missing = missing

    def share_progress(self, last: float) -> float:
        return last

    def share_hang(self, ranks: Sequence[HangRank]) -> tuple[list[HangRank], int]:
        other = [
            rank(1, file="/u/data.py", line=88, code="time.sleep(60)"),
            rank(2, file="/u/t.py", line=3, call="torch.distributed.all_reduce"),
        ]
        return [*ranks, *([] if self.missing else other)], self.missing

    def share_arrivals(self, seen: Any, members: Any) -> None:
        return None


@pytest.mark.parametrize("missing", [0, 1])
def test_the_watch_gives_one_verdict_from_every_nodes_ranks(tmp_path: Path, missing: int) -> None:
    from tests.harness import plan_of

    plan = plan_of(f"script={WORKERS / 'hang_probe.py'}", "hang.timeout=2")
    watch = LocalHangWatch(plan, RunDir(tmp_path), "vm", job=NodesShare(missing))
    record = watch.evidence([], 3.0, time.time())  # no rank of its own runs here
    if missing:
        assert [r.rank for r in record.ranks] == []
        assert record.verdict.endswith("(1 node(s) did not say where their ranks are)")
    else:
        assert [(r.rank, r.odd) for r in record.ranks] == [(1, True), (2, False)]
        assert record.verdict.startswith("hang after 3 s without progress: rank 1 at data.py:88")


def test_every_node_gets_the_job_wide_verdict_through_the_store() -> None:
    store = FlakyStore(failures=2)  # the other node's ranks are asked for again, not dropped
    other = json.dumps([rank(1, file="/u/data.py", line=88, code="time.sleep(60)").to_json()])
    store.set("elastic_hydra/r/hang/ranks/0/1/1", other)
    store.add("elastic_hydra/r/hang/read/0/1", 1)  # the other node has read every node's ranks
    mine = rank(0, file="/u/t.py", line=3, call="torch.distributed.all_reduce")
    ranks, missing = share.share_hang(store, "r", key="0/1", node=0, nodes=2, ranks=[mine],
                                      stopped=lambda: False)  # fmt: skip
    assert ([r.rank for r in ranks], missing) == ([0, 1], 0)
    text, odd = verdict.verdict(ranks, 3.0)
    assert odd == {1}
    assert text.startswith("hang after 3 s without progress: rank 1 at data.py:88")


def test_a_node_whose_ranks_do_not_read_is_named_as_missing() -> None:
    store = FlakyStore()
    store.set("elastic_hydra/r/hang/ranks/0/1/1", '[{"rank": "zero"}]')  # untrusted, malformed
    store.add("elastic_hydra/r/hang/read/0/1", 1)
    ranks, missing = share.share_hang(store, "r", key="0/1", node=0, nodes=2,
                                      ranks=[rank(0, file="/u/t.py", line=3)],
                                      stopped=lambda: False)  # fmt: skip
    assert ([r.rank for r in ranks], missing) == ([0], 1)


class SharedStore(FlakyStore):
    """One store for two nodes' threads; it dies with its host (`dead`), as an agent's does."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.dead = False
        self.checked = threading.Event()  # some node looked for a key that was not there

    def set(self, key: str, value: str | bytes) -> None:
        with self.lock:
            self._alive()
            super().set(key, value)

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            self._alive()
            there = super().check(keys)
            if not there:
                self.checked.set()
            return there

    def get(self, key: str) -> bytes:
        with self.lock:
            self._alive()
            return super().get(key)

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            self._alive()
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def _alive(self) -> None:
        if self.dead:
            raise RuntimeError("Connection reset by peer")


def test_the_node_hosting_the_store_waits_until_the_other_has_read_its_ranks() -> None:
    # Node 0 publishes and finds node 1's ranks missing; node 1 publishes, finds node 0's at
    # once, and its agent, which hosts the store, ends. Node 0 still reads node 1's ranks.
    store = SharedStore()
    results: dict[int, list[HangRank]] = {}

    def share_of(node: int) -> None:
        mine = [rank(node, file="/u/t.py", line=3 + node)]
        results[node], _ = share.share_hang(store, "r", key="0/1", node=node, nodes=2,
                                            ranks=mine, stopped=lambda: False)  # fmt: skip

    first = threading.Thread(target=share_of, args=(0,))
    first.start()
    assert store.checked.wait(10)  # node 0 looked once, too early
    share_of(1)
    store.dead = True  # node 1's agent ended, with the store
    first.join(20)
    assert [r.rank for r in results[0]] == [0, 1]
    assert [r.rank for r in results[1]] == [0, 1]


def test_no_node_may_claim_progress_in_the_future() -> None:
    store = FlakyStore()
    share.publish_progress(store, "r", 0, 0, 100.0)
    share.publish_progress(store, "r", 0, 1, 1e12)  # forged
    store.set("elastic_hydra/r/hang/progress/0/2", "not a time")
    assert share.latest_progress(store, "r", 0, 3, now=200.0) == 200.0
    assert share.latest_progress(store, "r", 0, 1, now=200.0) == 100.0
