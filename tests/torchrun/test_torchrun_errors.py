"""Failure reports side by side: torchrun's summary and ours, for the same failing workers.

`tests/scripts/fail.py MODE --rank 1` fails on rank 1 of 3 (a raised ValueError, a SIGSEGV, a
SIGKILL, `sys.exit(3)`); the other ranks sleep until the launcher stops them. Each case runs once
under `torchrun --standalone --nproc-per-node=3` and once under
`python -m elastic_hydra script=... nproc_per_node=3 stop_grace=5 logs.root=<tmp> -- ARGS`, with
the same parent environment. Both must name the same root cause (global rank, local rank, exit
code in `Popen.returncode` form: negative = the signal). Ours must also say what torchrun leaves
out without `@record` (the traceback, the Python stack at a segfault, the OOM hint for SIGKILL) and
must not count the ranks it stopped itself as failures, which torchrun lists under "Failures:"
with exit code -15 (torchrun-study.md A4).

Both outputs are written one above the other to `<tmp>/side_by_side/<case>.txt` and printed
(`pytest -s` shows them); with ELASTIC_HYDRA_SIDE_BY_SIDE_DIR set they are also written to
`$ELASTIC_HYDRA_SIDE_BY_SIDE_DIR/<case>.txt`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ELASTIC_HYDRA, WORKERS, wait_for

pytestmark = [
    pytest.mark.timeout(180),
]

WORKER = WORKERS / "fail.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # = the torchrun console script
NPROC = 3
FAILING_RANK = 1
COLLATERAL = sorted(set(range(NPROC)) - {FAILING_RANK})
LAUNCH_TIMEOUT = 60.0  # seconds for one launch; the sleeping ranks give up after 60 s anyway
CASES = ("raise", "segv", "kill", "exit3")
SIDE_BY_SIDE_ENV = "ELASTIC_HYDRA_SIDE_BY_SIDE_DIR"
# Variables a launcher sets for its workers: none may leak in from the environment of the tests.
LAUNCHER_VARS = {
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "PYTHON_EXEC",
}  # fmt: skip


# ------------------------------------------------------------------------------------------ helpers
@dataclass
class Launch:
    """One finished launch: its command, exit code and output."""

    kind: str
    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    summary: dict[str, Any] = field(default_factory=dict)  # ours only: summary.json

    def render(self) -> str:
        bar = "=" * 100
        return (
            f"{bar}\n{self.kind}: {subprocess.list2cmdline(self.cmd)}\n"
            f"exit code {self.returncode}\n{bar}\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}\n"
        )


@dataclass
class RootCause:
    rank: int
    local_rank: int
    exitcode: int
    text: str  # the whole block (torchrun) / the report from the root-cause line on (ours)


@dataclass
class Case:
    name: str
    torchrun: Launch
    ours: Launch
    side_by_side: Path


def parent_env(tmp: Path) -> dict[str, str]:
    """This process's environment without anything a launcher sets for its workers."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and not k.startswith(("TORCHELASTIC_", "ELASTIC_HYDRA_", "PET_"))
    }
    env["TMPDIR"] = str(tmp)  # torchrun's default log dir lands in tmp
    return env


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every descendant it has now (collected first: orphans get reparented)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with suppress(psutil.NoSuchProcess):
            p.kill()


def run_bounded(kind: str, cmd: list[str], tmp: Path) -> Launch:
    """Run `cmd` in `tmp` for at most LAUNCH_TIMEOUT s; on timeout kill its whole tree and fail."""
    proc = subprocess.Popen(
        cmd,
        cwd=tmp,
        env=parent_env(tmp),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{kind} ran past {LAUNCH_TIMEOUT} s:\n{stdout}\n{stderr}")
    return Launch(kind, cmd, proc.returncode, stdout, stderr)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone: pid 1 here may not reap orphans)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def assert_workers_gone(kind: str, pids: set[int]) -> None:
    """The launcher has ended: none of its workers may outlive it (they are not our children)."""
    assert pids, f"{kind}: no worker pids found in its output"
    try:
        wait_for(lambda: not any(alive(p) for p in pids), 5.0, f"{kind}'s workers to end")
    except AssertionError:
        left = sorted(p for p in pids if alive(p))
        for pid in left:
            kill_tree(pid)
        pytest.fail(f"{kind} left its workers {left} running")


def launch_torchrun(case: str, tmp: Path) -> Launch:
    cmd = [*TORCHRUN, "--standalone", f"--nproc-per-node={NPROC}", str(WORKER)]
    run = run_bounded("torchrun", [*cmd, case, "--rank", str(FAILING_RANK)], tmp)
    assert_workers_gone("torchrun", {int(p) for p in re.findall(r"\(pid: (\d+)\)", run.stderr)})
    return run


