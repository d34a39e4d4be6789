"""The `elastic-hydra` command line: argv sugar, script args byte for byte, --plan, completion."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from elastic_hydra.cli.run import main
from elastic_hydra.config.composed import composed_job
from elastic_hydra.plan import Action, LaunchPlan, NodeRange, PythonScript
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.resolve.entry import BOOTSTRAP
from elastic_hydra.resolve.resolver import resolve_config
from tests.conftest import REPO
from tests.harness import ELASTIC_HYDRA, compose, invocation, launcher_env, resolved, run

TIMEOUT = 60
JOB = "defaults: [elastic_hydra_base, _self_]\nscript: train.py\nhp:\n  learning_rate: 0.1\n"

TRICKY_ARGS = [
    "--lr",
    "1e-3",
    "--epochs=3",
    "--name",
    "a b, c=d",
    "--tpl",
    "${oc.env:HOME}",
    "it's",
    "back\\slash\\",
    "--flag",
    "true",
    "-x",
    "--",
    "007",
    "NaN",
    "",
]

OK = RunSummary(status=RunStatus.SUCCEEDED, exit_code=0)  # what a stubbed agent reports


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd with train.py and jobs/x.yaml; no COMP_LINE or full-error switch leaking in."""
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.yaml").write_text(JOB)
    for name in ("COMP_LINE", "COMP_POINT", "ELASTIC_HYDRA_FULL_ERROR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------------ parse_argv
def test_script_args_are_kept_apart_and_survive_byte_for_byte(workdir: Path) -> None:
    inv = invocation("script=train.py", "nproc_per_node=1", "--", *TRICKY_ARGS)
    assert inv.flags == ()
    assert inv.overrides == ("script=train.py", "nproc_per_node=1")
    assert inv.script_args == tuple(TRICKY_ARGS)
    cfg = compose("script=train.py", "nproc_per_node=1", "--", *TRICKY_ARGS)
    assert resolved(cfg)["args"] == TRICKY_ARGS
    plan = resolve_config(composed_job(cfg))
    assert isinstance(plan.entrypoint, PythonScript)
    assert plan.entrypoint.args == tuple(TRICKY_ARGS)
    assert plan.argv[-len(TRICKY_ARGS) :] == tuple(TRICKY_ARGS)


@pytest.mark.parametrize(
    "arg",
    [
        pytest.param("\\${x}", id="backslash-before-interpolation"),
        pytest.param("a\\${oc.env:HOME}", id="backslash-before-env-resolver"),
    ],
)
def test_backslash_before_interpolation_survives(workdir: Path, arg: str) -> None:
    cfg = compose("script=train.py", "--", arg)
    assert resolved(cfg)["args"] == [arg]


def test_no_double_dash_means_no_script_args() -> None:
    inv = invocation("script=train.py", "nnodes=1")
    assert inv.overrides == ("script=train.py", "nnodes=1")
    assert inv.script_args is None


def test_empty_tail_gives_empty_args(workdir: Path) -> None:
    assert invocation("script=train.py", "--").script_args == ()
    assert list(compose("script=train.py", "--").args) == []


def test_double_dash_appends_to_the_job_files_args(workdir: Path) -> None:
    # A job file's args are its defaults: the words after -- come after them (they used to
    # replace them silently, and examples/jobs/ddp.yaml then failed without --steps/--ckpt).
    (workdir / "jobs" / "a.yaml").write_text(JOB + "args: [--steps, '${hp.learning_rate}']\n")
    cfg = compose("jobs/a.yaml", "--", "--lr", "${x}")
    assert resolved(cfg)["args"] == [
        "--steps", "0.1", "--lr", "${x}",
    ]  # fmt: skip
    assert list(compose("jobs/a.yaml", "args=[--only]").args) == ["--only"]  # args= replaces
    proc = run("jobs/a.yaml", "--plan", "--", "--lr", "1", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "--steps 0.1 --lr 1" in proc.stdout
    assert "after --" in proc.stdout and "args=[...]" in proc.stdout


def test_flags_after_overrides_are_hoisted() -> None:
    inv = invocation("script=t.py", "-m", "nproc_per_node=1,2")
    assert inv.multirun
    assert inv.hydra_argv == ["-m", "script=t.py", "nproc_per_node=1,2"]
    assert inv.plan is None


def test_flag_value_travels_with_its_flag() -> None:
    inv = invocation("script=t.py", "--cfg", "job", "nnodes=1")
    assert inv.hydra_argv == ["--cfg", "job", "script=t.py", "nnodes=1"]


def test_plan_flag_is_ours_not_hydras() -> None:
    assert invocation("script=t.py", "--plan").plan == "text"
    assert invocation("script=t.py", "--plan=json").plan == "json"
    assert "--plan" not in invocation("script=t.py", "--plan").hydra_argv


def test_job_path_becomes_config_dir_and_name(workdir: Path) -> None:
    inv = invocation("jobs/x.yaml", "nproc_per_node=2")
    assert inv.job == Path("jobs/x.yaml")
    assert inv.flags == ("--config-dir", str(workdir / "jobs"), "--config-name", "x")
    assert inv.overrides == ("nproc_per_node=2",)
    cfg = compose("jobs/x.yaml", "nproc_per_node=2")
    assert cfg.script == "train.py" and cfg.hp.learning_rate == 0.1 and cfg.nproc_per_node == 2


def test_version_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("elastic-hydra 0.1.0")


# ---------------------------------------------------------------------------- the real command
def test_help_mentions_plan_presets_and_examples(workdir: Path) -> None:
    proc = run("--help", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "--plan" in out
    assert (
        "rdzv: auto, c10d, dstack, etcd, etcd-v2, jobset, kubeflow, skypilot, slurm, standalone,"
        " static"
    ) in out
    assert "restart: backoff, never, on_failure" in out
    assert "logs: files_only, quiet, tee" in out
    assert "Examples:" in out and "elastic-hydra script=train.py" in out
    assert "70 a bug in elastic-hydra" in out  # every exit code is listed


def test_cfg_job_prints_composed_yaml(workdir: Path) -> None:
    proc = run("script=t.py", "--cfg", "job", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "script: t.py" in proc.stdout.splitlines()
    assert "max_restarts: 0" in proc.stdout


def test_plan_prints_command_and_creates_nothing(workdir: Path) -> None:
    before = sorted(p.name for p in workdir.iterdir())
    proc = run("script=train.py", "nproc_per_node=2", "--plan", "--", "--lr", "0.1", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    # The exact worker command, the traceback-recording bootstrap included.
    worker = [sys.executable, "-u", BOOTSTRAP, str(workdir / "train.py"), "--lr", "0.1"]
    command = shlex.join(worker)
    assert command in proc.stdout
    assert "standalone" in proc.stdout
    assert "world size 2" in proc.stdout
    assert sorted(p.name for p in workdir.iterdir()) == before


@pytest.mark.parametrize("command", [["--plan"], ["--plan=json"], ["--plan=yaml"], ["report"]])
def test_a_reader_that_left_ends_the_output_quietly(workdir: Path, command: list[str]) -> None:
    """`--plan | head`: the reader is gone before the first write; no error line, SIGPIPE's code."""
    read, write = os.pipe()
    os.close(read)
    words = ["--nproc-per-node=2", "train.py"] if command[0].startswith("--plan") else []
    if command == ["report"]:
        assert run("script=train.py", cwd=workdir).returncode == 0
    try:
        proc = subprocess.run(
            [*ELASTIC_HYDRA, *command, *words],
            cwd=workdir,
            env=launcher_env(),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.returncode == 128 + signal.SIGPIPE
    assert "error" not in proc.stderr.lower() and "Traceback" not in proc.stderr, proc.stderr


def test_plan_for_a_job_file_in_another_directory(tmp_path: Path) -> None:
    jobs = tmp_path / "elsewhere" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "pretrain.yaml").write_text(JOB + "nproc_per_node: 3\n")
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "train.py").write_text("print('train')\n")
    for job in (str(jobs / "pretrain.yaml"), "../elsewhere/jobs/pretrain.yaml"):
        proc = run(job, "--plan", cwd=cwd)
        assert proc.returncode == 0, proc.stderr
        assert str(cwd / "train.py") in proc.stdout
        assert "world size 3" in proc.stdout
    assert sorted(p.name for p in cwd.iterdir()) == ["train.py"]


def test_bad_config_from_the_shell_is_one_line(workdir: Path) -> None:
    proc = run("script=train.py", "nnodes=0", "--plan", cwd=workdir)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "elastic-hydra: error: nnodes: needs at least 1 node (got 0); expected N or MIN:MAX "
        "with 1 <= MIN <= MAX, e.g. nnodes=2 or nnodes=2:4."
    ]


# ----------------------------------------------------------------------------- one composition
def test_a_plain_run_composes_once_and_saves_what_hydra_saves(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    from elastic_hydra.launch import wiring

    modes: list[RunMode | None] = []
    compose_config = Hydra.compose_config

    def counting(self: Hydra, *args: Any, **kwargs: Any) -> Any:
        modes.append(kwargs.get("run_mode", args[2] if len(args) > 2 else None))
        return compose_config(self, *args, **kwargs)

    plans: list[LaunchPlan] = []

    def recording(plan: LaunchPlan) -> tuple[int, RunSummary]:
        plans.append(plan)
        return 0, OK

    monkeypatch.setattr(Hydra, "compose_config", counting)
    monkeypatch.setattr(wiring, "run", recording)
    with pytest.raises(SystemExit) as exit_info:
        main(["jobs/x.yaml", "nproc_per_node=2"])
    assert exit_info.value.code == 0
    assert modes == [RunMode.RUN]
    (plan,) = plans
    assert plan.nproc_per_node == 2
    saved = Path(plan.run_dir) / ".hydra"
    assert OmegaConf.load(saved / "overrides.yaml") == ["nproc_per_node=2"]
    assert OmegaConf.load(saved / "config.yaml").hp.learning_rate == 0.1
    hc = OmegaConf.load(saved / "hydra.yaml").hydra
    assert hc.mode == "RUN" and list(hc.overrides.hydra) == ["hydra.mode=RUN"]
    assert (hc.job.name, hc.job.config_name) == ("elastic-hydra", "x")
    assert hc.runtime.output_dir == plan.run_dir


def test_outside_the_supported_hydra_range_hydra_main_runs_the_same_job(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from elastic_hydra.config import boundary
    from elastic_hydra.launch import wiring

    assert boundary.internals_supported("1.3.2") and boundary.internals_supported()
    assert not boundary.internals_supported("1.4.0")
    assert not boundary.internals_supported("1.3.1")
    plans: list[LaunchPlan] = []

    def recording(plan: LaunchPlan) -> tuple[int, RunSummary]:
        plans.append(plan)
        return 0, OK

    monkeypatch.setattr(wiring, "run", recording)
    argv = ["jobs/x.yaml", "nproc_per_node=2", "--", "--lr", "1"]
    for supported in (True, False):
        monkeypatch.setattr(boundary, "internals_supported", lambda s=supported: s)
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
    fast, fallback = plans
    assert fast.run_dir != fallback.run_dir
    assert replace(fast, run_dir="", launch_time=None) == replace(
        fallback, run_dir="", run_id=fast.run_id, launch_time=None
    )
    assert fast.argv[-2:] == ("--lr", "1")


def test_no_hydra_state_is_left_behind(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra._internal import utils as hydra_utils

    from elastic_hydra.launch import wiring

    report = hydra_utils.run_and_report
    argv = list(sys.argv)
    monkeypatch.setattr(wiring, "run", lambda plan: (0, OK))
    for args in (["jobs/x.yaml"], ["-m", "jobs/x.yaml", "env.X=1,2"], ["jobs/x.yaml", "x=1"]):
        with pytest.raises(SystemExit):
            main(args)
        assert hydra_utils.run_and_report is report and sys.argv == argv


def test_importing_the_cli_registers_nothing() -> None:
    probe = (
        "import elastic_hydra.cli.run\n"
        "from omegaconf import OmegaConf\n"
        "print(OmegaConf.has_resolver('eh.host'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=TIMEOUT, check=True
    )
    assert proc.stdout.strip() == "False"


def test_a_job_that_sets_multirun_mode_sweeps_without_dash_m(workdir: Path) -> None:
    (workdir / "jobs" / "sweep.yaml").write_text(JOB + "hydra:\n  mode: MULTIRUN\n")
    proc = run("jobs/sweep.yaml", "env.X=1,2", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert len([line for line in proc.stdout.splitlines() if "env.X=" in line]) == 2
    assert len(list((workdir / "eh_logs" / "multirun").rglob("summary.json"))) == 2


def test_a_sweep_without_multirun_is_one_line_and_creates_nothing(workdir: Path) -> None:
    proc = run("jobs/x.yaml", "env.X=1,2", cwd=workdir)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert "env.X=1,2" in line and "--multirun" in line
    assert not (workdir / "eh_logs").exists()


LEAVE = """
import logging, logging.handlers, sys
from elastic_hydra.cli import entry
# A buffering handler that writes only when flushed: what the exit must not lose.
target = logging.FileHandler(sys.argv[1])
logging.getLogger().addHandler(logging.handlers.MemoryHandler(1000, target=target))
logging.getLogger().warning("kept at exit")
print("buffered on a pipe", end="")
entry._leave(SystemExit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2]))
"""


@pytest.mark.parametrize(("code", "expected"), [("3", 3), ("0", 0), ("bye", 1)])
def test_the_exit_skips_teardown_but_flushes_logs_and_streams(
    tmp_path: Path, code: str, expected: int
) -> None:
    log = tmp_path / "launcher.log"
    proc = subprocess.run(
        [sys.executable, "-c", LEAVE, str(log), code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == expected, proc.stderr
    assert proc.stdout == "buffered on a pipe"
    assert log.read_text() == "kept at exit\n"
    assert proc.stderr == ("bye\n" if code == "bye" else "")


# ------------------------------------------------------------------------------------ completion
def complete(line: str, cwd: Path) -> list[str]:
    # What Hydra's bash function does: COMP_LINE/COMP_POINT set, then `<app> -sc query=bash`.
    env = {"COMP_LINE": line, "COMP_POINT": str(len(line))}
    proc = run("-sc", "query=bash", cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_completion_offers_presets(workdir: Path) -> None:
    offered = complete("elastic-hydra rdzv=", workdir)
    assert "rdzv=c10d" in offered
    assert {"rdzv=standalone", "rdzv=static", "rdzv=etcd-v2"} <= set(offered)


def test_completion_with_a_job_file(workdir: Path) -> None:
    assert complete("elastic-hydra jobs/x.yaml nproc", workdir) == ["nproc_per_node="]


def test_completion_sees_keys_only_the_job_file_has(workdir: Path) -> None:
    assert "hp.learning_rate=" in complete("elastic-hydra jobs/x.yaml hp.", workdir)


# -------------------------------------------------------------------------------------- examples
EXAMPLE_JOBS = sorted((REPO / "examples" / "jobs").glob("*.yaml"))


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLE_JOBS} >= {"hello.yaml", "resilient.yaml"}


@pytest.mark.parametrize("job", EXAMPLE_JOBS, ids=lambda p: p.name)
def test_example_job_plans(job: Path) -> None:
    before = sorted(p.name for p in REPO.iterdir())
    proc = run(str(job.relative_to(REPO)), "--plan", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    script = OmegaConf.load(job).script  # relative to the repository root, the cwd here
    assert (REPO / script).is_file()
    assert str(REPO / script) in proc.stdout
    assert sorted(p.name for p in REPO.iterdir()) == before


def test_resilient_example_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    cfg = compose("examples/jobs/resilient.yaml", "hp.greeting=bonjour")
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    assert container["nnodes"] == "1"  # quoted in the file: a string, not YAML's integer
    plan = resolve_config(composed_job(cfg))
    assert plan.argv[-2:] == ("--greeting", "bonjour")
    assert plan.nnodes == NodeRange(min=1, max=1) and plan.nproc_per_node == 2
    assert plan.restart.max_restarts == 3
    assert plan.restart.backoff.initial == 0.5 and plan.restart.backoff.jitter == 0.1  # preset
    assert plan.restart.window is not None  # from the backoff preset
    assert plan.restart.on_exit_code == ((3, Action.FAIL),)
    assert plan.restart.on_signal == ((int(signal.SIGKILL), Action.FAIL),)
    assert plan.logs.console_ranks == frozenset({0})
    assert dict(plan.env) == {"HELLO_STYLE": "friendly", "OMP_NUM_THREADS": "1"}


def test_hello_worker_runs_alone(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "hello.py"), "--greeting", "hi there"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "hello from rank 3/4 (local 1) on " in proc.stdout
    assert "['--greeting', 'hi there']" in proc.stdout


def test_a_launcher_bug_prints_its_traceback_and_asks_for_a_report(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from elastic_hydra.launch import wiring

    def broken(plan: object) -> tuple[int, RunSummary]:
        raise RuntimeError("bug in the agent")

    monkeypatch.setattr(wiring, "run", broken)
    with pytest.raises(SystemExit) as exit_info:
        main(["script=train.py", f"logs.root={workdir}/logs"])
    assert exit_info.value.code == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: bug in the agent" in err
    assert err.rstrip().endswith("please report it with the traceback above.")


def test_plan_warns_of_an_elastic_job_whose_store_dies_with_a_node(workdir: Path) -> None:
    shared = ("rdzv=c10d", "rdzv.endpoint=node0:29400", "rdzv.id=job7", "script=train.py")
    risky = run("nnodes=2:4", *shared, "--plan", cwd=workdir)
    assert risky.returncode == 0, risky.stderr
    (note,) = [ln for ln in risky.stdout.splitlines() if ln.startswith("note: nnodes=2:4")]
    assert "losing the node that hosts it ends the job" in note and "rdzv-server" in note
    for safe in (["nnodes=2:4", "rdzv.is_host=false"], ["nnodes=2"]):
        proc = run(*safe, *shared, "--plan", cwd=workdir)
        assert proc.returncode == 0 and "note: nnodes" not in proc.stdout, proc.stderr


# ------------------------------------------------------------------------------ torch not installed
# The command run in a Python where torch cannot be imported (a finder first on sys.meta_path
# refuses it), whatever this test environment has installed.
WITHOUT_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
sys.argv[0] = "elastic-hydra"
from elastic_hydra.cli.entry import main
main()
"""


@pytest.mark.parametrize("plan", [[], ["--plan"]], ids=["launch", "plan"])
def test_a_torch_backend_without_torch_is_one_line_and_creates_nothing(
    workdir: Path, plan: list[str]
) -> None:
    from elastic_hydra.errors import TORCH_INSTALL

    logs = workdir / "logs"
    args = ["script=train.py", "rdzv=c10d", f"logs.root={logs}", *plan]
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *args],
        cwd=workdir,
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()  # no Hydra "Error executing job" line before it
    assert line.startswith("elastic-hydra: error: rdzv.backend: needs PyTorch"), line
    assert f"`{TORCH_INSTALL}`" in line and "rdzv=standalone" in line
    assert not logs.exists(), sorted(logs.rglob("*"))  # resolution refused it: no run dir
    assert proc.stdout == ""


# ------------------------------------------------------------------------ --plan of a sweep
SWEPT = JOB + (
    "args: [--lr, '${hp.learning_rate}', --ckpt, runs/ckpt.pt,"
    " '--log=logs/${hp.learning_rate}.txt']\n"
)


def test_plan_of_a_sweep_says_which_paths_every_job_shares(workdir: Path) -> None:
    (workdir / "jobs" / "swept.yaml").write_text(SWEPT)
    before = sorted(p.name for p in workdir.iterdir())
    proc = run("-m", "jobs/swept.yaml", "hp.learning_rate=0.1,0.01", "--plan", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    jobs = [ln for ln in lines if ln.startswith("  #")]
    assert jobs == [
        "  #0 hp.learning_rate=0.1: args --lr 0.1 --ckpt runs/ckpt.pt --log=logs/0.1.txt",
        "  #1 hp.learning_rate=0.01: args --lr 0.01 --ckpt runs/ckpt.pt --log=logs/0.01.txt",
    ]
    (note,) = [ln for ln in lines if ln.startswith("note: every job of this sweep")]
    assert "same path(s) in args: runs/ckpt.pt;" in note  # the log path varies: not named
    assert "$ELASTIC_HYDRA_RUN_DIR" in note
    assert sorted(p.name for p in workdir.iterdir()) == before  # nothing created

    as_json = run("-m", "jobs/swept.yaml", "hp.learning_rate=0.1,0.01", "--plan=json", cwd=workdir)
    assert as_json.returncode == 0, as_json.stderr
    jobs_json = json.loads(as_json.stdout)
    assert [j["overrides"] for j in jobs_json] == [
        ["hp.learning_rate=0.1"], ["hp.learning_rate=0.01"]
    ]  # fmt: skip
    dirs = [Path(j["plan"]["run_dir"]) for j in jobs_json]
    assert [d.name for d in dirs] == ["0", "1"] and dirs[0].parent == dirs[1].parent


def test_plan_of_a_sweep_whose_paths_vary_has_no_note(workdir: Path) -> None:
    (workdir / "jobs" / "own.yaml").write_text(
        JOB + "args: [--ckpt, 'runs/${hp.learning_rate}/ckpt.pt', --data, data]\n"
    )
    proc = run("-m", "jobs/own.yaml", "hp.learning_rate=0.1,0.01", "--plan", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "every job of this sweep" not in proc.stdout
    assert len([ln for ln in proc.stdout.splitlines() if ln.startswith("  #")]) == 2


def test_a_bad_job_of_a_sweep_plan_is_one_line_naming_the_job(workdir: Path) -> None:
    proc = run("-m", "script=train.py", "nproc_per_node=1,0", "--plan", cwd=workdir)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("elastic-hydra: error: nproc_per_node:"), line
    assert line.endswith("(in sweep job #1: script=train.py nproc_per_node=0)"), line


@pytest.mark.parametrize(
    ("jobs", "shared"),
    [
        ([["--ckpt", "runs/c.pt", "--lr", "0.1"], ["--ckpt", "runs/c.pt", "--lr", "0.2"]],
         ["runs/c.pt"]),
        ([["--out=w.pt", "--lr=0.1"], ["--out=w.pt", "--lr=0.2"]], ["w.pt"]),
        ([["--ckpt", "a/c.pt"], ["--ckpt", "b/c.pt"]], []),
        ([["--ckpt", "$ELASTIC_HYDRA_RUN_DIR/c.pt"]] * 2, []),  # the worker expands it per job
        ([["--url", "https://x/y", "--name", "a b", "--lr", "1e-3"]] * 2, []),
        ([["--ckpt", "runs/c.pt"]], []),  # one job shares with nobody
    ],
)  # fmt: skip
def test_shared_paths_are_path_looking_args_that_every_job_passes(
    jobs: list[list[str]], shared: list[str]
) -> None:
    from elastic_hydra.cli.plan import shared_paths

    assert shared_paths(jobs) == shared


# --------------------------------------------------------------------------- a key without =
@pytest.mark.parametrize("before", [[], ["script=train.py"], ["jobs/x.yaml"]])
@pytest.mark.parametrize("word", ["env.BAR", "+hp.lr", "nproc_per_node", "rdzv.endpoint"])
def test_a_key_without_a_value_is_one_line_naming_it(
    workdir: Path, word: str, before: list[str]
) -> None:
    proc = run(*before, word, "--plan", cwd=workdir)
    assert proc.returncode == 2
    name = word.lstrip("+")
    assert proc.stderr.splitlines() == [
        f"elastic-hydra: error: {name}: a key without a value (got {word!r}); expected "
        f"{name}=VALUE. A script's own arguments go after --."
    ]


def test_a_script_named_like_a_key_is_still_a_script(workdir: Path) -> None:
    (workdir / "hp.tool").write_text("print('tool')\n")  # a file: the script, not a key
    assert "script='hp.tool'" in invocation("--nproc-per-node=2", "hp.tool").overrides
    assert "script='env.py'" in invocation("--nproc-per-node=2", "env.py").overrides
    assert invocation("-m", "env.mod").torchrun  # torchrun's -m: a module's name
    assert invocation("--module", "env.mod").torchrun
