"""`elastic-hydra quarantine` and a launch that reads the ledger, as real commands."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from elastic_hydra.quarantine.ledger import Ledger, QuarantineEntry
from tests.harness import run

SCRIPT = "print('trained', flush=True)\n"


def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def quarantine(ledger: Path, host: str, gpu: int | None = None) -> None:
    now = time.time()
    Ledger(ledger).add([QuarantineEntry(
        host=host, gpu=gpu, reason=f"preflight: {host} at 41 % of the median GEMM rate",
        added=now, until=now + 3600, job="run-7",
    )])  # fmt: skip


def test_a_quarantined_host_does_not_join_and_clear_lets_it_back(tmp_path: Path) -> None:
    cwd, host = job_dir(tmp_path), socket.gethostname()
    ledger = tmp_path / "ledger.json"
    quarantine(ledger, host)
    job = ("script=train.py", f"quarantine.ledger={ledger}")

    refused = run(*job, cwd=cwd)
    assert refused.returncode == 6, refused.stderr
    assert "trained" not in refused.stdout
    (line,) = [x for x in refused.stderr.splitlines() if "quarantine ledger until" in x]
    assert f"this node ({host}) is in the quarantine ledger until " in line
    assert f"preflight: {host} at 41 % of the median GEMM rate (added by run-7)" in line
    assert f"elastic-hydra quarantine clear {host} --ledger {ledger}" in line
    assert "--exclude" not in line
    run_dir = next((cwd / "eh_logs").glob("*/*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["exit_code"]) == ("quarantined", 6)
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["quarantined", "finish"]
    assert events[0]["host"] == host

    under_slurm = run(*job, "logs.quiet=true", cwd=cwd, env={"SLURM_JOB_ID": "42"})
    assert under_slurm.returncode == 6
    assert f"Under Slurm, resubmit with --exclude={host}" in under_slurm.stderr

    cleared = run("quarantine", "clear", host, "--ledger", str(ledger), cwd=cwd)
    assert cleared.returncode == 0 and "cleared 1 entry" in cleared.stdout
    ran = run(*job, cwd=cwd)
    assert ran.returncode == 0, ran.stderr
    assert "trained" in ran.stdout


def test_other_hosts_and_unused_gpus_do_not_keep_this_one_out(tmp_path: Path) -> None:
    cwd = job_dir(tmp_path)
    ledger = tmp_path / "ledger.json"
    quarantine(ledger, "elsewhere-1")
    quarantine(ledger, socket.gethostname(), gpu=7)
    job = ("script=train.py", "nproc_per_node=2", f"quarantine.ledger={ledger}")
    ran = run(*job, cwd=cwd)  # local ranks 0 and 1: GPUs 0 and 1 by torchrun's convention
    assert ran.returncode == 0, ran.stderr
    quarantine(ledger, socket.gethostname(), gpu=1)
    refused = run(*job, cwd=cwd)
    assert refused.returncode == 6, refused.stderr
    assert f"GPU 1 of this node ({socket.gethostname()}) is in the quarantine ledger" in (
        refused.stderr
    )
    assert "Leave the GPU out with gpus=[0], or elastic-hydra quarantine clear" in refused.stderr


def test_a_malformed_ledger_is_one_warning_and_the_job_runs(tmp_path: Path) -> None:
    cwd = job_dir(tmp_path)
    ledger = tmp_path / "ledger.json"
    ledger.write_text('{"version": 1, "entries": [{"host": "x"}]}')
    ran = run("script=train.py", f"quarantine.ledger={ledger}", cwd=cwd)
    assert ran.returncode == 0, ran.stderr
    warnings = [x for x in ran.stderr.splitlines() if "warning" in x]
    assert warnings == [
        f"elastic-hydra: warning: quarantine ledger {ledger}: 1 malformed entry ignored "
        "(entry 0: gpu: missing)"
    ]


def test_list_add_clear(tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.json")
    empty = run("quarantine", "list", "--ledger", ledger, cwd=tmp_path)
    assert empty.returncode == 0 and "no host or GPU is quarantined" in empty.stdout
    added = run("quarantine", "add", "node-3", "--gpu", "5", "--reason", "GEMM at 41 %",
                "--cooldown", "2h", "--ledger", ledger, cwd=tmp_path)  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("quarantined node-3 gpu 5 until ")
    run("quarantine", "add", "node-1", "--reason=flaky link", f"--ledger={ledger}", cwd=tmp_path)

    table = run("quarantine", "list", "--ledger", ledger, cwd=tmp_path).stdout.splitlines()
    assert table[0].split() == ["HOST", "GPU", "UNTIL", "(UTC)", "LEFT", "ADDED", "BY", "REASON"]
    assert table[1].split()[:2] == ["node-1", "-"] and table[1].endswith("flaky link")
    assert table[2].split()[:2] == ["node-3", "5"] and table[2].split()[4] in ("2h", "1h59m")
    assert table[3].endswith("under Slurm: --exclude=node-1,node-3")

    listed = json.loads(
        run("quarantine", "list", "--json", "--ledger", ledger, cwd=tmp_path).stdout
    )
    entries = listed["entries"]
    assert [(e["host"], e["gpu"], e["job"]) for e in entries] == [
        ("node-1", None, "cli"), ("node-3", 5, "cli"),
    ]  # fmt: skip
    assert 7100 < entries[1]["left_s"] <= 7200
    assert 86300 < entries[0]["left_s"] <= 86400  # the default cooldown, 24h

    cleared = run("quarantine", "clear", "node-3", "--gpu", "5", "--ledger", ledger, cwd=tmp_path)
    assert cleared.stdout.strip() == f"cleared 1 entry (node-3 gpu 5) in {ledger}"
    everything = run("quarantine", "clear", "--all", "--ledger", ledger, cwd=tmp_path)
    assert everything.stdout.strip() == f"cleared 1 entry (every host) in {ledger}"


def test_the_ledger_and_cooldown_of_a_job_file(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        "defaults:\n  - elastic_hydra_base\n  - _self_\nscript: train.py\n"
        "quarantine:\n  ledger: shared/ledger.json\n  cooldown: 3h\n"
    )
    (tmp_path / "shared").mkdir()
    added = run("quarantine", "add", "node-9", "--reason", "r", "job.yaml", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    (entry,) = Ledger(tmp_path / "shared" / "ledger.json").active(time.time())
    assert 3 * 3600 - 60 < entry.until - entry.added <= 3 * 3600
    other = run("quarantine", "list", "job.yaml", "quarantine.ledger=other.json", cwd=tmp_path)
    assert other.returncode == 0 and f"{tmp_path}/other.json" in other.stdout


def test_help(tmp_path: Path) -> None:
    shown = run("quarantine", "add", "-h", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: elastic-hydra quarantine")
    bare = run("quarantine", cwd=tmp_path)
    assert bare.returncode == 2 and bare.stderr == (
        "elastic-hydra: error: quarantine: unknown action (got <nothing>); expected list, add or "
        "clear. See elastic-hydra quarantine -h.\n"
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["list"], "--ledger: no ledger given"),
        (["frobnicate", "--ledger", "l.json"], "quarantine: unknown action (got 'frobnicate')"),
        (["add", "--reason", "r", "--ledger", "l.json"], "quarantine add: no host given"),
        (["add", "n1", "--ledger", "l.json"], "--reason: missing"),
        (["add", "bad host", "--reason", "r", "--ledger", "l.json"], "host: not a host name"),
        (["add", "n1", "--gpu", "x", "--reason", "r", "--ledger", "l.json"], "--gpu: not a GPU"),
        (["add", "n1", "--reason", "r", "--cooldown", "5x", "--ledger", "l.json"],
         "--cooldown: not a duration (got '5x')"),
        (["clear", "--ledger", "l.json"], "quarantine clear: give a host or --all"),
        (["clear", "n1", "--all", "--ledger", "l.json"], "quarantine clear: give a host or --all"),
        (["list", "--verbose", "--ledger", "l.json"], "quarantine: unknown flag"),
        (["list", "--ledger"], "--ledger: needs a value"),
        (["list", "quarantine.cooldown=soon"], "quarantine.cooldown: not a duration"),
        (["list", "nothere.yaml"], "job: no such file"),
        (["add", "n1", "--reason", "r", "--ledger", "no/such/dir/l.json"], "cannot be changed"),
        (["list", "--ledger", "."], "--ledger: is a directory (got '.')"),
        (["list", "--ledger", ""], "--ledger: is a directory (got '')"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], error: str) -> None:
    result = run("quarantine", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("elastic-hydra: error: ")
    assert error in result.stderr
