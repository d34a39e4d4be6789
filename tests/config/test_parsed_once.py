"""While Hydra composes, each interpolation's text is parsed once, and the config is the same."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, _utils, base, grammar_parser
from omegaconf.errors import GrammarParseError

from elastic_hydra.config import boundary
from elastic_hydra.config.resolvers import register
from tests.conftest import REPO
from tests.harness import invocation

ARGV = [
    ("script=t.py", "nproc_per_node=2", "hp.lr=${nproc_per_node}", "--", "${x}"),
    (str(REPO / "examples" / "jobs" / "ddp.yaml"),),
]


def composed(argv: tuple[str, ...]) -> tuple[str, Any]:
    """The composed config (hydra node included) as YAML, and the job's values resolved."""
    inv = invocation(*argv)
    register()
    try:
        cfg = boundary._compose(boundary._app(inv.job_dir), inv, logging=False)
        task, _ = boundary._job_view(cfg, inv)
        text = OmegaConf.to_yaml(cfg)
        text = text.replace(str(cfg.hydra.runtime.output_dir), "<run dir>")
        values = OmegaConf.to_container(task.dictconfig, resolve=True)
        return text, {**values, "hydra_run_dir": str(Path(cfg.hydra.run.dir).parent)}  # type: ignore[dict-item]
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("argv", ARGV)
def test_a_composition_is_the_same_with_each_text_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    monkeypatch.chdir(tmp_path)
    plain = composed(argv)
    with boundary._parsed_once():
        once = composed(argv)
    assert once == plain


def test_each_text_is_parsed_once_and_the_patch_ends_with_the_composition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    counts: Counter[str] = Counter()
    parse = grammar_parser.parse

    def counting(value: str, *args: Any, **kwargs: Any) -> Any:
        counts[value] += 1
        return parse(value, *args, **kwargs)

    for module in (grammar_parser, _utils, base):
        monkeypatch.setattr(module, "parse", counting)
    composed(ARGV[0])
    assert max(counts.values()) > 1  # not vacuous: OmegaConf parses a text again and again
    counts.clear()
    with boundary._parsed_once():
        composed(ARGV[0])
        with pytest.raises(GrammarParseError):  # a broken text raises each time, never cached
            OmegaConf.create({"a": "${oops"})
        with pytest.raises(GrammarParseError):
            OmegaConf.create({"a": "${oops"})
    assert counts["${oops"] == 2
    del counts["${oops"]
    assert counts and max(counts.values()) == 1
    assert all(vars(m)["parse"] is counting for m in (_utils, base))  # restored
