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
REQUIRED_PURE = ["elastic_hydra.plan", "elastic_hydra.errors"]
OPTIONAL_PURE = [
    "elastic_hydra.policy",
    "elastic_hydra.outcome",
    "elastic_hydra.env",
    "elastic_hydra.events",
]
HEAVY = ("hydra", "omegaconf", "rich")
MAY_IMPORT = {
    "hydra": {"cli.py", "resolve.py", "schema.py"},
    "omegaconf": {"cli.py", "resolve.py", "schema.py"},
    "rich": {"render.py"},
}

PROBE = """
import importlib, importlib.util, json, sys
required, optional, heavy = json.loads(sys.argv[1])
present = [m for m in optional if importlib.util.find_spec(m) is not None]
for name in [*required, *present]:
    importlib.import_module(name)
leaked = sorted(
    m for m in sys.modules if m.split(".")[0] in heavy
)
print(json.dumps({"imported": [*required, *present], "leaked": leaked}))
"""


def test_pure_modules_import_no_heavy_dependency() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([REQUIRED_PURE, OPTIONAL_PURE, HEAVY])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(REQUIRED_PURE) <= set(result["imported"])
    assert result["leaked"] == [], f"pure modules pulled in {result['leaked']}"


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
