"""GPUs and CPUs: CUDA_VISIBLE_DEVICES parsing, discovery, resolution, and real CPU binding.

No GPU is needed: an 8-GPU machine (two NUMA nodes, GPUs 0-3 on node 0 and 4-7 on node 1) is
faked three ways: an `nvidia-smi` script first on PATH, a sysfs tree under `tmp_path` (in-process,
through `probe.SYSFS`), and a `pynvml` module on sys.path / PYTHONPATH. The `--plan` tests run
the real CLI in a subprocess; NUMA is unknown there (the real /sys has no such PCI devices).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.agent.worker_env import WorkerFiles, worker_env
from elastic_hydra.errors import EXIT_CONFIG, ConfigError
from elastic_hydra.gpus import (
    DevicePolicy,
    Gpu,
    WorkerDevices,
    assign_gpus,
    bind_cpus,
    find_gpu,
    format_cpus,
    parse_cpus,
    parse_visible,
    split_evenly,
)
from elastic_hydra.plan import Endpoint, LaunchPlan, NodeRange, PythonScript, Standalone
from elastic_hydra.resolve import machine as probe
from elastic_hydra.resolve.gpus import Machine, resolve_devices, resolve_nproc
from tests.conftest import ELASTIC_HYDRA
from tests.harness import launcher_env

pytestmark = pytest.mark.timeout(60)

# ------------------------------------------------------------------------------- the fake machine
N_GPUS = 8
GPU_NAME = "NVIDIA H100 80GB HBM3"
MEMORY_MIB = 81559
NODE_CPULIST = {0: "0-31", 1: "32-63"}
SMI_ARGS = ("--query-gpu=index,uuid,name,memory.total,pci.bus_id", "--format=csv,noheader,nounits")
PREFIX = "elastic-hydra: error: "


def uuid(i: int) -> str:
    # The first group differs per GPU too, so that a short prefix (GPU-0000000N) is unique.
    return f"GPU-0000000{i}-0000-0000-0000-00000000000{i}"


def bus_id(i: int) -> str:
    return f"00000000:1{i}:00.0"  # NVIDIA's form; sysfs calls it 0000:1i:00.0


def numa(i: int) -> int:
    return 0 if i < 4 else 1


GPUS = tuple(
    Gpu(
        index=i,
        uuid=uuid(i),
        name=GPU_NAME,
        memory_mib=MEMORY_MIB,
        pci_bus_id=bus_id(i),
        numa_node=numa(i),
    )
    for i in range(N_GPUS)
)
NO_NUMA = tuple(dataclasses.replace(g, numa_node=None) for g in GPUS)

FAKE_PYNVML = f'''"""A fake NVML (nvidia-ml-py's pynvml) for elastic-hydra's tests: 8 H100s."""

from types import SimpleNamespace

GPUS = {[(uuid(i), bus_id(i), numa(i)) for i in range(N_GPUS)]!r}
NAME = {GPU_NAME!r}
MEMORY_BYTES = {MEMORY_MIB} * (1 << 20)
_initialized = 0


class NVMLError(Exception):
    pass


def _check():
    if _initialized <= 0:
        raise NVMLError("Uninitialized")


def nvmlInit():
    global _initialized
    _initialized += 1


def nvmlShutdown():
    global _initialized
    _check()
    _initialized -= 1


def nvmlDeviceGetCount():
    _check()
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index):
    _check()
    if not 0 <= index < len(GPUS):
        raise NVMLError("Invalid Argument")
    return SimpleNamespace(index=index)


def nvmlDeviceGetUUID(handle):
    return GPUS[handle.index][0]


def nvmlDeviceGetName(handle):
    return NAME


def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(total=MEMORY_BYTES, free=MEMORY_BYTES, used=0)


def nvmlDeviceGetPciInfo(handle):
    return SimpleNamespace(busId=GPUS[handle.index][1].encode())


def nvmlDeviceGetNumaNodeId(handle):
    return GPUS[handle.index][2]
'''


# ---------------------------------------------------------------------------------------- fixtures
@dataclasses.dataclass(frozen=True)
class FakeSmi:
    bin_dir: Path
    log: Path  # one line per call: its arguments

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def write_smi(bin_dir: Path, log: Path, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\n{body}')
    smi.chmod(0o755)


@pytest.fixture
def fake_smi(tmp_path: Path) -> FakeSmi:
    """`nvidia-smi` answering exactly the query elastic-hydra makes (anything else: exit 2)."""
    rows = "\n".join(
        f"{i}, {uuid(i)}, {GPU_NAME}, {MEMORY_MIB}, {bus_id(i)}" for i in range(N_GPUS)
    )
    body = (
        f'if [ "$#" -ne 2 ] || [ "$1" != "{SMI_ARGS[0]}" ] || [ "$2" != "{SMI_ARGS[1]}" ]; then\n'
        '  echo "nvidia-smi (fake): unsupported arguments: $*" >&2\n'
        "  exit 2\n"
        "fi\n"
        f"cat <<'ROWS'\n{rows}\nROWS\n"
    )
    smi = FakeSmi(bin_dir=tmp_path / "smi_bin", log=tmp_path / "smi_calls.log")
    write_smi(smi.bin_dir, smi.log, body)
    return smi


@pytest.fixture
def fake_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sysfs with the GPUs' PCI devices and the two NUMA nodes, as `probe.SYSFS`."""
    root = tmp_path / "sys"
    for i in range(N_GPUS):
        device = root / "bus/pci/devices" / bus_id(i).lower()[-12:]
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa(i)}\n")
    for node, cpulist in NODE_CPULIST.items():
        node_dir = root / f"devices/system/node/node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(cpulist + "\n")
    monkeypatch.setattr(probe, "SYSFS", root)
    return root


