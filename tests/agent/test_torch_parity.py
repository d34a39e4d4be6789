"""The worker environment matches torchrun's: the same worker runs under both launchers.

`tests/scripts/dump_env.py` dumps its environment, argv and cwd. It runs under
`torchrun --standalone --nnodes=1 --nproc-per-node=N` and under
`python -m elastic_hydra script=... nproc_per_node=N` (same topology, same parent environment),
and every variable of torchrun's worker contract (docs/worker-environment.md) is
compared: equal where it must be equal, the same form where the value is per-launch (ports, run
ids, paths).

Values that differ by design, side by side (torch 2.13, standalone, 2 workers):

    variable                      torchrun                              elastic-hydra
    MASTER_ADDR                   localhost (getfqdn() of the agent)    127.0.0.1 (Standalone.host)
    MASTER_PORT                   the agent's TCPStore port             a port the agent reserves
    TORCHELASTIC_RUN_ID           uuid4 with dashes                     uuid4().hex
    TORCHELASTIC_USE_AGENT_STORE  True                                  False
    TORCHELASTIC_ERROR_FILE       $TMPDIR/torchelastic_*/<id>_*/        <run dir>/attempt_<n>/<lr>/
                                  attempt_<n>/<lr>/error.json           error.json

TORCHELASTIC_SIGNALS_TO_HANDLE is no part of torchrun's worker contract (its agent sets it for
itself and the workers inherit it); ours set it to the same value, the signals the agent handles.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ELASTIC_HYDRA, WORKERS

pytestmark = [
    pytest.mark.timeout(180),
]

WORKER = WORKERS / "dump_env.py"  # dump_env.py DIR -> DIR/env_<RANK>_<RESTART_COUNT>.json
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # = the torchrun console script
SCRIPT_ARGS = ["--tag", "a b=c,d", "${not_interpolated}", "--", "'quoted'"]
LAUNCH_TIMEOUT = 120.0

# torchrun's worker contract (torch/distributed/elastic/agent/server/local_elastic_agent.py).
CONTRACT = (
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)  # fmt: skip
# Must be equal under both launchers, rank by rank.
EQUAL = (
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
)  # fmt: skip

Snapshots = dict[int, dict[str, Any]]


# ------------------------------------------------------------------------------------------ helpers
def parent_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This process's environment without anything a launcher sets (OMP_NUM_THREADS included)."""
    drop = {*CONTRACT, "PYTHON_EXEC", "ELASTIC_HYDRA_FULL_ERROR"}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("TORCHELASTIC_", "ELASTIC_HYDRA_", "PET_"))
    }
    env["TMPDIR"] = str(tmp)  # torchrun's default log dir (and its error files) land in tmp
    env.update(extra)
    return env


def launch(kind: str, nproc: int, tmp: Path, **extra_env: str) -> Snapshots:
    """Run the dump_env worker under `kind` (torchrun or ours); returns rank -> snapshot."""
    out = tmp / "out"
    args = [str(out), *SCRIPT_ARGS]
    if kind == "torchrun":
        cmd = [*TORCHRUN, "--standalone", "--nnodes=1", f"--nproc-per-node={nproc}", str(WORKER)]
        cmd += args
    else:
        cmd = [*ELASTIC_HYDRA, f"script={WORKER}", f"nproc_per_node={nproc}", "--", *args]
    env = parent_env(tmp, **extra_env)
    proc = subprocess.run(
        cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, check=False
    )
    assert proc.returncode == 0, f"{kind} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    snaps = {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in out.glob("env_*_0.json")}
    assert len(list(out.glob("*.json"))) == nproc, f"{kind}: {sorted(out.iterdir())}"
    assert sorted(snaps) == list(range(nproc)), f"{kind}: snapshots of ranks {sorted(snaps)}"
    for snap in snaps.values():
        snap["parent_env"] = env
        snap["launch_cwd"] = str(tmp)
    return snaps


def is_this_host(addr: str) -> bool:
    """True when `addr` resolves to an address of this machine (one a socket can bind)."""
    for family, _, _, _, sockaddr in socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((sockaddr[0], 0))
            except OSError:
                continue
            return True
    return False


