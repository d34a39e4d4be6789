"""The template's environment: the inherited half that every worker on this node shares. Pure.

Libraries read some variables when they are imported (`OMP_NUM_THREADS` and `MKL_NUM_THREADS`
size thread pools, `CUDA_VISIBLE_DEVICES` for those that look early, `PYTHONHASHSEED` and every
`PYTHON*` the interpreter reads at start): the template imports with the workers' own values.
Which variables those are is not guessed: the inherited half of each local rank's environment
(`inherit.inherited_env`: the agent's environment, the job's `env.*`, the thread and device
defaults) is built, and the template gets each variable whose value is the same for all of
them. The launcher's contract (`inherit.CONTRACT`: ranks, sizes, master, restart count,
attempt, run id, run files) is never in it, even where the value is common: each forked worker
gets it after the fork, with the rest of its environment, so no import sees a stale value.
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_hydra.agent.inherit import CONTRACT
from elastic_hydra.agent.worker_env import inherited
from elastic_hydra.plan import LaunchPlan


def template_env(plan: LaunchPlan, base: Mapping[str, str]) -> dict[str, str]:
    """The variables every worker of the launch on this node inherits, with the same value."""
    envs = [inherited(plan, base, local_rank) for local_rank in range(plan.nproc_per_node)]
    first = envs[0]
    return {
        k: v for k, v in first.items() if k not in CONTRACT and all(e.get(k) == v for e in envs[1:])
    }
