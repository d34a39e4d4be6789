"""Defaults and help have one source, the schema: the keys table of the docs (docs/job-files.md),
`--help` and the plan's own defaults are checked against it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from elastic_hydra.config import schema
from elastic_hydra.plan import CheckpointSpec, LaunchPlan
from tests.conftest import ELASTIC_HYDRA, REPO
from tests.harness import plan_of

JOB_FILES_PAGE = REPO / "docs" / "job-files.md"
START = (
    "<!-- keys: generated from elastic_hydra/config/schema.py; "
    "tests/config/test_defaults_docs.py keeps it equal -->"
)
END = "<!-- keys: end -->"
REGENERATE = (
    "the keys table of docs/job-files.md drifted from the schema; paste the output of\n"
    "  python -c 'from elastic_hydra.config import schema; print(schema.keys_markdown())'\n"
    f"between the lines {START!r} and {END!r}"
)


def test_the_docs_keys_table_is_the_schemas() -> None:
    text = JOB_FILES_PAGE.read_text()
    table = text[text.index(START) + len(START) : text.index(END)].strip()
    assert table == schema.keys_markdown(), REGENERATE


def test_every_key_has_help_and_the_table_has_every_key() -> None:
    rows = schema.keys_help()
    keys = [k for k, _, _ in rows]
    assert len(keys) == len(set(keys))
    free = {"env", "hp"}
    assert {k for k in keys if not k.endswith(".NAME")} | free == set(schema.schema_keys()) | free
    assert all(len(h) > 10 for _, _, h in rows)


def test_help_lists_every_key_with_its_default(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*ELASTIC_HYDRA, "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for key, default, _ in schema.keys_help():
        assert re.search(rf"^  {re.escape(key)} +{re.escape(default)} ", proc.stdout, re.M), key
    assert "70 a bug in elastic-hydra" in proc.stdout


def test_the_plans_own_defaults_are_the_schemas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan is pure and cannot read the schema: its dataclass defaults (used by code that
    # builds plans directly, the tests' fakes included) must equal what the schema resolves to.
    (tmp_path / "x.py").write_text("")
    monkeypatch.chdir(tmp_path)
    resolved = plan_of("script=x.py")
    required = {
        f.name: getattr(resolved, f.name)
        for f in dataclasses.fields(LaunchPlan)
        if f.default is dataclasses.MISSING
    }
    assert resolved.checkpoint is not None
    home = resolved.checkpoint.home  # the job's: where it runs, what it runs
    per_launch = LaunchPlan(
        **required, run_dir=resolved.run_dir, config_hash=resolved.config_hash,
        launch_time=resolved.launch_time,
        checkpoint=CheckpointSpec(home=home, job=resolved.checkpoint.job),
    )  # fmt: skip
    assert per_launch == resolved
