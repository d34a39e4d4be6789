"""The test command cannot be a false green: every nox session runs on a supported Python that
is present (the one running nox when it is 3.11 or newer), and fails when none is. Nor a red one
that no change of ours caused: nox, ruff and mypy are pinned, alike everywhere they are installed.

nox is not installed where the tests run: the noxfile is loaded with a stand-in `nox` module
that records what it declares.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.conftest import REPO


class FakeNox(ModuleType):
    """The parts of nox a noxfile uses: options, the session decorator, parametrize."""

    def __init__(self) -> None:
        super().__init__("nox")
        self.options = SimpleNamespace()
        self.sessions: dict[str, dict[str, Any]] = {}
        self.Session = object

    def session(self, **kwargs: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
        def record(func: Callable[..., None]) -> Callable[..., None]:
            self.sessions[func.__name__] = kwargs
            return func

        return record

    def parametrize(self, *args: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
        return lambda func: func


@pytest.fixture
def noxfile(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeNox, ModuleType]]:
    fake = FakeNox()
    monkeypatch.setitem(sys.modules, "nox", fake)
    spec = importlib.util.spec_from_file_location("noxfile", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield fake, module


def test_a_missing_interpreter_fails_the_run(noxfile: tuple[FakeNox, ModuleType]) -> None:
    fake, _ = noxfile
    assert fake.options.error_on_missing_interpreters is True


def test_every_session_runs_on_the_python_running_nox_when_it_is_supported(
    noxfile: tuple[FakeNox, ModuleType],
) -> None:
    fake, module = noxfile
    assert {"lint", "typecheck", "tests", "hydra_range", "docs"} <= set(fake.sessions)
    assert fake.options.sessions == ["lint", "typecheck", "tests", "docs"]
    # This test runs on a supported Python: every session takes it, whatever its minor version.
    assert {s.get("python") for s in fake.sessions.values()} == {sys.executable}
    choose = module.session_python
    for minor in (11, 12, 13, 14):
        assert choose((3, minor), f"/opt/py3{minor}/bin/python") == f"/opt/py3{minor}/bin/python"
    # An older Python runs nox: the sessions ask for the oldest supported one, which nox then
    # finds on PATH or fails for (error_on_missing_interpreters), never skips.
    assert choose((3, 10), "/usr/bin/python3.10") == "3.11"
    assert choose((3, 8, 18), "/usr/bin/python3.8") == "3.11"


def test_the_tools_are_pinned_alike_in_the_noxfile_the_dev_extra_and_ci(
    noxfile: tuple[FakeNox, ModuleType],
) -> None:
    _, module = noxfile
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    ci = re.search(r'^NOX="(nox==[^"]+)"$', (REPO / ".ci" / "run").read_text(), re.M)
    assert ci is not None, ".ci/run installs no pinned nox"
    pins = [module.RUFF, module.MYPY, ci.group(1)]
    assert [p for p in pins if not re.fullmatch(r"[a-z]+==[0-9.]+", p)] == []
    assert [p for p in pins if p not in dev] == []
