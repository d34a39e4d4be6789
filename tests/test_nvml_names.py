"""The NVML calls the package makes exist in the real nvidia-ml-py (pynvml), and the tests' fake
NVML offers no call the real one lacks: a renamed or misspelt call would otherwise pass every
test here (no GPU) and fail only on a GPU machine."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
from pathlib import Path

import elastic_hydra.nvml
from tests.conftest import REPO
from tests.resolve.test_gpus import FAKE_PYNVML

NAMES = ("nvml", "pynvml")  # what the package calls the module it gets from `nvml.load()`


def nvml_names(source: str) -> set[str]:
    """Every `nvml.X` / `pynvml.X` attribute a module's source uses."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in NAMES
    }


def test_every_nvml_call_of_the_package_is_in_the_real_pynvml() -> None:
    real = importlib.import_module("pynvml")
    assert importlib.metadata.version("nvidia-ml-py")  # the real one, installed
    assert "site-packages" in str(real.__file__), real.__file__
    used: dict[str, set[str]] = {}
    for path in sorted((REPO / "elastic_hydra").rglob("*.py")):
        if path.name == "nvml.py" and path.parent.name == "elastic_hydra":
            continue  # the loader: `nvml` there is the module itself
        for name in nvml_names(path.read_text()):
            used.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert {"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"} <= set(used)  # the scan works
    ours = set(vars(elastic_hydra.nvml))  # `nvml.load()`: our loader, also named nvml
    missing = {
        name: sorted(paths)
        for name, paths in used.items()
        if name not in ours and not hasattr(real, name)
    }
    assert missing == {}


def test_the_tests_fake_nvml_offers_only_real_calls() -> None:
    real = importlib.import_module("pynvml")
    tree = ast.parse(FAKE_PYNVML)
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}  # fmt: skip
    public = {name for name in defined if name.lower().startswith("nvml")}  # not its test data
    assert public, "the fake defines nothing: the scan is broken"
    assert sorted(name for name in public if not hasattr(real, name)) == []


def test_the_loader_itself_calls_real_names() -> None:
    real = importlib.import_module("pynvml")
    source = Path(REPO / "elastic_hydra" / "nvml.py").read_text()
    calls = {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == "nvml"}  # fmt: skip
    assert calls == {"nvmlInit", "nvmlShutdown"} and all(hasattr(real, c) for c in calls)
