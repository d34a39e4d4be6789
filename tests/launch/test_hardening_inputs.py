"""Hardening of the front end: no user directory deleted, private run dirs, no secret on disk,
the world's faults and hostile input each as one line (never exit 70), nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from elastic_hydra.agent.events import WorkersStarted
from elastic_hydra.config.composed import config_hash
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.report import events_file, summary
from elastic_hydra.report.events_file import read_events
from elastic_hydra.rundir import RunDir, reserve, room, write_kept
from tests.conftest import ELASTIC_HYDRA, WORKERS, tmpfs, wait_for
from tests.harness import run, run_raw

TIMEOUT = 60
BASE = "defaults: [elastic_hydra_base, _self_]\nscript: x.py\n"


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("elastic-hydra: error: "), line
    return line


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "x.py").write_text("print('hello')\n")
    return tmp_path


# ------------------------------------------------------------------------------------ data loss
def test_a_config_error_never_removes_the_working_directory_or_its_parents(work: Path) -> None:
    empty = work / "proj" / "empty"
    empty.mkdir(parents=True)  # proj/ holds nothing but the empty working directory
    proc = run("script=../../x.py", "nnodes=0", cwd=empty)
    assert "nnodes" in one_error_line(proc)
    assert empty.is_dir() and (work / "proj").is_dir()


def test_a_config_error_keeps_a_pre_created_logs_root_parent(work: Path) -> None:
    (work / "keep" / "runs").mkdir(parents=True)
    proc = run("script=x.py", f"logs.root={work}/keep/runs/exp1", "nproc_per_node=0", cwd=work)
    assert "nproc_per_node" in one_error_line(proc)
    assert (work / "keep" / "runs").is_dir()
    assert not (work / "keep" / "runs" / "exp1").exists()


@pytest.mark.parametrize(
    ("job", "args"),
    [
        (BASE, ["nnodes=0"]),
        (BASE, ["stop_grace=nan"]),
        ("script: x.py\n", []),  # no elastic_hydra_base: Hydra's own outputs/ must not appear
        (BASE + "nproc_per_nod: 2\n", []),
    ],
)
def test_a_failed_launch_leaves_the_tree_as_it_found_it(
    work: Path, job: str, args: list[str]
) -> None:
    (work / "job.yaml").write_text(job)
    before = tree(work)
    proc = run("job.yaml", *args, cwd=work)
    assert proc.returncode == 2, proc.stderr
    assert tree(work) == before


def test_discard_removes_only_what_the_launch_made_and_never_above_logs_root(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "a" / "b" / "logs"
    run = RunDir.create(logs / "day" / "run", logs_root=logs)
    assert run.created == (tmp_path / "a", tmp_path / "a" / "b", logs, logs / "day", run.root)
    (run.root / "plan.json").write_text("{}")
    run.discard()
    assert not logs.exists()
    assert (tmp_path / "a" / "b").is_dir()  # made by this launch, but above logs.root

    keep = RunDir.create(logs / "day" / "run", logs_root=logs)
    (logs / "day" / "users_notes.txt").write_text("mine")
    (keep.root / "users_file").write_text("mine too")
    keep.discard()
    assert (keep.root / "users_file").read_text() == "mine too"
    assert (logs / "day" / "users_notes.txt").exists()


def test_discard_of_an_existing_directory_removes_nothing_of_the_users(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    run = RunDir.create(tmp_path / "mine", logs_root=tmp_path)
    assert run.created == ()
    run.discard()
    assert (tmp_path / "mine").is_dir()


# ------------------------------------------------------------------------ privacy and secrets
def test_run_dirs_are_private_and_no_secret_value_reaches_a_file(work: Path) -> None:
    (work / "job.yaml").write_text(BASE + "env:\n  DB_PASSWORD: hunter2-in-yaml\n")
    proc = run(
        "job.yaml",
        "env.WANDB_API_KEY=s3cr3t-wandb",
        "+hp.hf_token=s3cr3t-hf",
        cwd=work,
        env={"OPENAI_API_KEY": "s3cr3t-inherited"},
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (work / "eh_logs").glob("*/*")
    files = [p for p in (work / "eh_logs").rglob("*") if p.is_file()]
    names = {str(p.relative_to(run_dir)) for p in files}
    assert {"plan.json", "config.yaml", "summary.json", "result.json", "events.jsonl"} <= names
    assert {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"} <= names
    for path in files:
        text = path.read_text()
        for secret in ("s3cr3t", "hunter2"):
            assert secret not in text, f"{secret} in {path}"
    dirs = [work / "eh_logs", *(p for p in (work / "eh_logs").rglob("*") if p.is_dir())]
    for d in dirs:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    plan = json.loads((run_dir / "plan.json").read_text())
    assert ["WANDB_API_KEY", "<redacted>"] in plan["env"]


def test_an_inherited_secret_reaches_the_worker_and_no_file(work: Path) -> None:
    out = work / "dump"
    proc = run(
        f"script={WORKERS / 'dump_env.py'}", "--", str(out), cwd=work, env={"HF_TOKEN": "tok-777"}
    )
    assert proc.returncode == 0, proc.stderr
    (dump,) = out.glob("env_*.json")
    assert json.loads(dump.read_text())["env"]["HF_TOKEN"] == "tok-777"
    for path in (work / "eh_logs").rglob("*"):
        assert not path.is_file() or "tok-777" not in path.read_text(), path


# --------------------------------------------------------------------------- the world's faults
def test_a_logs_root_that_cannot_be_made_is_one_line_before_anything_starts(work: Path) -> None:
    line = one_error_line(run("script=x.py", "logs.root=/etc/passwd/x", cwd=work))
    assert "logs.root" in line and "Not a directory" in line
    assert "hello" not in line


@pytest.mark.parametrize("sweep", [False, True])
def test_an_empty_logs_root_is_one_line_and_nothing_lands_in_the_root_dir(
    work: Path, sweep: bool
) -> None:
    # `${logs.root}/<date>/...` with an empty root is a path under /: run or sweep dir alike.
    before = set(Path("/").iterdir())
    line = one_error_line(run(*(["-m"] if sweep else []), "script=x.py", "logs.root=", cwd=work))
    assert line == (
        "elastic-hydra: error: logs.root: is empty (got ''); expected a directory, e.g. "
        "logs.root=eh_logs."
    )
    assert set(Path("/").iterdir()) == before
    assert tree(work) == {"x.py"}


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        yield ro


def test_a_read_only_logs_root_is_one_line(work: Path, read_only_dir: Path) -> None:
    line = one_error_line(run("script=x.py", f"logs.root={read_only_dir}/runs", cwd=work))
    assert "logs.root" in line and "Read-only file system" in line


def test_a_run_dir_removed_mid_run_keeps_the_jobs_exit_code(work: Path) -> None:
    go = work / "go"
    proc = subprocess.Popen(
        [*ELASTIC_HYDRA, f"script={WORKERS / 'wait_file.py'}", "--", "tok", str(go)],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def started() -> bool:
            return any(
                "tok rank 0" in p.read_text() for p in (work / "eh_logs").rglob("stdout.log")
            )

        wait_for(started, 20, "the worker's first line")

        def removed() -> bool:  # the agent may write a file in it meanwhile (its status)
            shutil.rmtree(work / "eh_logs", ignore_errors=True)
            return not (work / "eh_logs").exists()

        wait_for(removed, 10, "the run dir to be removed")
        go.touch()
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert "warning: cannot write" in err and "summary follows" in err
    assert '"status": "succeeded"' in err  # the summary, on stderr instead
    assert "Traceback" not in err


def test_the_room_kept_for_a_file_takes_it_when_the_disk_is_full(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=256k") as disk:
        kept, unkept = disk / "kept.json", disk / "unkept.json"
        assert reserve(kept, 8192)
        fill = disk / "fill"
        fd = os.open(fill, os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        with pytest.raises(OSError, match="No space left on device"):
            write_kept(unkept, "{}")  # no room was kept for it
        whole, short = "x" * 10_000, "short\n"
        assert write_kept(kept, whole, [whole, short])  # the first that fits the room: 8192 B
        assert kept.read_text() == short
        assert not room(kept).exists()
        fill.unlink()
        assert not write_kept(kept, whole)  # room enough: written the usual way
        assert kept.read_text() == whole


def test_a_timeline_cut_by_a_full_disk_is_named_in_the_summary(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        run = RunDir(disk)
        run.reserve_end(summary.SUMMARY_ROOM // 4, summary.RESULT_ROOM)
        events = events_file.EventLog(run.events)
        fill = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while True:
                os.write(fill, b"\0" * 4096)
        os.close(fill)
        for n in range(200):  # past the last page events.jsonl has
            events.emit(WorkersStarted(wall_time=1.0, mono_time=1.0, pids=(n,), attempt=n))
        events.close()
        ok = RunSummary(status=RunStatus.SUCCEEDED, exit_code=0, message="all workers exited")
        saved = summary.save_summary(run, ok, events_file.disk_full(events))
        assert saved.message == (
            "all workers exited; no space left on device in the run dir: events.jsonl stops "
            "early, summary.json written in the room kept for it"
        )
        assert json.loads(run.summary.read_text())["message"] == saved.message


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "override",
    [
        "stop_grace=nan",
        "stop_grace=inf",
        "rdzv.join_timeout=nan",
        "rdzv.join_timeout=inf",
        "restart.backoff.initial=inf",
        "restart.backoff.jitter=nan",
        "monitor_interval=-inf",
    ],
)
def test_every_float_key_refuses_nan_and_infinity(work: Path, override: str) -> None:
    line = one_error_line(run("script=x.py", override, "--plan", cwd=work))
    assert f"{override.split('=', maxsplit=1)[0]}: is not a finite number" in line


def test_a_huge_worker_count_is_refused_before_any_fork(work: Path) -> None:
    line = one_error_line(run("script=x.py", "nproc_per_node=100000", cwd=work))
    assert "nproc_per_node: more than 1024 workers" in line
    assert not (work / "eh_logs").exists()


def test_the_worker_count_is_checked_against_the_process_limit() -> None:
    from elastic_hydra.errors import ConfigError
    from elastic_hydra.resolve.resolver import Host, _check_process_room

    host = Host(cwd="/", environ={}, machine=None, process_room=lambda: 12)  # type: ignore[arg-type]
    _check_process_room(12, 12, host)
    with pytest.raises(ConfigError, match="can start only 12 more processes"):
        _check_process_room(13, 13, host)


def test_a_billion_laughs_job_file_fails_at_once(work: Path) -> None:
    lines = [BASE.rstrip(), "hp:", '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"  {name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    (work / "bomb.yaml").write_text("\n".join(lines) + "\n")
    assert (work / "bomb.yaml").stat().st_size < 1000
    started = time.monotonic()
    line = one_error_line(run("bomb.yaml", cwd=work))
    assert time.monotonic() - started < 20
    assert "YAML nodes through its aliases" in line


def test_a_job_file_that_is_not_utf8_is_one_line(work: Path) -> None:
    (work / "bad.yaml").write_bytes(BASE.encode() + b"env:\n  A: '\xff\xfe'\n")
    line = one_error_line(run("bad.yaml", cwd=work))
    assert "not UTF-8" in line and "0xff" in line


@pytest.mark.parametrize("code", [0, 1])
def test_arguments_that_are_not_utf8_reach_the_script_and_every_file(work: Path, code: int) -> None:
    arg, out = os.fsdecode(b"\xff\xfe"), work / "argv.bin"  # what Python makes of the bytes
    proc = run_raw(f"script={WORKERS / 'argv_bytes.py'}", "--", str(out), str(code), arg, cwd=work)
    assert proc.returncode == code, proc.stderr.decode(errors="replace")
    assert out.read_bytes() == b"\xff\xfe"
    assert b"[default0]:\xff\xfe\n" in proc.stdout  # the console gets the bytes too
    (run_dir,) = (p.parent for p in (work / "eh_logs").rglob("plan.json"))
    run = RunDir(run_dir)
    args = [str(out), str(code), arg]
    assert json.loads(run.plan.read_text())["entrypoint"]["args"] == args  # lossless
    for saved in (run.config, run.saved_config):
        assert yaml.safe_load(saved.read_text())["args"] == args
    assert yaml.safe_load(run.saved_overrides.read_text()) is not None
    summary = json.loads(run.summary.read_text())
    assert summary["status"] == ("succeeded" if code == 0 else "failed")
    assert json.loads(run.result.read_text())["exit_code"] == code
    assert read_events(run.events).skipped() is None
    report = run_raw("report", str(run_dir), cwd=work)
    assert report.returncode == code, report.stderr.decode(errors="replace")
    plan = run_raw(f"script={WORKERS / 'argv_bytes.py'}", "--plan", "--", arg, cwd=work)
    assert plan.returncode == 0, plan.stderr.decode(errors="replace")
    assert b"\xff\xfe" in plan.stdout


def test_an_argument_omegaconf_would_refuse_reaches_the_script_and_the_saved_files(
    work: Path,
) -> None:
    # `${oops` is no interpolation: the words after -- are the script's, byte for byte. The saved
    # files once went through OmegaConf, which refused it (exit 2, a half-written .hydra/).
    out = work / "argv.bin"
    proc = run_raw(f"script={WORKERS / 'argv_bytes.py'}", "--", str(out), "0", "${oops", cwd=work)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert out.read_bytes() == b"${oops"
    (run_dir,) = (p.parent for p in (work / "eh_logs").rglob("plan.json"))
    run = RunDir(run_dir)
    assert yaml.safe_load(run.saved_overrides.read_text())[-4:] == ["--", str(out), "0", "${oops"]
    assert yaml.safe_load(run.config.read_text())["args"] == [str(out), "0", "${oops"]


def test_the_config_hash_takes_any_argument_and_keeps_utf8_digests() -> None:
    raw = {"args": [os.fsdecode(b"\xff\xfe")]}
    assert config_hash(raw) != config_hash({"args": [os.fsdecode(b"\xff\xfd")]})
    # The digest of a UTF-8 job is the one earlier releases computed: mixed nodes still agree.
    assert config_hash({"args": ["é"]}) == "4b5c2ad82e4e9a66"


@pytest.mark.parametrize(
    ("yaml_line", "key"),
    [
        ('role: "a\\nb"', "role"),
        ('role: "\\e]0;owned\\a"', "role"),
        (f"role: {'r' * 65}", "role"),
        ('logs:\n  prefix: "\\e[2J{rank}"', "logs.prefix"),
        ('logs:\n  prefix: "{role.__class__}"', "logs.prefix"),
        ('logs:\n  prefix: "{rank[0]}"', "logs.prefix"),
        ('logs:\n  prefix: "{rank:>100000}"', "logs.prefix"),
        ('logs:\n  prefix: "{rank!r}"', "logs.prefix"),
        ('logs:\n  prefix: "{}"', "logs.prefix"),
    ],
)
def test_role_and_prefix_refuse_escapes_attributes_and_huge_widths(
    work: Path, yaml_line: str, key: str
) -> None:
    (work / "job.yaml").write_text(BASE + yaml_line + "\n")
    line = one_error_line(run("job.yaml", "--plan", cwd=work))
    assert line.startswith(f"elastic-hydra: error: {key}: "), line
    assert "\x1b" not in line and "\x07" not in line


def test_a_reasonable_prefix_and_role_still_work(work: Path) -> None:
    proc = run("script=x.py", "role=trainer-1.a", "logs.prefix='<{role}:{rank:>3}> '", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "<trainer-1.a:  0> hello" in proc.stdout


def test_nothing_here_exits_70(work: Path) -> None:
    """The launcher's own crash code is for bugs: none of the cases above may produce it."""
    for args in (["logs.root=/proc/none/x"], ["stop_grace=nan"], ["nproc_per_node=5000"]):
        proc = run("script=x.py", *args, cwd=work)
        assert proc.returncode == 2 and "internal error" not in proc.stderr, (args, proc.stderr)
