"""The one-machine recipe of docs/multi-node.md, run as written: a store apart, two agents on
their own loopback addresses, one job of two nodes (only the port is a free one here, and the
repository's root a directory that holds its `examples/`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, free_port
from tests.harness import launcher_env

PAGE = REPO / "docs" / "multi-node.md"


def recipe() -> str:
    found = re.search(r"<!-- loopback recipe -->\n```bash\n(.*?)```", PAGE.read_text(), re.S)
    assert found, "docs/multi-node.md lost its loopback recipe"
    return found.group(1)


def test_the_loopback_recipe_runs_as_written(tmp_path: Path) -> None:
    script = recipe().replace("29400", str(free_port()))
    (tmp_path / "examples").symlink_to(REPO / "examples")  # its run dirs go here, not the repo's
    bin_dir = tmp_path / "bin"  # `elastic-hydra` as installed: this interpreter's module
    bin_dir.mkdir()
    (bin_dir / "elastic-hydra").write_text(
        f'#!/bin/sh\nexec {sys.executable} -m elastic_hydra "$@"\n'
    )
    (bin_dir / "elastic-hydra").chmod(0o755)
    env = launcher_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    proc = subprocess.Popen(
        ["bash", "-c", script], cwd=tmp_path, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError):  # the store and agents, if it failed
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, out + err
    ranks = sorted(re.findall(r"^\[[^]]+:default0\]:hello from rank (\d)/2 ", out, re.M))
    assert ranks == ["0", "1"], out  # one job of two nodes
    assert err.count("elastic-hydra: succeeded") == 2, err