def both(runs: dict[str, Snapshots]) -> list[tuple[str, int, dict[str, str]]]:
    return [
        (kind, rank, snap["env"]) for kind, snaps in runs.items() for rank, snap in snaps.items()
    ]


# ----------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Snapshots]:
    """nproc_per_node=2, OMP_NUM_THREADS unset in the parent."""
    return {
        kind: launch(kind, 2, tmp_path_factory.mktemp(f"{kind}-2")) for kind in ("torchrun", "ours")
    }


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Snapshots]:
    return {
        kind: launch(kind, 1, tmp_path_factory.mktemp(f"{kind}-1")) for kind in ("torchrun", "ours")
    }


@pytest.fixture(scope="module")
def user_omp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Snapshots]:
    """nproc_per_node=2 with OMP_NUM_THREADS=3 set by the user."""
    return {
        kind: launch(kind, 2, tmp_path_factory.mktemp(f"{kind}-omp"), OMP_NUM_THREADS="3")
        for kind in ("torchrun", "ours")
    }


# -------------------------------------------------------------------------------------------- tests
def test_every_contract_variable_is_set_by_both(two_workers: dict[str, Snapshots]) -> None:
    for kind, rank, env in both(two_workers):
        missing = [name for name in CONTRACT if name not in env]
        assert not missing, f"{kind} rank {rank} lacks {missing}"


def test_nothing_torchrun_adds_is_missing_from_ours(two_workers: dict[str, Snapshots]) -> None:
    for rank, snap in two_workers["torchrun"].items():
        added = {k for k, v in snap["env"].items() if snap["parent_env"].get(k) != v}
        ours = set(two_workers["ours"][rank]["env"])
        assert added - {"TMPDIR"} <= ours


def test_equal_variables_are_equal(two_workers: dict[str, Snapshots]) -> None:
    expected = {
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": "2",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",  # unset in the parent and nproc > 1
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    }
    for rank in (0, 1):
        theirs, ours = two_workers["torchrun"][rank]["env"], two_workers["ours"][rank]["env"]
        assert {k: ours[k] for k in EQUAL} == {k: theirs[k] for k in EQUAL}
        rank_vars = {"LOCAL_RANK": str(rank), "RANK": str(rank), "ROLE_RANK": str(rank)}
        assert {k: ours[k] for k in (*expected, *rank_vars)} == expected | rank_vars


def test_master_endpoint_has_the_same_form(two_workers: dict[str, Snapshots]) -> None:
    # torchrun's standalone agent hosts a TCPStore and hands out getfqdn() ("localhost" here);
    # ours reserves a port on 127.0.0.1 and rank 0's init_process_group binds it. The values
    # differ; both must name this machine and one port shared by all ranks.
    for kind, snaps in two_workers.items():
        endpoints = {(s["env"]["MASTER_ADDR"], s["env"]["MASTER_PORT"]) for s in snaps.values()}
        assert len(endpoints) == 1, f"{kind}: ranks disagree on the master: {endpoints}"
        ((addr, port),) = endpoints
        assert port.isdigit() and 1 <= int(port) <= 65535, f"{kind}: MASTER_PORT={port!r}"
        assert is_this_host(addr), f"{kind}: MASTER_ADDR={addr!r} is not this machine"
    assert two_workers["ours"][0]["env"]["MASTER_ADDR"] == "127.0.0.1"


def test_run_id_is_shared_and_nonempty(two_workers: dict[str, Snapshots]) -> None:
    for kind, snaps in two_workers.items():
        ids = {s["env"]["TORCHELASTIC_RUN_ID"] for s in snaps.values()}
        assert len(ids) == 1, f"{kind}: ranks disagree on the run id: {ids}"
        assert ids.pop().strip() not in ("", "none"), f"{kind}: standalone needs a fresh run id"
    ours = two_workers["ours"][0]["env"]
    summary = json.loads(Path(ours["ELASTIC_HYDRA_RUN_DIR"], "summary.json").read_text())
    assert summary["run_id"] == ours["TORCHELASTIC_RUN_ID"]


