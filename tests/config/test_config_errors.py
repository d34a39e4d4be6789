"""Errors inside job files get the command line's one line, plus the file and line of the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from elastic_hydra.cli.run import main
from elastic_hydra.config.explain import from_omegaconf
from elastic_hydra.config.invocation import keep_as_typed
from elastic_hydra.config.schema import ElasticHydraConf
from elastic_hydra.plan import LaunchPlan
from elastic_hydra.records.summary import RunStatus, RunSummary

BASE = "defaults:\n  - elastic_hydra_base\n  - _self_\nscript: x.py\n"

OK = RunSummary(status=RunStatus.SUCCEEDED, exit_code=0)  # what a stubbed agent reports


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            "nproc_per_nod: 2\n",
            "nproc_per_nod: unknown key in job.yaml:5 (got 'nproc_per_nod'); expected a key of the "
            "job schema. Did you mean nproc_per_node?",
        ),
        (
            "restart:\n  max_restart: 3\n",
            "restart.max_restart: unknown key in job.yaml:6 (got 'restart.max_restart'); expected "
            "a key of the job schema. Did you mean restart.max_restarts?",
        ),
        (
            "stop_grace: soon\n",
            "stop_grace: not a number in job.yaml:5 (got 'soon'); expected a number.",
        ),
    ],
)
def test_a_job_file_error_is_one_line_with_its_file_and_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    body: str,
    line: str,
) -> None:
    (tmp_path / "x.py").write_text("")
    (tmp_path / "job.yaml").write_text(BASE + body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ELASTIC_HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["job.yaml", "--plan"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"elastic-hydra: error: {line}"]
    assert not (tmp_path / "eh_logs").exists()


def test_the_upstream_messages_these_lines_are_made_from() -> None:
    """The exact OmegaConf messages `from_omegaconf` reads (pinned: an upgrade that changes them
    fails here first)."""
    cfg = OmegaConf.structured(ElasticHydraConf)
    with pytest.raises(ConfigKeyError) as unknown:
        OmegaConf.merge(cfg, {"nproc_per_nod": 2})
    assert str(unknown.value).splitlines()[0] == "Key 'nproc_per_nod' not in 'ElasticHydraConf'"
    with pytest.raises(ValidationError) as wrong_type:
        OmegaConf.merge(cfg, {"stop_grace": "soon"})
    assert str(wrong_type.value).splitlines()[0] == (
        "Value 'soon' of type 'str' could not be converted to Float"
    )
    assert from_omegaconf(wrong_type.value).line() == (
        "stop_grace: not a number (got 'soon'); expected a number."
    )


# ------------------------------------------------------------- documented forms, values as typed
def plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """The plan a launch would run (plan.json), through the real command line, started nothing."""
    from elastic_hydra.launch import wiring

    plans: list[LaunchPlan] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)

        def recording(plan: LaunchPlan) -> tuple[int, RunSummary]:
            plans.append(plan)
            return 0, OK

        mp.setattr(wiring, "run", recording)
        with pytest.raises(SystemExit) as exit_info:
            main(list(args))
    assert exit_info.value.code == 0, capsys.readouterr().err
    (plan,) = plans
    return json.loads((Path(plan.run_dir) / "plan.json").read_text())  # type: ignore[no-any-return]


def test_restart_rules_take_readmes_forms_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x.py").write_text("")
    plan = plan_json(
        tmp_path,
        capsys,
        "script=x.py",
        "restart.on_exit_code={3: fail}",
        "restart.on_exit_code.4=retry",
        "restart.on_signal.SIGKILL=fail",
    )
    assert plan["restart"]["on_exit_code"] == [[3, "fail"], [4, "retry"]]
    assert plan["restart"]["on_signal"] == [[9, "fail"]]


def test_text_values_reach_the_workers_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_json(
        tmp_path, capsys, "cmd=true", "env.X=1e3", "env.BAR=true", "env.N=007", "rdzv.id=1e3"
    )
    assert plan["entrypoint"]["program"] == "true"
    assert plan["env"] == [["X", "1e3"], ["BAR", "true"], ["N", "007"]]
    assert plan["run_id"] == "1e3"
    assert keep_as_typed("nproc_per_node=2") == "nproc_per_node=2"  # numbers stay numbers
    assert keep_as_typed("env.X=1,2") == "env.X=1,2"  # a sweep stays a sweep
    assert keep_as_typed("cmd=null") == "cmd=null"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["script=train.py", "--lr", "0.1"], "--lr: not an elastic-hydra or torchrun flag (got "
         "'--lr'); the script's own arguments go after the script path (elastic-hydra train.py "
         "--lr 0.1) or after -- (script=train.py -- --lr 0.1)."),
        (["--nproc", "2", "train.py"], "--nproc: not an elastic-hydra or torchrun flag (got "
         "'--nproc'); the script's own arguments go after the script path (elastic-hydra "
         "train.py --lr 0.1) or after -- (script=train.py -- --lr 0.1). Did you mean "
         "--nproc-per-node? Abbreviated flags are not accepted."),
        (["--virtual-local-rank", "train.py"], "--virtual-local-rank: not supported by "
         "elastic-hydra (got '--virtual-local-rank'); drop it. devices=isolate gives each worker "
         "only its own GPU (cuda:0) but keeps LOCAL_RANK; index devices with cuda:0 there."),
    ],
)  # fmt: skip
def test_words_that_are_no_flag_get_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    line: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"elastic-hydra: error: {line}"]