@pytest.fixture
def empty_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "empty_sys"
    root.mkdir()
    monkeypatch.setattr(probe, "SYSFS", root)
    return root


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import pynvml` fails in this process, whatever is installed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake `pynvml` importable in-process (and from PYTHONPATH=<the yielded dir>)."""
    lib = tmp_path / "nvml_lib"
    lib.mkdir()
    (lib / "pynvml.py").write_text(FAKE_PYNVML)
    sys.modules.pop("pynvml", None)
    monkeypatch.syspath_prepend(str(lib))
    yield lib
    sys.modules.pop("pynvml", None)  # no test after this one may see it


@pytest.fixture
def no_gpu_bin(tmp_path: Path) -> Path:
    path = tmp_path / "empty_bin"
    path.mkdir()
    return path


def fake_pynvml_module() -> Any:
    import pynvml  # type: ignore[import-untyped]  # the fake, from the fake_nvml fixture

    assert getattr(pynvml, "__file__", "").endswith(os.path.join("nvml_lib", "pynvml.py"))
    return pynvml


# ------------------------------------------------------------------ 1. CUDA_VISIBLE_DEVICES parsing
VISIBLE_CASES = [
    pytest.param(None, list(range(8)), id="unset-all"),
    pytest.param("0,2,5", [0, 2, 5], id="indices"),
    pytest.param("5,0", [5, 0], id="order-kept"),
    pytest.param(f"{uuid(3)},{uuid(1)}", [3, 1], id="uuids"),
    pytest.param(uuid(6).upper().replace("GPU-", "gpu-"), [6], id="uuid-case-insensitive"),
    pytest.param("GPU-00000004", [4], id="unique-uuid-prefix"),
    pytest.param("GPU-00000004,GPU-0000000,1", [4], id="ambiguous-prefix-stops"),
    pytest.param("GPU-0000000", [], id="ambiguous-prefix-first"),
    pytest.param("", [], id="empty-none"),
    pytest.param("-1", [], id="minus-one-none"),
    pytest.param("1,-1,2", [1], id="stops-at-first-invalid"),
    pytest.param("0,0,1", [0, 1], id="dedup"),
    pytest.param(f"2,{uuid(2)},3", [2, 3], id="dedup-index-and-uuid"),
    pytest.param(" 3 , 1 ,  7", [3, 1, 7], id="spaces"),
    pytest.param("9", [], id="out-of-range"),
    pytest.param("7,8,0", [7], id="out-of-range-stops"),
    pytest.param("1,,2", [1], id="empty-entry-stops"),
    pytest.param("GPU-ffffffff", [], id="unknown-uuid"),
]


@pytest.mark.parametrize(("value", "expected"), VISIBLE_CASES)
def test_parse_visible(value: str | None, expected: list[int]) -> None:
    assert [g.index for g in parse_visible(value, GPUS)] == expected


def test_find_gpu_forms() -> None:
    assert find_gpu(3, GPUS) == GPUS[3]
    assert find_gpu("3", GPUS) == GPUS[3]
    assert find_gpu(uuid(5), GPUS) == GPUS[5]
    assert find_gpu("GPU-00000002-0000", GPUS) == GPUS[2]
    assert find_gpu("GPU-", GPUS) is None  # a prefix of all eight
    assert find_gpu(8, GPUS) is None
    assert find_gpu("", GPUS) is None
    assert find_gpu("0", ()) is None


# -------------------------------------------------------------------------------- 2. discovery
def test_discovery_via_nvidia_smi_reads_numa_from_sysfs(
    fake_smi: FakeSmi, fake_sysfs: Path, no_nvml: None
) -> None:
    assert probe.visible_gpus({"PATH": str(fake_smi.bin_dir)}) == GPUS
    assert fake_smi.calls() == [" ".join(SMI_ARGS)]  # exactly the query, once


def test_discovery_via_nvidia_smi_without_sysfs_has_unknown_numa(
    fake_smi: FakeSmi, empty_sysfs: Path, no_nvml: None
) -> None:
    assert probe.visible_gpus({"PATH": str(fake_smi.bin_dir)}) == NO_NUMA


def test_discovery_prefers_nvml_and_takes_numa_from_it(
    fake_smi: FakeSmi, fake_nvml: Path, empty_sysfs: Path
) -> None:
    """The sysfs is empty: the NUMA nodes can only come from NVML; nvidia-smi is never run."""
    assert probe.visible_gpus({"PATH": str(fake_smi.bin_dir)}) == GPUS
    assert fake_smi.calls() == []
    assert fake_pynvml_module()._initialized == 0, "nvmlShutdown must follow nvmlInit"


def test_nvml_without_numa_api_falls_back_to_sysfs(
    fake_nvml: Path, fake_sysfs: Path, no_gpu_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pynvml = fake_pynvml_module()

    def unsupported(handle: Any) -> int:
        raise pynvml.NVMLError("Not Supported")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNumaNodeId", unsupported)
    assert probe.visible_gpus({"PATH": str(no_gpu_bin)}) == GPUS
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNumaNodeId", lambda handle: -1)
    assert probe.visible_gpus({"PATH": str(no_gpu_bin)}) == GPUS


def test_nvml_without_driver_falls_back_to_nvidia_smi(
    fake_smi: FakeSmi, fake_nvml: Path, fake_sysfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pynvml = fake_pynvml_module()

    def no_driver() -> None:
        raise pynvml.NVMLError("Driver Not Loaded")

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert probe.visible_gpus({"PATH": str(fake_smi.bin_dir)}) == GPUS
    assert len(fake_smi.calls()) == 1


@pytest.mark.parametrize("source", ["nvidia-smi", "nvml"])
@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        pytest.param(None, list(range(8)), id="unset"),
        pytest.param("3,1", [3, 1], id="indices"),
        pytest.param(f"{uuid(5)},{uuid(0)}", [5, 0], id="uuids"),
        pytest.param("GPU-00000007", [7], id="uuid-prefix"),
        pytest.param("-1", [], id="hidden"),
    ],
)
def test_discovery_honours_cuda_visible_devices(
    source: str,
    visible: str | None,
    expected: list[int],
    fake_sysfs: Path,
    request: pytest.FixtureRequest,
) -> None:
    if source == "nvml":
        request.getfixturevalue("fake_nvml")
        path = str(request.getfixturevalue("no_gpu_bin"))
    else:
        request.getfixturevalue("no_nvml")
        path = str(request.getfixturevalue("fake_smi").bin_dir)
    environ = {"PATH": path}
    if visible is not None:
        environ["CUDA_VISIBLE_DEVICES"] = visible
    found = probe.visible_gpus(environ)
    assert [g.index for g in found] == expected
    assert found == tuple(GPUS[i] for i in expected)  # NUMA nodes included
    assert len(probe.visible_gpus(environ)) == len(expected)


def test_no_gpus_without_nvml_or_nvidia_smi(
    no_gpu_bin: Path, fake_sysfs: Path, no_nvml: None
) -> None:
    assert probe.visible_gpus({"PATH": str(no_gpu_bin)}) == ()
    assert probe.visible_gpus({"PATH": str(no_gpu_bin), "CUDA_VISIBLE_DEVICES": "0"}) == ()


def test_failing_nvidia_smi_means_no_gpus(tmp_path: Path, fake_sysfs: Path, no_nvml: None) -> None:
    """The driver is gone: nvidia-smi prints its complaint and exits 9."""
    bin_dir, log = tmp_path / "broken_bin", tmp_path / "broken.log"
    write_smi(
        bin_dir, log, 'echo "NVIDIA-SMI has failed because it couldn\'t communicate"\nexit 9\n'
    )
    assert probe.visible_gpus({"PATH": str(bin_dir)}) == ()
    assert log.read_text().splitlines() == [" ".join(SMI_ARGS)]


def test_nvidia_smi_odd_rows(tmp_path: Path, fake_sysfs: Path, no_nvml: None) -> None:
    """[N/A] memory is unknown, not a crash; rows that are not GPUs are skipped."""
    bin_dir, log = tmp_path / "odd_bin", tmp_path / "odd.log"
    rows = f"0, {uuid(0)}, {GPU_NAME}, [N/A], {bus_id(0)}\nNo devices were found\n\n"
    write_smi(bin_dir, log, f"cat <<'ROWS'\n{rows}ROWS\n")
    assert probe.visible_gpus({"PATH": str(bin_dir)}) == (
        dataclasses.replace(GPUS[0], memory_mib=None),
    )


def test_node_cpus_from_sysfs(fake_sysfs: Path) -> None:
    assert probe.node_cpus(0) == tuple(range(32))
    assert probe.node_cpus(1) == tuple(range(32, 64))
    assert probe.node_cpus(2) == ()


# ---------------------------------------------------------------------- 3. resolution via --plan
def cli_env(*, path_first: Path | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The agent's environment: this one, minus test variables, any real nvidia-smi and NVML."""
    env = launcher_env()
    for key in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH"):
        env.pop(key, None)
    dirs = [d for d in env.get("PATH", os.defpath).split(os.pathsep) if d]
    dirs = [d for d in dirs if not os.access(os.path.join(d, "nvidia-smi"), os.X_OK)]
    env["PATH"] = os.pathsep.join(([str(path_first)] if path_first else []) + dirs)
    env.update(extra or {})
    return env


@pytest.fixture
def no_nvml_lib(tmp_path: Path) -> Path:
    """A PYTHONPATH dir whose `pynvml` cannot be imported (hides any real nvidia-ml-py)."""
    lib = tmp_path / "no_nvml_lib"
    lib.mkdir()
    (lib / "pynvml.py").write_text("raise ImportError('no NVML in this test')\n")
    return lib


@pytest.fixture
def plan_cli(
    tmp_path: Path, fake_smi: FakeSmi, no_nvml_lib: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`python -m elastic_hydra script=x.py ARGS --plan` in tmp_path, fake GPUs or none."""
    (tmp_path / "x.py").write_text("print('x')\n")

    def run(
        *args: str, gpus: bool = True, visible: str | None = None, pythonpath: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        extra = {"PYTHONPATH": str(pythonpath or no_nvml_lib)}
        if visible is not None:
            extra["CUDA_VISIBLE_DEVICES"] = visible
        env = cli_env(path_first=fake_smi.bin_dir if gpus else None, extra=extra)
        return subprocess.run(
            [*ELASTIC_HYDRA, "script=x.py", *args, "--plan"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    return run


def plan_ok(proc: subprocess.CompletedProcess[str]) -> dict[int, str]:
    """The --plan table's device lines, by local rank (after checking the run succeeded)."""
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return {int(m[1]): m[2].strip() for m in re.finditer(r"local rank (\d+): (.*)", proc.stdout)}


def own_gpus(lines: dict[int, str]) -> list[int | None]:
    found = [re.match(r"GPU (\d+) \(", lines[r]) for r in sorted(lines)]
    return [int(m[1]) if m else None for m in found]


def workers(proc: subprocess.CompletedProcess[str]) -> int:
    found = re.search(r"1 node\(s\) x (\d+) process\(es\)", proc.stdout)
    assert found, proc.stdout
    return int(found[1])


def config_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert proc.returncode == EXIT_CONFIG, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    line = proc.stderr.rstrip("\n")
    assert line.startswith(PREFIX), line
    for fragment in fragments:
        assert fragment in line, line
    return line


def test_plan_nproc_gpu_uses_every_gpu(plan_cli: Callable[..., Any], fake_smi: FakeSmi) -> None:
    proc = plan_cli("nproc_per_node=gpu")
    lines = plan_ok(proc)
    assert workers(proc) == 8
    assert own_gpus(lines) == list(range(8))
    for rank, line in lines.items():
        assert uuid(rank) in line and GPU_NAME in line
        assert "sees GPUs 0,1,2,3,4,5,6,7" in line
        assert "NUMA" not in line  # the real /sys knows nothing of these GPUs
        assert "CPUs" not in line
    assert fake_smi.calls() == [" ".join(SMI_ARGS)]


def test_plan_nproc_gpu_honours_cuda_visible_devices(plan_cli: Callable[..., Any]) -> None:
    proc = plan_cli("nproc_per_node=gpu", visible="2,3")
    lines = plan_ok(proc)
    assert workers(proc) == 2
    assert own_gpus(lines) == [2, 3]
    assert lines[0].startswith(f"GPU 2 ({GPU_NAME}, {uuid(2)})")
    assert lines[1].startswith(f"GPU 3 ({GPU_NAME}, {uuid(3)})")
    assert all("sees GPUs 2,3" in line for line in lines.values())


def test_plan_nproc_auto_with_gpus(plan_cli: Callable[..., Any]) -> None:
    proc = plan_cli("nproc_per_node=auto")
    assert workers(proc) == 8
    assert own_gpus(plan_ok(proc)) == list(range(8))


def test_plan_nproc_auto_without_gpus_is_cpu_count(plan_cli: Callable[..., Any]) -> None:
    proc = plan_cli("nproc_per_node=auto", gpus=False)
    assert plan_ok(proc) == {}
    assert workers(proc) == len(os.sched_getaffinity(0))
    assert "as the environment has them" in proc.stdout


def test_plan_nproc_gpu_without_gpus_fails(plan_cli: Callable[..., Any]) -> None:
    config_error(plan_cli("nproc_per_node=gpu", gpus=False), "nproc_per_node", "no usable NVIDIA")


def test_plan_nproc_gpu_with_every_gpu_hidden_fails(plan_cli: Callable[..., Any]) -> None:
    config_error(plan_cli("nproc_per_node=gpu", visible="-1"), "nproc_per_node")


def test_plan_gpu_selection(plan_cli: Callable[..., Any]) -> None:
    lines = plan_ok(plan_cli("gpus=[0,2,5]", "nproc_per_node=3"))
    assert own_gpus(lines) == [0, 2, 5]
    assert all("sees GPUs 0,2,5" in line for line in lines.values())


def test_plan_gpu_selection_by_uuid(plan_cli: Callable[..., Any]) -> None:
    lines = plan_ok(plan_cli(f"gpus=[{uuid(3)},1]", "nproc_per_node=2"))
    assert own_gpus(lines) == [3, 1]
    assert all("sees GPUs 3,1" in line for line in lines.values())


def test_plan_more_workers_than_selected_gpus(plan_cli: Callable[..., Any]) -> None:
    proc = plan_cli("gpus=[0,2]", "nproc_per_node=3")
    config_error(proc, "nproc_per_node", "gpu_sharing", "got 3")
    lines = plan_ok(plan_cli("gpus=[0,2]", "nproc_per_node=3", "gpu_sharing=true"))
    assert own_gpus(lines) == [0, 2, 0]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        pytest.param(["gpus=[9]"], ("gpus", "got 9", "0, 1, 2"), id="gpus-out-of-range"),
        pytest.param(["gpus=[1,1]"], ("gpus", "twice"), id="gpus-twice"),
        pytest.param(["devices=bogus"], ("devices", "got 'bogus'", "visible or isolate"), id="dev"),
    ],
)
def test_plan_device_errors(
    plan_cli: Callable[..., Any], args: list[str], fragments: tuple[str, ...]
) -> None:
    config_error(plan_cli(*args), *fragments)


def test_plan_isolate_each_rank_sees_only_its_gpu(plan_cli: Callable[..., Any]) -> None:
    lines = plan_ok(plan_cli("devices=isolate", "nproc_per_node=gpu"))
    assert own_gpus(lines) == list(range(8))
    assert all("sees GPUs" not in line for line in lines.values())


def test_plan_with_nvml_shows_numa_nodes(plan_cli: Callable[..., Any], fake_nvml: Path) -> None:
    """NVML from PYTHONPATH, no nvidia-smi at all: NUMA comes from NVML even with the real /sys."""
    lines = plan_ok(plan_cli("nproc_per_node=gpu", gpus=False, pythonpath=fake_nvml))
    assert own_gpus(lines) == list(range(8))
    for rank, line in lines.items():
        assert f"{uuid(rank)}, NUMA {numa(rank)})" in line


# ------------------------------------------------------------------------ 4. pure-level resolution
@pytest.fixture
def machine(fake_sysfs: Path) -> Machine:
    """The fake 8-GPU, 64-CPU machine, its node CPUs read from the fake sysfs."""
    return Machine(gpus=lambda: GPUS, cpus=lambda: tuple(range(64)), node_cpus=probe.node_cpus)


def resolved(machine: Machine, nproc: int, **keys: Any) -> tuple[WorkerDevices, ...]:
    options: dict[str, Any] = {
        "from_gpus": False,
        "gpus": None,
        "policy": "visible",
        "sharing": False,
        "cpu_bind": False,
    }
    options.update(keys)
    return resolve_devices(nproc=nproc, machine=machine, **options)


def test_isolate_gives_each_worker_its_own_uuid(machine: Machine) -> None:
    result = resolved(machine, 8, from_gpus=True, policy="isolate")
    assert [w.cuda_visible_devices for w in result] == [uuid(i) for i in range(8)]
    assert [w.gpus for w in result] == [(g,) for g in GPUS]
    assert [w.own for w in result] == list(GPUS)
    assert all(w.cpus is None for w in result)


def test_isolate_with_selection(machine: Machine) -> None:
    result = resolved(machine, 2, gpus=[6, uuid(2)], policy="isolate")
    assert [w.cuda_visible_devices for w in result] == [uuid(6), uuid(2)]


def test_visible_with_selection_restricts_every_worker(machine: Machine) -> None:
    result = resolved(machine, 3, gpus=[5, 0, "GPU-00000003"])
    expected = f"{uuid(5)},{uuid(0)},{uuid(3)}"
    assert [w.cuda_visible_devices for w in result] == [expected] * 3
    assert [w.own for w in result] == [GPUS[5], GPUS[0], GPUS[3]]
    assert all(w.gpus == (GPUS[5], GPUS[0], GPUS[3]) for w in result)


def test_visible_without_selection_leaves_cuda_visible_devices(machine: Machine) -> None:
    result = resolved(machine, 8, from_gpus=True)
    assert [w.cuda_visible_devices for w in result] == [None] * 8
    assert [w.own for w in result] == list(GPUS)
    assert all(w.gpus == GPUS for w in result)


def test_sharing_round_robin(machine: Machine) -> None:
    result = resolved(machine, 5, gpus=[1, 4], sharing=True, policy="isolate")
    assert [w.cuda_visible_devices for w in result] == [uuid(i) for i in (1, 4, 1, 4, 1)]
    with pytest.raises(ConfigError) as err:
        resolved(machine, 5, gpus=[1, 4])
    assert err.value.key == "nproc_per_node" and "gpu_sharing" in str(err.value)


def test_devices_untouched_by_default_and_gpus_not_queried() -> None:
    def no_query() -> tuple[Gpu, ...]:
        raise AssertionError("GPU discovery ran for a job that does not use GPUs")

    lazy = Machine(gpus=no_query, cpus=lambda: (0, 1), node_cpus=lambda n: ())
    assert resolved(lazy, 4) == ()
    assert resolve_nproc(4, lazy) == (4, False)
    assert resolve_nproc("cpu", lazy) == (2, False)


def test_resolve_nproc_keywords(machine: Machine) -> None:
    assert resolve_nproc("gpu", machine) == (8, True)
    assert resolve_nproc(" AUTO ", machine) == (8, True)
    assert resolve_nproc("cpu", machine) == (64, False)
    assert resolve_nproc("3", machine) == (3, False)
    none = dataclasses.replace(machine, gpus=lambda: ())
    assert resolve_nproc("auto", none) == (64, False)
    with pytest.raises(ConfigError, match="nproc_per_node"):
        resolve_nproc("gpu", none)
    for bad in (0, True, 1.5, "lots"):
        with pytest.raises(ConfigError, match="nproc_per_node"):
            resolve_nproc(bad, machine)


def test_selection_errors(machine: Machine) -> None:
    for gpus, fragment in (([9], "names no usable GPU"), ([1, 1], "twice"), ([], "empty")):
        with pytest.raises(ConfigError, match=fragment):
            resolved(machine, 1, gpus=gpus)
    with pytest.raises(ConfigError, match="devices"):
        resolved(dataclasses.replace(machine, gpus=lambda: ()), 1, policy="isolate")
    with pytest.raises(ConfigError, match="devices"):
        resolved(machine, 1, policy="Isolate ")


def test_cpu_bind_follows_numa_nodes(machine: Machine) -> None:
    result = resolved(machine, 8, from_gpus=True, cpu_bind=True)
    shares = [w.cpus for w in result]
    assert shares == [tuple(range(8 * i, 8 * i + 8)) for i in range(8)]
    assert all(set(shares[i] or ()) <= set(range(32)) for i in range(4))
    assert all(set(shares[i] or ()) <= set(range(32, 64)) for i in range(4, 8))
    assert [w.cuda_visible_devices for w in result] == [None] * 8  # binding keeps the GPUs
    assert [w.own for w in result] == list(GPUS)


def test_cpu_bind_uneven_numa_use(machine: Machine) -> None:
    """Three workers on node 0's GPUs, one on node 1's: each node's CPUs split among its own."""
    result = resolved(machine, 4, gpus=[0, 1, 2, 7], cpu_bind=True)
    assert [format_cpus(w.cpus or ()) for w in result] == ["0-10", "11-21", "22-31", "32-63"]


def test_cpu_bind_without_gpus_splits_evenly(machine: Machine) -> None:
    result = resolved(machine, 3, cpu_bind=True)
    assert [w.cpus for w in result] == [
        tuple(range(0, 22)),
        tuple(range(22, 43)),
        tuple(range(43, 64)),
    ]
    assert all(w.own is None and w.cuda_visible_devices is None for w in result)


def test_cpu_bind_more_workers_than_cpus_wraps(machine: Machine) -> None:
    small = dataclasses.replace(machine, cpus=lambda: (0, 1))
    result = resolved(small, 3, cpu_bind=True)
    assert [w.cpus for w in result] == [(0,), (1,), (0,)]
    # GPUs on node 0 whose CPUs are 0-31, of which this process may use only 0 and 1.
    result = resolved(small, 3, gpus=[0, 1, 2], cpu_bind=True)
    assert [w.cpus for w in result] == [(0,), (1,), (0,)]


def test_cpu_bind_respects_affinity(machine: Machine) -> None:
    """The process may use CPUs 16-47 only: node 0 offers 16-31, node 1 offers 32-47."""
    narrow = dataclasses.replace(machine, cpus=lambda: tuple(range(16, 48)))
    result = resolved(narrow, 4, gpus=[0, 1, 4, 5], cpu_bind=True)
    assert [format_cpus(w.cpus or ()) for w in result] == ["16-23", "24-31", "32-39", "40-47"]


def test_cpu_bind_mixed_known_and_unknown_numa_is_disjoint() -> None:
    """GPUs 0-3 on node 0, GPUs 4-7 with no NUMA information: still a disjoint share each."""
    gpus = GPUS[:4] + NO_NUMA[4:]
    workers = assign_gpus(8, gpus, DevicePolicy.VISIBLE, restrict=False)
    node = {0: tuple(range(32)), 1: tuple(range(32, 64))}
    result = bind_cpus(workers, range(64), lambda n: node.get(n, ()))
    seen: list[int] = []
    for w in result:
        assert w.cpus
        seen += w.cpus
    assert len(seen) == len(set(seen)), [format_cpus(w.cpus or ()) for w in result]


@pytest.mark.parametrize(
    ("cpus", "parts", "expected"),
    [
        pytest.param(range(64), 3, [(0, 21), (22, 42), (43, 63)], id="64-by-3"),
        pytest.param(range(8), 4, [(0, 1), (2, 3), (4, 5), (6, 7)], id="even"),
        pytest.param(range(5), 5, [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)], id="one-each"),
        pytest.param(range(4), 1, [(0, 3)], id="one-part"),
    ],
)
def test_split_evenly(cpus: range, parts: int, expected: list[tuple[int, int]]) -> None:
    shares = split_evenly(list(cpus), parts)
    assert [(s[0], s[-1]) for s in shares] == expected
    assert [c for s in shares for c in s] == list(cpus)


def test_split_evenly_wraps_and_keeps_order() -> None:
    assert split_evenly([3, 9], 5) == [(3,), (9,), (3,), (9,), (3,)]
    assert split_evenly([9, 3, 5], 2) == [(9, 3), (5,)]


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ((0, 1, 2, 3), "0-3"),
        ((0, 1, 2, 3, 8, 10, 11), "0-3,8,10-11"),
        ((5,), "5"),
        ((), ""),
        (tuple(range(32, 64)), "32-63"),
        ((1, 3, 5), "1,3,5"),
    ],
)
def test_cpulist_round_trip(cpus: tuple[int, ...], text: str) -> None:
    assert format_cpus(cpus) == text
    assert parse_cpus(text) == cpus
    assert parse_cpus(text + "\n") == cpus


def test_format_cpus_sorts_and_dedups() -> None:
    assert format_cpus([3, 1, 2, 2, 7]) == "1-3,7"


# --------------------------------------------------------------------------------- 5. worker_env
FILES = WorkerFiles(
    run_dir="/run", plan_path="/run/plan.json", config_path="/run/config.yaml",
    error_file="/run/error.json", fault_file="/run/fault.log",
)  # fmt: skip
NODE = NodeAssignment(
    group_rank=0, group_world_size=1, base_rank=0, world_size=2, role_base_rank=0,
    role_world_size=2, master=Endpoint(host="127.0.0.1", port=29500),
)  # fmt: skip
PLAN = LaunchPlan(
    entrypoint=PythonScript(path="/x.py", python=sys.executable),
    nnodes=NodeRange(min=1, max=1),
    nproc_per_node=2,
    rdzv=Standalone(),
    run_id="r",
)
BOUND = (
    WorkerDevices(gpus=(GPUS[0],), own=GPUS[0], cuda_visible_devices=uuid(0), cpus=tuple(range(8))),
    WorkerDevices(gpus=(GPUS[1],), own=GPUS[1], cuda_visible_devices=uuid(1), cpus=(8, 9, 10)),
)


def env_of(plan: LaunchPlan, base: dict[str, str], local_rank: int) -> dict[str, str]:
    return worker_env(
        plan, base, NODE, local_rank=local_rank, attempt=0, restart_count=0, files=FILES
    )


def test_worker_env_bound_worker() -> None:
    plan = dataclasses.replace(PLAN, devices=BOUND)
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "7"}
    first, second = env_of(plan, base, 0), env_of(plan, base, 1)
    assert (first["OMP_NUM_THREADS"], second["OMP_NUM_THREADS"]) == ("8", "3")
    assert (first["CUDA_VISIBLE_DEVICES"], second["CUDA_VISIBLE_DEVICES"]) == (uuid(0), uuid(1))
    assert (first["LOCAL_RANK"], second["LOCAL_RANK"]) == ("0", "1")
    assert base == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "7"}, "the base is not modified"


def test_worker_env_keeps_user_omp_num_threads() -> None:
    plan = dataclasses.replace(PLAN, devices=BOUND)
    assert env_of(plan, {"OMP_NUM_THREADS": "3"}, 0)["OMP_NUM_THREADS"] == "3"
    from_job = dataclasses.replace(plan, env=(("OMP_NUM_THREADS", "5"),))
    assert env_of(from_job, {}, 0)["OMP_NUM_THREADS"] == "5"
    assert env_of(from_job, {"OMP_NUM_THREADS": "3"}, 1)["OMP_NUM_THREADS"] == "5"


def test_worker_env_visible_keeps_cuda_visible_devices() -> None:
    visible = tuple(WorkerDevices(gpus=GPUS[2:4], own=g) for g in GPUS[2:4])
    plan = dataclasses.replace(PLAN, devices=visible)
    env = env_of(plan, {"CUDA_VISIBLE_DEVICES": "2,3"}, 1)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["OMP_NUM_THREADS"] == "1"  # not bound: torchrun's rule
    assert "CUDA_VISIBLE_DEVICES" not in env_of(plan, {}, 0)


def test_worker_env_without_devices_is_torchruns() -> None:
    assert env_of(PLAN, {}, 0)["OMP_NUM_THREADS"] == "1"
    single = dataclasses.replace(PLAN, nproc_per_node=1)
    assert "OMP_NUM_THREADS" not in env_of(single, {}, 0)
    bound_single = dataclasses.replace(single, devices=(WorkerDevices(cpus=(0, 1, 2, 3)),))
    assert env_of(bound_single, {}, 0)["OMP_NUM_THREADS"] == "4"


# ------------------------------------------------------------------------ 6. real binding (launch)
PROBE = """\
import json, os, sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
keys = ("LOCAL_RANK", "RANK", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
record = {
    "affinity": sorted(os.sched_getaffinity(0)),
    "env": {k: os.environ.get(k) for k in keys},
}
name = os.environ["LOCAL_RANK"] + ".json"
(out / (name + ".tmp")).write_text(json.dumps(record))
os.replace(out / (name + ".tmp"), out / name)
"""


def launch_probe(tmp_path: Path, *args: str, path_first: Path | None) -> list[dict[str, Any]]:
    """Run the real launcher with two probe workers; their records, by local rank."""
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / "probe_out"
    proc = subprocess.run(
        [*ELASTIC_HYDRA, "script=probe.py", "nproc_per_node=2", *args, "--", str(out)],
        cwd=tmp_path,
        env=cli_env(path_first=path_first),
        capture_output=True,
        timeout=45,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]


def test_cpu_bind_pins_real_workers(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    first, second = launch_probe(tmp_path, "cpu_bind=true", path_first=None)
    shares = [list(s) for s in split_evenly(allowed, 2)]  # one CPU: both wrap onto it
    assert first["affinity"] == shares[0]  # {0} on a 2-CPU machine
    assert second["affinity"] == shares[1]  # {1}
    if len(allowed) >= 2:
        assert not set(first["affinity"]) & set(second["affinity"])
    assert first["env"]["OMP_NUM_THREADS"] == str(len(shares[0]))
    assert second["env"]["OMP_NUM_THREADS"] == str(len(shares[1]))
    assert [first["env"]["LOCAL_RANK"], second["env"]["LOCAL_RANK"]] == ["0", "1"]
    assert first["env"]["CUDA_VISIBLE_DEVICES"] is None  # no GPUs involved


def test_isolate_real_workers_see_own_gpu(tmp_path: Path, fake_smi: FakeSmi) -> None:
    first, second = launch_probe(tmp_path, "devices=isolate", path_first=fake_smi.bin_dir)
    assert first["env"]["CUDA_VISIBLE_DEVICES"] == uuid(0)
    assert second["env"]["CUDA_VISIBLE_DEVICES"] == uuid(1)
    assert [first["env"]["LOCAL_RANK"], second["env"]["LOCAL_RANK"]] == ["0", "1"]
    assert [first["env"]["RANK"], second["env"]["RANK"]] == ["0", "1"]
    assert first["env"]["OMP_NUM_THREADS"] == "1"  # not bound: torchrun's rule
    allowed = sorted(os.sched_getaffinity(0))
    assert first["affinity"] == second["affinity"] == allowed  # not bound: inherited
    assert len(fake_smi.calls()) == 1


def test_bind_cpus_on_a_socket_limited_allocation_stays_disjoint() -> None:
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i}", numa_node=0 if i < 4 else 1) for i in range(8))
    nodes = {0: tuple(range(32)), 1: tuple(range(32, 64))}
    workers = bind_cpus(
        assign_gpus(8, gpus, DevicePolicy.VISIBLE, restrict=False),
        range(32),  # e.g. a scheduler allowed socket 0 only
        lambda n: nodes.get(n, ()),
    )
    assert [format_cpus(w.cpus or ()) for w in workers[:4]] == ["0-7", "8-15", "16-23", "24-31"]
    # Node 1 has no allowed CPU: those workers share what is allowed (there is nothing else).
    assert all(set(w.cpus or ()) <= set(range(32)) for w in workers[4:])


def test_a_job_env_cuda_visible_devices_conflicting_with_gpu_handling_is_refused(
    machine: Machine,
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_devices(
            nproc=2, from_gpus=True, gpus=None, policy="visible", sharing=False,
            cpu_bind=False, machine=machine, job_visible="1",
        )  # fmt: skip
    assert info.value.key == "env.CUDA_VISIBLE_DEVICES" and "gpus=" in info.value.line()
    # A job that leaves GPUs alone may set it as it likes.
    assert resolve_devices(
        nproc=2, from_gpus=False, gpus=None, policy="visible", sharing=False,
        cpu_bind=False, machine=machine, job_visible="1",
    ) == ()  # fmt: skip
