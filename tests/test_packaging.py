"""The wheel: built from the repository, installed into a fresh venv, used from outside the repo.

Dependencies come from the package index, so a missing one in pyproject.toml fails here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from elastic_hydra.errors import TORCH_INSTALL
from tests.conftest import REPO

# Never copied into the build tree: VCS data, build outputs and caches of the checkout.
SKIP = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".nox", "*_cache",
    "eh_logs", "outputs", "multirun",
)  # fmt: skip


def run(
    cmd: list[str], cwd: Path, timeout: float, expect: int = 0
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("ELASTIC_HYDRA_FULL_ERROR", None)
    env["COLUMNS"] = "500"
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == expect, (
        f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def build_wheel(tmp: Path) -> Path:
    # Build from a copy so setuptools' build/ and egg-info never land in the checkout.
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=SKIP)
    dist = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(src)]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.insert(4, "--no-build-isolation")  # setuptools is here: skip a build venv
    run(cmd, cwd=tmp, timeout=300)
    wheels = list(dist.glob("elastic_hydra-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.timeout(600)
def test_wheel_installs_and_runs_outside_the_repo(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)

    names = set(zipfile.ZipFile(wheel).namelist())
    assert "elastic_hydra/conf/elastic_hydra_base.yaml" in names
    assert "elastic_hydra/conf/rdzv/c10d.yaml" in names
    assert "elastic_hydra/conf/__init__.py" in names
    assert "elastic_hydra/py.typed" in names
    presets = {
        "elastic_hydra/conf/" + p.relative_to(REPO / "conf").as_posix()
        for p in (REPO / "conf").rglob("*.yaml")
    }
    assert presets <= names, f"presets missing from the wheel: {sorted(presets - names)}"
    # The pool launcher, where Hydra's plugin scan looks: in the hydra_plugins namespace.
    assert "hydra_plugins/elastic_hydra_pool/pool_launcher.py" in names
    assert "hydra_plugins/__init__.py" not in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "elastic-hydra = elastic_hydra.cli.entry:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], cwd=tmp_path, timeout=300)
    run([str(python), "-m", "pip", "check"], cwd=tmp_path, timeout=120)

    work = tmp_path / "work"  # outside the repository: only the installed package can answer
    work.mkdir()
    (work / "train.py").write_text("print('train')\n")
    where = run(
        [str(python), "-c", "import elastic_hydra; print(elastic_hydra.__file__)"], work, 60
    )
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout

    plan = run([str(env_dir / "bin" / "elastic-hydra"), "script=train.py", "--plan"], work, 60)
    assert "standalone" in plan.stdout
    # The exact worker command: through the installed package's bootstrap.
    as_json = run([str(env_dir / "bin" / "elastic-hydra"), "script=train.py", "--plan=json"],
                  work, 60)  # fmt: skip
    entrypoint = json.loads(as_json.stdout)["entrypoint"]
    assert (entrypoint["python"], entrypoint["path"]) == (str(python), str(work / "train.py"))
    bootstrap = Path(entrypoint["bootstrap"])
    assert bootstrap.name == "bootstrap.py" and bootstrap.is_relative_to(env_dir)
    assert bootstrap.is_file()

    # torch is not a dependency: c10d without it is one line naming the pinned install, exit 2,
    # from --plan as from a launch.
    c10d = run(
        [str(python), "-m", "elastic_hydra", "script=train.py", "rdzv=c10d", "--plan"], work, 60, 2
    )
    assert "rdzv.backend: needs PyTorch" in c10d.stderr and TORCH_INSTALL in c10d.stderr

    # Hydra finds the installed pool launcher: a sweep of two jobs side by side.
    sweep = run(
        [str(env_dir / "bin" / "elastic-hydra"), "-m", "hydra/launcher=pool", "script=train.py",
         "+hp.n=1,2", f"logs.root={tmp_path / 'logs'}"],
        work, 60,
    )  # fmt: skip
    assert "elastic-hydra pool: 2 job(s)" in sweep.stdout, sweep.stdout + sweep.stderr
    assert len(list((tmp_path / "logs").rglob("result.json"))) == 2

    version = run([str(python), "-m", "elastic_hydra", "--version"], work, 60)
    assert version.stdout.startswith("elastic-hydra 0.1.0")
    assert sorted(p.name for p in work.iterdir()) == ["train.py"]


def test_every_folder_of_the_package_is_in_the_wheel() -> None:
    """A folder left out of pyproject's `packages` imports in the checkout and not in a wheel:
    found here in a moment rather than by the wheel's run above."""
    import tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "elastic_hydra").rglob("__init__.py")
    }
    assert folders - listed == set()
