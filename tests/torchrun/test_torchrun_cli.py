"""torchrun's command line and PET_* variables, read as elastic-hydra keys (torchrun_cli).

Pure translation tests: a command line (and an environment) in, the overrides, the script's argv,
the notes or the one-line refusal out. The flag table itself is checked against torch 2.13's own
parser, and a few translations are resolved all the way to the plan a launch would run.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.agent.worker_env import SIGNALS_TO_HANDLE
from elastic_hydra.cli.argv import own_words, parse_argv
from elastic_hydra.config import boundary
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import Dynamic, DynamicBackend, Endpoint, PythonModule, Standalone, Static
from elastic_hydra.stopsignals import STOP_SIGNALS
from elastic_hydra.torchrun.flags import DEFAULT_SIGNALS, FLAGS
from elastic_hydra.torchrun.logs import prefix_from_template
from tests.harness import compose, plan_of

FLAGS_OF_HYDRA = boundary.hydra_flags()


def parse(*words: str, env: Mapping[str, str] | None = None) -> Invocation:
    return parse_argv(words, FLAGS_OF_HYDRA, env or {})


def overrides(*words: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's overrides as key -> value text (Hydra's quotes included)."""
    return dict(o.split("=", 1) for o in parse(*words, env=env).overrides)


def refusal(*words: str, env: Mapping[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse(*words, env=env)
    line = info.value.line()
    assert "\n" not in line
    return line


@pytest.fixture(autouse=True)
def no_pet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The tests that compose read this process's environment: no PET_* from outside."""
    import os

    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", raising=False)
    yield


# ------------------------------------------------------------------------------ the flag table
def test_every_flag_of_torchrun_is_known_with_its_spellings_and_variable() -> None:
    from torch.distributed import run  # the tests' environment has torch 2.13
    from torch.distributed.argparse_util import check_env, env

    theirs = {}
    for action in run.get_args_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        pet = isinstance(action, (env, check_env))
        theirs[action.dest] = (set(action.option_strings), action.nargs == 0, pet)
    ours = {f.dest: (set(f.options), f.switch, f.pet) for f in FLAGS}
    assert ours == theirs


def test_the_signals_variable_names_the_agents_stop_signals() -> None:
    names = tuple(signal.Signals(s).name for s in STOP_SIGNALS)
    assert names == DEFAULT_SIGNALS
    assert ",".join(DEFAULT_SIGNALS) == SIGNALS_TO_HANDLE


# ------------------------------------------------------------------------------ translations
# PyTorch's documented command lines (torchrun docs, "Usage") and the old launch habits.
TRANSLATIONS: list[tuple[list[str], dict[str, str], tuple[str, ...]]] = [
    (["--standalone", "--nnodes=1", "--nproc-per-node=2", "train.py", "--lr", "0.1"],
     {"script": "'train.py'", "nnodes": "1", "nproc_per_node": "2", "rdzv": "standalone"},
     ("--lr", "0.1")),
    (["--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1", "--master-port=29511",
      "train.py"],
     {"script": "'train.py'", "nnodes": "2", "rdzv": "static", "master_addr": "'127.0.0.1'",
      "master_port": "29511", "node_rank": "0"}, ()),
    (["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=x",
      "train.py"],
     {"script": "'train.py'", "nnodes": "'1:2'", "rdzv": "c10d",
      "rdzv.endpoint": "'127.0.0.1:29400'", "rdzv.id": "'x'"}, ()),
    (["--nnodes=4", "--nproc-per-node=8", "--max-restarts=3", "--rdzv-id=job42",
      "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400", "train.py", "--arg1", "v"],
     {"script": "'train.py'", "nnodes": "4", "nproc_per_node": "8", "restart.max_restarts": "3",
      "rdzv": "c10d", "rdzv.id": "'job42'", "rdzv.endpoint": "'node0:29400'"}, ("--arg1", "v")),
    # underscores and separate values, as torch.distributed.launch users write them
    (["--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
      "--master_port", "1234", "train.py"],
     {"script": "'train.py'", "nproc_per_node": "2", "nnodes": "2", "rdzv": "static",
      "node_rank": "1", "master_addr": "'10.0.0.1'", "master_port": "1234"}, ()),
    (["--nproc-per-node=gpu", "t.py"], {"script": "'t.py'", "nproc_per_node": "'gpu'"}, ()),
    (["--nproc-per-node", "auto", "t.py"], {"script": "'t.py'", "nproc_per_node": "'auto'"}, ()),
    (["--nproc_per_node=cpu", "t.py"], {"script": "'t.py'", "nproc_per_node": "'cpu'"}, ()),
    (["-m", "pkg.train", "--x"], {"module": "'pkg.train'"}, ("--x",)),
    (["--module", "pkg.train"], {"module": "'pkg.train'"}, ()),
    (["--no-python", "./bin/my prog", "a"], {"cmd": "'\\'./bin/my prog\\''"}, ("a",)),
    (["--run-path", "--start-method=spawn", "t.py"], {"script": "'t.py'"}, ()),
    (["--role", "trainer", "--max_restarts=2", "--monitor-interval", "0.5",
      "--shutdown-timeout=5", "--local-addr=127.0.0.1", "t.py"],
     {"script": "'t.py'", "role": "'trainer'", "restart.max_restarts": "2",
      "monitor_interval": "0.5", "stop_grace": "5", "local_addr": "'127.0.0.1'"}, ()),
    (["--log-dir", "/tmp/logs", "-t", "3", "t.py"],
     {"script": "'t.py'", "logs.root": "'/tmp/logs'", "logs.tee": "true"}, ()),
    (["--log-dir=", "t.py"], {"script": "'t.py'"}, ()),  # empty: unset, as torchrun
    (["-r3", "t.py"], {"script": "'t.py'", "logs.tee": "false"}, ()),
    (["-r", "3", "--tee=3", "t.py"], {"script": "'t.py'", "logs.tee": "true"}, ()),
    (["--redirects=0:3", "--nproc-per-node=3", "t.py"],
     {"script": "'t.py'", "nproc_per_node": "3", "logs.tee": "true", "logs.ranks": "[1,2]"}, ()),
    (["--local-ranks-filter=0,5", "--nproc-per-node=2", "t.py"],
     {"script": "'t.py'", "nproc_per_node": "2", "logs.tee": "true", "logs.ranks": "[0]"}, ()),
    (["--rdzv-backend=c10d", "--rdzv-conf=join_timeout=5,last_call_timeout=1,close_timeout=2,"
      "read_timeout=9,heartbeat_timeout=3,keep_alive_interval=4,keep_alive_max_attempt=5,"
      "is_host=false,timeout=60,store_type=tcp", "t.py"],
     {"script": "'t.py'", "rdzv": "c10d", "rdzv.join_timeout": "5",
      "rdzv.last_call_timeout": "1", "rdzv.close_timeout": "2", "rdzv.read_timeout": "9",
      "rdzv.heartbeat_timeout": "3", "rdzv.keep_alive_interval": "4",
      "rdzv.keep_alive_max_attempt": "5", "rdzv.is_host": "false", "rdzv.timeout": "60"}, ()),
    (["--rdzv-backend=static", "--rdzv-endpoint=[::1]:29501", "--nnodes=2", "t.py"],
     {"script": "'t.py'", "rdzv": "static", "nnodes": "2", "master_addr": "'::1'",
      "master_port": "29501"}, ()),
    # torchrun's own switch: static, one node, no endpoint, no port -> standalone c10d
    (["--rdzv-backend=static", "--nnodes=1", "t.py"],
     {"script": "'t.py'", "rdzv": "standalone", "nnodes": "1"}, ()),
    (["--nnodes=1", "--master-port=29512", "t.py"],
     {"script": "'t.py'", "rdzv": "static", "nnodes": "1", "master_port": "29512"}, ()),
    (["--numa-binding=exclusive", "--signals-to-handle=SIGINT,SIGTERM,SIGQUIT,SIGHUP",
      "--event-log-handler", "null", "t.py"], {"script": "'t.py'", "cpu_bind": "true"}, ()),
    # Hydra overrides before the script; everything after it is the script's, byte for byte
    (["--nproc-per-node=2", "restart=backoff", "hp.lr=0.1", "train.py", "--plan", "--",
      "--nproc-per-node=3", "a b", "${x}", "key=value"],
     {"script": "'train.py'", "nproc_per_node": "2", "restart": "backoff", "hp.lr": "0.1"},
     ("--plan", "--", "--nproc-per-node=3", "a b", "${x}", "key=value")),
]  # fmt: skip


@pytest.mark.parametrize(("words", "expected", "script_args"), TRANSLATIONS)
def test_torchrun_command_lines(
    words: list[str], expected: dict[str, str], script_args: tuple[str, ...]
) -> None:
    inv = parse(*words)
    assert inv.torchrun and not inv.multirun
    assert dict(o.split("=", 1) for o in inv.overrides) == expected
    assert inv.script_args == script_args
    assert inv.plan is None


KUBEFLOW = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "trainer-master-0", "PET_MASTER_PORT": "23456"}  # fmt: skip


def test_pet_variables_alone_make_the_command() -> None:
    assert overrides("train.py", env=KUBEFLOW) == {
        "script": "'train.py'", "nnodes": "2", "nproc_per_node": "4", "rdzv": "static",
        "master_addr": "'trainer-master-0'", "master_port": "23456", "node_rank": "1",
    }  # fmt: skip
    elastic = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:29400", "PET_NNODES": "1:3",
               "PET_RDZV_ID": "job", "PET_MAX_RESTARTS": "2", "PET_STANDALONE": "0"}  # fmt: skip
    assert overrides("train.py", env=elastic) == {
        "script": "'train.py'", "nnodes": "'1:3'", "rdzv": "c10d", "rdzv.endpoint": "'h:29400'",
        "rdzv.id": "'job'", "restart.max_restarts": "2",
    }  # fmt: skip
    assert overrides("pkg.mod", env={"PET_MODULE": "1", "PET_STANDALONE": "1"}) == {
        "module": "'pkg.mod'",
        "rdzv": "standalone",
    }


