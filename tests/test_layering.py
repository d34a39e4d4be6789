"""The layering of DESIGN.md section 3, checked rather than hoped for.

ALLOWED is the table of internal imports: each module and the modules of the package it may
import (lazy imports included). A new edge is a design decision: add it here, or move the code.
Pure modules import no I/O and nothing heavy; hydra and omegaconf stay in the front end (hydra's
internals in the boundary alone), rich in `render`, torch in the torch rendezvous adapter and the
store server.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "elastic_hydra"
FRONT = {"errors", "schema", "plan", "redact"}
RUNTIME = {"errors", "events", "outcome", "plan", "records", "seams"}
ALLOWED: dict[str, set[str]] = {
    # entry and the front end: argv, Hydra, config errors, the job
    "__main__": {"entry"},
    "entry": {"cli", "rdzv_server", "stopsignals"},
    "cli": FRONT | {"argv", "config_errors", "hydra_boundary", "job", "jobfile", "jobyaml",
                    "records", "render", "rundir", "stacks", "stopsignals"},
    "jobyaml": {"argv", "hydra_boundary", "redact"},  # a command as a job file (--plan)
    "argv": {"errors", "schema", "torchrun_cli", "torchrun_rdzv"},
    # torchrun's command line and PET_* variables, as our keys (pure)
    "torchrun_cli": {"errors", "torchrun_logs", "torchrun_rdzv"},
    "torchrun_logs": {"errors", "torchrun_rdzv"},
    "torchrun_rdzv": {"errors"},
    "hydra_boundary": {"argv", "errors", "schema", "slurm"},  # slurm: a Slurm step's run dir
    "config_errors": {"errors", "jobfile", "schema"},
    "jobfile": {"errors"},
    "schema": set(),
    "job": FRONT | {"agent", "argv", "hydra_boundary", "notices", "records", "render", "resolve",
                    "rundir", "stopsignals"},
    # resolution: the only place that validates configuration
    "resolve": FRONT | {"config_errors", "devices", "resolve_entry", "resolve_gpus",
                        "resolve_runtime", "resolve_topology"},
    "resolve_entry": {"errors", "plan", "schema"},
    "resolve_topology": {"errors", "plan", "resolve_runtime", "schema", "slurm"},
    "resolve_runtime": {"errors", "plan", "schema"},
    "resolve_gpus": {"errors", "gpus"},
    "devices": {"gpus"},
    # the agent: wiring, the loop and what implements its seams
    "agent": RUNTIME | {"capture", "contain", "env", "executor", "hang_watch", "logpump",
                        "notices", "redact", "render", "rendezvous", "rendezvous_torch", "rundir",
                        "stopsignals", "summary", "supervise"},
    "executor": {"errors", "events", "outcome", "plan", "policy", "records", "seams"},
    "supervise": {"contain", "errors", "logpump", "rundir", "seams"},
    "rendezvous": {"outcome", "plan", "seams"},
    "rendezvous_torch": RUNTIME | {"hang_share", "job_store", "rendezvous", "store_records",
                                   "torch_handler"},
    "torch_handler": {"errors", "plan", "rendezvous"},
    "hang_share": {"hangs", "records"},
    "job_store": {"seams", "store_records"},
    "rdzv_server": {"rendezvous", "stopsignals"},
    "contain": {"env"},
    "stopsignals": {"logpump"},
    "capture": {"outcome", "records", "rundir", "tracebacks"},
    "summary": {"outcome", "plan", "records", "tracebacks"},
    "render": {"gpus", "hangs", "notices", "plan", "records", "redact", "tracebacks"},
    "notices": {"events", "records"},
    # the pool of a sweep (the Hydra side is the plugin, hydra_plugins.elastic_hydra_pool)
    "pool": {"errors", "gpus", "records", "rundir", "stopsignals"},
    "render_pool": {"pool", "records", "render", "tracebacks"},
    "logpump": set(),
    "rundir": set(),
    "hang_watch": {"env", "hangs", "plan", "records", "rundir", "seams", "tracebacks"},
    "stacks": {"errors", "hang_watch", "hangs", "records", "rundir", "tracebacks"},
    "bootstrap": set(),  # runs inside the user's interpreter: the standard library only
    # pure
    "seams": {"events", "outcome", "plan", "records"},
    "hangs": {"records", "tracebacks"},
    "outcome": {"errors", "records", "tracebacks"},
    "records": set(),
    "env": {"plan", "seams"},
    "plan": {"gpus"},
    "policy": {"plan"},
    "errors": set(),
    "events": set(),
    "tracebacks": set(),
    "gpus": set(),
    "slurm": set(),
    "redact": set(),
    "store_records": set(),
    "__init__": set(),
}  # fmt: skip
PURE = [
    "elastic_hydra." + name
    for name in ("plan", "errors", "policy", "outcome", "records", "seams", "env", "events",
                 "tracebacks", "gpus", "slurm", "redact", "store_records", "torchrun_cli",
                 "torchrun_logs", "torchrun_rdzv")
]  # fmt: skip
# Pure means no I/O, no clock, no process state: none of these may be imported.
IMPURE_STDLIB = {"os", "sys", "time", "subprocess", "socket", "pathlib", "io", "shutil", "select"}
HEAVY = ("hydra", "omegaconf", "rich")
MAY_IMPORT = {
    "hydra": {"argv", "cli", "config_errors", "hydra_boundary", "schema"},
    "omegaconf": {"config_errors", "hydra_boundary", "job", "jobyaml", "resolve", "schema"},
    "rich": {"render", "render_pool"},
    "torch": {"rendezvous_torch", "rdzv_server", "torch_handler"},
}


def internal_imports(path: Path) -> set[str]:
    """The package's modules a file imports (anywhere in it, lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "elastic_hydra":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("elastic_hydra."):
            found.add(str(node.module).split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {
                a.name.split(".")[1] for a in node.names if a.name.startswith("elastic_hydra.")
            }
    return found - {"conf"}


def test_every_module_is_in_the_table() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(ALLOWED)


def test_internal_imports_follow_the_table() -> None:
    offenders = [
        f"{path.stem} imports {sorted(extra)}"
        for path in sorted(PACKAGE.glob("*.py"))
        if (extra := internal_imports(path) - ALLOWED[path.stem])
    ]
    assert offenders == []


def test_the_table_checker_sees_imports() -> None:
    # Not vacuous: it finds the edges the modules do have.
    assert {"hydra_boundary", "job", "argv"} <= internal_imports(PACKAGE / "cli.py")
    assert "seams" in internal_imports(PACKAGE / "executor.py")


def test_hydra_internals_are_imported_by_the_boundary_only() -> None:
    users = {path.stem for path in PACKAGE.glob("*.py") if "hydra._internal" in path.read_text()}
    assert users == {"hydra_boundary"}


PLUGIN = REPO / "hydra_plugins" / "elastic_hydra_pool"


def test_the_pool_plugin_uses_hydras_public_api_and_imports_lightly() -> None:
    # Hydra imports every plugin module at each start, whatever the launcher: no internals, and
    # nothing of ours until a pool sweep runs.
    assert not [p.name for p in PLUGIN.glob("*.py") if "hydra._internal" in p.read_text()]
    assert not (REPO / "hydra_plugins" / "__init__.py").exists()  # a namespace package
    leaked = probe(["hydra_plugins.elastic_hydra_pool.pool_launcher"], ("elastic_hydra", "rich"))
    assert leaked == []


def test_the_executor_loads_no_process_machinery() -> None:
    # The loop is composed of seams: importing it starts no subprocess or ctypes machinery.
    leaked = probe(["elastic_hydra.executor"], ("subprocess", "ctypes", "hydra", "omegaconf"))
    assert leaked == []


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
        if bad := internal_imports(path) - {m.rsplit(".", 1)[1] for m in PURE}:
            offenders.append(f"{path.name} imports impure {sorted(bad)}")
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


def test_only_the_allowed_modules_import_hydra_omegaconf_rich_torch() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        roots = imported_roots(path)
        for dependency, allowed in MAY_IMPORT.items():
            if dependency in roots and path.stem not in allowed:
                offenders.append(f"{path.relative_to(REPO)} imports {dependency}")
    assert offenders == []


def test_the_checker_sees_imports() -> None:
    # The static check must not pass vacuously: it finds the imports the allowed modules do have.
    assert {"hydra", "omegaconf"} <= imported_roots(PACKAGE / "hydra_boundary.py")
    assert "rich" in imported_roots(PACKAGE / "render.py")
    assert "torch" in imported_roots(PACKAGE / "rendezvous_torch.py")
    assert "torch" in imported_roots(PACKAGE / "torch_handler.py")


def test_the_launch_path_loads_rich_only_for_reports() -> None:
    # rich costs about 0.1 s of every start: the CLI and the agent leave it to `render`, which
    # they import only for a failure report, a plan or a sweep table.
    assert probe(["elastic_hydra.cli", "elastic_hydra.agent"], ("rich",)) == []
