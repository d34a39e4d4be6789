"""The layering of docs/architecture.md, checked rather than hoped for.

FOLDERS is the design: which folder of the package may import which. Every folder may import the
shared words: the root (errors, plan, tracebacks, rundir, ...) and `records/` (the typed records
of a run), as if they were one. The root imports no folder, `records/` included; `records/`
imports the root only. A new edge between folders is a design decision: add it here with its
reason, or move the code.
Beside the table: hydra and omegaconf stay in `config/` (hydra's internals in the boundary
alone, and no DictConfig is read outside it), rich in the rendering modules, torch under
`rendezvous/`; the pure modules do no I/O; the bootstrap runs on the standard library; and no
module does work when it is imported.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.harness import launcher_env

PACKAGE = REPO / "elastic_hydra"
ROOT = "(root)"
RECORDS = "records"
SHARED = {ROOT, RECORDS}  # the shared words: every folder may import them (not a row's edges)
FOLDERS: dict[str, set[str]] = {
    "cli": {"torchrun", "config", "launch", "hangs", "report",
            "rendezvous",  # `rdzv-server` runs the store server of rendezvous/
            "observe",
            "quarantine",  # `top`
            "schedulers",  # `--plan` names the detected scheduler, prints manifests
            "warm",  # the entry point starts the warm template before the composition
            "checkpoint"},  # --plan says what a launch would resume from
    "torchrun": set(),
    "config": {"schedulers"},  # `eh.launch` names a Slurm step's run directory (its `slurm`)
    "resolve": {"config", "schedulers"},  # rdzv=kubeflow... read their scheduler's variables
    "launch": {"config", "resolve", "agent", "workers", "rendezvous", "hangs", "report",
               "observe",
               "quarantine",  # the status publisher and metrics; the ledger's gate
               "preflight",  # the battery between a round and the workers
               "stragglers",  # the straggler watch beside the hang watch
               "failures",  # a failed worker's class, from its record and the kernel log
               "warm",
               "checkpoint"},  # the snapshot area and the checkpoint home of the workers
    "agent": set(),
    "workers": {"agent"},
    "rendezvous": {"agent"},
    "hangs": {"agent", "workers"},  # the /proc reader of the watch (workers.procfs)
    "report": {"hangs", "agent", "resolve"},
    "sweeps": {"report", "resolve"},
    "observe": {"agent", "workers"},  # the events it folds; the /proc reader (workers.procfs)
    "quarantine": set(),  # the ledger and the gate: launch wires it, cli edits it
    "warm": {"workers", "agent"},  # the spawner seam of supervise; the worker environment
    "preflight": {"agent"},
    "stragglers": {"agent"},  # the watch's seams (JobShare, NodeAssignment)
    "schedulers": set(),
    "failures": set(),  # the classifier on records; the kernel log's reader
    # The worker environment's names, the node exchange seam; the /proc reader (a dead agent).
    "checkpoint": {"agent", "workers"},
    RECORDS: set(),  # imports the root only; every folder may import it, as it may the root
    ROOT: set(),  # imports no folder, records/ included
}  # fmt: skip
# Pure: no I/O, no clock, no process state. Whole folders, and these shared words of the root.
PURE_FOLDERS = ("agent", "torchrun", "schedulers", "records")
PURE_ROOT = ("plan", "errors", "jsonrecord", "tracebacks", "gpus", "redact", "durations")
PURE_MORE = (
    "hangs.verdict",
    "failures.classify",
    "stragglers.score",
    "rendezvous.sealed_records",
    "report.goodput",
    "report.timeline",
    "report.gantt",
    "observe.status",
    "preflight.verdict",
    "preflight.results",
)
IMPURE_STDLIB = {"os", "sys", "time", "subprocess", "socket", "pathlib", "io", "shutil", "select"}
HEAVY = ("hydra", "omegaconf", "rich")
# Third-party imports, by the folder or module that may make them.
MAY_IMPORT = {
    "hydra": {"config"},
    "omegaconf": {"config"},
    # report's three renderers (failure report, plan, history), the pool's live view, top's.
    "rich": {"report.render", "report.history", "report.plan_view", "sweeps.view",
             "observe.view"},  # `top`'s table
    # The preflight probe runs in the preflight's worker processes (python -m), never in an
    # agent: no module imports it (test_the_preflight_probe_is_run_not_imported).
    # The snapshot codec runs in the workers, with the torch their script imported.
    "torch": {"rendezvous", "preflight.probe", "checkpoint.codec"},
}  # fmt: skip


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name under `elastic_hydra` (`agent.executor`)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        if rel.parts[0] != "conf":
            found[".".join(rel.parts)] = path
    return found


def folder_of(module: str) -> str:
    head = module.split(".", maxsplit=1)[0]
    return head if (PACKAGE / head).is_dir() else ROOT


def internal_imports(path: Path) -> set[str]:
    """The package's modules a file imports (anywhere in it, lazy imports included), dotted."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "elastic_hydra":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("elastic_hydra."):
                name = node.module.removeprefix("elastic_hydra.")
                if (PACKAGE / name).is_dir():  # `from elastic_hydra.agent import seams`
                    found |= {f"{name}.{alias.name}" for alias in node.names}
                else:
                    found.add(name)
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("elastic_hydra.")
                for a in node.names
                if a.name.startswith("elastic_hydra.")
            }
    return {m for m in found if m.split(".")[0] != "conf"}