def test_a_flag_beats_its_pet_variable_and_an_override_beats_both() -> None:
    env = {"PET_NPROC_PER_NODE": "4", "PET_MAX_RESTARTS": "2", "PET_ROLE": "x", "PET_TEE": ""}
    got = overrides("--nproc-per-node=2", "restart.max_restarts=5", "t.py", env=env)
    assert got == {"script": "'t.py'", "nproc_per_node": "2", "role": "'x'",
                   "restart.max_restarts": "5"}  # fmt: skip
    # a switch: the flag sets it whatever PET_* says; PET_*=0 leaves it unset
    assert overrides("--standalone", "t.py", env={"PET_STANDALONE": "0"})["rdzv"] == "standalone"
    assert "rdzv" not in overrides("t.py", env={"PET_STANDALONE": "0"})
    # the last of a repeated flag wins, as with argparse
    assert overrides("--nnodes=2", "--nnodes=1", "t.py")["nnodes"] == "1"


def test_a_flag_and_an_override_of_the_same_key_are_refused() -> None:
    line = refusal("--nproc-per-node=2", "nproc_per_node=4", "t.py")
    assert line == (
        "nproc_per_node: given twice, as --nproc-per-node=2 and as an override (got "
        "'nproc_per_node=4'); keep one of them."
    )
    assert "given twice, as --rdzv-backend=c10d" in refusal(
        "--rdzv-backend=c10d", "rdzv=etcd", "t.py"
    )
    assert "given twice, as t.py" in refusal("script=other.py", "t.py")