def test_error_file_is_error_json_in_a_per_rank_dir(two_workers: dict[str, Snapshots]) -> None:
    for kind, snaps in two_workers.items():
        paths = {rank: Path(s["env"]["TORCHELASTIC_ERROR_FILE"]) for rank, s in snaps.items()}
        assert len(set(paths.values())) == len(paths), f"{kind}: ranks share an error file"
        assert len({p.parent for p in paths.values()}) == len(paths), f"{kind}: ranks share a dir"
        for rank, path in paths.items():
            assert path.is_absolute() and path.name == "error.json", f"{kind}: {path}"
            # <...>/attempt_<restart>/<local_rank>/error.json in both launchers
            assert (path.parent.parent.name, path.parent.name) == ("attempt_0", str(rank)), path
            assert not path.exists(), f"{kind}: a worker that did not fail left {path}"
    ours = two_workers["ours"][0]["env"]
    assert Path(ours["TORCHELASTIC_ERROR_FILE"]).is_relative_to(ours["ELASTIC_HYDRA_RUN_DIR"])


def test_agent_store_flag_differs_by_design(two_workers: dict[str, Snapshots]) -> None:
    # torchrun's agent creates the TCPStore and its workers' init_process_group connects to it as
    # clients ("True"). Our standalone agent imports no torch and hosts no store: rank 0's
    # init_process_group creates the store at MASTER_ADDR:MASTER_PORT, as under
    # torch.distributed.launch. "False" tells torch exactly that.
    for rank in (0, 1):
        assert two_workers["torchrun"][rank]["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert two_workers["ours"][rank]["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_signals_to_handle_names_the_signals_the_agent_handles(
    two_workers: dict[str, Snapshots],
) -> None:
    # torchrun's agent exports its --signals-to-handle; ours handles the same four signals.
    from elastic_hydra.stopsignals import STOP_SIGNALS

    ours = ",".join(sig.name for sig in STOP_SIGNALS)
    for kind, rank, env in both(two_workers):
        assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == ours, f"{kind} rank {rank}"


def test_omp_num_threads_is_not_set_for_one_worker(one_worker: dict[str, Snapshots]) -> None:
    for kind, rank, env in both(one_worker):
        assert "OMP_NUM_THREADS" not in env, f"{kind} rank {rank}: {env['OMP_NUM_THREADS']}"
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("1", "1")


def test_user_omp_num_threads_is_kept(user_omp: dict[str, Snapshots]) -> None:
    for kind, rank, env in both(user_omp):
        assert env["OMP_NUM_THREADS"] == "3", f"{kind} rank {rank}"


def test_argv_cwd_and_interpreter_match(two_workers: dict[str, Snapshots]) -> None:
    for kind, snaps in two_workers.items():
        for rank, snap in snaps.items():
            where = f"{kind} rank {rank}"
            assert not any(a.startswith(("--local-rank", "--local_rank")) for a in snap["argv"])
            assert snap["argv"][2:] == SCRIPT_ARGS, where  # byte for byte (argv[1] = out dir)
            assert Path(snap["argv"][0]).resolve() == WORKER, where
            assert snap["orig_argv"][1] == "-u", f"{where}: not unbuffered: {snap['orig_argv']}"
            assert snap["unbuffered"], where
            assert snap["cwd"] == snap["launch_cwd"], where


def test_our_variables_point_at_existing_files(two_workers: dict[str, Snapshots]) -> None:
    env = two_workers["ours"][0]["env"]
    assert Path(env["ELASTIC_HYDRA_RUN_DIR"]).is_dir()
    assert env["ELASTIC_HYDRA_ATTEMPT"] == "0"
    assert Path(env["ELASTIC_HYDRA_PLAN"]).is_file()


def test_config_variable_points_at_the_resolved_config(two_workers: dict[str, Snapshots]) -> None:
    assert Path(two_workers["ours"][0]["env"]["ELASTIC_HYDRA_CONFIG"]).is_file()
