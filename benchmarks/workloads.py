"""The worker script, the two launcher command lines the benchmarks compare, and the floor.

One plain-Python worker (no torch import: the point is the launcher's overhead) is driven by
environment variables; every mode that measures time writes *stamps* (small files named after the
event, holding `time.time()` and the pid) atomically into `BENCH_STAMPS`. The floor is no launcher:
a bare stdlib program that starts the same workers, for what starting fresh interpreters costs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

Launcher = Literal["elastic-hydra", "torchrun"]
LAUNCHERS: tuple[Launcher, Launcher] = ("elastic-hydra", "torchrun")
# The runner name the floor's samples are filed under, next to the launchers' (never a Launcher).
FLOOR: Final = "floor"

# Generous bounds: a worker never outlives them even if the harness were killed itself.
WORKER_SLEEP_CAP_S = 60

WORKER = f"""\
import os, sys, time
t0 = time.time()
mode = os.environ["BENCH_MODE"]
if mode == "exit":
    sys.exit(0)
if mode == "print":
    for i in range(int(os.environ["BENCH_LINES"])):
        print(f"line {{i}}")
    sys.exit(0)
d = os.environ["BENCH_STAMPS"]
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
rank = os.environ["RANK"]
world = int(os.environ["WORLD_SIZE"])


def stamp(name, t):
    tmp = os.path.join(d, "." + name)
    with open(tmp, "w") as f:
        f.write(f"{{t!r}} {{os.getpid()}}")
    os.replace(tmp, os.path.join(d, name))


def wait_all_started(deadline):
    prefix = f"start_{{attempt}}_"
    while time.time() < deadline:
        if sum(n.startswith(prefix) for n in os.listdir(d)) >= world:
            return
        time.sleep(0.01)


stamp(f"start_{{attempt}}_{{rank}}", t0)
# mode "start": the start stamp alone, then exit 0.
if mode == "fail":
    if attempt == "0" and rank == "0":
        wait_all_started(t0 + 30)
        time.sleep(0.2)
        stamp("fail", time.time())
        sys.exit(1)
    if attempt == "0":
        time.sleep({WORKER_SLEEP_CAP_S})
elif mode == "sleep":
    wait_all_started(t0 + 30)
    time.sleep(float(os.environ["BENCH_SLEEP"]))
    stamp(f"end_{{rank}}", time.time())
elif mode == "hold":
    time.sleep({WORKER_SLEEP_CAP_S})
"""


# The floor: Popen `nproc` workers with the least environment a launcher gives, wait for all.
# With a third argument, first write a stamp there (the restart floor's "failure" time).
BARE = """\
import os, subprocess, sys, time
script, n = sys.argv[1], int(sys.argv[2])
if len(sys.argv) > 3:
    with open(sys.argv[3], "w") as f:
        f.write(f"{time.time()!r} {os.getpid()}")
procs = [
    subprocess.Popen([sys.executable, "-u", script], env=dict(
        os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
    ))
    for r in range(n)
]
sys.exit(1 if any([p.wait() for p in procs]) else 0)
"""


def write_worker(directory: Path) -> Path:
    """Write the worker script into `directory` and return its path."""
    path = directory / "bench_worker.py"
    path.write_text(WORKER)
    return path


@dataclass(frozen=True)
class C10d:
    """A c10d rendezvous on this host shared by several agents (otherwise: standalone)."""

    nnodes: str  # "N" or "MIN:MAX"
    endpoint: str  # 127.0.0.1:PORT
    run_id: str


def command(
    launcher: Launcher,
    script: Path,
    nproc: int,
    run_dir: Path,
    *,
    max_restarts: int = 0,
    tee: bool = False,
    rdzv: C10d | None = None,
) -> list[str]:
    """The command line that runs `script` on `nproc` local workers under `launcher`.

    Args:
        launcher: which launcher.
        script: the worker script.
        nproc: workers on this node.
        run_dir: a fresh directory for this run; each launcher's own logs go under it.
        max_restarts: restarts after a failure.
        tee: copy the workers' output to the launcher's stdout (elastic-hydra's default `logs=tee`,
            torchrun's `--tee 3`); otherwise elastic-hydra runs with `logs=quiet` and torchrun
            lets the workers inherit its (discarded) stdout.
        rdzv: join this c10d rendezvous as one of several agents; None: a standalone job.

    Returns:
        The argv, both launchers run by the same interpreter as modules.
    """
    if launcher == "elastic-hydra":
        rdzv_args = [] if rdzv is None else [
            f"nnodes={rdzv.nnodes}", "rdzv=c10d", f"rdzv.endpoint={rdzv.endpoint}",
            f"rdzv.id={rdzv.run_id}", "local_addr=127.0.0.1",
        ]  # fmt: skip
        return [
            sys.executable, "-m", "elastic_hydra", f"script={script}", f"nproc_per_node={nproc}",
            *rdzv_args, f"restart.max_restarts={max_restarts}",
            f"logs.root={run_dir / 'eh_logs'}", *([] if tee else ["logs=quiet"]),
        ]  # fmt: skip
    rdzv_args = ["--standalone"] if rdzv is None else [
        f"--nnodes={rdzv.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv.endpoint}",
        f"--rdzv-id={rdzv.run_id}", "--local-addr=127.0.0.1",
    ]  # fmt: skip
    return [
        sys.executable, "-m", "torch.distributed.run", *rdzv_args, f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}", f"--log-dir={run_dir / 'torchrun_logs'}",
        *(["--tee", "3"] if tee else []), str(script),
    ]  # fmt: skip


def floor_command(script: Path, nproc: int, stamp: Path | None = None) -> list[str]:
    """The bare program (no launcher) that runs `script` on `nproc` local workers; with `stamp`,
    it first writes the time it starts them there."""
    return [sys.executable, "-c", BARE, str(script), str(nproc), *([str(stamp)] if stamp else [])]


def worker_env(mode: str, stamps: Path, **extra: str) -> dict[str, str]:
    """The harness's environment plus the worker's mode, stamp directory and extras."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELASTIC_HYDRA_", "BENCH_"))}
    env.update(BENCH_MODE=mode, BENCH_STAMPS=str(stamps))
    env.update({f"BENCH_{k.upper()}": v for k, v in extra.items()})
    return env
