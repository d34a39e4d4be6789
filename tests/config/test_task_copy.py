"""The task's config, copied without its `hydra` node: the copy Hydra's job runner makes, and the
composed config left as it was."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from elastic_hydra.config import boundary
from elastic_hydra.config.resolvers import register
from tests.conftest import REPO
from tests.harness import invocation


def flags(cfg: DictConfig) -> list[tuple[str, object, object, object]]:
    """Every node's key, type, struct and readonly flags, depth first."""
    found: list[tuple[str, object, object, object]] = []

    def walk(node: DictConfig, path: str) -> None:
        for key in node:
            name = f"{path}{key!s}"
            child = node._get_node(key)
            assert child is not None and child._get_parent() is node, name
            meta = (OmegaConf.get_type(node, str(key)), child._get_flag("struct"),
                    child._get_flag("readonly"))  # fmt: skip
            found.append((name, *meta))
            if isinstance(child, DictConfig):
                walk(child, f"{name}.")

    walk(cfg, "")
    return found


@pytest.mark.parametrize(
    "argv",
    [
        ("script=t.py", "nproc_per_node=2", "hp.lr=${nproc_per_node}", "--", "${x}"),
        (str(REPO / "examples" / "jobs" / "ddp.yaml"),),
    ],
)
def test_the_task_copy_is_hydras_and_leaves_the_config_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    monkeypatch.chdir(tmp_path)
    inv = invocation(*argv)
    register()
    try:
        cfg = boundary._compose(boundary._app(inv.job_dir), inv, logging=False)
        before = OmegaConf.to_yaml(cfg)
        reference = copy.deepcopy(cfg)  # what Hydra's run_job does
        with open_dict(reference):
            del reference["hydra"]
        task = boundary._copy_without_hydra(cfg)
        assert OmegaConf.to_yaml(task) == OmegaConf.to_yaml(reference)
        assert OmegaConf.get_type(task) is OmegaConf.get_type(reference)
        assert flags(task) == flags(reference) and "hydra" not in task
        assert OmegaConf.to_container(task, resolve=True) == OmegaConf.to_container(
            reference, resolve=True
        )
        # The composed config keeps its hydra node, whose parent is still the config.
        assert OmegaConf.to_yaml(cfg) == before
        assert cfg._get_node("hydra")._get_parent() is cfg  # type: ignore[union-attr]
        flags(cfg)
    finally:
        GlobalHydra.instance().clear()
