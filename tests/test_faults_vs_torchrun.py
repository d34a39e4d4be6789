"""Fault injection side by side: the same fault under torchrun and under elastic-hydra.

Each case runs the same plain-Python worker under `torchrun --standalone` and under
`elastic-hydra`, injects one fault, and records what each launcher did in a table printed at the
end (`pytest -s`) and written to `<tmp>/faults.md`. Both columns are asserted: elastic-hydra's
behaviour, and torchrun's as docs/hardening.md's fault table states it (the table comes from
here), so a torchrun that changes its behaviour shows up as a failing reference case.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_hydra.records.goodput import Phase
from elastic_hydra.records.summary import RunSummary
from tests.conftest import ELASTIC_HYDRA, WORKERS, wait_for
from tests.workers.test_hardening_processes import marked

pytestmark = pytest.mark.timeout(180)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
ROWS: list[str] = []
TORCHRUN_GRACE = 3  # torchrun's --shutdown-timeout where the case waits for it (default 30 s)


def launch(
    kind: str, tmp: Path, script: Path, *args: str, torchrun: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    if kind == "torchrun":
        cmd = [*TORCHRUN, *torchrun, str(script), *args]
    else:
        cmd = [*ELASTIC_HYDRA, f"script={script}", "nproc_per_node=2", f"logs.root={tmp}"]
        cmd += ["--", *args]
    return subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def reap(proc: subprocess.Popen[bytes], marker: str) -> list[int]:
    """End the launcher; return (and kill) what it left alive."""
    proc.kill()
    proc.wait()
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not marked(marker), 3, "the launch's processes to end")
    left = marked(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.parametrize("kind", ["torchrun", "elastic-hydra"])
def test_a_daemon_left_by_a_worker(tmp_path: Path, kind: str) -> None:
    marker, pidfile = f"eh-fault-{uuid.uuid4().hex}", tmp_path / "daemon.pid"
    proc = launch(kind, tmp_path, WORKERS / "daemonize.py", "ok", str(pidfile), marker)
    try:
        wait_for(pidfile.exists, 60, "the daemon")
        code = proc.wait(timeout=60)
        left = [p for p in marked(marker) if p == int(pidfile.read_text())]
    finally:
        extra = reap(proc, marker)
    ROWS.append(f"| worker daemonizes, job succeeds | {kind} | exit {code}, daemon left: "
                f"{'yes' if left or extra else 'no'} |")  # fmt: skip
    if kind == "torchrun":  # the reference: the job succeeds, its worker's daemon outlives it
        assert code == 0 and left, ROWS[-1]
    else:
        assert code == 0 and not left and not extra
        assert_time_accounted(tmp_path)


@pytest.mark.parametrize("kind", ["torchrun", "elastic-hydra"])
def test_sigterm_with_a_stopped_worker(tmp_path: Path, kind: str) -> None:
    marker = f"eh-fault-{uuid.uuid4().hex}"
    # torchrun waits its whole grace for the stopped worker: 30 s by default, here the 3 s it is
    # given. elastic-hydra keeps its default stop_grace (30 s), which it must not wait for.
    proc = launch(kind, tmp_path, WORKERS / "stop_self.py", str(tmp_path), marker,
                  torchrun=(f"--shutdown-timeout={TORCHRUN_GRACE}",))  # fmt: skip
    try:
        wait_for((tmp_path / "READY_1").exists, 60, "rank 1")
        wait_for(lambda: any(_state(p) == b"T" for p in marked(marker)), 20, "rank 1 to stop")
        os.kill(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        try:
            code: int | str = proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            code = "still running after 45 s"
        took = time.monotonic() - started
    finally:
        left = reap(proc, marker)
    grace = f" (--shutdown-timeout={TORCHRUN_GRACE})" if kind == "torchrun" else ""
    ROWS.append(f"| SIGTERM while a worker is SIGSTOPped | {kind} | exit {code} after "
                f"{took:.1f} s{grace}, left: {len(left)} |")  # fmt: skip
    if kind == "torchrun":  # the reference: its whole grace, then exit 1, the worker killed
        assert code == 1 and took >= TORCHRUN_GRACE and not left, ROWS[-1]
    else:
        assert code == 143 and took < 10 and not left
        assert_time_accounted(tmp_path)


def assert_time_accounted(logs: Path) -> None:
    """The goodput ledger of the run accounts for its wall time: under 1 % unattributed."""
    (path,) = logs.rglob("summary.json")
    ledger = RunSummary.from_json(json.loads(path.read_text())).ledger
    assert ledger is not None and ledger.wall_s > 0
    assert sum(p.wall_s for p in ledger.phases) == pytest.approx(ledger.wall_s, rel=0.01)
    assert ledger.seconds(Phase.UNATTRIBUTED) < 0.01 * ledger.wall_s, ledger


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b""


@pytest.fixture(scope="module", autouse=True)
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the module: the side-by-side table of the cases that ran, printed and saved."""
    yield
    text = "| fault | launcher | outcome |\n|---|---|---|\n" + "\n".join(ROWS) + "\n"
    (tmp_path_factory.mktemp("faults") / "faults.md").write_text(text)
    print("\n" + text)
