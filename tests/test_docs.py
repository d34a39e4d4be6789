"""The docs stay true: README is short and points at the pages, every page is in mkdocs.yml's
nav, every link and every path of the repository they name exists, the tables copied from the
code equal it, and the commands they show run.

A runnable command is a line that starts with `$ ` inside a ```console block of README.md or of
a page (the convention is written down in docs/development.md): `$ [NAME=value ...]
elastic-hydra ...`, continued on the next line after a trailing backslash, expected to exit 0 or
the code of a trailing `# exit N`. The commands of a page run in order, without a shell, in one
scratch directory holding a copy of examples/. An `elastic-hydra: error:` line shown under a
command is what it printed.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from tests.conftest import ELASTIC_HYDRA, REPO
from tests.test_layering import FOLDERS, ROOT

DOCS = REPO / "docs"
README = REPO / "README.md"
PAGES = sorted(DOCS.rglob("*.md"))
README_MAX_LINES = 150
COMMAND_TIMEOUT = 60  # seconds for one command; each is a plain-Python job of a second or two
# The launcher reads these from its environment (PET_*, a Slurm step, an enclosing launch): a
# command shown in the docs must mean the same wherever the suite runs.
SCRUBBED = (
    "PET_",
    "SLURM_",
    "TORCHELASTIC_",
    "ELASTIC_HYDRA_",
    "TORCH_ELASTIC_",
    "SKYPILOT_",
    "DSTACK_",
    "JOBSET_",
    "JOB_COMPLETION_INDEX",
    "REPLICATED_JOB_NAME",
)
# Paths of the repository the docs may name; each one named must exist.
REPO_PATH = re.compile(r"^(?:elastic_hydra|tests|benchmarks|examples|hydra_plugins|conf|docs)/\S*$")
FENCE = "```"


def markdown_files() -> list[Path]:
    return [README, *PAGES]


def prose_and_code(text: str) -> tuple[list[str], list[str]]:
    """The lines of a markdown text outside fenced code blocks, and those inside them."""
    prose: list[str] = []
    code: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith(FENCE):
            fenced = not fenced
        elif fenced:
            code.append(line)
        else:
            prose.append(line)
    return prose, code


def code_spans(line: str) -> list[str]:
    """The contents of a line's inline code spans (`x`, ``x``)."""
    return [m.group(2).strip() for m in re.finditer(r"(`+)(.+?)\1", line)]


def without_code_spans(line: str) -> str:
    return re.sub(r"(`+).+?\1", "", line)


def slug(heading: str) -> str:
    """A heading's anchor, as Python-Markdown's toc (mkdocs) makes it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    prose, _ = prose_and_code(page.read_text())
    return {slug(line.lstrip("#")) for line in prose if re.match(r"#{1,6} ", line)}


def links(page: Path) -> list[str]:
    """The targets of a page's markdown links and images, outside code."""
    prose, _ = prose_and_code(page.read_text())
    return [
        m.group(1)
        for line in prose
        for m in re.finditer(r"\]\(([^)\s]+)\)", without_code_spans(line))
    ]


# ---------------------------------------------------------------------------- README and the nav


def test_readme_is_short_and_links_every_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md: move the detail to docs/"
    linked = {(README.parent / t.split("#")[0]).resolve() for t in links(README)}
    assert [p.name for p in PAGES if p.resolve() not in linked and p.name != "index.md"] == []