def test_torchruns_other_variables() -> None:
    env = {
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}-r${rank}-l$local_rank] ",
    }
    got = overrides("t.py", env=env)
    assert got["stop_grace"] == "7"
    assert got["logs.prefix"] == "'[{role}-r{rank}-l{local_rank}] '"
    assert overrides("--shutdown-timeout=3", "t.py", env=env)["stop_grace"] == "3"
    assert prefix_from_template("{$$x ${other}}") == "{{$x ${{other}}}}"


# ------------------------------------------------------------------------- -m, -r and the rest
def test_short_m_is_torchruns_module_only_in_front_of_a_script() -> None:
    sweep = parse("-m", "script=t.py", "nproc_per_node=1,2")
    assert sweep.multirun and not sweep.torchrun and "-m" in sweep.flags
    module = parse("-m", "pkg.train")
    assert module.torchrun and not module.multirun and "-m" not in module.flags
    swept_module = parse("--multirun", "-m", "nproc_per_node=1,2", "pkg.train")
    assert swept_module.multirun and "module='pkg.train'" in swept_module.overrides


def test_short_r_is_a_redirect_only_with_a_redirect_spec() -> None:
    hydra_run = parse("-r", "script=t.py")
    assert "-r" in hydra_run.flags and not hydra_run.torchrun
    assert overrides("-r", "3", "t.py")["logs.tee"] == "false"
    assert overrides("-r=0:3,1:3", "--nproc-per-node=2", "t.py")["logs.tee"] == "false"


