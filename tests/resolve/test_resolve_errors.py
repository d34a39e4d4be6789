"""The config pipeline: every user mistake is exit 2 and one clean line; good inputs resolve.

The table calls `elastic_hydra.cli.run.main([... , "--plan"])` in-process, from a temporary
directory holding a real `train.py`, exactly as a user's shell would.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.cli.run import main
from elastic_hydra.config.composed import composed_job
from elastic_hydra.errors import EXIT_CONFIG, ConfigError
from elastic_hydra.plan import Command, Dynamic, NodeRange, PythonScript, Standalone, Static
from elastic_hydra.resolve.entry import BOOTSTRAP
from elastic_hydra.resolve.resolver import resolve_config
from tests.harness import compose, plan_of

REPO = Path(__file__).resolve().parents[2]
PREFIX = "elastic-hydra: error: "
BASE = "defaults: [elastic_hydra_base, _self_]\nscript: train.py\n"

# Job files some cases pass as their first argument (written into the temporary cwd).
JOB_FILES = {
    # YAML 1.1 reads an unquoted 2:4 as the base-60 integer 124.
    "unquoted_range.yaml": BASE + "nnodes: 2:4\n",
    "env_dash.yaml": BASE + 'env: {"A-B": "1"}\n',
    "env_nested.yaml": BASE + "env:\n  NCCL:\n    DEBUG: INFO\n",
    "broken.yaml": BASE + "nproc_per_node: [1, 2\n",
    "no_base.yaml": "script: train.py\n",
}


def case(
    id: str,
    argv: list[str],
    key: str,
    *fragments: str,
    xfail: str | None = None,
) -> Any:
    """One bad input: the argv before --plan, the key its error must name, and what else it says."""
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(argv, key, fragments, id=id, marks=marks)


T = "script=train.py"
C10D = [T, "rdzv=c10d"]
STATIC = [T, "rdzv=static"]

CASES = [
    # ------------------------------------------------------------------------------------ nnodes
    case("nnodes-zero", [T, "nnodes=0"], "nnodes", "needs at least 1 node", "got 0"),
    case("nnodes-min-above-max", [T, "nnodes=4:2"], "nnodes", "MIN is larger than MAX", "'4:2'"),
    case("nnodes-not-a-number", [T, "nnodes=abc"], "nnodes", "got 'abc'", "nnodes=2:4"),
    case("nnodes-three-parts", [T, "nnodes=1:2:3"], "nnodes", "got '1:2:3'", "MIN:MAX"),
    case("nnodes-absurd", [T, "nnodes=1:99999999999999999999"], "nnodes", "more than 65536"),
    case(
        "nnodes-yaml-base60",
        ["unquoted_range.yaml"],
        "nnodes",
        "got 124",
        'quote it: nnodes: "2:4"',
    ),
    case(
        "nnodes-yaml-base60-c10d",
        ["unquoted_range.yaml", "rdzv=c10d"],
        "nnodes",
        "got 124",
        'quote it: nnodes: "2:4"',
    ),
    # ---------------------------------------------------------------------------- nproc_per_node
    case("nproc-zero", [T, "nproc_per_node=0"], "nproc_per_node", "got 0", "positive integer"),
    case("nproc-negative", [T, "nproc_per_node=-1"], "nproc_per_node", "got -1"),
    case("nproc-fraction", [T, "nproc_per_node=1.5"], "nproc_per_node", "got 1.5"),
    case(
        "nproc-gpu-without-gpus",
        [T, "nproc_per_node=gpu"],
        "nproc_per_node",
        "no usable NVIDIA GPU",
        "nproc_per_node=cpu",
    ),
    case("nproc-bogus", [T, "nproc_per_node=lots"], "nproc_per_node", "got 'lots'", "gpu, cpu"),
    # -------------------------------------------------------------------------------- entrypoint
    case("script-missing", ["script=missing.py"], "script", "got 'missing.py'", "no such file"),
    case("script-is-directory", ["script=adir"], "script", "is a directory", "module=NAME"),
    case(
        "two-entrypoints",
        [T, "module=pkg.train"],
        "module",
        "more than one entrypoint",
        "script=train.py, module=pkg.train",
    ),
    case(
        "no-entrypoint",
        ["nproc_per_node=1"],
        "script",
        "no entrypoint given",
        "exactly one of script=train.py, module=pkg.train or cmd=./program",
    ),
    case("cmd-not-found", ["cmd=no-such-program-xyz"], "cmd", "got 'no-such-program-xyz'"),
    case("module-with-space", ["module=a b"], "module", "got 'a b'", "not a module name"),
    # -------------------------------------------------------------------------------- rendezvous
    case(
        "endpoint-too-many-colons",
        [*C10D, "rdzv.endpoint=host:29400:x"],
        "rdzv.endpoint",
        "got 'host:29400:x'",
        "[addr]:port",
    ),
    case(
        "endpoint-port-out-of-range",
        [*C10D, "rdzv.endpoint=host:70000"],
        "rdzv.endpoint",
        "got 'host:70000'",
        "1..65535",
    ),
    case("endpoint-empty-port", [*C10D, "rdzv.endpoint=host:"], "rdzv.endpoint", "no port"),
    case("endpoint-v6-empty-port", [*C10D, "rdzv.endpoint='[::1]:'"], "rdzv.endpoint", "no port"),
    case(
        "endpoint-empty-host",
        [*C10D, "rdzv.endpoint=:29400"],
        "rdzv.endpoint",
        "no host",
        "got ':29400'",
    ),
    case(
        "backend-unknown",
        [T, "rdzv.backend=zookeeper"],
        "rdzv.backend",
        "got 'zookeeper'",
        "standalone, static, c10d, etcd-v2, etcd",
    ),
    case(
        "preset-unknown",
        [T, "rdzv=zookeeper"],
        "rdzv",
        "got 'zookeeper'",
        "auto, c10d, dstack, etcd, etcd-v2, jobset, kubeflow, skypilot, slurm, standalone, static",
    ),
    case(
        "static-node-rank-too-big",
        [*STATIC, "nnodes=2", "node_rank=2", "master_addr=node0"],
        "node_rank",
        "got 2",
        "node_rank < 2",
    ),
    case(
        "static-without-master-addr",
        [*STATIC, "nnodes=2"],
        "master_addr",
        "required",
        "master_addr=node0",
    ),
    case(
        "static-elastic",
        [*STATIC, "nnodes=2:4"],
        "nnodes",
        "static rendezvous cannot be elastic",
        "rdzv=c10d",
    ),
    case("static-master-port-zero", [*STATIC, "master_port=0"], "master_port", "got 0", "1..65535"),
    # Keys only rdzv=static reads were ignored without a word by the other backends.
    case(
        "standalone-master-port",
        [T, "master_port=29501"],
        "master_port",
        "not used by rdzv=standalone (it picks a free port)",
        "rdzv=static",
    ),
    case("standalone-master-addr", [T, "master_addr=node0"], "master_addr", "got 'node0'"),
    case("standalone-node-rank", [T, "node_rank=1"], "node_rank", "not used by rdzv=standalone"),
    case("c10d-node-rank", [*C10D, "node_rank=1"], "node_rank", "the rendezvous does"),
    case(
        "join-timeout-zero",
        [*C10D, "rdzv.join_timeout=0"],
        "rdzv.join_timeout",
        "got 0.0",
        "seconds > 0",
    ),
    case(
        "last-call-timeout-negative",
        [*C10D, "rdzv.last_call_timeout=-1"],
        "rdzv.last_call_timeout",
        "got -1.0",
        "seconds > 0",
    ),
    case(
        "standalone-two-nodes",
        [T, "nnodes=2"],
        "nnodes",
        "standalone runs exactly one node",
        "rdzv=c10d",
    ),
    case(
        "preset-not-a-name",
        [T, "rdzv=5"],
        "rdzv",
        "auto, c10d, dstack, etcd, etcd-v2, jobset, kubeflow, skypilot, slurm, standalone, static",
    ),
    # ------------------------------------------------------------------------ restart and timing
    case(
        "max-restarts-negative",
        [T, "restart.max_restarts=-1"],
        "restart.max_restarts",
        "got -1",
        "0 (never) or more",
    ),
    case("monitor-interval-zero", [T, "monitor_interval=0"], "monitor_interval", "seconds > 0"),
    case("stop-grace-negative", [T, "stop_grace=-1"], "stop_grace", "got -1.0", "seconds >= 0"),
    case("logs-merge-negative", [T, "logs.merge=-1"], "logs.merge", "got -1.0", "0 (off) to 60"),
    case("logs-merge-nan", [T, "logs.merge=nan"], "logs.merge", "got nan", "not a finite number"),
    case("logs-merge-long", [T, "logs.merge=61"], "logs.merge", "got 61.0", "logs.merge=1"),
    case(
        "on-exit-code-not-a-number",
        [T, "+restart.on_exit_code.abc=fail"],
        "restart.on_exit_code.abc",
        "not an exit code",
        "1..255",
    ),
    case(
        "on-exit-code-unknown-action",
        [T, "+restart.on_exit_code.3=explode"],
        "restart.on_exit_code.3",
        "got 'explode'",
        "retry or fail",
    ),
    case(
        "on-signal-unknown",
        [T, "+restart.on_signal.SIGFOO=fail"],
        "restart.on_signal.SIGFOO",
        "unknown signal",
        "SIGKILL",
    ),
    case(
        "backoff-multiplier-below-one",
        [T, "restart.backoff.multiplier=0.5"],
        "restart.backoff.multiplier",
        "got 0.5",
        ">= 1",
    ),
    case(
        "backoff-jitter-above-one",
        [T, "restart.backoff.jitter=1.5"],
        "restart.backoff.jitter",
        "got 1.5",
        "[0, 1)",
    ),
    case(
        "window-restarts-without-seconds",
        [T, "restart.window_restarts=3"],
        "restart.window_restarts",
        "restart.window_seconds",
        "or neither",
    ),
    # ---------------------------------------------------------------------------- checkpoint
    case("checkpoint-keep-zero", [T, "checkpoint.keep=0"], "checkpoint.keep", "at least 1"),
    case(
        "checkpoint-size",
        [T, "checkpoint.max_memory=lots"],
        "checkpoint.max_memory",
        "not a size",
        "got 'lots'",
        "4GiB",
    ),
    case(
        "checkpoint-memory-relative",
        [T, "checkpoint.memory=shm"],
        "checkpoint.memory",
        "not an absolute path",
        "/dev/shm",
    ),
    # ---------------------------------------------------------------------------------- logs
    case(
        "logs-ranks-out-of-range",
        [T, "nproc_per_node=2", "logs.ranks=[0,5]"],
        "logs.ranks",
        "got 5",
        "0..1",
    ),
    case(
        "logs-prefix-unknown-field",
        [T, "logs.prefix='{foo}'"],
        "logs.prefix",
        "got '{foo}'",
        "{local_rank}",
    ),
    case(
        "logs-prefix-attribute-of-field",
        [T, "logs.prefix='{rank.foo}'"],
        "logs.prefix",
        "got '{rank.foo}'",
    ),
    case(
        "logs-prefix-index-of-field",
        [T, "logs.prefix='{rank[0]}'"],
        "logs.prefix",
        "got '{rank[0]}'",
    ),
    # ---------------------------------------------------------------------- keys, types, env
    case(
        "unknown-top-level-key",
        [T, "max_restart=3"],
        "max_restart",
        "unknown key",
        "Did you mean restart.max_restarts?",
    ),
    case(
        "unknown-top-level-key-forced",
        [T, "+max_restart=3"],
        "max_restart",
        "Did you mean restart.max_restarts?",
    ),
    case(
        "unknown-nested-key",
        [T, "rdzv.endpont=node0"],
        "rdzv.endpont",
        "Did you mean rdzv.endpoint?",
    ),
    case(
        "wrong-type",
        [T, "restart.max_restarts=abc"],
        "restart.max_restarts",
        "got 'abc'",
        "expected an integer",
    ),
    case(
        "env-name-with-dash-override",
        [T, "+env.A-B=1"],
        "env.A-B",
        "not a valid variable name",
        "env.NCCL_DEBUG=INFO",
    ),
    case(
        "env-name-with-dash-yaml",
        ["env_dash.yaml"],
        "env.A-B",
        "not a valid variable name",
        "got 'A-B'",
    ),
    case(
        "env-nested-override",
        [T, "+env.X.Y=1"],
        "env.X",
        "not a plain value",
        "env.NAME=value",
    ),
    case(
        "env-nested-yaml",
        ["env_nested.yaml"],
        "env.NCCL",
        "env.NAME=value",
    ),
    # ------------------------------------------------------------------------ files and argv
    case("job-file-missing", ["nope/job.yaml"], "job", "got 'nope/job.yaml'", "no such file"),
    case(
        "job-file-not-yaml",
        ["broken.yaml"],
        "job",
        "broken.yaml",
    ),
    case(
        "job-file-without-base",
        ["no_base.yaml"],
        "defaults",
        "elastic_hydra_base",
    ),
    case(
        "override-unparsable",
        [T, "nnodes=["],
        "nnodes=[",
        "cannot parse",
    ),
]


@pytest.fixture
def job_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd with a real train.py, a directory, the job files above, and no GPU tools on PATH."""
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "adir").mkdir()
    for name, text in JOB_FILES.items():
        (tmp_path / name).write_text(text)
    empty_bin = tmp_path / "empty_bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))  # no nvidia-smi, whatever this machine has
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ELASTIC_HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("COMP_LINE", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_main(argv: list[str]) -> int | str | None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    return exited.value.code


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 35
    assert len({p.id for p in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "key", "fragments"), CASES)
def test_bad_input_is_one_clean_line(
    job_dir: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    key: str,
    fragments: tuple[str, ...],
) -> None:
    code = run_main([*argv, "--plan"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    assert code == EXIT_CONFIG, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line: {err!r}"
    line = err.rstrip("\n")
    assert line.startswith(PREFIX) and line.strip() != PREFIX.strip()
    assert key in line, line
    for fragment in fragments:
        assert fragment in line, line
    assert out == "", "nothing belongs on stdout when the config is wrong"


# ------------------------------------------------------------------------------------ good inputs
def _presets() -> list[Any]:
    params = []
    for group in ("rdzv", "restart", "logs"):
        for path in sorted((REPO / "conf" / group).glob("*.yaml")):
            params.append(pytest.param(group, path.stem, id=f"{group}={path.stem}"))
    return params


def test_presets_found() -> None:
    found = {p.id for p in _presets()}
    expected = {
        "rdzv=standalone",
        "rdzv=static",
        "rdzv=c10d",
        "rdzv=etcd-v2",
        "rdzv=etcd",
        "restart=never",
        "restart=on_failure",
        "restart=backoff",
        "logs=tee",
        "logs=files_only",
        "logs=quiet",
    }
    assert expected <= found


SLURM_ENV = {  # inside `srun --ntasks-per-node=1` on a 5-node allocation's last 4 nodes
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "node[00-03,07]",
    "SLURM_NNODES": "5",
    "SLURM_STEP_ID": "1",
    "SLURM_STEP_NODELIST": "node[01-03,07]",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_NODEID": "2",
}


SCHEDULER_ENVS = {  # node 1 of 2, as each scheduler describes it
    "kubeflow": {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "tj-node-0-0.tj",
                 "PET_MASTER_PORT": "29400"},
    "jobset": {"JOBSET_NAME": "js", "REPLICATED_JOB_NAME": "node", "JOB_COMPLETION_INDEX": "0"},
    "skypilot": {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2",
                 "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2"},
    "dstack": {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "2",
               "DSTACK_MASTER_NODE_IP": "10.0.0.1"},
    "auto": {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "2",
             "DSTACK_MASTER_NODE_IP": "10.0.0.1"},
}  # fmt: skip


@pytest.mark.parametrize(("group", "option"), _presets())
def test_every_preset_plans(
    job_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    group: str,
    option: str,
) -> None:
    monkeypatch.setenv("COLUMNS", "500")  # rich folds long paths at the default 80 columns
    # The presets that read a scheduler's variables get them.
    for name, value in ({"slurm": SLURM_ENV} | SCHEDULER_ENVS).get(option, {}).items():
        monkeypatch.setenv(name, value)
    code = run_main([T, f"{group}={option}", "--plan"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    assert "launch plan" in out
    assert str(job_dir / "train.py") in out
    assert sorted(p.name for p in job_dir.iterdir()) == sorted(
        ["train.py", "adir", "empty_bin", *JOB_FILES]
    ), "--plan must not create anything"


SHARED = ("rdzv.endpoint=node0:29400", "rdzv.id=job7")  # what every node of a job names


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param(["nnodes=2:4", "rdzv=c10d"], NodeRange(min=2, max=4), id="range"),
        pytest.param(["nnodes='2:4'", "rdzv=c10d"], NodeRange(min=2, max=4), id="quoted-range"),
        pytest.param(["nnodes=3", "rdzv=c10d"], NodeRange(min=3, max=3), id="int"),
        pytest.param(["nnodes='3'", "rdzv=c10d"], NodeRange(min=3, max=3), id="string"),
        pytest.param(["nnodes=1:1"], NodeRange(min=1, max=1), id="one-to-one"),
    ],
)
def test_nnodes_forms(job_dir: Path, overrides: list[str], expected: NodeRange) -> None:
    assert plan_of(T, *overrides, *SHARED).nnodes == expected


def test_quoted_range_in_job_file(job_dir: Path) -> None:
    (job_dir / "quoted.yaml").write_text(BASE + 'nnodes: "2:4"\n')
    cfg = compose("quoted.yaml", "rdzv=c10d", *SHARED)
    assert resolve_config(composed_job(cfg)).nnodes == NodeRange(min=2, max=4)


@pytest.mark.parametrize("backend", ["c10d", "etcd-v2", "etcd"])
def test_several_nodes_need_an_endpoint_and_a_run_id_they_all_name(
    job_dir: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    # The defaults would leave each node alone with a store on its own 127.0.0.1.
    for given, key in [((), "rdzv.endpoint"), (("rdzv.endpoint=node0:29400",), "rdzv.id")]:
        assert run_main([T, f"rdzv={backend}", "nnodes=2", *given, "--plan"]) == EXIT_CONFIG
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"elastic-hydra: error: {key}: is needed"), line
        assert f"{key}=" in line  # the fix, spelled out
    assert plan_of(T, f"rdzv={backend}", "nnodes=1").nnodes == NodeRange(min=1, max=1)


def test_defaults_equal_torchrun(job_dir: Path) -> None:
    plan = plan_of(T)
    assert isinstance(plan.rdzv, Standalone)
    assert isinstance(plan.entrypoint, PythonScript)
    assert plan.entrypoint == PythonScript(
        path=str(job_dir / "train.py"), python=plan.entrypoint.python, args=(), bootstrap=BOOTSTRAP
    )
    # The exact worker command: through the traceback-recording bootstrap, as a launch runs it.
    assert plan.argv == (plan.entrypoint.python, "-u", BOOTSTRAP, str(job_dir / "train.py"))
    assert Path(BOOTSTRAP).is_file()
    assert plan.nnodes == NodeRange(min=1, max=1)
    assert plan.nproc_per_node == 1
    assert plan.restart.max_restarts == 0
    assert plan.restart.window is None
    assert plan.stop_grace == 30.0
    assert plan.monitor_interval == 0.1
    assert plan.role == "default"
    assert plan.logs.prefix == "[{role}{local_rank}]:"
    assert plan.logs.tee and not plan.logs.quiet and plan.logs.console_ranks is None
    assert plan.env == ()

    dynamic = plan_of(T, "rdzv=c10d").rdzv
    assert isinstance(dynamic, Dynamic)
    assert dynamic.join_timeout == 600.0
    # Not torchrun's 30 s and 5 s: membership changes in seconds (torchrun agents of a job are
    # still judged at torch's bound, 15 s).
    assert dynamic.last_call_timeout == 2.0
    assert dynamic.close_timeout == 30.0
    assert dynamic.heartbeat_timeout == 5.0
    assert dynamic.keep_alive_interval == 1.0
    assert dynamic.keep_alive_max_attempt == 3
    assert (dynamic.departure_bound, dynamic.torchrun_departure_bound) == (3.0, 15.0)
    assert dynamic.read_timeout == 60.0
    unnamed = plan_of(T, "rdzv=c10d")
    assert (unnamed.run_id, unnamed.torch_run_id) == (None, "none")  # torchrun's default rdzv id

    static = plan_of(T, "rdzv=static").rdzv
    assert isinstance(static, Static)
    assert (static.master.host, static.master.port) == ("127.0.0.1", 29500)
    assert static.node_rank == 0


def test_endpoint_default_ports(job_dir: Path) -> None:
    c10d = plan_of(T, "rdzv=c10d", "rdzv.endpoint=node0").rdzv
    etcd = plan_of(T, "rdzv=etcd-v2", "rdzv.endpoint=node0").rdzv
    assert isinstance(c10d, Dynamic) and isinstance(etcd, Dynamic)
    assert (c10d.endpoint.host, c10d.endpoint.port) == ("node0", 29400)
    assert (etcd.endpoint.host, etcd.endpoint.port) == ("node0", 2379)


def test_launch_plan_is_frozen(job_dir: Path) -> None:
    plan = plan_of(T, "rdzv=c10d", "restart=backoff")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.nproc_per_node = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rdzv.join_timeout = 1.0  # type: ignore[misc,union-attr]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.restart.max_restarts = 99  # type: ignore[misc]
    assert plan.nproc_per_node == 1 and plan.restart.max_restarts == 10


def test_env_and_hp_take_new_keys_without_plus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """env and hp are free-form: the form --help advertises (env.NAME=value) works as is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    plan = plan_of("script=train.py", "env.NCCL_DEBUG=INFO", "hp.lr=0.1", "args=[${hp.lr}]")
    assert ("NCCL_DEBUG", "INFO") in plan.env
    assert plan.argv[-1] == "0.1"


# ------------------------------------------------------------------------------------ slurm
def test_slurm_preset_reads_the_allocation(job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SLURM_ENV.items():
        monkeypatch.setenv(name, value)
    plan = plan_of(T, "rdzv=slurm")
    assert isinstance(plan.rdzv, Dynamic)
    assert plan.rdzv.backend.value == "c10d"
    # The step's first node hosts the store, on a port of job 4242 step 1's own.
    assert str(plan.rdzv.endpoint) == f"node01:{20000 + (4242 * 64 + 2) % 10000}"
    assert (plan.rdzv.is_host, plan.rdzv.node_order) == (False, 2)
    assert plan.nnodes == NodeRange(min=4, max=4)
    assert plan.run_id == "4242.1"
    assert plan.logs.prefix == "[{host}:{role}{local_rank}]:"
    # Every node of the step writes in one job dir, each in its own subdir.
    assert Path(plan.run_dir).relative_to(job_dir) == Path(
        "eh_logs", "slurm", "slurm-4242.1", socket.gethostname().split(".")[0]
    )

    other = plan_of(T, "rdzv=slurm", "rdzv.endpoint=:31000", "nnodes=2:4", "rdzv.id=mine")
    assert isinstance(other.rdzv, Dynamic)
    assert str(other.rdzv.endpoint) == "node01:31000"
    assert (other.nnodes, other.run_id) == (NodeRange(min=2, max=4), "mine")
    elsewhere = plan_of(T, "rdzv=slurm", "rdzv.endpoint=svc0:29500").rdzv
    assert isinstance(elsewhere, Dynamic) and str(elsewhere.endpoint) == "svc0:29500"


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        pytest.param({}, "needs a Slurm allocation (SLURM_JOB_ID is not set)", id="outside"),
        pytest.param(
            SLURM_ENV | {"SLURM_STEP_NUM_NODES": "3"},
            "names 4 nodes but SLURM_STEP_NUM_NODES='3'",
            id="count",
        ),
        pytest.param(SLURM_ENV | {"SLURM_STEP_NODELIST": "n[3-1]"}, "reversed range", id="list"),
        pytest.param(
            {k: v for k, v in SLURM_ENV.items() if "STEP" not in k},
            "runs one launcher per node, under srun, but this is job 4242's batch script or shell",
            id="not-in-srun",
        ),
        pytest.param(
            SLURM_ENV | {"SLURM_STEP_NUM_TASKS": "8"},
            "step 4242.1 has 8 task(s) on 4 node(s)",
            id="two-per-node",
        ),
    ],
)
def test_slurm_preset_errors_are_one_line(
    job_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    fragment: str,
) -> None:
    for name in SLURM_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run_main([T, "rdzv=slurm", "--plan"]) == EXIT_CONFIG
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("elastic-hydra: error: rdzv.backend: ") and fragment in line, line


def test_torch_rendezvous_timeouts_are_whole_seconds(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main([T, "rdzv=c10d", "rdzv.join_timeout=2.5", "--plan"]) == EXIT_CONFIG
    (line,) = capsys.readouterr().err.splitlines()
    assert "rdzv.join_timeout: torch's rendezvous takes whole seconds (got 2.5)" in line
    assert "e.g. rdzv.join_timeout=2" in line


# ------------------------------------------------------------------------------ injected host facts
def test_resolution_asks_the_host_it_is_given() -> None:
    """Files and programs are the given host's: a script that exists only there resolves, a
    program missing from its PATH does not, whatever this machine has."""
    from elastic_hydra.config.schema import ElasticHydraConf
    from elastic_hydra.resolve.gpus import Machine
    from elastic_hydra.resolve.resolver import Host, resolve

    files = {"/job/train.py"}
    host = Host(
        cwd="/job",
        environ={"PATH": "/opt/bin"},
        machine=Machine(gpus=lambda: (), cpus=lambda: (0, 1), node_cpus=lambda node: ()),
        process_room=lambda: None,
        is_file=files.__contains__,
        is_dir=lambda path: False,
        is_executable=lambda path: False,
        which=lambda program, path: "/opt/bin/trainer" if program == "trainer" else None,
    )
    plan = resolve(ElasticHydraConf(script="train.py"), run_dir="", host=host)
    assert isinstance(plan.entrypoint, PythonScript)
    assert plan.entrypoint.path == "/job/train.py"
    assert isinstance(resolve(ElasticHydraConf(cmd="trainer"), run_dir="", host=host).entrypoint,
                      Command)  # fmt: skip
    with pytest.raises(ConfigError, match="cmd: program not found"):
        resolve(ElasticHydraConf(cmd="python3"), run_dir="", host=host)  # on this machine's PATH
    with pytest.raises(ConfigError, match="script: no such file in /job"):
        resolve(ElasticHydraConf(script="other.py"), run_dir="", host=host)


@pytest.mark.parametrize(
    ("backend", "missing", "says"),
    [
        ("c10d", "torch", "needs PyTorch"),
        ("etcd-v2", "torch", "needs PyTorch"),
        ("etcd", "etcd", "needs the python-etcd client"),
    ],
)
def test_torch_backends_need_their_packages_in_this_python(
    backend: str, missing: str, says: str
) -> None:
    """Resolution asks the host whether torch (and python-etcd) would import: a launch fails
    before anything is made, and `--plan` says the same."""
    from elastic_hydra.config.schema import ElasticHydraConf, RdzvConf
    from elastic_hydra.errors import TORCH_INSTALL
    from elastic_hydra.resolve.gpus import Machine
    from elastic_hydra.resolve.resolver import Host, resolve

    def host(*absent: str) -> Host:
        return Host(
            cwd="/job",
            environ={},
            machine=Machine(gpus=lambda: (), cpus=lambda: (0,), node_cpus=lambda node: ()),
            process_room=lambda: None,
            is_file=lambda path: True,
            importable=lambda name: name not in absent,
        )

    conf = ElasticHydraConf(script="train.py", rdzv=RdzvConf(backend=backend))
    with pytest.raises(ConfigError, match=f"rdzv.backend: {says}") as info:
        resolve(conf, run_dir="", host=host(missing))
    assert repr(backend) in info.value.line()
    if missing == "torch":
        assert f"`{TORCH_INSTALL}`" in info.value.line()
    assert isinstance(resolve(conf, run_dir="", host=host()).rdzv, Dynamic)
    standalone = ElasticHydraConf(script="train.py")  # needs no torch
    assert isinstance(resolve(standalone, run_dir="", host=host("torch", "etcd")).rdzv, Standalone)
