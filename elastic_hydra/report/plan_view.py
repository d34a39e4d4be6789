"""The launch plan for people: `--plan`'s table (rich, imported only when a plan is shown).

Each row says what the launch will do in the words of its keys: the entrypoint and its exact
command, the topology, the rendezvous and its timings, the restart policy, when a hang can be
found first, devices and the extra environment (secret values masked).
"""

from __future__ import annotations

import shlex
import signal

from rich import box
from rich.table import Table
from rich.text import Text

from elastic_hydra.durations import show_duration
from elastic_hydra.gpus import format_cpus
from elastic_hydra.plan import (
    CLEAR_SHARE,
    LEARN_FLOOR,
    LEARN_GAPS,
    LEARN_MULTIPLE,
    MIN_SCORED,
    NAME_SHARE,
    QUICK_SHARE,
    RELATIVE,
    Dynamic,
    DynamicBackend,
    HangAction,
    LaunchPlan,
    PreflightMode,
    RestartSpec,
    Standalone,
    Static,
    StragglerAction,
)
from elastic_hydra.redact import redact_env
from elastic_hydra.report.render import console, show
from elastic_hydra.resolve import timeouts


def plan_table(plan: LaunchPlan, *, run_dir_hint: str = "", resume: str = "") -> Table:
    """The plan as a two-column table (`resume`: what a launch would resume from)."""
    table = Table(title="elastic-hydra launch plan", box=box.SIMPLE_HEAVY, show_header=False)
    table.add_column("what", style="bold cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    world = f"{plan.nnodes.min * plan.nproc_per_node}"
    if plan.nnodes.min != plan.nnodes.max:
        world += f"..{plan.nnodes.max * plan.nproc_per_node}"
    rows = {
        "topology": f"{plan.nnodes} node(s) x {plan.nproc_per_node} process(es) "
        f"= world size {world}",
        "rendezvous": describe_rdzv(plan),
        "run id": plan.torch_run_id,
        "role": plan.role,
        "restart": describe_restart(plan.restart),
        "stop grace": f"{plan.stop_grace:g} s (SIGTERM, then SIGKILL)",
        "hangs": describe_hang(plan),
        "stragglers": describe_straggler(plan),
        "command": shlex.join(plan.argv),
        "extra env": "\n".join(f"{k}={v}" for k, v in redact_env(plan.env)) or "(none)",
    }
    logs = plan.logs
    console_text = "quiet" if logs.quiet else ("tee " if logs.tee else "files only")
    if logs.tee and logs.console_ranks is not None:
        console_text += "local ranks " + ",".join(map(str, sorted(logs.console_ranks)))
    elif logs.tee:
        console_text += f"all ranks, prefix {logs.prefix!r}"
    if logs.tee and logs.merge > 0 and plan.nproc_per_node > 1:
        console_text += f"; a line several ranks print within {logs.merge:g} s shown once"
    rows["console"] = console_text
    rows["devices"] = describe_devices(plan)
    rows["timeouts"] = describe_timeouts(plan)
    rows["preflight"] = describe_preflight(plan)
    rows["warm"] = describe_warm(plan)
    rows["quarantine"] = describe_quarantine(plan)
    rows["checkpoint"] = describe_checkpoint(plan, resume)
    rows["run dir"] = plan.run_dir or run_dir_hint
    for what, value in rows.items():  # Text: values are the user's words, never rich markup
        table.add_row(what, Text(value))
    return table


def describe_devices(plan: LaunchPlan) -> str:
    """One line per local rank: its GPU, what else it sees, its CPUs."""
    if not plan.devices:
        return "as the environment has them (no GPU selection, no CPU binding)"
    lines = []
    for local_rank, d in enumerate(plan.devices):
        parts = [str(d.own) if d.own else "no GPU"]
        if len(d.gpus) > 1:
            parts.append("sees GPUs " + ",".join(str(g.index) for g in d.gpus))
        if d.cpus:
            parts.append(f"CPUs {format_cpus(d.cpus)}")
        lines.append(f"local rank {local_rank}: " + "; ".join(parts))
    return "\n".join(lines)


def describe_timeouts(plan: LaunchPlan) -> str:
    """The timeout layers from the bottom, each with its value, what it does and where the
    value comes from; then each pair in the wrong order (the warnings of `resolve.timeouts`)."""
    derived = timeouts.derive(plan)
    lines = ["from the first to fire; each must fire before the ones after it:"]
    for layer in derived.layers:
        value = "off" if layer.seconds is None else f"{layer.seconds:g} s"
        lines.append(f"{layer.name}: {value}: {layer.why} [{layer.source}]")
    lines += [f"warning: {line}" for line in derived.warnings]
    return "\n".join(lines)


def describe_preflight(plan: LaunchPlan) -> str:
    """The battery after each round: what it runs, its bounds, what fails a node."""
    p = plan.preflight
    if p.mode is PreflightMode.OFF:
        return "off (preflight=off): the workers start right after the rendezvous"
    links = ", every link between nodes" if p.mode is PreflightMode.FULL else ""
    paths = ", ".join(("logs.root", *p.paths))
    return (
        f"{p.mode.value} after each rendezvous round, at most {p.timeout:g} s "
        f"(preflight.timeout): {p.gemm_size} x {p.gemm_size} GEMM for {p.gemm_seconds:g} s per "
        f"worker, allreduces of {p.allreduce_bytes / (1 << 20):g} MiB x {p.allreduce_reps} in "
        f"and across nodes{links}\n"
        f"a node fails under {p.min_ratio:g} of the median (preflight.min_ratio), or with less "
        f"than {p.min_free_bytes / (1 << 30):g} GiB free or no write in {paths}"
    )


def describe_warm(plan: LaunchPlan) -> str:
    imports = plan.warm.imports
    if not imports:
        return "off (warm.imports=[]): every worker starts cold"
    return (
        f"Python workers forked from a template that imported {', '.join(imports)} "
        "(warm.imports), restarts too; a cold start where the template cannot serve"
    )


def describe_checkpoint(plan: LaunchPlan, resume: str) -> str:
    spec = plan.checkpoint
    if spec is None:
        return "none"
    limit = f", at most {spec.max_memory} bytes a rank" if spec.max_memory else ""
    text = (
        f"snapshots (ckpt.snapshot) kept in {spec.memory}{limit}; copies in {spec.home}, the "
        f"newest {spec.keep} kept"
    )
    if spec.buddy and plan.nnodes.max > 1 and isinstance(plan.rdzv, Dynamic):
        text += (
            "; a copy of each node's snapshots in the next node's memory (checkpoint.buddy): "
            "a node holds its ranks' newest two (up to 8 while the copies lag) and the previous "
            "node's newest two"
        )
    if not spec.resume:
        return f"{text}; resumes nothing (checkpoint.resume=false)"
    return f"{text}; resumes from {resume}" if resume else text


def describe_quarantine(plan: LaunchPlan) -> str:
    q = plan.quarantine
    if q is None:
        return "off (quarantine.ledger=null)"
    return (
        f"ledger {q.ledger}, read before every rendezvous round: a host in it does not join; "
        f"entries this job adds last {show_duration(q.cooldown)} (quarantine.cooldown)"
    )


def describe_rdzv(plan: LaunchPlan) -> str:
    r = plan.rdzv
    match r:
        case Standalone():
            return "standalone (this machine only, no external service)"
        case Static():
            return f"static: node_rank {r.node_rank}, master {r.master}"
        case Dynamic():
            legacy = r.backend is DynamicBackend.ETCD  # its own bound, and no heartbeats
            join = f"timeout {r.timeout:g}" if legacy else f"join_timeout {r.join_timeout:g}"
            text = f"{r.backend.value} at {r.endpoint}; {join} s"
            if plan.nnodes.min < plan.nnodes.max:  # torch waits the last call below MAX nodes
                text += f", then last_call_timeout {r.last_call_timeout:g} s for more nodes"
            if legacy:
                return text
            theirs = r.torchrun_departure_bound
            return (
                f"{text}; a node without a heartbeat for {r.departure_bound:g} s has left "
                f"(keep_alive_interval {r.keep_alive_interval:g} s x {r.keep_alive_max_attempt}"
                + (f"; a torchrun agent of the job: {theirs:g} s" if theirs > r.departure_bound
                   else "") + ")"
            )  # fmt: skip
    return str(r)  # pragma: no cover


def describe_hang(plan: LaunchPlan) -> str:
    """When the first hang verdict can come, and what follows it."""
    h = plan.hang
    if h.timeout is None or h.first_verdict is None:
        return "not watched (hang.timeout=null)"
    grace = min(h.grace, plan.stop_grace)
    after = "" if h.action is HangAction.REPORT else f"; SIGKILL {grace:g} s after SIGTERM"
    then = f"then {h.action} (hang.action){after}{' (hang.grace)' if after else ''}"
    if h.learned:
        return (
            f"first verdict {h.first_verdict:g} s after an attempt starts at the earliest (the "
            f"longer of {LEARN_FLOOR:g} s and hang.warmup={h.warmup:g})\n"
            f"a hang: no progress on any rank for {LEARN_MULTIPLE:g}x the longest gap between "
            f"the job's progress events, once {LEARN_GAPS} gaps were seen after the warm-up, "
            f"at least {LEARN_FLOOR:g} s and at most {h.timeout:g} s ({h.timeout:g} s until "
            f"then; hang.timeout=auto)\n{then}"
        )
    return (
        f"first verdict {h.first_verdict:g} s after an attempt starts at the earliest (the "
        f"longer of hang.timeout={h.timeout:g} and hang.warmup={h.warmup:g})\n"
        f"a hang: no progress on any rank for {h.timeout:g} s (hang.timeout)\n{then}"
    )


def describe_straggler(plan: LaunchPlan) -> str:
    """Which rank is named a straggler, and what follows."""
    s = plan.straggler
    if why := plan.stragglers_unscored():
        return f"not scored: {why}"
    then = "end the job, exit 1" if s.action is StragglerAction.FAIL else "nothing is stopped"
    return (
        f"a rank that arrives last at {NAME_SHARE:.0%} or more of its last {s.window} collectives"
        f" (straggler.window) or {QUICK_SHARE:.0%} of the last {MIN_SCORED}, a median of at least"
        f" {s.behind * 1000:g} ms and {RELATIVE:.0%} of the job's interval between collectives"
        f" behind (straggler.behind), is named; cleared under {CLEAR_SHARE:.0%} of the last"
        f" {MIN_SCORED}; then {s.action} (straggler.action): {then}"
    )


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
    by_action: dict[str, list[str]] = {}
    for found, action in spec.on_class:
        by_action.setdefault(action.value, []).append(found.value)
    parts.append(
        "by class (restart.on_class): "
        + ", ".join(f"{' '.join(names)}: {action}" for action, names in by_action.items())
    )
    if spec.fail_fast_seconds:
        parts.append(f"no retry for failures in the first {spec.fail_fast_seconds:g} s")
    return "; ".join(parts)


def print_plan(plan: LaunchPlan, *, run_dir_hint: str = "", resume: str = "") -> None:
    show(console(), plan_table(plan, run_dir_hint=run_dir_hint, resume=resume))
