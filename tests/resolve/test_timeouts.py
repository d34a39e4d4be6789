"""The timeout hierarchy: each layer derived from the plan with its source, the pairs that fire
in the wrong order refused or warned, and torch's defaults read from torch's own source."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from elastic_hydra.errors import ConfigError
from elastic_hydra.gpus import Gpu, WorkerDevices
from elastic_hydra.resolve import timeouts
from elastic_hydra.resolve.timeouts import Severity, derive
from tests.harness import plan_of, run

C10D = ("rdzv=c10d", "rdzv.endpoint=127.0.0.1:29400", "rdzv.id=t")
ELASTIC = ("nnodes=1:2", *C10D)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    return tmp_path


def test_torchs_defaults_are_the_ones_in_its_source() -> None:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    headers = Path(spec.origin).parent / "include/torch/csrc/distributed/c10d"
    found = {}
    for name, header in (("kProcessGroupDefaultTimeout", "ProcessGroup.hpp"),
                         ("kProcessGroupNCCLDefaultTimeout", "ProcessGroupNCCL.hpp")):  # fmt: skip
        text = (headers / header).read_text()
        match = re.search(rf"{name}\s*=\s*std::chrono::milliseconds\(([\d *]+)\)", text)
        assert match, name
        found[name] = eval(match.group(1)) / 1000  # "30 * 60 * 1000"
    assert found["kProcessGroupDefaultTimeout"] == timeouts.TORCH_GLOO_TIMEOUT
    assert found["kProcessGroupNCCLDefaultTimeout"] == timeouts.TORCH_NCCL_TIMEOUT


def test_the_layers_of_an_elastic_job_from_the_bottom_with_their_sources() -> None:
    derived = derive(plan_of("script=train.py", *ELASTIC, "rdzv.keep_alive_interval=4"))
    assert [(x.name, x.seconds) for x in derived.layers] == [
        ("heartbeat", 12), ("last call", 2), ("join", 600), ("hang", 300),
        ("collective", 1800), ("exit barrier", 300), ("stop grace", 30),
    ]  # fmt: skip
    by_name = {layer.name: layer for layer in derived.layers}
    assert by_name["heartbeat"].source == (
        "rdzv.keep_alive_interval=4 x rdzv.keep_alive_max_attempt=3 (default)"
    )
    assert by_name["collective"].source.startswith("torch's default for gloo (no GPUs)")
    assert derived.conflicts == ()  # the defaults are in order


def test_one_node_has_no_rendezvous_layers_and_hang_off_is_shown_as_off() -> None:
    derived = derive(plan_of("script=train.py", "hang.timeout=null"))
    assert [(x.name, x.seconds) for x in derived.layers] == [
        ("hang", None), ("collective", 1800), ("stop grace", 30),
    ]  # fmt: skip
    assert derived.layers[0].source == "hang.timeout=null: off"


def test_gpu_workers_get_nccls_default_and_a_set_collective_timeout_wins() -> None:
    plan = plan_of("script=train.py")
    gpu = Gpu(index=0, uuid="GPU-0")
    on_gpus = dataclasses.replace(plan, devices=(WorkerDevices(gpus=(gpu,), own=gpu),))
    collective = {layer.name: layer for layer in derive(on_gpus).layers}["collective"]
    assert collective.seconds == 600 and "nccl" in collective.source
    set_plan = dataclasses.replace(on_gpus, collective_timeout=120.0)
    collective = {layer.name: layer for layer in derive(set_plan).layers}["collective"]
    assert (collective.seconds, collective.source) == (120, "timeouts.collective=120")


@pytest.mark.parametrize(
    ("overrides", "lower", "upper"),
    [
        (("hang.timeout=900", "timeouts.collective=600"), "hang", "collective"),
        (("hang.warmup=2000",), "hang", "collective"),  # the first verdict comes after warm-up
        ((*C10D, "rdzv.keep_alive_interval=200"), "heartbeat", "hang"),
        ((*ELASTIC, "restart.max_restarts=1", "timeouts.collective=2", "hang.timeout=null"),
         "heartbeat", "collective"),
    ],
)  # fmt: skip
def test_risky_orders_warn(overrides: tuple[str, ...], lower: str, upper: str) -> None:
    conflicts = derive(plan_of("script=train.py", *overrides)).conflicts
    assert [(c.severity, c.lower.name, c.upper.name) for c in conflicts] == [
        (Severity.WARN, lower, upper)
    ]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (("rdzv.last_call_timeout=600",),
         "rdzv.last_call_timeout: the last call layer is not shorter than the join layer, "
         "rdzv.join_timeout (600 s) (got 600.0); expected rdzv.last_call_timeout < "
         "rdzv.join_timeout. A round that gets fewer than the most nodes passes the join "
         "deadline"),
        (("timeouts.collective=2", "hang.timeout=null"),
         "rdzv.keep_alive_interval x rdzv.keep_alive_max_attempt: the heartbeat layer is not "
         "shorter than the collective layer, timeouts.collective (2 s) (got 3.0)"),
    ],
)  # fmt: skip
def test_orders_that_break_an_elastic_job_are_refused(
    overrides: tuple[str, ...], line: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_of("script=train.py", *ELASTIC, *overrides)
    assert caught.value.line().startswith(line)
    # Not elastic: the last call is never waited; with restarts, a lost node costs one.
    plan_of("script=train.py", *C10D, "rdzv.last_call_timeout=600")
    plan_of("script=train.py", *ELASTIC, "restart.max_restarts=1", *overrides[1:])


def test_the_command_refuses_with_one_line_and_exit_2(in_tmp: Path) -> None:
    refused = run("script=train.py", *ELASTIC, "rdzv.last_call_timeout=900", "--plan", cwd=in_tmp)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("elastic-hydra: error: rdzv.last_call_timeout: ")
    assert "rdzv.join_timeout (600 s) (got 900.0)" in refused.stderr
    assert "Lower rdzv.last_call_timeout (e.g. 2) or raise rdzv.join_timeout." in refused.stderr
    launched = run("script=train.py", *ELASTIC, "rdzv.last_call_timeout=900", cwd=in_tmp)
    assert launched.returncode == 2 and "rdzv.last_call_timeout" in launched.stderr


def test_plan_prints_the_layers_and_a_risky_order_warns(in_tmp: Path) -> None:
    shown = run("script=train.py", "hang.timeout=900", "timeouts.collective=600", "--plan",
                cwd=in_tmp)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "from the first to fire; each must fire before the ones after it:" in out
    assert "hang: 900 s: no progress on any rank" in out
    assert "collective: 600 s: a collective that waits this long fails" in out
    assert "[timeouts.collective=600]" in out
    assert "stop grace: 30 s: SIGTERM to SIGKILL" in out
    (warning,) = [x for x in shown.stderr.splitlines() if "warning" in x]
    assert warning.startswith(
        "elastic-hydra: warning: hang.timeout: the hang layer (900 s) is not shorter than the "
        "collective layer, timeouts.collective (600 s)"
    )
    quiet = run("script=train.py", "--plan", cwd=in_tmp)
    assert "warning" not in quiet.stderr  # the defaults are in order


def test_the_preflight_is_a_layer_that_must_end_before_a_waiting_node_gives_up() -> None:
    derived = derive(plan_of("script=train.py", *ELASTIC, "preflight=quick"))
    assert [(x.name, x.seconds) for x in derived.layers][:4] == [
        ("heartbeat", 3), ("last call", 2), ("preflight", 60), ("join", 600),
    ]  # fmt: skip
    by_name = {layer.name: layer for layer in derived.layers}
    assert by_name["preflight"].source == "preflight=quick, preflight.timeout=60 (default)"
    assert derived.conflicts == ()  # the presets are in order (full: 300 s)
    assert derive(plan_of("script=train.py", *ELASTIC, "preflight=full")).conflicts == ()
    off = derive(plan_of("script=train.py", *ELASTIC))
    assert "preflight" not in [x.name for x in off.layers]
    slow = derive(plan_of("script=train.py", *ELASTIC, "preflight=quick",
                          "preflight.timeout=600"))  # fmt: skip
    assert [(c.severity, c.lower.name, c.upper.name) for c in slow.conflicts] == [
        (Severity.WARN, "preflight", "join")
    ]
    assert slow.warnings[0].startswith(
        "preflight.timeout: the preflight layer (600 s) is not shorter than the join layer, "
        "rdzv.join_timeout (600 s); a node that arrives while a round runs its battery waits"
    )
    one_node = derive(plan_of("script=train.py", "preflight=quick", "preflight.timeout=900"))
    assert one_node.conflicts == ()  # no rendezvous to wait on


def test_plan_shows_the_preflight_and_warm_settings(in_tmp: Path) -> None:
    shown = run("script=train.py", *ELASTIC, "preflight=quick", "preflight.timeout=700",
                "preflight.paths=[/data]", "warm.imports=[json]", "--plan", cwd=in_tmp)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "preflight: 700 s: the battery after each round" in out
    assert (
        "preflight    quick after each rendezvous round, at most 700 s (preflight.timeout): "
        "512 x 512 GEMM for 0.5 s per worker, allreduces of 4 MiB x 5 in and across nodes" in out
    )
    assert "no write in logs.root, /data" in out
    assert "warm         Python workers forked from a template that imported json" in out
    (warning,) = [x for x in shown.stderr.splitlines() if "warning" in x]
    assert warning.startswith("elastic-hydra: warning: preflight.timeout: the preflight layer")
    plain = run("script=train.py", "--plan", cwd=in_tmp).stdout
    assert "preflight    off (preflight=off)" in plain
    assert "warm         off (warm.imports=[]): every worker starts cold" in plain