def launch_ours(case: str, tmp: Path) -> Launch:
    cmd = [
        *ELASTIC_HYDRA,
        f"script={WORKER}",
        f"nproc_per_node={NPROC}",
        "stop_grace=5",
        f"logs.root={tmp / 'logs'}",
        "--",
        case,
        "--rank",
        str(FAILING_RANK),
    ]
    run = run_bounded("elastic-hydra", cmd, tmp)
    summaries = sorted((tmp / "logs").rglob("summary.json"))
    assert len(summaries) == 1, f"expected one summary.json, found {summaries}\n{run.stderr}"
    run.summary = json.loads(summaries[0].read_text())
    assert_workers_gone("elastic-hydra", {e["pid"] for e in run.summary["exits"]})
    return run


def save_side_by_side(case: str, torchrun: Launch, ours: Launch, tmp: Path) -> Path:
    heading = f"##### case {case!r}: fail.py {case} --rank {FAILING_RANK}, {NPROC} processes"
    text = f"{heading}\n\n{torchrun.render()}\n{ours.render()}"
    path = tmp / "side_by_side" / f"{case}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if os.environ.get(SIDE_BY_SIDE_ENV):
        extra = Path(os.environ[SIDE_BY_SIDE_ENV])
        extra.mkdir(parents=True, exist_ok=True)
        (extra / f"{case}.txt").write_text(text)
    print(f"\n{text}")
    return path


def torchrun_blocks(stderr: str) -> tuple[RootCause, list[RootCause]]:
    """torchrun's summary: the "Root Cause (first observed failure):" entry and the "Failures:"."""
    summary = stderr.rsplit("ChildFailedError:", 1)[-1]
    assert "Root Cause (first observed failure):" in summary, f"no torchrun summary in:\n{stderr}"
    failures_part, cause_part = summary.split("Root Cause (first observed failure):", 1)
    cause_part = re.split(r"^=+$", cause_part, maxsplit=1, flags=re.M)[0]
    (cause,) = _torchrun_entries(cause_part)
    others: list[RootCause] = []
    if "Failures:" in failures_part:
        others = _torchrun_entries(failures_part.split("Failures:", 1)[1])
    return cause, others


def _torchrun_entries(block: str) -> list[RootCause]:
    entries = re.split(r"^\[\d+\]:$", block, flags=re.M)[1:]
    parsed = []
    for entry in entries:
        rank = re.search(r"^\s*rank\s*: (\d+) \(local_rank: (\d+)\)", entry, re.M)
        code = re.search(r"^\s*exitcode\s*: (-?\d+) \(pid: \d+\)", entry, re.M)
        assert rank and code, f"cannot parse torchrun's failure entry:\n{entry}"
        parsed.append(RootCause(int(rank[1]), int(rank[2]), int(code[1]), entry))
    return parsed


def our_report(stderr: str) -> str:
    """Our failure report: stderr from the "elastic-hydra: failed" line on."""
    match = re.search(r"^elastic-hydra: failed: .*", stderr, re.M | re.S)
    assert match, f"no failure report in our stderr:\n{stderr}"
    return match[0]


@dataclass
class OurCause:
    rank: int
    local_rank: int
    head: str  # the root-cause lines: who, how it ended, when (not the traceback)


def our_root_cause(stderr: str) -> OurCause:
    """The head of our report's root cause: `root cause: rank R (local rank L) ..., <exit>, at T`
    on one line, or a grid of `root cause  rank R (local rank L) ...` / `exit  ...` / `time  ...`.
    """
    found = re.findall(
        r"^root cause:?\s+rank \d+ \(local rank \d+\).*\n(?:(?:exit|time)\s.*\n)*", stderr, re.M
    )
    assert len(found) == 1, f"expected one root cause, got {found}:\n{stderr}"
    match = re.match(r"root cause:?\s+rank (\d+) \(local rank (\d+)\)", found[0])
    assert match, found[0]
    return OurCause(int(match[1]), int(match[2]), found[0])


# ----------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    """One failure mode under both launchers (each launched once per module)."""
    name: str = request.param
    torchrun = launch_torchrun(name, tmp_path_factory.mktemp(f"torchrun-{name}"))
    ours = launch_ours(name, tmp_path_factory.mktemp(f"ours-{name}"))
    saved = save_side_by_side(name, torchrun, ours, tmp_path_factory.mktemp(f"both-{name}"))
    return Case(name, torchrun, ours, saved)


# -------------------------------------------------------------------------------------------- tests
def test_both_launchers_exit_1(case: Case) -> None:
    assert case.torchrun.returncode == 1, case.torchrun.render()
    assert case.ours.returncode == 1, case.ours.render()
    assert case.ours.summary["status"] == "failed"
    assert case.ours.summary["exit_code"] == 1


