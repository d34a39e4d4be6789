"""The template's environment: what every worker of every attempt on this node shares. Pure.

Libraries read some variables when they are imported (`OMP_NUM_THREADS` and `MKL_NUM_THREADS`
size thread pools, `CUDA_VISIBLE_DEVICES` for those that look early, `PYTHONHASHSEED` and every
`PYTHON*` the interpreter reads at start): the template imports with the workers' own values.
Which variables those are is not guessed: the worker environment (`agent.worker_env`) is built
for every local rank of two made-up attempts on two made-up nodes, and the template gets each
variable whose value is the same in all of them. Everything else (ranks, world size, master
address and port, restart count, attempt, per-rank files and devices) differs between workers
or attempts, and each forked worker gets it after the fork, with the rest of its environment.
The run dir, which tags the launch's processes for containment, is left out on purpose: the
template is not one of the workers.
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_hydra.agent.seams import NodeAssignment
from elastic_hydra.agent.worker_env import RUN_DIR, WorkerFiles, worker_env
from elastic_hydra.plan import Endpoint, LaunchPlan


def _variant(plan: LaunchPlan, base: Mapping[str, str], n: int) -> list[dict[str, str]]:
    node = NodeAssignment(
        group_rank=n,
        group_world_size=n + 2,
        base_rank=n * 1000,
        world_size=n * 1000 + plan.nproc_per_node,
        role_base_rank=n * 1000,
        role_world_size=n * 1000 + plan.nproc_per_node,
        master=Endpoint(host=f"node{n}.invalid", port=1000 + n),
        use_agent_store=bool(n),
    )
    files = WorkerFiles(
        run_dir=f"/run{n}",
        plan_path=f"/plan{n}",
        config_path=f"/config{n}",
        error_file=f"/error{n}",
        fault_file=f"/fault{n}",
        stacks_file=f"/stacks{n}",
        progress_file=f"/progress{n}",
        launch_time=float(n),
    )
    return [
        worker_env(plan, base, node, local_rank=lr, attempt=n, restart_count=n, files=files)
        for lr in range(plan.nproc_per_node)
    ]


def template_env(plan: LaunchPlan, base: Mapping[str, str]) -> dict[str, str]:
    """The variables every worker of the launch on this node has, with the same value."""
    envs = _variant(plan, base, 0) + _variant(plan, base, 1)
    first = envs[0]
    common = {k: v for k, v in first.items() if all(e.get(k) == v for e in envs[1:])}
    common.pop(RUN_DIR, None)
    return common
