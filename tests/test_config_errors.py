"""Errors inside job files get the command line's one line, plus the file and line of the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from elastic_hydra.cli import main
from elastic_hydra.config_errors import from_omegaconf
from elastic_hydra.schema import ElasticHydraConf

BASE = "defaults:\n  - elastic_hydra_base\n  - _self_\nscript: x.py\n"


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
