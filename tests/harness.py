"""Launching elastic-hydra in tests: composing a job exactly as the command does, running it.

`run` / `run_raw` run one launch to its end (text / bytes); `started` runs one in the background
and kills it if the test leaves it running. Every launch gets `launcher_env`: this environment
minus what a test run or a surrounding launch would leak into it.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from elastic_hydra.cli.argv import parse_argv
from elastic_hydra.config import boundary
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.launch import job
from elastic_hydra.plan import LaunchPlan


def invocation(*argv: str) -> Invocation:
    """The command line `elastic-hydra ARGV`, parsed."""
    return parse_argv(argv, boundary.hydra_flags())


def compose(*argv: str) -> DictConfig:
    """The job config a launch of `elastic-hydra ARGV` runs."""
    cfg, _ = boundary.compose(invocation(*argv))
    return cfg.dictconfig


def plan_of(*argv: str) -> LaunchPlan:
    """The plan a launch of `elastic-hydra ARGV` runs (the one `--plan` prints)."""
    cfg, ctx = boundary.compose(invocation(*argv))
    return job.plan_of(cfg.job(), ctx)


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as plain data, interpolations resolved."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


ELASTIC_HYDRA = [sys.executable, "-m", "elastic_hydra"]
TIMEOUT = 120.0
# Set by pytest, by a launch around the test run, or by shell completion: never the launch's own.
_LEAKS = ("ELASTIC_HYDRA", "PYTEST", "COMP_", "TORCHELASTIC_", "PYTHON_EXEC")


def launcher_env(**extra: str) -> dict[str, str]:
    """The environment of a launch: this one minus leaks, rich's tables one row per line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKS) and k != "RANK"}
    env["COLUMNS"] = "500"
    env.update(extra)
    return env


def run(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """`elastic-hydra ARGS` to its end, its output as text."""
    return subprocess.run(
        [*ELASTIC_HYDRA, *args],
        cwd=cwd,
        env=launcher_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_raw(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    """`elastic-hydra ARGS` to its end, its output byte for byte."""
    return subprocess.run(
        [*ELASTIC_HYDRA, *args],
        cwd=cwd,
        env=launcher_env(**(env or {})),
        capture_output=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def started(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`elastic-hydra ARGS` in the background; killed if the test leaves it running."""
    proc = subprocess.Popen(
        [*ELASTIC_HYDRA, *args],
        cwd=cwd,
        env=launcher_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def on_a_terminal(
    *args: str, cwd: Path, env: Mapping[str, str], stream: str, timeout: float = TIMEOUT
) -> tuple[int, bytes]:
    """`elastic-hydra ARGS` with its `stream` ("stdout" or "stderr") on a pseudo-terminal, the
    other one discarded: the exit code and everything written to the terminal."""
    main_fd, term_fd = pty.openpty()
    out, err = (
        (term_fd, subprocess.DEVNULL) if stream == "stdout" else (subprocess.DEVNULL, term_fd)
    )
    proc = subprocess.Popen([*ELASTIC_HYDRA, *args], cwd=cwd, env=dict(env), stdout=out, stderr=err)
    os.close(term_fd)
    output = b""
    try:
        while True:
            try:
                chunk = os.read(main_fd, 4096)
            except OSError:  # EIO: every writer is gone
                break
            if not chunk:
                break
            output += chunk
        return proc.wait(timeout=timeout), output
    finally:
        os.close(main_fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
