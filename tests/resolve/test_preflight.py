"""preflight=off|quick|full and preflight.* resolved into the plan, or refused in one line."""

from __future__ import annotations

import pytest

from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import PreflightMode, PreflightSpec
from tests.harness import plan_of

C10D = ("nnodes=2:4", "rdzv=c10d", "rdzv.endpoint=127.0.0.1:29400", "rdzv.id=j")


def test_preflight_is_off_by_default_on_one_node_and_on_several() -> None:
    assert plan_of("cmd=true").preflight == PreflightSpec()
    assert plan_of("cmd=true", *C10D).preflight.mode is PreflightMode.OFF


def test_the_presets_resolve_into_the_plan() -> None:
    quick = plan_of("cmd=true", *C10D, "preflight=quick").preflight
    assert quick.mode is PreflightMode.QUICK and quick.min_ratio == 0.8
    assert quick.allreduce_bytes == 4 << 20 and quick.timeout == 60.0
    full = plan_of("cmd=true", *C10D, "preflight=full", "preflight.paths=[/tmp,/var/tmp/]")
    assert full.preflight.mode is PreflightMode.FULL and full.preflight.gemm_size == 1024
    assert full.preflight.paths == ("/tmp", "/var/tmp")
    assert plan_of("cmd=true", "preflight=off").preflight.mode is PreflightMode.OFF


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (("preflight.mode=sometimes",), "preflight.mode", "expected off, quick or full"),
        (("preflight=quick", "preflight.min_ratio=1.5"), "preflight.min_ratio", "(0, 1]"),
        (("preflight=quick", "preflight.min_ratio=0"), "preflight.min_ratio", "(0, 1]"),
        (("preflight=quick", "preflight.gemm_size=4"), "preflight.gemm_size", "8 to"),
        (("preflight=quick", "preflight.allreduce_mb=0"), "preflight.allreduce_mb", "MiB"),
        (("preflight=quick", "preflight.allreduce_reps=0"), "preflight.allreduce_reps", "1 to"),
        (("preflight=quick", "preflight.gemm_seconds=-1"), "preflight.gemm_seconds", "> 0"),
        (("preflight=quick", "preflight.timeout=0.2"), "preflight.timeout", "more than"),
        (("preflight=quick", "preflight.paths=[data]"), "preflight.paths", "absolute"),
        (("preflight=quick", "preflight.min_free_gb=-1"), "preflight.min_free_gb", ">= 0"),
        (
            ("preflight=quick", "nnodes=2", "rdzv=static", "master_addr=127.0.0.1"),
            "preflight.mode",
            "use rdzv=c10d",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(
    overrides: tuple[str, ...], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_of("cmd=true", *overrides)
    line = caught.value.line()
    assert line.startswith(f"{key}: ") and words in line, line
