"""Each worker's environment: a pure function of the plan, the rendezvous result and the attempt.

Compatible with torchrun's contract (the variables below), plus our own ELASTIC_HYDRA_* ones. An
attempt is one start of the worker group, after a failure or a membership change alike: the n of
ELASTIC_HYDRA_ATTEMPT is the n of the attempt_<n>/ directory the worker logs to. Restarts for
failures alone are counted by TORCHELASTIC_RESTART_COUNT, as torchrun counts them.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass

from elastic_hydra.agent.inherit import SNAPSHOT_LIMIT, SNAPSHOTS, inherited_env
from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.plan import LaunchPlan, StragglerAction

RUN_DIR = "ELASTIC_HYDRA_RUN_DIR"
ATTEMPT = "ELASTIC_HYDRA_ATTEMPT"
PLAN_PATH = "ELASTIC_HYDRA_PLAN"
CONFIG_PATH = "ELASTIC_HYDRA_CONFIG"
FAULT_FILE = "ELASTIC_HYDRA_FAULT_FILE"  # where the bootstrap's faulthandler writes a crash
# When this node's launch started (seconds since the epoch): the same for every rank and every
# attempt, so a Hydra app in the worker gets one `${now:...}` (the bootstrap pins it, hydra#2070).
LAUNCH_TIME = "ELASTIC_HYDRA_LAUNCH_TIME"
# The bootstrap's own (it takes them out of the script's environment): where it dumps every
# thread's stack on DUMP_SIGNAL, and where it notes each change of its main thread's stack.
STACKS_FILE = "ELASTIC_HYDRA_STACKS_FILE"
STACKS_SIGNAL = "ELASTIC_HYDRA_STACKS_SIGNAL"
PROGRESS_FILE = "ELASTIC_HYDRA_PROGRESS_FILE"
PROGRESS_EVERY = "ELASTIC_HYDRA_PROGRESS_EVERY"
# Where the bootstrap writes its collectives when the agent asks (a hang).
COLLECTIVES_FILE = "ELASTIC_HYDRA_COLLECTIVES_FILE"
# Where the bootstrap keeps the times it arrived at its recent collectives (the straggler score).
ARRIVALS_FILE = "ELASTIC_HYDRA_ARRIVALS_FILE"
# A real-time signal: no library uses it (SIGUSR1/2 are taken by Lightning, submitit...).
DUMP_SIGNAL = int(signal.SIGRTMIN) + 4

# The signals the agent handles (stopsignals.STOP_SIGNALS), as torchrun names them in the variable
# its agent sets and its workers inherit (torch's process contexts in a worker read it).
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def to_workers(received: int) -> int:
    """The signal that stops the workers when the agent received `received`: the same one, as
    torchrun forwards it, except the save request (stopsignals.SAVE_SIGNAL, SIGUSR1), for which
    they get SIGTERM: a worker's SIGUSR1 means "requeue me" to Lightning and submitit."""
    return int(signal.SIGTERM) if received == signal.SIGUSR1 else received


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFiles:
    run_dir: str
    plan_path: str
    config_path: str
    error_file: str
    fault_file: str
    stacks_file: str = ""
    progress_file: str = ""
    collectives_file: str = ""
    arrivals_file: str = ""
    snapshots: str = ""  # the node's snapshot area (checkpoint/); "": none
    launch_time: float | None = None  # when this node's launch started (time.time())


def inherited(plan: LaunchPlan, base: Mapping[str, str], local_rank: int) -> dict[str, str]:
    """The half of a worker's environment it inherits (`inherit.inherited_env`) under `plan`."""
    devices = plan.devices[local_rank] if plan.devices else None
    return inherited_env(
        base,
        dict(plan.env),
        nproc_per_node=plan.nproc_per_node,
        cpus=len(devices.cpus) if devices is not None and devices.cpus else 0,
        cuda_visible_devices=None if devices is None else devices.cuda_visible_devices,
    )


def worker_env(
    plan: LaunchPlan,
    base: Mapping[str, str],
    node: NodeAssignment,
    *,
    local_rank: int,
    attempt: int,
    restart_count: int,
    files: WorkerFiles,
) -> dict[str, str]:
    """The complete environment of one worker (base = the agent's environment at start): what
    it inherits (`inherit.inherited_env`), then the launcher's contract (`inherit.CONTRACT`)."""
    env = inherited(plan, base, local_rank)
    env.update(
        {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(node.base_rank + local_rank),
            "GROUP_RANK": str(node.group_rank),
            "ROLE_RANK": str(node.role_base_rank + local_rank),
            "ROLE_NAME": plan.role,
            "LOCAL_WORLD_SIZE": str(plan.nproc_per_node),
            "WORLD_SIZE": str(node.world_size),
            "GROUP_WORLD_SIZE": str(node.group_world_size),
            "ROLE_WORLD_SIZE": str(node.role_world_size),
            "MASTER_ADDR": node.master.host,
            "MASTER_PORT": str(node.master.port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(plan.restart.max_restarts),
            "TORCHELASTIC_RUN_ID": plan.torch_run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(node.use_agent_store),
            "TORCHELASTIC_ERROR_FILE": files.error_file,
            "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
            RUN_DIR: files.run_dir,
            ATTEMPT: str(attempt),
            PLAN_PATH: files.plan_path,
            CONFIG_PATH: files.config_path,
            FAULT_FILE: files.fault_file,
        }
    )
    if files.launch_time is not None:
        env[LAUNCH_TIME] = f"{files.launch_time:.6f}"
    if files.snapshots:
        env[SNAPSHOTS] = files.snapshots
        if plan.checkpoint is not None and plan.checkpoint.max_memory:
            env[SNAPSHOT_LIMIT] = str(plan.checkpoint.max_memory)
    if plan.entrypoint_bootstrapped and files.stacks_file:
        env.update({STACKS_FILE: files.stacks_file, STACKS_SIGNAL: str(DUMP_SIGNAL)})
    if plan.entrypoint_bootstrapped and files.progress_file and plan.hang.timeout is not None:
        env.update({PROGRESS_FILE: files.progress_file, PROGRESS_EVERY: f"{plan.hang.sample:g}"})
        if files.collectives_file:
            env[COLLECTIVES_FILE] = files.collectives_file
        if files.arrivals_file and plan.straggler.action is not StragglerAction.OFF:
            env[ARRIVALS_FILE] = files.arrivals_file
    return env
