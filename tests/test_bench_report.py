"""The benchmark harness's report (benchmarks/report.py) with its floor (no launcher) columns,
the floor program itself, and what other processes used of the machine meanwhile
(benchmarks/host.py)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

BENCHMARKS = str(REPO / "benchmarks")
LAUNCH = {"elastic-hydra": [1.0, 1.2, 1.1], "torchrun": [3.0, 3.1, 2.9], "floor": [0.9, 1.0, 0.8]}
GAP = {"elastic-hydra": [0.05, 0.04], "torchrun": [0.3, 0.5]}  # no floor
META = {
    "cpu_model": "test", "cores": 2, "loadavg": "0 0 0", "date": "today", "python": "3",
    "torch": "2", "elastic_hydra": "0", "runs": 3, "quick": False, "lines": 10,
    "command": "python benchmarks/run.py", "compiled": "installed", "errors": [],
    "leftovers": [],
}  # fmt: skip


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    """benchmarks' report and workloads modules, imported as benchmarks/run.py imports them."""
    sys.path.insert(0, BENCHMARKS)
    try:
        yield importlib.import_module("report"), importlib.import_module("workloads")
    finally:
        sys.path.remove(BENCHMARKS)


def test_rows_carry_the_floor_and_the_ratio_above_it(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    report, _ = bench
    launch, gap = report.rows({"restart_gap@2": GAP, "launch@4": LAUNCH})
    assert launch["key"] == "launch@4" and gap["key"] == "restart_gap@2"
    assert launch["floor"]["median"] == pytest.approx(0.9)
    # The plain ratio and its verdict do not change: the target is judged on it.
    assert launch["ratio"] == pytest.approx(1.1 / 3.0) and launch["met"] == "not met"
    assert launch["ratio_above_floor"] == pytest.approx((1.1 - 0.9) / (3.0 - 0.9))
    assert gap["floor"] == {"values": [], "min": None, "median": None, "max": None}
    assert gap["ratio_above_floor"] is None and gap["met"] == "met"
    # torchrun's median at or below the floor's: no overhead to compare against.
    assert report.above_floor([1.0], [0.9], [0.95]) is None
    assert report.above_floor([1.0], [], [0.95]) is None


def test_markdown_and_json_show_the_floor_only_where_measured(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    report, _ = bench
    text = report.write(tmp_path, META, {"launch@4": LAUNCH, "restart_gap@2": GAP})
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("| metric "))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "metric", "nproc", "unit", "elastic-hydra", "torchrun", "floor (no launcher)", "ratio",
        "above floor", "target", "met?",
    ]  # fmt: skip
    launch = next(ln for ln in lines if ln.startswith("| launch"))
    assert "| 0.800 / 0.900 / 1.000 | 0.37x | 0.10x | <= 0.25x | not met |" in launch
    gap = next(ln for ln in lines if ln.startswith("| restart gap"))
    assert "| 0.300 / 0.400 / 0.500 | - | 0.11x | - | <= 0.2x | met |" in gap
    assert any(ln.startswith("- **floor (no launcher)**: launch and restart gap") for ln in lines)
    assert any("elastic-hydra (installed) is byte-compiled" in ln for ln in lines)
    doc = json.loads((tmp_path / "latest.json").read_text())
    by_key = {row["key"]: row for row in doc["metrics"]}
    assert by_key["launch@4"]["floor"]["values"] == LAUNCH["floor"]
    assert by_key["launch@4"]["ratio_above_floor"] == pytest.approx(0.2 / 2.1)
    assert by_key["restart_gap@2"]["ratio_above_floor"] is None
    # Without floor samples there is no floor entry in "How each metric is measured".
    no_floor = report.markdown(META, report.rows({"restart_gap@2": GAP}))
    assert "floor (no launcher)**" not in no_floor


def test_the_floor_program_starts_every_rank_with_a_launchers_env(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _, workloads = bench
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    proc = subprocess.run(
        workloads.floor_command(workloads.write_worker(tmp_path), 3, stamps / "fail"),
        env=workloads.worker_env("start", stamps),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    names = sorted(p.name for p in stamps.iterdir())
    assert names == ["fail", "start_0_0", "start_0_1", "start_0_2"]
    # The restart floor's stamp is written before any worker starts.
    spawning = float((stamps / "fail").read_text().split()[0])
    starts = [float((stamps / f"start_0_{r}").read_text().split()[0]) for r in range(3)]
    assert spawning <= min(starts)


def test_the_report_says_the_machine_was_shared_only_when_other_processes_used_it(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    report, _ = bench

    def machine(**meta: object) -> str:
        text: str = report.markdown({**META, **meta}, report.rows({"launch@4": LAUNCH}))
        return next(ln for ln in text.splitlines() if ln.startswith("- Machine:"))

    assert machine() == "- Machine: test, 2 cores; load average at start 0 0 0"  # older results
    assert machine(others_cores=0.01) == (
        "- Machine: test, 2 cores; load average at start 0 0 0; other processes used 0.01 cores "
        "on average over the run"
    )
    assert machine(others_cores=0.4).endswith(
        "used 0.40 cores on average over the run (other work shared this machine)"
    )


def test_other_processes_cpu_is_the_hosts_less_the_harnesss_and_its_waited_children(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    host = importlib.import_module("host")
    start = host.CpuReading(at=10.0, host_s=100.0, ours_s=5.0)
    end = host.CpuReading(at=20.0, host_s=112.0, ours_s=13.0)
    assert host.others_cores(start, end) == pytest.approx(0.4)  # 12 s of CPU, 8 of them ours
    assert host.others_cores(start, host.CpuReading(at=20.0, host_s=108.0, ours_s=13.0)) == 0.0
    # A live child: other work until it is waited for, the harness's own from then on. Other
    # processes on the host can only add to the first figure, never to the second.
    burn = "import time\nwhile time.process_time() < 0.3: pass"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        before = host.read_cpu()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        exited = host.read_cpu()
    finally:
        child.wait(timeout=60)
    reaped = host.read_cpu()
    assert (exited.host_s - before.host_s) - (exited.ours_s - before.ours_s) >= 0.25
    assert reaped.ours_s - exited.ours_s >= 0.25
