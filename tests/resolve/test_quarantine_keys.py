"""`quarantine.*` and `timeouts.collective` resolved into the plan, and refused as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import QuarantineSpec
from tests.harness import plan_of


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    return tmp_path


def test_no_ledger_by_default_and_a_relative_one_made_absolute(in_tmp: Path) -> None:
    assert plan_of("script=train.py").quarantine is None
    plan = plan_of("script=train.py", "quarantine.ledger=ledger.json", "quarantine.cooldown=2h")
    assert plan.quarantine == QuarantineSpec(ledger=str(in_tmp / "ledger.json"), cooldown=7200)
    assert plan_of("script=train.py", "quarantine.ledger=x", "quarantine.cooldown=90").quarantine


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("quarantine.cooldown=soon", "quarantine.cooldown: not a duration (got 'soon'); expected"),
        ("quarantine.cooldown=0", "quarantine.cooldown: not a duration"),
        ("quarantine.ledger=no/such/dir/l.json", "quarantine.ledger: its directory does not"),
        ("quarantine.ledger=.", "quarantine.ledger: is a directory"),
        ("timeouts.collective=0", "timeouts.collective: must be positive"),
    ],
)
def test_bad_values_are_one_line(in_tmp: Path, override: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_of("script=train.py", override)
    assert caught.value.line().startswith(line)
