"""What a worker inherits from the agent's environment, and the names the launcher sets. Pure.

A worker's environment has two halves (`agent.worker_env`): what it inherits (the agent's
environment with the job's `env.*` on top and the thread and device defaults: this module) and
the launcher's contract (ranks, sizes, master, attempt, run files: `CONTRACT`), which differs
between workers or attempts and always wins. The warm template (`warm/`) imports with the
inherited half of the workers, before the plan exists when it can: this module imports nothing
but the standard library, so the agent's first instant can use it.
"""

from __future__ import annotations

from collections.abc import Mapping

# torch's Flight Recorder (gloo and NCCL), on for every worker unless the job sets it (0: off):
# the entries a hang's verdict reads (hangs/). TORCH_NCCL_TRACE_BUFFER_SIZE is its older name.
FR_BUFFER = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_ENTRIES = "2000"

# Never inherited from the launcher's environment: a surrounding torchrun's signal list is not
# ours; the rendezvous secret signs the agents' records and workers never need it.
AGENT_ONLY = ("TORCHELASTIC_SIGNALS_TO_HANDLE", "ELASTIC_HYDRA_RDZV_SECRET")

# The node's snapshot area (checkpoint/) and the most bytes one rank's snapshot may take there.
SNAPSHOTS = "ELASTIC_HYDRA_SNAPSHOTS"
SNAPSHOT_LIMIT = "ELASTIC_HYDRA_SNAPSHOT_LIMIT"

# Every variable the launcher's contract may set (torchrun's, then ours). A warm worker gets all
# of them after the fork: none is in the template while it imports.
CONTRACT = frozenset(
    {
        "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
        "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
        "TORCHELASTIC_SIGNALS_TO_HANDLE",
        "ELASTIC_HYDRA_RUN_DIR", "ELASTIC_HYDRA_ATTEMPT", "ELASTIC_HYDRA_PLAN",
        "ELASTIC_HYDRA_CONFIG", "ELASTIC_HYDRA_FAULT_FILE", "ELASTIC_HYDRA_LAUNCH_TIME",
        "ELASTIC_HYDRA_STACKS_FILE", "ELASTIC_HYDRA_STACKS_SIGNAL",
        "ELASTIC_HYDRA_PROGRESS_FILE", "ELASTIC_HYDRA_PROGRESS_EVERY",
        "ELASTIC_HYDRA_COLLECTIVES_FILE", "ELASTIC_HYDRA_ARRIVALS_FILE",
        SNAPSHOTS, SNAPSHOT_LIMIT,
    }
)  # fmt: skip


def inherited_env(
    base: Mapping[str, str],
    job_env: Mapping[str, str],
    *,
    nproc_per_node: int,
    cpus: int = 0,
    cuda_visible_devices: str | None = None,
) -> dict[str, str]:
    """One worker's inherited half: `base` (the agent's environment at start) less the agent's
    own, `job_env` (the job's `env.*`) on top, and the defaults: one OMP thread per worker when
    several share the machine (torchrun's rule), or as many as its `cpus` when it is bound; its
    devices (`gpus`); torch's Flight Recorder on (`FR_BUFFER`), unless the job sets it."""
    env = {k: v for k, v in base.items() if k not in AGENT_ONLY}
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.update(job_env)
    if FR_BUFFER not in env and FR_BUFFER_OLD not in env:
        env[FR_BUFFER] = FR_ENTRIES
    if "OMP_NUM_THREADS" not in env:
        if cpus:
            env["OMP_NUM_THREADS"] = str(cpus)
        elif nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = "1"
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    return env