def folder_edges(path: Path, module: str) -> set[str]:
    """The folders a module imports besides its own and the shared words (for the root and
    records/, the root alone: an import of records/ from the root is an edge)."""
    own = folder_of(module)
    shared = {ROOT} if own in SHARED else SHARED
    return {folder_of(m) for m in internal_imports(path)} - {own} - shared


def test_every_folder_is_in_the_table_and_teaches_what_it_owns() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} - {"conf"}
    assert folders | {ROOT} == set(FOLDERS)
    for name in folders:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) >= 5, f"{name}/__init__.py needs a docstring"


def folder_doc(folder: str) -> str:
    """The docstring of a folder's `__init__.py` (the root's: the package's)."""
    init = PACKAGE / ("" if folder == ROOT else folder) / "__init__.py"
    return ast.get_docstring(ast.parse(init.read_text())) or ""


def test_every_folders_docstring_names_each_of_its_modules() -> None:
    # The docstring is the folder's map: a module it does not name is a stale map. The package's
    # names every folder and every module of the root.
    missing = [
        f"{folder}: {module}"
        for folder in FOLDERS
        for module in sorted(m.rpartition(".")[2] for m in modules() if folder_of(m) == folder)
        if module not in ("__init__", "__main__") and f"`{module}`" not in folder_doc(folder)
    ]
    missing += [f"(root): {f}/" for f in FOLDERS if f != ROOT and f"{f}/" not in folder_doc(ROOT)]
    assert missing == []


# "Imports: agent (the seams it implements) and the root." Its first sentence names the folders
# of the table's row (the shared words, the root and records/, may be named or not).
IMPORTS = re.compile(r"^Imports: (.*?)\.(?:\s|$)", re.MULTILINE | re.DOTALL)


def imports_said(doc: str) -> set[str] | None:
    """The folders the `Imports:` line of a docstring names, besides the shared words."""
    said = IMPORTS.search(doc)
    return (
        None if said is None else set(re.findall(r"[a-z]+", said.group(1))) & set(FOLDERS) - SHARED
    )


def test_every_folders_docstring_says_what_it_imports_as_the_table_does() -> None:
    wrong = {
        folder: imports_said(folder_doc(folder))
        for folder in FOLDERS
        if folder != ROOT and imports_said(folder_doc(folder)) != FOLDERS[folder]
    }
    assert wrong == {}
    # Not vacuous: the line is read up to its first full stop, folder names only.
    doc = "Imports: workers (the /proc reader), agent and the root. `launch` wires it."
    assert imports_said(doc) == {"workers", "agent"} and imports_said("Imports go") is None


def test_imports_between_folders_follow_the_table() -> None:
    offenders = [
        f"{module} ({folder_of(module)}) imports {sorted(bad)}"
        for module, path in modules().items()
        if module != "__main__"  # `python -m elastic_hydra` is the console entry, cli.entry
        if (bad := folder_edges(path, module) - FOLDERS[folder_of(module)])
    ]
    assert offenders == []


def test_the_table_checker_sees_imports() -> None:
    # Not vacuous: it finds the edges the modules do have, and would flag a wrong one.
    found = modules()
    assert folder_edges(found["cli.plan"], "cli.plan") >= {"config", "launch", "report"}
    assert folder_edges(found["launch.wiring"], "launch.wiring") >= {"agent", "workers"}
    assert folder_edges(found["launch.wiring"], "launch.wiring") - FOLDERS["agent"]
    assert "agent.seams" in internal_imports(found["agent.executor"])
    # records/ is a shared word for the folders, an edge for the root.
    assert "records.failures" in internal_imports(found["agent.seams"])
    assert folder_edges(found["agent.seams"], "agent.seams") == set()
    assert folder_edges(found["records.summary"], "plan") == {RECORDS}  # as if in the root


