"""Launching elastic-hydra in tests: composing a job exactly as the command does, running it."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from elastic_hydra import hydra_boundary, job
from elastic_hydra.argv import Invocation, parse_argv
from elastic_hydra.plan import LaunchPlan


def invocation(*argv: str) -> Invocation:
    """The command line `elastic-hydra ARGV`, parsed."""
    return parse_argv(argv, hydra_boundary.hydra_flags())


def compose(*argv: str) -> DictConfig:
    """The job config a launch of `elastic-hydra ARGV` runs."""
    cfg, _ = hydra_boundary.compose(invocation(*argv))
    return cfg


def plan_of(*argv: str) -> LaunchPlan:
    """The plan a launch of `elastic-hydra ARGV` runs (the one `--plan` prints)."""
    cfg, ctx = hydra_boundary.compose(invocation(*argv))
    return job.plan_of(cfg, ctx)


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as plain data, interpolations resolved."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}
