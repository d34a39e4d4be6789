"""The preflight feeds the ledger, for real: a job whose node fails its preflight (a
`preflight.paths` entry that is a file, not a directory) puts that node into the ledger; a
later job that reads the same ledger refuses the node before the rendezvous (exit 6); once
`elastic-hydra quarantine clear` has run, the next job runs there again."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from elastic_hydra.agent.events import Joining, Quarantined
from elastic_hydra.errors import EXIT_PREFLIGHT_NODE, EXIT_QUARANTINED
from elastic_hydra.quarantine.ledger import Ledger
from elastic_hydra.records.goodput import Phase
from elastic_hydra.records.summary import RunSummary
from elastic_hydra.report.events_file import read_events
from tests.conftest import WORKERS
from tests.harness import run

QUICK = ("preflight=quick", "preflight.min_ratio=0.5", "preflight.gemm_seconds=0.3")
DEADLINE = 180.0  # the probe imports torch: seconds of CPU on a shared host


def launch(tmp: Path, name: str, ledger: Path, *overrides: str) -> tuple[int, str, Path]:
    root = tmp / name
    proc = run(
        f"script={WORKERS / 'exit_code.py'}", f"logs.root={root}", f"quarantine.ledger={ledger}",
        "quarantine.cooldown=2h", f"rdzv.id=job-{name}", *overrides,
        cwd=tmp, timeout=DEADLINE,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, root


def test_a_node_that_fails_preflight_is_kept_out_of_the_next_job_until_cleared(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger.json"
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("a file where the job wants a directory\n")
    host = socket.gethostname()

    code, out, root = launch(tmp_path, "first", ledger, *QUICK, f"preflight.paths=[{not_a_dir}]")
    assert code == EXIT_PREFLIGHT_NODE, out
    adds_up(root, ran=False)
    (entry,) = Ledger(ledger).active(0)
    assert (entry.host, entry.gpu, entry.job) == (host, None, "job-first")
    found = f"preflight: node 0 ({host}) preflight.paths {not_a_dir} is not a directory"
    assert entry.reason == found
    assert 2 * 3600 - 120 < entry.until - entry.added <= 2 * 3600  # quarantine.cooldown
    (said,) = [ln for ln in out.splitlines() if ln.startswith("elastic-hydra: quarantined ")]
    assert said.startswith(f"elastic-hydra: quarantined {host} until ")
    assert f"(quarantine.cooldown=2h) in {ledger}" in said
    assert said.endswith(f"elastic-hydra quarantine clear {host} --ledger {ledger}")
    assert ledger.stat().st_mode & 0o777 == 0o600
    (path,) = root.glob(
        "**/summary.json"
    )  # the bad node's own record says it, not only its console
    verdict = RunSummary.from_json(json.loads(path.read_text())).preflight
    assert verdict is not None
    assert (verdict.quarantined, verdict.quarantined_until) == ((host,), entry.until)
    (closing,) = [ln for ln in out.splitlines() if ln.startswith(f"quarantined {host} until ")]
    assert closing.endswith(" UTC (this node, in quarantine.ledger)"), out  # its closing report

    code, out, root = launch(tmp_path, "second", ledger)  # preflight off: the ledger alone
    assert code == EXIT_QUARANTINED, out
    assert f"this node ({host}) is in the quarantine ledger until " in out
    assert "is not a directory (added by job-first)" in out
    (events_file,) = root.glob("**/events.jsonl")
    seen = read_events(events_file).events
    assert [type(e) for e in seen if isinstance(e, (Quarantined, Joining))] == [Quarantined]
    assert not list(root.glob("**/attempt_*"))  # no worker started

    cleared = run("quarantine", "clear", host, "--ledger", str(ledger), cwd=tmp_path)
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert Ledger(ledger).active(0) == []
    code, out, root = launch(tmp_path, "third", ledger, *QUICK)
    assert code == 0, out
    assert "preflight: 1 node(s) passed" in out
    adds_up(root, ran=True)


def adds_up(root: Path, *, ran: bool) -> None:
    """The goodput ledger of a real preflight job: its battery counted as `preflight` (the
    event's seconds), every phase adding up to the wall time within 1 %."""
    (path,) = root.glob("**/summary.json")
    summary = RunSummary.from_json(json.loads(path.read_text()))
    led, verdict = summary.ledger, summary.preflight
    assert led is not None and verdict is not None
    assert led.seconds(Phase.PREFLIGHT) == pytest.approx(verdict.seconds, abs=0.01)
    assert 0 < led.seconds(Phase.PREFLIGHT) < led.wall_s
    assert sum(p.wall_s for p in led.phases) == pytest.approx(led.wall_s, rel=0.01)
    assert led.seconds(Phase.UNATTRIBUTED) < 0.01 * led.wall_s
    assert (led.seconds(Phase.RUNNING) > 0) is ran
