"""`report DIR --html FILE`: the pages of real runs (one node, a failed two-node job, a pool
sweep) loaded in headless Chromium, the screenshot checked non-blank, the rendered DOM naming
every rank (every job); and what a run wrote never runs as script."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

from elastic_hydra.agent import events as ev
from elastic_hydra.agent.outcome import Status
from elastic_hydra.records.failures import FailureRecord
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.report import gantt, goodput, timeline
from tests.conftest import ELASTIC_HYDRA, WORKERS
from tests.harness import launcher_env, run
from tests.multinode import FAST, job, rdzv_server
from tests.report import chromium

HOSTILE = (
    "<script>document.body.setAttribute('data-pwned','1')</script><img src=x onerror=alert(1)>"
)


def report_html(run_dir: Path, page: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run("report", str(run_dir), "--html", str(page), cwd=cwd, timeout=60)


def check_in_browser(page: Path, ranks: list[str]) -> str:
    """The page as Chromium renders it: a real, non-blank screenshot; its DOM, returned."""
    png = chromium.screenshot(page, page.with_suffix(".png"))
    assert chromium.png_colours(png) >= 8, "the screenshot is (nearly) blank"
    dom = chromium.dump_dom(page)
    shown = re.sub(r"<[^>]+>", " ", dom)
    for rank in ranks:
        assert re.search(rf"\b{rank}\b", shown), f"{rank} missing from the rendered page"
    assert 'data-pwned="1"' not in dom  # no script of the run's ran
    return dom


def test_the_page_of_a_run_with_a_restart_and_a_hang_renders(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = run(
        f"script={WORKERS / 'goodput.py'}", "nproc_per_node=3", "hang.timeout=1",
        "hang.warmup=0", "hang.action=restart", "restart=on_failure", "logs.quiet=true",
        f"logs.root={logs}", "--", "0.5", "fail", "hang", cwd=tmp_path, timeout=90,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run_dir = next(logs.rglob("summary.json")).parent
    page = tmp_path / "page.html"
    page.write_text("old")
    page.chmod(0o644)
    shown = report_html(run_dir, page, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert stat.S_IMODE(page.stat().st_mode) == 0o600  # private, though the file was there
    text = page.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text.lower()
    dom = check_in_browser(page, ["rank 0", "rank 1", "rank 2"])
    for what in ("goodput ledger", "hung", "restart 1", "hang verdict", "stopped after a hang"):
        assert what in dom, what


def test_the_page_of_a_failed_two_node_job_names_every_rank_and_the_root_cause(
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "runs" / "job"
    # The store runs apart from the agents: hosted by the failing node's agent, it would go with
    # that agent, and the other node would end with a lost rendezvous instead.
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        for node in ("n0", "n1"):
            argv = j.command(
                "nnodes=2", "nproc_per_node=2", "restart.max_restarts=0", *FAST, "logs=quiet",
                f"hydra.run.dir={job_dir}", "--", "raise", "--rank", "3",
                script=WORKERS / "fail.py",
            )  # fmt: skip
            j.start(argv=argv, env={"SLURMD_NODENAME": node})
        codes = j.finish(120)
    assert sorted(codes) == [1, 1], j.explain()
    page = tmp_path / "job.html"
    shown = subprocess.run(
        [*ELASTIC_HYDRA, "report", str(job_dir), "--html", str(page)],
        env=launcher_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 1 and "goodput ledger: job, the sum of node(s) n0, n1" in (
        shown.stdout
    ), shown.stdout + shown.stderr
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    dom = check_in_browser(page, ["rank 0", "rank 1", "rank 2", "rank 3", "node n0", "node n1"])
    assert "root cause: rank 3 on" in dom and "boom from rank 3" in dom


def test_what_a_run_wrote_is_shown_never_run(tmp_path: Path) -> None:
    # A traceback, a host name and a reason that carry markup: escaped in the page, and the
    # browser runs none of it.
    cause = FailureRecord(
        rank=0, local_rank=0, host=HOSTILE, pid=1, attempt=0, returncode=1, time=2.0,
        message=f"ValueError: {HOSTILE}", stderr_tail=(HOSTILE,),
    )  # fmt: skip
    stamp = ev.Stamp(wall_time=1.5, mono_time=1.5)
    exited = ev.WorkerExited(
        **stamp, rank=0, local_rank=0, pid=7, returncode=1, exit=HOSTILE,
        terminated_by_launcher=False, attempt=0,
    )  # fmt: skip
    end = ev.Finish(
        wall_time=1.6, mono_time=1.6, status=Status.FAILED, exit_code=1, reason=HOSTILE,
        attempts=1,
    )  # fmt: skip
    events: list[ev.Event] = [
        ev.WorkersStarted(wall_time=1.0, mono_time=1.0, pids=(7,), attempt=0),
        exited,
        end,
    ]
    led = goodput.ledger(events, node=HOSTILE, start=0.5, end=2.0)
    summary = RunSummary(
        status=RunStatus.FAILED, exit_code=1, message=HOSTILE, host=HOSTILE, started=0.5,
        duration_s=1.5, root_cause=cause, ledger=led,
    )  # fmt: skip
    node = timeline.NodeView(name=HOSTILE, summary=summary, events=events)
    html = timeline.page(f"run {HOSTILE}", [node])
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert html.count("&lt;script&gt;") >= 4
    page = tmp_path / "hostile.html"
    page.write_text(html)
    dom = chromium.dump_dom(page)
    assert 'data-pwned="1"' not in dom and "<img" not in dom.lower()
    assert "&lt;script&gt;document.body" in dom  # shown as text


def test_chromium_runs_nothing_after_it_returns() -> None:
    page = Path(os.devnull)  # an empty document loads at once
    assert chromium.dump_dom(page).startswith("<html")
    found = ["pgrep", "-f", chromium.PROFILES]
    leftovers = subprocess.run(found, capture_output=True, check=False, timeout=10)
    assert leftovers.stdout == b"", leftovers.stdout


def test_html_without_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run("report", str(tmp_path), "--html", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "report --html: needs the file to write (got '--html')" in line, line


# ------------------------------------------------------------------------------------ sweeps
def test_the_page_of_a_pool_sweep_draws_each_job_on_its_slot(tmp_path: Path) -> None:
    codes = ["0", "3", "0", "0"]
    args = ",".join(f"[--code,{c}]" for c in codes)
    proc = run(
        "-m", "hydra/launcher=pool", "hydra.launcher.slots=2", f"script={WORKERS / 'exit_code.py'}",
        f"args={args}", f"logs.root={tmp_path / 'logs'}", "logs=quiet", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr  # job 1 failed
    sweep_dir = next((tmp_path / "logs" / "multirun").glob("*/*"))
    page = tmp_path / "sweep.html"
    shown = report_html(sweep_dir, page, tmp_path)
    assert shown.returncode == 1, shown.stderr
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    dom = check_in_browser(page, ["job 0", "job 1", "job 2", "job 3", "slot 0", "slot 1"])
    assert "4 job(s), 1 failed" in dom and "args=[--code,3]" in dom


def test_pool_json_rows_that_do_not_read_are_skipped_and_counted() -> None:
    good = {"number": 0, "overrides": [HOSTILE], "state": "succeeded", "slot": 0,
            "where": "CPU 0", "start_s": 0.0, "end_s": 1.5, "exit_code": 0}  # fmt: skip
    rows = [good, {**good, "number": "1"}, {**good, "state": "<b>"}, [], {**good, "slot": 1.5}]
    bars, bad = gantt.pool_bars({"jobs": rows})
    assert [b.number for b in bars] == [0] and bad == 4
    assert gantt.pool_bars("nonsense") == ([], 0) and gantt.pool_bars({"jobs": {}}) == ([], 0)
    html = gantt.sweep_page(f"sweep {HOSTILE}", bars, [], bad, "pool.json")
    assert "<script" not in html.lower() and "4 row(s) of pool.json did not read" in html
