"""`elastic-hydra --plan[=json|yaml]`: the launch minus the processes, printed.

The job is composed and resolved exactly as a launch would be; nothing is created. The table
(or JSON) is the `LaunchPlan`; `yaml` is the job file of a torchrun-style command. Of a sweep
(`-m`), every job is composed and resolved: the first job's plan, then each job's overrides and
arguments, and a note when path-looking arguments are the same in every job (the jobs would
share, and resume, each other's files).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence

from elastic_hydra.config import boundary
from elastic_hydra.config.boundary import JobContext
from elastic_hydra.config.composed import Composed
from elastic_hydra.config.invocation import Invocation
from elastic_hydra.errors import ConfigError
from elastic_hydra.launch import job
from elastic_hydra.plan import Dynamic, DynamicBackend, LaunchPlan
from elastic_hydra.schedulers import detect


def show_plan(inv: Invocation) -> int:
    """`--plan`: the launch minus the processes, printed; nothing is created."""
    if inv.plan in ("jobset", "trainjob"):
        from elastic_hydra.cli import manifest

        return manifest.show_manifest(inv)
    if inv.multirun:
        return _show_sweep(inv)
    cfg, ctx = boundary.compose(inv)
    if ctx.swept:  # the job sets hydra.mode: MULTIRUN
        return _show_sweep(inv)
    checked = cfg.job()
    plan = job.plan_of(checked, ctx)
    if inv.plan == "json":
        print(json.dumps(job.plan_dict(plan), indent=2))
        return 0
    from elastic_hydra.cli import jobyaml  # a small module: the YAML of a torchrun-style command

    if inv.plan == "yaml":
        print(jobyaml.job_yaml(inv, cfg, ctx), end="")
        return 0
    from elastic_hydra.report import plan_view

    plan_view.print_plan(
        plan, run_dir_hint=f"{ctx.run_dir} (created at launch)", resume=_resume_from(plan)
    )
    scheduler = detect.describe(checked.conf.rdzv.backend, os.environ)
    if scheduler:
        print(f"scheduler: {scheduler}")
    _plan_notes(inv, plan, len(checked.conf.args))
    if inv.torchrun:  # the command as a file to commit
        print(f"\n{YAML_HEADING}\n{jobyaml.job_yaml(inv, cfg, ctx)}", end="")
    return 0


def _resume_from(plan: LaunchPlan) -> str:
    """What a launch of `plan` would resume from (its digests are checked at the launch)."""
    if plan.checkpoint is None:
        return ""
    from elastic_hydra.checkpoint.keeper import newest_copy

    found = newest_copy(plan.checkpoint)
    if found is None:
        return "nothing yet (no complete copy): a fresh start"
    world, per_rank = found.world_size, _bytes(found.size // max(1, found.world_size))
    return f"step {found.step} (the newest complete copy, of {world} ranks, {per_rank} a rank)"


def _bytes(size: int) -> str:
    """`size` for people: bytes, KiB, MiB or GiB, three digits."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


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


def _show_sweep(inv: Invocation) -> int:
    """`--plan` of a sweep: every job resolved; the first one's plan, then one line per job."""
    if inv.plan == "yaml":
        raise ConfigError(
            "--plan", "=yaml writes the job file of one torchrun-style command", "yaml",
            "use --plan or --plan=json for a sweep",
        )  # fmt: skip
    planned = [(ctx, _sweep_plan(num, cfg, ctx)) for num, (cfg, ctx) in
               enumerate(boundary.sweep_jobs(inv))]  # fmt: skip
    if inv.plan == "json":
        jobs = [{"job": n, "overrides": _shown(ctx), "plan": job.plan_dict(plan)}
                for n, (ctx, plan) in enumerate(planned)]  # fmt: skip
        print(json.dumps(jobs, indent=2))
        return 0
    from elastic_hydra.report import plan_view

    first_ctx, first = planned[0]
    plan_view.print_plan(first, run_dir_hint=f"{first_ctx.run_dir} (job #0; created at launch)")
    print(f"\nsweep: {len(planned)} job(s), one launch each, in {first_ctx.run_dir.parent}:")
    for num, (ctx, plan) in enumerate(planned):
        words = " ".join(_shown(ctx)) or "(no overrides)"
        print(f"  #{num} {words}: args {shlex.join(plan.entrypoint.args) or '(none)'}")
    _plan_notes(inv, first, len(first.entrypoint.args))
    shared = shared_paths([plan.entrypoint.args for _, plan in planned])
    if shared:
        print(
            f"note: every job of this sweep passes the same path(s) in args: "
            f"{', '.join(shared)}; files a job writes there are overwritten, or resumed, by the "
            "next. Give each job its own: the job's run dir, $ELASTIC_HYDRA_RUN_DIR in the "
            "workers' environment, or a path that uses a swept value (e.g. runs/lr${hp.lr})"
        )
    return 0


def _sweep_plan(num: int, cfg: Composed, ctx: JobContext) -> LaunchPlan:
    """One job's plan; its mistake names the job it is in."""
    try:
        return job.plan_of(cfg.job(), ctx)
    except ConfigError as exc:
        where = f"(in sweep job #{num}: {' '.join(_shown(ctx))})"
        raise ConfigError(
            exc.key, exc.problem, exc.value, exc.expected, f"{exc.hint} {where}".strip()
        ) from None


def _shown(ctx: JobContext) -> list[str]:
    """A job's overrides as the sweep table shows them (its args apart: the line shows them)."""
    words = ctx.overrides[: ctx.overrides.index("--")] if "--" in ctx.overrides else ctx.overrides
    return [o for o in words if not o.startswith("args=")]


# Files a job may write: a word with one of these suffixes is a path even without a '/'.
_FILE_SUFFIX = re.compile(
    r"[^./]\.(pt|pth|ckpt|bin|safetensors|pkl|pickle|npz|npy|h5|onnx|json|jsonl|yaml|yml|csv|"
    r"tsv|txt|log|tar|gz|zip|parquet|arrow|db|sqlite)$",
    re.IGNORECASE,
)


def shared_paths(args_of_jobs: Sequence[Sequence[str]]) -> list[str]:
    """The path-looking arguments (a '/', or a file suffix; `--flag=PATH` too) that every job
    of a sweep passes unchanged, in the first job's order; none for a sweep of one job."""
    if len(args_of_jobs) < 2:
        return []
    found = [[p for a in args if (p := _path_in(a))] for args in args_of_jobs]
    common = set(found[0]).intersection(*found[1:])
    return list(dict.fromkeys(p for p in found[0] if p in common))


def _path_in(word: str) -> str | None:
    value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
    if not value or value.startswith("-") or "://" in value or "$" in value:
        return None  # a flag, a URL, a variable the worker expands (one per job)
    return value if "/" in value or _FILE_SUFFIX.search(value) else None