def test_same_root_cause_rank_and_exit_code(case: Case) -> None:
    theirs, _ = torchrun_blocks(case.torchrun.stderr)
    assert (theirs.rank, theirs.local_rank) == (FAILING_RANK, FAILING_RANK), theirs.text
    cause = case.ours.summary["root_cause"]
    # summary.json: Popen convention, like torchrun's exitcode (-11 = SIGSEGV, -9 = SIGKILL)
    assert (cause["rank"], cause["local_rank"]) == (theirs.rank, theirs.local_rank)
    assert cause["returncode"] == theirs.exitcode
    assert not cause["terminated_by_launcher"]
    # the printed report names the same rank, and the same exit code or signal
    printed = our_root_cause(case.ours.stderr)
    assert (printed.rank, printed.local_rank) == (theirs.rank, theirs.local_rank)
    if theirs.exitcode >= 0:
        assert re.search(rf"\bexit code {theirs.exitcode}\b", printed.head), printed.head
    else:
        signame = re.search(r"exitcode\s*: -\d+ \(pid: \d+\)\s+\((SIG\w+)\)", theirs.text)
        assert signame, theirs.text
        assert signame[1] in printed.head, printed.head


def test_ours_shows_what_torchrun_leaves_out(case: Case) -> None:
    theirs, _ = torchrun_blocks(case.torchrun.stderr)
    report = our_report(case.ours.stderr)
    cause_head = our_root_cause(case.ours.stderr).head
    if case.name == "raise":
        assert "To enable traceback see" in theirs.text
        assert "ValueError" not in theirs.text
        assert "ValueError: boom from rank 1" in report
        assert re.search(r'^\s*File "[^"]*fail\.py", line \d+, in fail$', report, re.M), report
    elif case.name == "segv":
        assert "Signal 11 (SIGSEGV) received by PID" in theirs.text
        assert "fail.py" not in theirs.text
        assert "segmentation fault" in cause_head.lower()
        # faulthandler's Python stack at the crash, down to the frame that crashed
        assert re.search(r'^\s*File "[^"]*fail\.py", line \d+, in fail$', report, re.M), report
    elif case.name == "kill":
        assert "Signal 9 (SIGKILL) received by PID" in theirs.text
        assert "SIGKILL" in cause_head
        assert "OOM" in cause_head
    elif case.name == "exit3":
        assert "To enable traceback see" in theirs.text
        assert "rank 1: giving up with exit code 3" not in theirs.text
        assert "rank 1: giving up with exit code 3" in report  # the tail of the rank's stderr
    else:  # pragma: no cover - a new case needs its own checks
        pytest.fail(f"no checks for case {case.name!r}")


def test_collateral_ranks_are_not_failures(case: Case) -> None:
    # torchrun counts the ranks its agent SIGTERMed as failures ...
    _, theirs = torchrun_blocks(case.torchrun.stderr)
    assert sorted(f.rank for f in theirs) == COLLATERAL, case.torchrun.stderr
    assert all(f.exitcode == -15 for f in theirs), [f.text for f in theirs]
    # ... ours lists them as stopped by the launcher, not as failures
    report = our_report(case.ours.stderr)
    assert "Failures" not in report
    rows = dict(re.findall(r"^(\d+)\s+\d+\s+\d+\s+(.+?)\s*$", report, re.M))
    assert sorted(int(r) for r in rows) == COLLATERAL, report
    for rank, how in rows.items():
        assert how.startswith("terminated by launcher"), f"rank {rank}: {how!r}"
    for rank in COLLATERAL:
        assert f"rank {rank} (local rank" not in report
    summary = case.ours.summary
    assert summary["root_cause"]["rank"] == FAILING_RANK
    for record in summary["failures"]:
        if record["rank"] != FAILING_RANK:
            assert record["terminated_by_launcher"], record


def test_ours_has_no_launcher_traceback(case: Case) -> None:
    output = case.ours.stdout + case.ours.stderr
    frames = re.findall(r'File "([^"]+)"', output)
    ours = [f for f in frames if "elastic_hydra" in Path(f).parts]
    assert not ours, f"the launcher's own frames in its output: {ours}\n{output}"
    for name in ("cli.py", "agent.py"):
        assert f"elastic_hydra/{name}" not in output
    if case.name != "raise":  # only the worker's ValueError may bring a traceback
        assert "Traceback" not in output, output


def test_side_by_side_file_has_both(case: Case) -> None:
    text = case.side_by_side.read_text()
    assert text.index("Root Cause (first observed failure):") < text.index("elastic-hydra: failed")
    target = os.environ.get(SIDE_BY_SIDE_ENV)
    if target:
        assert Path(target, f"{case.name}.txt").read_text() == text
