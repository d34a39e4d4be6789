"""One owner of a run's file names: `elastic_hydra/rundir.py` spells them, no other module does.

Every other module asks `RunDir` (a launch's files) or `SweepDir` (a sweep's) for a path, so a
renamed file or a new layout is one edit. Docstrings and comments may name the files; code may not.
The tests themselves spell the names: they check the layout users see.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

OWNER = REPO / "elastic_hydra" / "rundir.py"
SOURCES = sorted((REPO / "elastic_hydra").rglob("*.py")) + sorted(
    (REPO / "hydra_plugins").rglob("*.py")
)
# The names of a run dir and a sweep dir, and logs.root's default, as rundir.py spells them.
NAMES = (
    "plan.json", "config.yaml", "events.jsonl", "summary.json", "result.json", "console.log",
    ".hydra", "hydra.yaml", "overrides.yaml", "attempt_", "stdout.log", "stderr.log",
    "error.json", "fault.log", "stacks.txt", "pool.json", "eh_logs", "status.json",
)  # fmt: skip
WHOLE = ("progress",)  # a common word: only a literal that is the name alone counts
# Where a name may stay, and why.
ALLOWED = {
    # torchrun/ is pure (tests/test_layering.py) and may not import rundir: its refusal of
    # --event-log-handler names the file in words.
    ("elastic_hydra/torchrun/flags.py", "events.jsonl"),
    # `top`'s column of what the last progress was: a header, not the progress file.
    ("elastic_hydra/observe/view.py", "progress"),
}
_PATTERN = re.compile(
    "|".join(
        [rf"(?<![\w.-]){re.escape(name)}(?![\w-])" for name in NAMES if name != "attempt_"]
        + [r"(?<![\w.-])attempt_(?![a-z])"]  # attempt_3, attempt_<n>, f"attempt_{n}"
    )
)


def literals(path: Path) -> list[tuple[int, str]]:
    """The string literals of a file's code (f-strings' literal parts included), docstrings
    left out, with their line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def spelled(text: str) -> set[str]:
    """The run-dir names a literal spells."""
    found = {m.group(0) for m in _PATTERN.finditer(text)}
    return found | {name for name in WHOLE if text == name}


def test_no_module_but_rundir_spells_a_file_name_of_a_run() -> None:
    found = [
        (str(path.relative_to(REPO)), line, name, text)
        for path in SOURCES
        if path != OWNER
        for line, text in literals(path)
        for name in sorted(spelled(text))
    ]
    offenders = [
        f"{rel}:{line}: {name!r} in {text!r:.80}"
        for rel, line, name, text in found
        if (rel, name) not in ALLOWED
    ]
    assert offenders == []
    assert {(rel, name) for rel, _, name, _ in found} >= ALLOWED  # no stale exception


def test_the_check_sees_the_names_where_they_are_spelled() -> None:
    # Not vacuous: rundir.py itself spells every name, and the matcher tells names from words.
    owned = {name for _, text in literals(OWNER) for name in spelled(text)}
    assert owned == set(NAMES) | set(WHOLE)
    assert spelled("attempt_") == {"attempt_"} and spelled("*/result.json") == {"result.json"}
    assert spelled("no summary.json in this directory") == {"summary.json"}
    assert not spelled("no rank made progress for 30 s") | spelled("attempt_runtime")
    assert not spelled("job.hydra.yaml") | spelled("my_eh_logs") | spelled("job_config.yaml")
    summary = REPO / "elastic_hydra" / "records" / "summary.py"  # its docstring names summary.json
    doc = literals(summary)
    assert not any(spelled(text) for _, text in doc)


def test_runs_and_a_sweeps_jobs_are_found_by_the_files_users_see(tmp_path: Path) -> None:
    from elastic_hydra.rundir import SweepDir, finished_runs, running_runs

    for run, files in {"a/1": ("events.jsonl", "summary.json"), "b": ("events.jsonl",)}.items():
        (tmp_path / run).mkdir(parents=True)
        for name in files:
            (tmp_path / run / name).write_text("{}")
    assert [r.root for r in finished_runs(tmp_path)] == [tmp_path / "a" / "1"]
    assert [r.root for r in running_runs(tmp_path)] == [tmp_path / "b"]
    assert finished_runs(tmp_path / "missing") == []
    sweep = SweepDir(tmp_path / "a")
    (tmp_path / "a" / "10" / "node1").mkdir(parents=True)
    (tmp_path / "a" / "10" / "node1" / "result.json").write_text("{}")
    assert sweep.job_results() == [
        (tmp_path / "a" / "1" / "result.json",),
        (tmp_path / "a" / "10" / "result.json", tmp_path / "a" / "10" / "node1" / "result.json"),
    ]
    assert (sweep.pool.name, SweepDir(tmp_path / "none").job_results()) == ("pool.json", [])
