"""The saved files' YAML: `to_yaml` writes the bytes OmegaConf writes, without building a config.

The reference is OmegaConf's own way (`OmegaConf.to_yaml(OmegaConf.create(data))`), run on the
files a real launch saves and on values chosen to need OmegaConf's quoting rules.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from omegaconf import OmegaConf
from omegaconf.errors import GrammarParseError

from elastic_hydra.config import boundary
from elastic_hydra.config.composed import to_yaml
from elastic_hydra.redact import redact
from tests.conftest import REPO
from tests.harness import invocation


def omegaconf_yaml(data: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(data))


class Color(enum.Enum):
    RED = "red"


TRICKY = [
    "true", "yes", "on", "off", "No", "1", "007", "-1", "1.5", "1e3", "1e-3", ".inf", "-.inf",
    "nan", "NaN", "null", "~", "", " lead", "trail ", "a: b", "- x", "#c", "x #c", "'q'", '"q"',
    "${x}", "${a.b:c}", "\\${x}", "???", "a\nb", "a\n", "tab\there", "bell\x07", "é 日本",
    "word " * 30, "long-" * 30, "\ufeffbom", "\x85nel", "a,b=c", "*star", "&amp", "!tag", "%pc",
    "@at", "`tick", "[x]", "{x}", "|", ">", "?", ":", "-", "--lr=0.1",
]  # fmt: skip
VALUES: list[Any] = [
    {"s": TRICKY},
    {"n": [0, 1, -7, 1.0, -0.0, 2.5e-9, 1e300, float("inf"), True, False, None]},
    {"nested": {"a": [{"b": [1, {"c": "d"}]}, [], {}], "empty": {}, "e": []}},
    {"mode": Color.RED, Color.RED: "key", 7: "int key", "t": ("x", 1)},
    {"k" * 200: "a key too long for a simple key"},
    ["--", "${x}", "a b, c=d", "it's"],
    [],
    {},
]


@pytest.mark.parametrize("data", VALUES)
def test_to_yaml_writes_what_omegaconf_writes(data: Any) -> None:
    assert to_yaml(data) == omegaconf_yaml(data)


def test_to_yaml_writes_a_launchs_saved_files_as_omegaconf_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every file save_config writes, for the shipped example jobs: the config, the hydra node
    # (long help texts Hydra folds), the overrides and the resolved config.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    commands = [
        ("script=t.py", "nproc_per_node=2", "env.HF_TOKEN=x", "--", "${x}", "\\${y}", "é"),
        *((str(job),) for job in sorted((REPO / "examples" / "jobs").glob("*.yaml"))),
    ]
    for argv in commands:
        cfg, ctx = boundary.compose(invocation(*argv))
        job = cfg.job()
        for data in (job.unresolved, {"hydra": ctx.hydra_cfg}, ctx.overrides, job.resolved):
            assert to_yaml(redact(data)) == omegaconf_yaml(redact(data)), argv


def test_to_yaml_writes_a_script_argument_omegaconf_would_parse() -> None:
    # `-- '${oops'` reaches the script as is; OmegaConf would refuse it as an interpolation.
    data = {"args": ["${oops", "a"]}
    with pytest.raises(GrammarParseError, match="oops"):
        omegaconf_yaml(data)
    assert yaml.safe_load(to_yaml(data)) == data


def test_to_yaml_leaves_other_values_to_omegaconf() -> None:
    assert to_yaml({"p": Path("/x")}) == omegaconf_yaml({"p": Path("/x")})
    assert to_yaml({"b": b"\x00"}) == omegaconf_yaml({"b": b"\x00"})
    with pytest.raises(ValueError):  # as before: OmegaConf refuses what it cannot hold
        to_yaml({"o": object()})
