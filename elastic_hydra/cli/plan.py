"""`elastic-hydra --plan[=json|yaml]`: the launch minus the processes, printed.

The job is composed and resolved exactly as a launch would be; nothing is created. The table
(or JSON) is the `LaunchPlan`; `yaml` is the job file of a torchrun-style command.
"""

from __future__ import annotations

import json

from elastic_hydra.config import boundary
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.errors import ConfigError
from elastic_hydra.launch import job
from elastic_hydra.plan import Dynamic, DynamicBackend, LaunchPlan


def show_plan(inv: Invocation) -> int:
    """`--plan`: the launch minus the processes, printed; nothing is created."""
    if inv.multirun:
        raise ConfigError("--plan", "shows one launch", "-m", "drop -m, or pick one value per key")
    cfg, ctx = boundary.compose(inv)
    if ctx.swept:
        raise ConfigError(
            "--plan", "shows one launch", "hydra.mode=MULTIRUN",
            "the job sets hydra.mode: MULTIRUN; pick one value per key and add hydra.mode=RUN",
        )  # fmt: skip
    checked = cfg.job()
    plan = job.plan_of(checked, ctx)
    if inv.plan == "json":
        print(json.dumps(job.plan_dict(plan), indent=2))
        return 0
    from elastic_hydra.cli import jobyaml  # a small module: the YAML of a torchrun-style command

    if inv.plan == "yaml":
        print(jobyaml.job_yaml(inv, cfg, ctx), end="")
        return 0
    from elastic_hydra.report import render

    render.print_plan(plan, run_dir_hint=f"{ctx.run_dir} (created at launch)")
    _plan_notes(inv, plan, len(checked.conf.args))
    if inv.torchrun:  # the command as a file to commit
        print(f"\n{YAML_HEADING}\n{jobyaml.job_yaml(inv, cfg, ctx)}", end="")
    return 0


YAML_HEADING = "equivalent job file (--plan=yaml prints it alone):"


def _plan_notes(inv: Invocation, plan: LaunchPlan, args: int) -> None:
    """What the plan's table does not say: an elastic job's store host, the job's own args."""
    rdzv, elastic = plan.rdzv, plan.nnodes.min != plan.nnodes.max
    if (
        elastic
        and isinstance(rdzv, Dynamic)
        and rdzv.backend is DynamicBackend.C10D
        and (rdzv.is_host is not False)
    ):
        print(
            f"note: nnodes={plan.nnodes} with the c10d store in an agent: losing the node that "
            "hosts it ends the job on every node; run the store apart (elastic-hydra "
            "rdzv-server, then rdzv.is_host=false) or use rdzv=etcd-v2"
        )
    own = args - len(inv.script_args or ())
    if inv.script_args and own > 0:
        where = "the script" if inv.torchrun else "--"
        print(
            f"note: the {len(inv.script_args)} word(s) after {where} follow the job's own {own} "
            "arg(s); to replace the job's args instead, write args=[...]"
        )
