"""elastic-hydra as a drop-in for torchrun: the same words under both launchers.

Each case runs `tests/scripts/dump_env.py` under `python -m torch.distributed.run WORDS` and under
`python -m elastic_hydra WORDS` (the same words, the same parent environment, PET_* included;
every agent of a multi-node case started side by side on 127.0.0.1), and compares what the
workers saw: the variables test_torch_parity requires to be equal, equal; per-launch values
(ports, fresh run ids) of the same form; the script's argv byte for byte. Known differences by
design are listed in test_torch_parity's docstring and in docs/coming-from-torchrun.md.

Then the command as a file: the job YAML `--plan` prints for a torchrun-style command composes to
the same plan as the command itself, and a launch runs the plan `--plan` showed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.cli.plan import YAML_HEADING
from elastic_hydra.cli.run import main
from tests.agent.test_torch_parity import (
    EQUAL,
    SCRIPT_ARGS,
    TORCHRUN,
    WORKER,
    is_this_host,
    parent_env,
)
from tests.config.test_one_composition import comparable
from tests.conftest import ELASTIC_HYDRA, free_port
from tests.harness import run

pytestmark = [pytest.mark.timeout(300)]

LAUNCH_TIMEOUT = 120.0
# torchrun's own words among the script's: after the script they are the script's, untouched.
ARGS = [*SCRIPT_ARGS, "--nproc-per-node=3", "--plan", "-m"]


@dataclass(frozen=True)
class Case:
    """One command line: the launcher words of each agent (before the script), its environment."""

    name: str
    agents: list[list[str]]
    world: int
    env: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None  # the run id the workers must see; None: a fresh one


def cases() -> list[Case]:
    static, c10d = free_port(), free_port()
    node = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={static}"]
    return [
        Case("standalone", [["--standalone", "--nnodes=1", "--nproc-per-node=2"]], world=2),
        Case(
            "static-2-nodes",
            [[*node, "--node-rank=0", "--nproc_per_node=1"], [*node, "--node_rank", "1"]],
            world=2,
            run_id="none",
        ),
        Case(
            "elastic-c10d",
            [
                [
                    "--nnodes=1:2",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{c10d}",
                    "--rdzv-id=dropin",
                    "--rdzv-conf=last_call_timeout=1",
                    "--nproc-per-node=2",
                ]
            ],
            world=2,
            run_id="dropin",
        ),
        Case(
            "pet-only",
            [[]],
            world=2,
            env={"PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "1", "PET_ROLE": "trainer"},
        ),
    ]


Snapshots = dict[int, dict[str, Any]]


def launch(kind: str, case: Case, tmp: Path) -> Snapshots:
    """Every agent of `case` under `kind` (torchrun or ours), side by side; rank -> snapshot."""
    tmp.mkdir()
    out = tmp / "out"
    env = parent_env(tmp, **case.env)
    launcher = TORCHRUN if kind == "torchrun" else ELASTIC_HYDRA
    procs = []
    try:
        for i, words in enumerate(case.agents):
            log = (tmp / f"agent{i}.log").open("wb")
            cmd = [*launcher, *words, str(WORKER), str(out), *ARGS]
            procs.append(subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=log))
            log.close()
        codes = [p.wait(timeout=LAUNCH_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(tmp.glob("agent*.log")))
    assert codes == [0] * len(procs), f"{kind} {case.name}: exit codes {codes}\n{logs}"
    snaps = {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in out.glob("env_*_0.json")}
    assert sorted(snaps) == list(range(case.world)), f"{kind} {case.name}: {sorted(snaps)}\n{logs}"
    for snap in snaps.values():
        snap["parent_env"] = env
    return snaps


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Snapshots]]:
    """case name -> launcher -> snapshots, each case run under both launchers."""
    results: dict[str, dict[str, Snapshots]] = {}
    for case in cases():
        tmp = tmp_path_factory.mktemp(case.name)
        results[case.name] = {kind: launch(kind, case, tmp / kind) for kind in ("torchrun", "ours")}
    return results


CASES = {case.name: case for case in cases()}


@pytest.mark.parametrize("name", list(CASES))
def test_the_workers_see_what_torchruns_see(
    runs: dict[str, dict[str, Snapshots]], name: str
) -> None:
    theirs, ours = runs[name]["torchrun"], runs[name]["ours"]
    for rank in theirs:
        t, o = theirs[rank]["env"], ours[rank]["env"]
        assert {k: o.get(k) for k in EQUAL} == {k: t.get(k) for k in EQUAL}, f"rank {rank}"
        assert o["RANK"] == str(rank)


# Per-launch values, and the agent store our standalone and static agents do not host
# (test_torch_parity's docstring says why for each). PWD: our workers start through /bin/sh,
# which sets it to their working directory; torchrun's inherit the launcher's, stale or not.
MAY_DIFFER = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_ERROR_FILE", "PWD"}  # fmt: skip
# Ours alone, on purpose: torch's Flight Recorder on, for a hang's verdict (docs/hangs.md).
OURS_ONLY = {"TORCH_FR_BUFFER_SIZE"}


@pytest.mark.parametrize("name", list(CASES))
def test_only_the_documented_variables_differ(
    runs: dict[str, dict[str, Snapshots]], name: str
) -> None:
    added = {}
    for kind, snaps in runs[name].items():
        env, parent = snaps[0]["env"], snaps[0]["parent_env"]
        added[kind] = {k: v for k, v in env.items() if parent.get(k) != v}
    theirs, ours = added["torchrun"], added["ours"]
    assert set(theirs) - set(ours) == set(), "torchrun sets these, we do not"
    assert {k for k in theirs if theirs[k] != ours[k]} <= MAY_DIFFER
    extra = {k for k in set(ours) - set(theirs) - MAY_DIFFER if not k.startswith("ELASTIC_HYDRA_")}
    assert extra == OURS_ONLY, "we set these, torchrun does not"
    if name == "elastic-c10d":  # torch's own handler: the same store contract as torchrun's
        assert ours["TORCHELASTIC_USE_AGENT_STORE"] == theirs["TORCHELASTIC_USE_AGENT_STORE"]


@pytest.mark.parametrize("name", list(CASES))
def test_the_script_and_its_argv_are_torchruns(
    runs: dict[str, dict[str, Snapshots]], name: str
) -> None:
    for kind, snaps in runs[name].items():
        for rank, snap in snaps.items():
            where = f"{kind} rank {rank}"
            assert Path(snap["argv"][0]).resolve() == WORKER, where
            assert snap["argv"][2:] == ARGS, where  # byte for byte (argv[1] = the out dir)
            assert snap["orig_argv"][1] == "-u", where


@pytest.mark.parametrize("name", list(CASES))
def test_master_and_run_id_have_torchruns_form(
    runs: dict[str, dict[str, Snapshots]], name: str
) -> None:
    case = CASES[name]
    for kind, snaps in runs[name].items():
        envs = [s["env"] for s in snaps.values()]
        masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}
        assert len(masters) == 1, f"{kind}: ranks disagree on the master: {masters}"
        ((addr, port),) = masters
        assert is_this_host(addr) and port.isdigit(), f"{kind}: {addr}:{port}"
        run_ids = {e["TORCHELASTIC_RUN_ID"] for e in envs}
        assert len(run_ids) == 1, f"{kind}: {run_ids}"
        if case.run_id is not None:
            assert run_ids == {case.run_id}, kind
        else:
            assert run_ids.pop() not in ("", "none"), f"{kind}: needs a fresh run id"
    if name == "static-2-nodes":  # fixed by the flags: the same values under both
        fixed = [
            {(s["env"]["MASTER_ADDR"], s["env"]["MASTER_PORT"]) for s in runs[name][k].values()}
            for k in ("torchrun", "ours")
        ]
        assert fixed[0] == fixed[1]


# ------------------------------------------------------------------------ the command as a file
@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith(("PET_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    (tmp_path / "train.py").write_text("")
    program = tmp_path / "run.sh"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    yield tmp_path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`elastic-hydra ARGS` in this process: its stdout (it must exit 0)."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    return out


COMMANDS = [
    ["--standalone", "--nnodes=1", "--nproc-per-node=2", "train.py", "--lr", "0.1", "${x}", "a b"],
    ["--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1", "--master-port=29515", "train.py"],
    ["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=x",
     "--rdzv-conf=last_call_timeout=1,is_host=1", "train.py"],
    ["--nproc-per-node=2", "restart=backoff", "-t", "3", "--local-ranks-filter=1",
     "--role=trainer", "--max-restarts=2", "env.NCCL_DEBUG=INFO", "train.py", "--epochs", "3"],
    ["-m", "json.tool", "--sort-keys"],
    ["--no-python", "./run.sh", "x"],
    ["--log-dir=logs", "-r", "3", "--shutdown-timeout=5", "--monitor-interval=0.5",
     "--rdzv-backend=etcd-v2", "--rdzv-endpoint=127.0.0.1:2379", "train.py"],
]  # fmt: skip


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: " ".join(w)[:40])
def test_the_job_file_plan_prints_runs_the_same_plan(
    words: list[str], here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (here / "job.yaml").write_text(cli(capsys, "--plan=yaml", *words))
    from_file = json.loads(cli(capsys, "job.yaml", "--plan=json"))
    from_words = json.loads(cli(capsys, "--plan=json", *words))
    assert same_plan(from_file, here) == same_plan(from_words, here)
    assert from_file["config_hash"] == from_words["config_hash"]


def same_plan(plan: dict[str, Any], here: Path) -> dict[str, Any]:
    """A plan without what differs between two compositions of one command: the launch's time in
    the run dir (one level deeper on several nodes) and a fresh run id."""
    plan = comparable(plan)
    plan["run_dir"] = Path(plan["run_dir"]).relative_to(here).parts[0]  # the logs root
    return plan


def test_the_text_plan_ends_with_the_job_file(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words = ["--nproc-per-node=2", "--max-restarts=1", "train.py", "--lr", "0.1"]
    text = cli(capsys, "--plan", *words)
    assert "elastic-hydra launch plan" in text
    yaml_text = text.split(YAML_HEADING + "\n", 1)[1]
    assert yaml_text == cli(capsys, "--plan=yaml", *words)
    assert yaml_text.startswith(
        "# elastic-hydra job for: elastic-hydra --nproc-per-node=2 --max-restarts=1 train.py "
        "--lr 0.1\n"
    )
    assert "defaults:\n- elastic_hydra_base\n- _self_\nscript: train.py\n" in yaml_text
    assert YAML_HEADING not in cli(capsys, "--plan", "script=train.py")  # plain: as before


def test_a_torchrun_style_launch_runs_the_plan_it_showed(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("import sys; assert sys.argv[1:] == ['--plan', 'a b']\n")
    words = [f"--log-dir={tmp_path}/logs", "--nproc-per-node=2", "--max-restarts=1", "ok.py"]
    dry = run("--plan=json", *words, "--plan", "a b", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    launched = run(*words, "--plan", "a b", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr + launched.stdout
    (plan_json,) = (tmp_path / "logs").rglob("plan.json")
    assert comparable(json.loads(plan_json.read_text())) == comparable(json.loads(dry.stdout))


def test_a_refused_flag_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run("--virtual-local-rank", "--nproc-per-node=2", "train.py", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("elastic-hydra: error: --virtual-local-rank: not supported")
    assert not (tmp_path / "eh_logs").exists()


def test_notes_come_before_the_launch(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("")
    proc = run("--node-rank=0", "--master-addr=10.9.9.9", "ok.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first == (
        "elastic-hydra: note: --master-addr=10.9.9.9 is used by a static rendezvous only; "
        "ignored with rdzv=standalone, as torchrun ignores it"
    )


def test_pet_variables_reach_a_plain_command_only_as_a_note(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("")
    proc = run("script=ok.py", "--plan=json", cwd=tmp_path, env={"PET_NPROC_PER_NODE": "3"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["nproc_per_node"] == 1
    assert "PET_NPROC_PER_NODE set: torchrun's variables apply to a torchrun-style" in proc.stderr
    via_pet = run("--plan=json", "ok.py", cwd=tmp_path, env={"PET_NPROC_PER_NODE": "3"})
    assert via_pet.returncode == 0, via_pet.stderr
    assert json.loads(via_pet.stdout)["nproc_per_node"] == 3
    assert "PET_" not in via_pet.stderr
