"""The layering of DESIGN.md section 3, checked rather than hoped for.

Pure modules import neither hydra, omegaconf nor rich; only cli/resolve/schema import hydra or
omegaconf, and only render imports rich.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "elastic_hydra"
PURE = [
    "elastic_hydra.plan",
    "elastic_hydra.errors",
    "elastic_hydra.policy",
    "elastic_hydra.outcome",
    "elastic_hydra.env",
    "elastic_hydra.events",
    "elastic_hydra.tracebacks",
    "elastic_hydra.gpus",
    "elastic_hydra.slurm",
    "elastic_hydra.redact",
    "elastic_hydra.store_records",
]
# Pure means no I/O, no clock, no process state: none of these may be imported.
IMPURE_STDLIB = {"os", "sys", "time", "subprocess", "socket", "pathlib", "io", "shutil", "select"}
HEAVY = ("hydra", "omegaconf", "rich")
MAY_IMPORT = {
    "hydra": {"cli.py", "resolve.py", "schema.py", "config_errors.py"},
    "omegaconf": {"cli.py", "resolve.py", "schema.py", "config_errors.py"},
    "rich": {"render.py"},
}

PROBE = """
import importlib, importlib.util, json, sys
pure, heavy = json.loads(sys.argv[1])
for name in pure:
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(json.dumps({"imported": pure, "leaked": leaked}))
"""


def probe(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    """Import `modules` in a fresh interpreter; the `heavy` modules that came with them."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([modules, heavy])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["imported"] == modules
    return list(result["leaked"])


def test_pure_modules_import_no_heavy_dependency() -> None:
    leaked = probe(PURE, HEAVY)
    assert leaked == [], f"pure modules pulled in {leaked}"


def test_pure_modules_do_no_io() -> None:
    offenders = []
    for module in PURE:
        path = PACKAGE / (module.rsplit(".", 1)[1] + ".py")
        tree = ast.parse(path.read_text(), filename=str(path))
        if bad := imported_roots(path) & IMPURE_STDLIB:
            offenders.append(f"{path.name} imports {sorted(bad)}")
        calls = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        if bad_calls := calls & {"open", "print", "input"}:
            offenders.append(f"{path.name} calls {sorted(bad_calls)}")
    assert offenders == []


def test_bootstrap_uses_the_standard_library_only() -> None:
    # It runs inside the user's interpreter, which need not have elastic-hydra installed.
    roots = imported_roots(PACKAGE / "bootstrap.py")
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every module a file imports (anywhere in it, lazy imports included)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_the_allowed_modules_import_hydra_omegaconf_rich() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert {"cli.py", "resolve.py", "schema.py", "plan.py", "errors.py"} <= {f.name for f in files}
    offenders = []
    for path in files:
        roots = imported_roots(path)
        for dependency, allowed in MAY_IMPORT.items():
            if dependency in roots and path.name not in allowed:
                offenders.append(f"{path.relative_to(REPO)} imports {dependency}")
    assert offenders == []


def test_the_checker_sees_imports() -> None:
    # The static check must not pass vacuously: it finds the imports the allowed modules do have.
    assert {"hydra", "omegaconf"} <= imported_roots(PACKAGE / "cli.py")
    assert "rich" in imported_roots(PACKAGE / "render.py")


def test_the_launch_path_loads_rich_only_for_reports() -> None:
    # rich costs about 0.1 s of every start: the CLI and the agent leave it to `render`, which
    # they import only for a failure report, a plan or a sweep table.
    assert probe(["elastic_hydra.cli", "elastic_hydra.agent"], ("rich",)) == []
