"""`elastic-hydra logs`: a run's per-rank logs as one stream, equal lines of several ranks once,
tracebacks never merged, filters, and a live run followed to its end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elastic_hydra.report.logs import Merger, Source
from tests.conftest import wait_for
from tests.harness import ELASTIC_HYDRA, launcher_env, run

pytestmark = pytest.mark.timeout(120)


def lanes(n: int, stream: str = "stdout", attempt: int = 0) -> list[Source]:
    return [
        Source(path=Path(f"/r/{r}"), node="", attempt=attempt, rank=r, stream=stream)
        for r in range(n)
    ]


TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 9, in <module>',
    "    step()",
    "ValueError: bad batch",
]


def test_equal_lines_once_with_their_ranks_and_ranks_kept_in_step() -> None:
    merger = Merger(lanes(4), several_attempts=False)
    for r in range(4):
        merger.feed(r, ["UserWarning: deprecated", "  warnings.warn(x)", f"loss {r}", "done"])
    assert list(merger.drain()) == [
        "[ranks 0-3]: UserWarning: deprecated",
        "[ranks 0-3]:   warnings.warn(x)",
        "[rank 0]: loss 0", "[rank 1]: loss 1", "[rank 2]: loss 2", "[rank 3]: loss 3",
        "[ranks 0-3]: done",
    ]  # fmt: skip


def test_tracebacks_are_never_merged_even_when_equal() -> None:
    merger = Merger(lanes(2), several_attempts=False)
    merger.feed(0, [*TRACEBACK, "after"])
    merger.feed(1, [*TRACEBACK, "after"])
    shown = list(merger.drain())
    assert shown == [
        *(f"[rank 0]: {line}" for line in TRACEBACK),
        *(f"[rank 1]: {line}" for line in TRACEBACK),
        "[ranks 0-1]: after",
    ]


def test_streams_and_attempts_are_merged_apart_and_labelled() -> None:
    merger = Merger([*lanes(2), *lanes(2, "stderr"), *lanes(1, attempt=1)], several_attempts=True)
    for i in range(5):
        merger.feed(i, ["same"])
    assert sorted(merger.drain()) == [
        "[rank 0 attempt 1]: same", "[ranks 0-1 attempt 0 err]: same",
        "[ranks 0-1 attempt 0]: same",
    ]  # fmt: skip


def test_no_merge_keeps_every_rank_apart() -> None:
    merger = Merger(lanes(3), several_attempts=False, merge=0)
    for r in range(3):
        merger.feed(r, ["hello"])
    assert list(merger.drain()) == ["[rank 0]: hello", "[rank 1]: hello", "[rank 2]: hello"]


def test_following_a_line_waits_for_ranks_that_have_not_written_that_far() -> None:
    merger = Merger(lanes(2), several_attempts=False, merge=1.0)
    merger.feed(0, ["hello"], now=10.0)
    assert list(merger.drain(now=10.5, final=False)) == []  # rank 1 may write it too
    merger.feed(1, ["hello"], now=10.6)
    assert list(merger.drain(now=10.6, final=False)) == ["[ranks 0-1]: hello"]
    merger.feed(0, ["only mine"], now=11.0)
    assert list(merger.drain(now=12.1, final=False)) == ["[rank 0]: only mine"]  # waited enough
    other = Merger(lanes(2), several_attempts=False, merge=1.0)
    other.feed(0, ["a"], now=13.0)
    other.feed(1, ["b"], now=13.0)  # each wrote something else here: nothing to wait for
    assert list(other.drain(now=13.0, final=False)) == ["[rank 0]: a", "[rank 1]: b"]


WARNS = """
import os, sys, warnings
warnings.warn("TypedStorage is deprecated")
rank = int(os.environ["RANK"])
print(f"step 0 loss {rank / 10}", flush=True)
print("done", flush=True)
"""


def test_the_logs_of_a_real_run_merged_filtered_and_refused(tmp_path: Path) -> None:
    (tmp_path / "warns.py").write_text(WARNS)
    done = run("script=warns.py", "nproc_per_node=4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (p.parent for p in (tmp_path / "eh_logs").rglob("summary.json"))
    files = {p: p.read_bytes() for p in run_dir.rglob("*.log")}
    shown = run("logs", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == f"elastic-hydra logs: the newest run, {run_dir.relative_to(tmp_path)}\n"
    lines = shown.stdout.splitlines()
    assert lines.count('[ranks 0-3 err]: warnings.warn("TypedStorage is deprecated")') == 0
    assert sum("UserWarning: TypedStorage is deprecated" in line for line in lines) == 1
    assert "[ranks 0-3]: done" in lines and "[rank 2]: step 0 loss 0.2" in lines
    one = run("logs", str(run_dir), "--rank", "1-2", "--stream", "stdout", "--grep", "loss",
              cwd=tmp_path)  # fmt: skip
    assert one.stdout.splitlines() == ["[rank 1]: step 0 loss 0.1", "[rank 2]: step 0 loss 0.2"]
    apart = run("logs", str(run_dir), "--no-merge", cwd=tmp_path)
    assert sum("UserWarning: TypedStorage" in line for line in apart.stdout.splitlines()) == 4
    for words, key in ((["--rank", "x"], "--rank"), (["--grep", "("], "--grep"),
                       ([str(tmp_path / "nowhere")], "logs")):  # fmt: skip
        bad = run("logs", *words, cwd=tmp_path)
        assert bad.returncode == 2 and bad.stderr.startswith(f"elastic-hydra: error: {key}: ")
        assert bad.stderr.count("\n") == 1, bad.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*.log")} == files  # read, never changed


SLOW = """
import os, sys, time
from pathlib import Path
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
print(f"attempt {attempt} starts", flush=True)
go = Path(os.environ["OUT"], "go")
if attempt == "0":
    while not go.exists():  # until the follower runs
        time.sleep(0.02)
    sys.exit(3)
print("bye", flush=True)
"""


def test_follow_shows_a_live_run_new_attempts_included_and_ends_with_it(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    job = subprocess.Popen(
        [*ELASTIC_HYDRA, "script=slow.py", "nproc_per_node=2", "restart.max_restarts=1",
         f"env.OUT={tmp_path}"],
        cwd=tmp_path, env=launcher_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    follower = None
    try:
        assert job.stderr is not None
        runs = tmp_path / "eh_logs"

        def both_started() -> bool:  # whole lines: printed with flush, one write each
            said = [p.read_text() for p in runs.rglob("attempt_0/*/stdout.log")]
            return len(said) == 2 and all(s.endswith("starts\n") for s in said)

        wait_for(both_started, 60, "both ranks' first line")
        follower = subprocess.Popen(
            [sys.executable, "-m", "elastic_hydra", "logs", "-f"], cwd=tmp_path,
            env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follower.stdout is not None
        first = follower.stdout.readline()
        (tmp_path / "go").write_text("")  # attempt 0 fails now; attempt 1 says bye
        rest, _ = follower.communicate(timeout=60)
        assert job.wait(timeout=60) == 0
        assert follower.returncode == 0
    finally:
        for proc in (job, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first == "[ranks 0-1]: attempt 0 starts\n"
    assert rest.splitlines() == [
        "[ranks 0-1 attempt 1]: attempt 1 starts", "[ranks 0-1 attempt 1]: bye",
    ]  # fmt: skip