def nav_pages(nav: object) -> list[str]:
    """Every page file named in mkdocs.yml's nav (nested sections included)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    nav = nav_pages(config["nav"])
    assert sorted(nav) == sorted(str(p.relative_to(DOCS)) for p in PAGES)
    assert nav[0] == "index.md"


# ----------------------------------------------------------------------------- links and paths


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert broken == []


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_paths_of_the_repository_they_name_exist(page: Path) -> None:
    prose, code = prose_and_code(page.read_text())
    words = [w for line in prose for span in code_spans(line) for w in span.split()]
    words += [w for line in code for w in line.split()]
    named = {w.strip("'\",:;()") for w in words}
    missing = [p for p in sorted(named) if REPO_PATH.match(p) and not any(REPO.glob(p.rstrip("/")))]
    assert missing == []


def test_the_checkers_see_links_paths_and_anchors() -> None:
    # Not vacuous: the parsers find what the pages do hold.
    assert "docs/job-files.md" in links(README)
    assert "keys-and-defaults" in anchors(DOCS / "job-files.md")
    assert slug("Elastic jobs: `nnodes=MIN:MAX`") == "elastic-jobs-nnodesminmax"
    assert code_spans("a `tests/x.py` and ``b``") == ["tests/x.py", "b"]


# --------------------------------------------------------------- tables and commands kept equal

TEST_COMMAND = re.compile(r"^nox -s ((?:\w+ ?)+)$", re.M)


def noxfile_default_sessions() -> list[str]:
    tree = ast.parse((REPO / "noxfile.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "nox.options.sessions":
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(v) for v in value]
    raise AssertionError("noxfile.py sets no nox.options.sessions")


def test_readme_ci_and_nox_run_the_same_sessions() -> None:
    def sessions(path: Path) -> list[list[str]]:
        return [m.group(1).split() for m in TEST_COMMAND.finditer(path.read_text())]

    expected = noxfile_default_sessions()
    assert "docs" in expected
    assert sessions(README) == [expected]
    assert sessions(REPO / ".ci" / "run") == [expected]
    assert sessions(DOCS / "development.md") == [expected]


LAYERING_START = "<!-- layering: the FOLDERS table of tests/test_layering.py; "
LAYERING_END = "<!-- layering: end -->"


def test_the_architecture_pages_import_table_is_the_layering_tests() -> None:
    text = (DOCS / "architecture.md").read_text()
    table = text[text.index(LAYERING_START) : text.index(LAYERING_END)].splitlines()[3:]
    documented = {}
    for row in table:
        folder, allowed = (cell.strip() for cell in row.strip("|").split("|"))
        documented[folder.strip("`")] = {a.strip(" `") for a in allowed.split(",")} - {"—"}
    assert documented == {k: v for k, v in FOLDERS.items() if k != ROOT}


def test_the_architecture_pages_folder_table_names_every_module() -> None:
    # The folder map is the first page of the design: a module it does not name is a stale map.
    text = (DOCS / "architecture.md").read_text()
    rows = {
        cells[1].strip().strip("`/"): cells[3]
        for line in text.splitlines()
        if line.startswith("| `") and len(cells := line.split("|")) == 5
    }
    package = REPO / "elastic_hydra"
    missing = [
        f"{folder.name}/{module.stem}"
        for folder in sorted(p for p in package.iterdir() if (p / "__init__.py").exists())
        if folder.name != "conf"
        for module in sorted(folder.glob("*.py"))
        if module.stem != "__init__" and f"`{module.stem}`" not in rows.get(folder.name, "")
    ]
    assert missing == []


# ------------------------------------------------------------------------- runnable commands


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """A `$ ` line of a console block: what runs, the exit code and error line it shows."""

    line: int
    env: dict[str, str]
    argv: list[str]
    exit_code: int
    error: str | None  # an `elastic-hydra: error:` line shown right under it


def parse_command(text: str, line: int) -> Command:
    expected = re.search(r"\s#\s*exit\s+(\d+)\s*$", text)
    words = shlex.split(text, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[:1] == ["elastic-hydra"], f"line {line}: a `$ ` line runs elastic-hydra"
    return Command(
        line=line,
        env=env,
        argv=words[1:],
        exit_code=int(expected.group(1)) if expected else 0,
        error=None,
    )


def console_commands(page: Path) -> list[Command]:
    """The runnable commands of a page, in order."""
    commands: list[Command] = []
    block: str | None = None  # the language of the fenced block we are in
    pending = ""
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if line.startswith(FENCE):
            block = line[3:].strip() if block is None else None
            continue
        if block != "console":
            continue
        if pending or line.startswith("$ "):
            pending += line.removeprefix("$ ") if not pending else " " + line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            commands.append(parse_command(pending, number))
            pending = ""
        elif line.startswith("elastic-hydra: error:") and commands:
            last = commands[-1]
            commands[-1] = Command(
                line=last.line, env=last.env, argv=last.argv, exit_code=last.exit_code, error=line
            )
    return commands


RUNNABLE = [p for p in markdown_files() if console_commands(p)]


def test_the_pages_show_runnable_commands() -> None:
    # Not vacuous: the first steps, failures, refusals and torchrun's form are all run.
    names = {p.name for p in RUNNABLE}
    assert {"README.md", "getting-started.md", "runs-and-failures.md"} <= names
    codes = {c.exit_code for p in RUNNABLE for c in console_commands(p)}
    assert {0, 1, 2} <= codes


def scrubbed_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED)}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.name)
def test_console_commands_run_as_shown(page: Path, tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    for command in console_commands(page):
        proc = subprocess.run(
            [*ELASTIC_HYDRA, *command.argv],
            cwd=tmp_path,
            env={**scrubbed_environ(), **command.env},
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        where = f"{page.name}:{command.line}: elastic-hydra {shlex.join(command.argv)}"
        assert proc.returncode == command.exit_code, f"{where}\n{proc.stdout}\n{proc.stderr}"
        if command.error is not None:
            assert command.error in proc.stderr.splitlines(), f"{where}\n{proc.stderr}"


PIP_INSTALL = re.compile(r"pip install ([^`\n#&;]*)")


def test_the_pages_install_torch_as_the_errors_say() -> None:
    """One install command for PyTorch, pinned: the one the launcher's errors name."""
    from elastic_hydra.errors import TORCH_INSTALL

    found = [
        (path.name, word)
        for path in markdown_files()
        for m in PIP_INSTALL.finditer(path.read_text())
        for word in m.group(1).split()
        if re.match(r"['\"]?torch\b", word)
    ]
    assert found, "no page says how to install torch"
    assert {f"pip install {word}" for _, word in found} == {TORCH_INSTALL}, found


@pytest.mark.parametrize("page", [README, DOCS / "getting-started.md", DOCS / "development.md"],
                         ids=lambda p: p.name)  # fmt: skip
def test_set_up_commands_install_into_a_virtual_environment(page: Path) -> None:
    """A stock Debian or Ubuntu Python refuses `pip install` outside a venv
    (externally-managed-environment): the first steps make one before they install anything."""
    _, code = prose_and_code(page.read_text())
    installs = [i for i, line in enumerate(code) if "pip install" in line]
    assert installs, f"{page.name} shows no set-up command"
    first_venv = next((i for i, line in enumerate(code) if "-m venv" in line), None)
    assert first_venv is not None, f"{page.name} makes no virtual environment"
    line = code[installs[0]]
    assert installs[0] > first_venv or line.index("-m venv") < line.index("pip install"), line
    system_pip = [line for line in code if "python3 -m pip install" in line]
    assert not system_pip, f"{page.name}: pip of the system's Python: {system_pip}"