def test_a_plain_command_is_unchanged_and_ignores_pet_with_a_note() -> None:
    inv = parse("script=t.py", "nproc_per_node=2", "--", "--lr", "0.1", env=KUBEFLOW)
    assert not inv.torchrun
    assert inv.overrides == ("script=t.py", "nproc_per_node=2")
    assert inv.script_args == ("--lr", "0.1")
    (note,) = inv.notes
    assert note.startswith("PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, ")
    assert "apply to a torchrun-style command" in note
    assert note.endswith("rdzv=kubeflow reads them in a job")
    assert parse("script=t.py").notes == ()
    # The presets that read PET_* on purpose get no note.
    assert parse("script=t.py", "rdzv=kubeflow", env=KUBEFLOW).notes == ()
    assert parse("script=t.py", "rdzv=auto", env=KUBEFLOW).notes == ()


def test_own_words_stop_at_the_script() -> None:
    assert own_words(["--nproc-per-node=2", "train.py", "--version"]) == ["--nproc-per-node=2"]
    assert own_words(["job.yaml", "-V", "--", "--version"]) == ["job.yaml", "-V"]
    assert own_words(["--version"]) == ["--version"]


# -------------------------------------------------------------------------------------- notes
NOTES = [
    (["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--rdzv-id=j", "--node-rank=1",
      "t.py"], "--node-rank=1 is used by a static rendezvous only; ignored with rdzv=c10d, as "
     "torchrun ignores it"),
    (["--standalone", "--rdzv-endpoint=h:1", "t.py"],
     "--rdzv-endpoint=h:1 is ignored with --standalone, as torchrun ignores it"),
    (["--master-addr=10.0.0.1", "t.py"], "--master-addr=10.0.0.1 is used by a static rendezvous "
     "only; ignored with rdzv=standalone, as torchrun ignores it"),
    (["--start-method=fork", "t.py"], "--start-method=fork only matters to torchrun's "
     "--run-path; scripts start as fresh processes either way"),
    (["--rdzv-conf=join_timeout=5", "t.py"], "--rdzv-conf=join_timeout=5: not used by "
     "rdzv=standalone (only c10d, etcd-v2 and etcd read it)"),
    (["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "t.py"], "no --rdzv-id: the "
     "run id is torchrun's default, none; give each job its own --rdzv-id so that jobs sharing "
     "a store stay apart"),
    (["--run-path", "--no-python", "t.py"],
     "--no-python is ignored with --run-path, as torchrun ignores it"),
    (["--rdzv-backend=static", "--rdzv-endpoint=h:2", "--master-port=3", "--nnodes=2", "t.py"],
     "--master-port=3 is ignored: --rdzv-endpoint=h:2 names the master of a static rendezvous, "
     "as under torchrun"),
    (["--signals-to-handle=SIGTERM", "t.py"], "--signals-to-handle=SIGTERM: elastic-hydra stops "
     "on SIGTERM, SIGINT, SIGHUP and SIGQUIT alike, forwarding the signal to the workers "
     "(TORCHELASTIC_SIGNALS_TO_HANDLE names all four)"),
]  # fmt: skip


@pytest.mark.parametrize(("words", "note"), NOTES)
def test_what_torchrun_ignores_is_said_not_silenced(words: list[str], note: str) -> None:
    assert note in parse(*words).notes


# ----------------------------------------------------------------------------------- refusals
REFUSALS = [
    (["--virtual-local-rank", "t.py"], "--virtual-local-rank: not supported by elastic-hydra"),
    (["--duplicate-stdout-filters=err", "t.py"], "--duplicate-stdout-filters: not supported"),
    (["--duplicate_stderr_filters", "err", "t.py"], "--duplicate_stderr_filters: not supported"),
    (["--logs-specs=mine", "t.py"], "--logs-specs: not supported by elastic-hydra"),
    (["--event-log-handler=console", "t.py"], "events to events.jsonl in its run dir"),
    (["--signals-to-handle=SIGTERM,SIGUSR1", "t.py"], "srun --signal=TERM@120"),
    (["--signals-to-handle=SIGUSR1", "t.py"], "stops on SIGTERM, SIGINT, SIGHUP and SIGQUIT only"),
    (["-r", "4", "t.py"], "-r: not a redirect spec (got '-r 4'); expected 0-3 or e.g. 0:3,1:0"),
    (["-r0:5", "t.py"], "-r: not a redirect spec (got '-r0:5')"),
    (["--numa-binding=node", "t.py"], "--numa-binding: only exclusive has an equivalent here"),
    (["--numa-binding=socket", "t.py"], "cpu_bind=true gives each worker its own CPUs"),
    (["--numa-binding", "core-complex", "t.py"], "only exclusive has an equivalent here"),
    (["--nproc-per-node=xpu", "t.py"], "elastic-hydra counts NVIDIA GPUs only."),
    (["--nproc-per-node=many", "t.py"], "expected a number, gpu, cpu or auto"),
    (["--rdzv-backend=mine", "t.py"], "torchrun's plugin backends (torchrun.handlers)"),
    (["--rdzv-backend=c10d", "--rdzv-conf=store_type=file", "t.py"], "always a TCPStore"),
    (["--rdzv-backend=static", "--rdzv-conf=rank=1", "t.py"], "Give --node-rank instead."),
    (["--rdzv-backend=etcd-v2", "--rdzv-conf=ssl_cert=c.pem", "t.py"], "no TLS or key-prefix"),
    (["--rdzv-conf=color=red", "t.py"], "--rdzv-conf: unknown key color"),
    (["--rdzv-conf=join_timeout=1.5", "t.py"], "join_timeout is not whole seconds"),
    (["--rdzv-conf=is_host=maybe", "t.py"], "is_host is not a boolean"),
    (["--rdzv-conf=join_timeout", "t.py"], "--rdzv-conf: not key=value,..."),
    (["--rdzv-backend=static", "--rdzv-endpoint=node0", "--nnodes=2", "t.py"],
     "a static rendezvous needs host:port"),
    (["-r", "1", "t.py"], "-r: stdout and stderr cannot be split here"),
    (["--tee=2", "--redirects=3", "t.py"], "stdout and stderr cannot be split here"),
    (["--redirects=0:3", "--nproc-per-node=gpu", "t.py"], "a per-rank map needs the number"),
    (["--local-ranks-filter=a", "t.py"], "--local-ranks-filter: not a list of local ranks"),
    (["--redirects=4", "t.py"], "--redirects: not a redirect spec"),
    (["--start-method=thread", "t.py"], "--start-method: not a start method"),
    (["--run-path", "--start-method=fork", "t.py"], "starts every worker as a fresh interpreter"),
    (["-m", "--no-python", "x"], "-m: cannot be combined with --no-python"),
    (["--run-path", "--module", "x"], "--module: cannot be combined with --run-path"),
    (["--module", "script=t.py"], "--module: names no program"),
    (["--max-restarts=x", "t.py"], "--max-restarts: not a whole number"),
    (["--monitor-interval=fast", "t.py"], "--monitor-interval: not a number"),
    (["--nnodes=2", "--master-port=abc", "t.py"], "--master-port: not a whole number"),
    (["--standalone=1", "t.py"], "--standalone: takes no value"),
    (["t.py", "--nnodes"], None),  # after the script: the script's, not ours
    (["--nnodes"], "--nnodes: needs a value"),
    (["--nnodes", "--nproc-per-node=2", "t.py"], "--nnodes: needs a value"),
    (["--nproc=2", "t.py"], "Did you mean --nproc-per-node?"),
    (["--foo", "t.py"], "--foo: not an elastic-hydra or torchrun flag"),
    (["a.yaml", "b.yaml"], "job: a second job file"),
]  # fmt: skip


@pytest.mark.parametrize(("words", "part"), REFUSALS)
def test_what_cannot_be_honoured_is_refused_in_one_line(words: list[str], part: str | None) -> None:
    if part is None:
        assert parse(*words).script_args == ("--nnodes",)
        return
    assert part in refusal(*words)


def test_a_bad_pet_variable_is_named() -> None:
    assert refusal("t.py", env={"PET_STANDALONE": "yes"}) == (
        "PET_STANDALONE: is not 0 or 1 (got 'yes'); expected PET_STANDALONE=1 or unset."
    )
    assert refusal("t.py", env={"PET_MAX_RESTARTS": "x"}).startswith(
        "PET_MAX_RESTARTS: not a whole number (got 'PET_MAX_RESTARTS=x')"
    )
    assert "PET_VIRTUAL_LOCAL_RANK: not supported" in refusal(
        "t.py", env={"PET_VIRTUAL_LOCAL_RANK": "1"}
    )


# ----------------------------------------------------------------------- down to the plan
@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    return tmp_path


def test_the_documented_command_lines_resolve_to_torchruns_rendezvous(here: Path) -> None:
    alone = plan_of("--standalone", "--nnodes=1", "--nproc-per-node=2", "train.py", "--lr", "1")
    assert isinstance(alone.rdzv, Standalone) and alone.nproc_per_node == 2
    assert alone.argv[-3:] == (str(here / "train.py"), "--lr", "1")
    fixed = plan_of("--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
                    "--master-port=29513", "train.py")  # fmt: skip
    assert fixed.rdzv == Static(master=Endpoint(host="127.0.0.1", port=29513), node_rank=1)
    assert (fixed.run_id, fixed.torch_run_id) == (None, "none")  # torchrun's, without --rdzv-id
    elastic = plan_of("--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400",
                      "--rdzv-id=x", "--rdzv-conf=last_call_timeout=1", "train.py")  # fmt: skip
    assert isinstance(elastic.rdzv, Dynamic)
    assert elastic.rdzv.backend is DynamicBackend.C10D
    assert elastic.rdzv.endpoint == Endpoint(host="127.0.0.1", port=29400)
    assert elastic.rdzv.last_call_timeout == 1
    assert (str(elastic.nnodes), elastic.run_id) == ("1:2", "x")


def test_pet_only_resolves_like_the_flags(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "127.0.0.1",
                        "PET_MASTER_PORT": "29514", "PET_MAX_RESTARTS": "2"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    plan = plan_of("train.py")
    assert plan.rdzv == Static(master=Endpoint(host="127.0.0.1", port=29514), node_rank=1)
    assert plan.restart.max_restarts == 2


def test_a_module_and_its_args(here: Path) -> None:
    plan = plan_of("-m", "json.tool", "--sort-keys")
    assert isinstance(plan.entrypoint, PythonModule)
    assert (plan.entrypoint.name, plan.entrypoint.args) == ("json.tool", ("--sort-keys",))


def test_the_script_replaces_a_job_files_entrypoint(here: Path) -> None:
    (here / "job.yaml").write_text("defaults: [elastic_hydra_base, _self_]\nmodule: pkg.x\n")
    cfg: Any = compose("job.yaml", "--nproc-per-node=2", "train.py", "a")
    assert (cfg.script, cfg.module, cfg.cmd, cfg.nproc_per_node) == ("train.py", None, None, 2)
    assert list(cfg.args) == ["a"]


def test_the_script_after_dashes_is_torchruns_with_its_flags_only() -> None:
    # torchrun reads `-- train.py --lr 0.1` as the script and its args
    inv = parse("--nproc-per-node=2", "--", "train.py", "--lr", "0.1")
    assert overrides("--nproc-per-node=2", "--", "train.py") == {
        "script": "'train.py'", "nproc_per_node": "2",
    }  # fmt: skip
    assert inv.script_args == ("--lr", "0.1")
    module = parse("--nproc-per-node=2", "-m", "--", "pkg.train", "--x")
    assert "module='pkg.train'" in module.overrides and module.script_args == ("--x",)
    # Our own form keeps `--` for the script's args: with an entrypoint override, a job file, no
    # torchrun flag, or a word after `--` that is a flag
    named = parse("--nproc-per-node=2", "script=t.py", "--", "train.py")
    assert "script=t.py" in named.overrides and named.script_args == ("train.py",)
    job = parse("--nproc-per-node=2", "-cn", "pretrain", "--", "train.py")
    assert job.script_args == ("train.py",)
    plain = parse("nproc_per_node=2", "--", "train.py")
    assert not plain.torchrun and plain.script_args == ("train.py",)
    assert parse("--nproc-per-node=2", "--", "--lr").script_args == ("--lr",)


def test_plan_after_the_script_goes_to_the_script_with_one_note() -> None:
    inv = parse("--nproc-per-node=2", "train.py", "--lr", "0.1", "--plan=json")
    assert inv.plan is None and inv.script_args == ("--lr", "0.1", "--plan=json")
    (note,) = inv.notes
    assert note.startswith("--plan=json comes after the script train.py, so it goes to the script")
    assert parse("--plan", "train.py", "--plan").notes == ()  # the plan is shown: nothing runs
    assert parse("train.py", "--planner").notes == ()
    assert parse("script=train.py", "--", "--plan").notes == ()  # after --: the user said so
