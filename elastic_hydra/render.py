"""Rich renderings for people: the launch plan and the sweep table. The only module importing rich.

On a terminal these use colour; elsewhere (CI logs, pipes) rich emits plain text without ANSI codes.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table

from elastic_hydra.outcome import RunOutcome, Status, describe_returncode
from elastic_hydra.plan import Dynamic, LaunchPlan, RestartSpec, Standalone, Static

if TYPE_CHECKING:
    from elastic_hydra.cli import JobResult


def console(stderr: bool = False, soft_wrap: bool = False) -> Console:
    # Off a terminal (CI logs, pipes) do not fold long paths and commands at 80 columns.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, soft_wrap=soft_wrap, highlight=False, width=width)


def plan_table(plan: LaunchPlan, *, run_dir_hint: str = "") -> Table:
    """The plan as a two-column table."""
    table = Table(title="elastic-hydra launch plan", box=box.SIMPLE_HEAVY, show_header=False)
    table.add_column("what", style="bold cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    world = f"{plan.nnodes.min * plan.nproc_per_node}"
    if plan.nnodes.min != plan.nnodes.max:
        world += f"..{plan.nnodes.max * plan.nproc_per_node}"
    table.add_row(
        "topology",
        f"{plan.nnodes} node(s) x {plan.nproc_per_node} process(es) = world size {world}",
    )
    table.add_row("rendezvous", describe_rdzv(plan))
    table.add_row("run id", plan.run_id)
    table.add_row("role", plan.role)
    table.add_row("restart", describe_restart(plan.restart))
    table.add_row("stop grace", f"{plan.stop_grace:g} s (SIGTERM, then SIGKILL)")
    table.add_row("command", shlex.join(plan.argv))
    env = "\n".join(f"{k}={v}" for k, v in plan.env) or "(none)"
    table.add_row("extra env", env)
    logs = plan.logs
    console_text = "quiet" if logs.quiet else ("tee " if logs.tee else "files only")
    if logs.tee and logs.console_ranks is not None:
        console_text += "local ranks " + ",".join(map(str, sorted(logs.console_ranks)))
    elif logs.tee:
        console_text += f"all ranks, prefix {logs.prefix!r}"
    table.add_row("console", console_text)
    table.add_row("run dir", plan.run_dir or run_dir_hint)
    return table


def describe_rdzv(plan: LaunchPlan) -> str:
    r = plan.rdzv
    match r:
        case Standalone():
            return "standalone (this machine only, no external service)"
        case Static():
            return f"static: node_rank {r.node_rank}, master {r.master}"
        case Dynamic():
            return (
                f"{r.backend.value} at {r.endpoint}; join_timeout {r.join_timeout:g} s, "
                f"last_call_timeout {r.last_call_timeout:g} s"
            )
    return str(r)  # pragma: no cover


def describe_restart(spec: RestartSpec) -> str:
    if spec.max_restarts == 0:
        return "never (a failure ends the job)"
    b = spec.backoff
    parts = [f"up to {spec.max_restarts} restart(s)"]
    if b.initial > 0:
        jitter = f" +-{b.jitter:.0%}" if b.jitter else ""
        parts.append(f"backoff {b.initial:g} s x{b.multiplier:g} up to {b.maximum:g} s{jitter}")
    if spec.window:
        parts.append(f"at most {spec.window.max_restarts} in {spec.window.seconds:g} s")
    rules = [f"exit {c}: {a.value}" for c, a in spec.on_exit_code]
    rules += [f"{signal.Signals(s).name}: {a.value}" for s, a in spec.on_signal]
    if rules:
        parts.append(", ".join(rules))
    if spec.fail_fast_seconds:
        parts.append(f"no retry for failures in the first {spec.fail_fast_seconds:g} s")
    return "; ".join(parts)


def print_plan(plan: LaunchPlan, *, run_dir_hint: str = "") -> None:
    console().print(plan_table(plan, run_dir_hint=run_dir_hint))


def sweep_table(results: Sequence[JobResult]) -> Table:
    table = Table(title="elastic-hydra sweep", box=box.SIMPLE_HEAVY)
    for name in ("#", "overrides", "status", "exit", "attempts", "duration", "run dir"):
        table.add_column(name, overflow="fold")
    for i, r in enumerate(results):
        status = "[green]ok[/]" if r.exit_code == 0 else "[red]failed[/]"
        duration = r.details.get("duration_s")
        table.add_row(
            str(i),
            " ".join(o for o in r.overrides if not o.startswith("args=")) or "(none)",
            status,
            str(r.exit_code),
            str(r.details.get("attempts", "-")),
            f"{duration:.2f} s" if isinstance(duration, float) else "-",
            _relative(r.run_dir),
        )
    return table


def _relative(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def print_sweep(results: Sequence[JobResult]) -> None:
    console().print(sweep_table(results))


def print_outcome(
    plan: LaunchPlan, outcome: RunOutcome, summary: dict[str, Any], *, quiet: bool = False
) -> None:
    """The closing lines of a launch, on stderr."""
    out = console(stderr=True, soft_wrap=True)
    took = f"{summary['duration_s']:.2f} s, {outcome.attempts} attempt(s)"
    if outcome.status is Status.SUCCEEDED:
        if not quiet:
            out.print(f"[green]elastic-hydra: succeeded[/] ({took}); run dir {plan.run_dir}")
        return
    out.print(f"[bold red]elastic-hydra: {outcome.status.value}[/]: {outcome.reason} ({took})")
    cause = outcome.root_cause
    if cause is not None:
        out.print(
            f"  root cause: rank {cause.rank} (local rank {cause.local_rank}, pid {cause.pid}), "
            f"{describe_returncode(cause.returncode)}"
        )
    if outcome.stuck_pids:
        out.print(f"  [red]processes that would not die:[/] {list(outcome.stuck_pids)}")
    out.print(f"  run dir {plan.run_dir}")