def test_the_table_is_a_one_way_design() -> None:
    # No cycle between folders: a folder never reaches back to one that imports it.
    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in FOLDERS[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    assert [f for f in FOLDERS if f in reach(f)] == []


def test_hydra_internals_are_imported_by_the_boundary_only() -> None:
    users = {m for m, path in modules().items() if "hydra._internal" in path.read_text()}
    assert users == {"config.boundary"}


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
    leaked = probe(["elastic_hydra.agent.executor"], ("subprocess", "ctypes", "hydra", "omegaconf"))
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


PURE = sorted(
    m for m in modules() if folder_of(m) in PURE_FOLDERS or m in PURE_ROOT or m in PURE_MORE
)


def may_import(module: str, dependency: str) -> bool:
    allowed = MAY_IMPORT[dependency]
    return module in allowed or folder_of(module) in allowed


def test_pure_modules_import_no_heavy_dependency() -> None:
    leaked = probe(["elastic_hydra." + m for m in PURE], HEAVY)
    assert leaked == [], f"pure modules pulled in {leaked}"


def test_pure_modules_do_no_io() -> None:
    found = modules()
    offenders = []
    for module in PURE:
        path = found[module]
        if bad := {m for m in internal_imports(path) if m in found} - set(PURE):
            offenders.append(f"{module} imports impure {sorted(bad)}")
        tree = ast.parse(path.read_text(), filename=str(path))
        if bad := imported_roots(path) & IMPURE_STDLIB:
            offenders.append(f"{module} imports {sorted(bad)}")
        calls = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        if bad_calls := calls & {"open", "print", "input"}:
            offenders.append(f"{module} calls {sorted(bad_calls)}")
    assert offenders == []


@pytest.mark.parametrize("module", ["bootstrap", "recorder"])
def test_bootstrap_uses_the_standard_library_only(module: str) -> None:
    # It runs inside the user's interpreter, which need not have elastic-hydra installed (and
    # loads `recorder` beside it by path).
    roots = imported_roots(PACKAGE / "workers" / f"{module}.py")
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots


def test_warm_template_uses_the_standard_library_only() -> None:
    # The template becomes every warm worker: nothing of the agent's dependencies may be in it.
    roots = imported_roots(PACKAGE / "warm" / "template.py")
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
    offenders = [
        f"{module} imports {dependency}"
        for module, path in modules().items()
        for dependency in MAY_IMPORT
        if dependency in imported_roots(path) and not may_import(module, dependency)
    ]
    assert offenders == []


def test_no_dictconfig_is_read_outside_config() -> None:
    # The boundary hands each composed job on as a `config.composed.Composed`; the rest reads
    # its plain values, never Hydra's object (a name or attribute, imported or passed along).
    offenders = [
        module
        for module, path in modules().items()
        if folder_of(module) != "config" and {"DictConfig", "dictconfig"} & names_used(path)
    ]
    assert offenders == []
    assert "dictconfig" in names_used(PACKAGE / "config" / "composed.py")  # not vacuous


def names_used(path: Path) -> set[str]:
    """Every name and attribute a file's code mentions (docstrings and comments aside)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.id if isinstance(node, ast.Name) else node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Name | ast.Attribute)
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_checker_sees_imports() -> None:
    # The static check must not pass vacuously: it finds the imports the allowed modules do have.
    found = modules()
    assert {"hydra", "omegaconf"} <= imported_roots(found["config.boundary"])
    assert "rich" in imported_roots(found["report.render"])
    assert "torch" in imported_roots(found["rendezvous.torch_backend"])
    assert not may_import("agent.executor", "torch") and not may_import("cli.run", "rich")


def test_the_preflight_probe_is_run_not_imported() -> None:
    # The probe imports torch (~2 s a process): it runs in the preflight's worker processes as
    # `python -m elastic_hydra.preflight.probe`; an agent that imported it would pay for torch.
    importers = [m for m, path in modules().items() if "preflight.probe" in internal_imports(path)]
    assert importers == []
    assert "torch" in imported_roots(modules()["preflight.probe"])


# The pool plugin is a front end of its own: Hydra calls it, it drives a sweep.
PLUGIN_MAY = {"sweeps", "launch", "resolve", "report"} | SHARED


def test_the_pool_plugin_imports_follow_the_table() -> None:
    offenders = [
        f"{path.name} imports {module}"
        for path in sorted(PLUGIN.glob("*.py"))
        for module in internal_imports(path)
        if folder_of(module) not in PLUGIN_MAY
    ]
    assert offenders == []
    roots = set().union(*(imported_roots(p) for p in PLUGIN.glob("*.py")))
    assert "torch" not in roots and "rich" not in roots


def test_the_launch_path_loads_rich_only_for_reports() -> None:
    # rich costs about 0.1 s of every start: the CLI and the agent leave it to `render`, which
    # they import only for a failure report, a plan or a sweep table.
    assert probe(["elastic_hydra.cli.run", "elastic_hydra.launch.wiring"], ("rich",)) == []


SIDE_EFFECTS = """
import ctypes, importlib, json, shutil, socket, sys
import hydra, omegaconf, rich  # third-party imports may do what they like
def refuse(*args, **kwargs):
    raise AssertionError("called at import time")
ctypes.CDLL = refuse
shutil.which = refuse
socket.gethostname = refuse
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except AssertionError as exc:
        failed[name] = str(exc)
print(json.dumps(failed))
"""


def test_no_module_does_work_when_imported() -> None:
    # No ctypes.CDLL, shutil.which or gethostname at import: each would run in every process
    # that imports the module (the pool plugin is imported by every Hydra start).
    names = ["elastic_hydra." + m for m in modules() if m != "__main__"]
    names.append("hydra_plugins.elastic_hydra_pool.pool_launcher")
    proc = subprocess.run(
        [sys.executable, "-c", SIDE_EFFECTS, json.dumps(names)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}


def test_the_tests_mirror_the_folders() -> None:
    # A folder's tests live in tests/<folder>/; the root's and whole-project checks in tests/.
    tests = REPO / "tests"
    mirrored = {p.name for p in tests.iterdir() if (p / "__init__.py").exists()}
    assert mirrored == set(FOLDERS) - {ROOT}
    assert all(list((tests / name).glob("test_*.py")) for name in mirrored)


# What only some launches need, loaded where it is used: a plain launch (one node, `preflight=off`,
# no ledger, no metrics, no --plan, no torchrun flags) has loaded none of it when its first worker
# starts. A package stands for its modules.
NOT_ON_THE_LAUNCH_PATH = (
    "elastic_hydra.cli.plan",  # --plan
    "elastic_hydra.cli.report",  # `report`
    "elastic_hydra.config.explain",  # a user's mistake, explained
    "elastic_hydra.config.jobfile",  # a job file's own checks
    "elastic_hydra.resolve.kubernetes",  # --plan=jobset|trainjob
    "elastic_hydra.launch.preflight",  # preflight=quick|full
    "elastic_hydra.preflight",
    "elastic_hydra.quarantine",  # quarantine.ledger=PATH
    "elastic_hydra.torchrun",  # a torchrun-style command: its flags, a script named, PET_*
    "elastic_hydra.schedulers",  # rdzv=slurm|auto|kubeflow|..., a run dir named in a Slurm step
    "elastic_hydra.observe.metrics",  # metrics.port|textfile
    "prometheus_client",
    "elastic_hydra.report.render",  # a failure's report: a launch that succeeds never renders
    "rich",
    "elastic_hydra.report.goodput",  # the ledger, computed when the agent ends
    "elastic_hydra.rendezvous.torch_backend",  # rdzv=c10d|etcd|...
    "torch",
)
# A plain launch run to its end; what the launcher had loaded when it started its first worker
# (the Popen whose argv names the script) is written to the file named by argv[2].
AT_THE_FIRST_WORKER = """
import json, sys
script, out, logs = sys.argv[1:]
started = []
def at_the_first_worker(event, args):
    if event == "subprocess.Popen" and not started and script in map(str, args[1] or ()):
        started.append(script)
        with open(out, "w") as f:
            json.dump(sorted(sys.modules), f)
sys.addaudithook(at_the_first_worker)
sys.argv = ["elastic-hydra", "script=" + script, "nproc_per_node=2", "logs.root=" + logs]
from elastic_hydra.cli.entry import main
main()
"""


def test_a_plain_launch_loads_only_what_it_runs(tmp_path: Path) -> None:
    script, loaded_file = tmp_path / "hello.py", tmp_path / "loaded.json"
    script.write_text("print('hi')\n")
    # Not a Slurm job, no PET_*: those would rightly load the schedulers, torchrun's flags.
    env = {k: v for k, v in launcher_env().items() if not k.startswith(("SLURM_", "PET_"))}
    proc = subprocess.run(
        [sys.executable, "-c", AT_THE_FIRST_WORKER, str(script), str(loaded_file),
         str(tmp_path / "logs")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert loaded_file.exists(), "no worker was started with subprocess.Popen"
    loaded = json.loads(loaded_file.read_text())
    assert {"elastic_hydra.launch.wiring", "hydra"} <= set(loaded)  # not vacuous
    leaked = [m for m in loaded for p in NOT_ON_THE_LAUNCH_PATH if m == p or m.startswith(p + ".")]
    assert leaked == []
