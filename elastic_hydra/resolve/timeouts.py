"""The timeout hierarchy of a job: each layer, where its value comes from, and whether each one
fires before the layer it protects. Pure: derived from the plan alone.

From the bottom up (a layer must fire before the ones above it, torchtitan#2899):

    heartbeat     a node silent for keep_alive_interval x keep_alive_max_attempt has left: the
                  others re-rendezvous without spending a restart
    last call     once MIN nodes joined, how long a round waits for more (elastic jobs)
    preflight     the battery between a round and its workers (preflight=quick|full): a node
                  that arrives meanwhile waits in torch's wait list, on its join deadline, until
                  the round's nodes have their verdict and start their workers (then they see
                  it waiting and re-rendezvous); heartbeats go on during the battery (torch's
                  keep-alive thread), so it needs no order with the heartbeat
    join          how long a round waits for MIN nodes before the rendezvous fails
    hang          no progress on any rank: every rank's stack is saved, then hang.action
    collective    the workers' own collective timeout (NCCL's watchdog ends the process)
    exit barrier  after its workers succeed, how long a node waits for the others
    stop grace    SIGTERM to SIGKILL when workers are stopped (a hang's: hang.grace)

The checks (`check`): one that breaks the job is refused (`ConfigError`, exit 2, naming both
keys, their values and the fix); one that costs a feature the job relies on is a warning.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic_hydra.config.schema import ElasticHydraConf, HangConf, PreflightConf, RdzvConf
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import LEARN_FLOOR, Dynamic, DynamicBackend, LaunchPlan, PreflightMode

# torch 2.13's defaults (torch/csrc/distributed/c10d: ProcessGroup.hpp kProcessGroupDefaultTimeout,
# ProcessGroupNCCL.hpp kProcessGroupNCCLDefaultTimeout; distributed_c10d._get_default_timeout).
TORCH_GLOO_TIMEOUT = 1800.0
TORCH_NCCL_TIMEOUT = 600.0
_RDZV, _HANG, _TOP, _PREFLIGHT = RdzvConf(), HangConf(), ElasticHydraConf(), PreflightConf()


class Severity(enum.StrEnum):
    REFUSE = "refuse"  # the job cannot work as configured: exit 2 at resolve
    WARN = "warn"  # it works, but a layer would fire before the one it protects


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One timeout the job runs with."""

    name: str
    seconds: float | None  # None: never fires (hang.timeout=null)
    key: str  # the key that sets it, for messages
    source: str  # where the value comes from: the keys and whether they are defaults
    why: str  # what it does when it fires


@dataclass(frozen=True, slots=True, kw_only=True)
class Conflict:
    """A layer that would not fire before the one above it."""

    severity: Severity
    lower: Layer  # must be shorter...
    upper: Layer  # ... than this one
    cost: str  # what the wrong order costs
    fix: str

    @property
    def line(self) -> str:
        """One line: both keys, their values, the cost, the fix."""
        low, up = self.lower, self.upper
        return (
            f"{low.key}: the {low.name} layer ({low.seconds:g} s) is not shorter than the "
            f"{up.name} layer, {up.key} ({up.seconds:g} s); {self.cost}. {self.fix}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    layers: tuple[Layer, ...]
    conflicts: tuple[Conflict, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(c.line for c in self.conflicts if c.severity is Severity.WARN)


def _given(key: str, value: float, default: float) -> str:
    return f"{key}={value:g}" + (" (default)" if value == default else "")


def layers(plan: LaunchPlan) -> dict[str, Layer]:
    """The layers of this plan by name, in order from the bottom (some only on several nodes)."""
    found: dict[str, Layer] = {}
    rdzv = plan.rdzv
    if isinstance(rdzv, Dynamic):
        interval, beats = rdzv.keep_alive_interval, rdzv.keep_alive_max_attempt
        found["heartbeat"] = Layer(
            name="heartbeat", seconds=rdzv.departure_bound,
            key="rdzv.keep_alive_interval x rdzv.keep_alive_max_attempt",
            source=f"{_given('rdzv.keep_alive_interval', interval, _RDZV.keep_alive_interval)}"
            f" x {_given('rdzv.keep_alive_max_attempt', beats, _RDZV.keep_alive_max_attempt)}",
            why="a node silent this long has left: the others re-rendezvous, no restart spent"
            + (f" (a torchrun agent of the job: {rdzv.torchrun_departure_bound:g} s, torch's "
               "default)" if rdzv.torchrun_departure_bound > rdzv.departure_bound else ""),
        )  # fmt: skip
        if plan.nnodes.min < plan.nnodes.max:
            found["last call"] = Layer(
                name="last call", seconds=rdzv.last_call_timeout, key="rdzv.last_call_timeout",
                source=_given("rdzv.last_call_timeout", rdzv.last_call_timeout,
                              _RDZV.last_call_timeout),
                why=f"once {plan.nnodes.min} node(s) joined, a round waits this long for more: "
                "the nodes of a running round re-join within it after a change (each sees the "
                "change within a second of the others)",
            )  # fmt: skip
    if plan.preflight.mode is not PreflightMode.OFF:
        found["preflight"] = _preflight(plan)
    if isinstance(rdzv, Dynamic):
        legacy = rdzv.backend is DynamicBackend.ETCD
        key, join = ("rdzv.timeout", rdzv.timeout) if legacy else ("rdzv.join_timeout",
                                                                   rdzv.join_timeout)  # fmt: skip
        found["join"] = Layer(
            name="join", seconds=join, key=key,
            source=_given(key, join, _RDZV.timeout if legacy else _RDZV.join_timeout),
            why=f"a round waits this long for {plan.nnodes.min} node(s), then fails (exit 3)",
        )  # fmt: skip
    found["hang"] = _hang(plan)
    found["collective"] = _collective(plan)
    if isinstance(rdzv, Dynamic):
        found["exit barrier"] = Layer(
            name="exit barrier", seconds=rdzv.exit_barrier_timeout,
            key="rdzv.exit_barrier_timeout",
            source=_given("rdzv.exit_barrier_timeout", rdzv.exit_barrier_timeout,
                          _RDZV.exit_barrier_timeout),
            why="after its workers succeed, a node waits this long for the others",
        )  # fmt: skip
    found["stop grace"] = Layer(
        name="stop grace", seconds=plan.stop_grace, key="stop_grace",
        source=_given("stop_grace", plan.stop_grace, _TOP.stop_grace)
        + f"; a hang's: {_given('hang.grace', min(plan.hang.grace, plan.stop_grace), _HANG.grace)}",
        why="SIGTERM to SIGKILL when the workers are stopped",
    )  # fmt: skip
    return found


def _preflight(plan: LaunchPlan) -> Layer:
    spec = plan.preflight
    return Layer(
        name="preflight", seconds=spec.timeout, key="preflight.timeout",
        source=f"preflight={spec.mode.value}, "
        + _given("preflight.timeout", spec.timeout, _PREFLIGHT.timeout),
        why="the battery after each round, at most this long, before the workers start",
    )  # fmt: skip


def _hang(plan: LaunchPlan) -> Layer:
    hang = plan.hang
    if hang.timeout is None:
        source = "hang.timeout=null: off"
    elif hang.learned:
        source = (
            f"hang.timeout=auto: learned from the job's rhythm, {min(LEARN_FLOOR, hang.timeout):g}"
            f" to {hang.timeout:g} s"
        )
    else:
        source = f"hang.timeout={hang.timeout:g}"
        if hang.warmup > hang.timeout:
            source += f", hang.warmup={hang.warmup:g} (the first verdict comes after it)"
    # The latest a hang is called (a learned timeout's cap): what the layers above must outlast.
    latest = None if hang.timeout is None else max(hang.timeout, hang.warmup)
    return Layer(
        name="hang", seconds=latest, key="hang.timeout", source=source,
        why=f"no progress on any rank: every rank's stack saved, then {hang.action.value}",
    )  # fmt: skip


def uses_gpus(plan: LaunchPlan) -> bool:
    return any(worker.gpus or worker.own for worker in plan.devices)


def _collective(plan: LaunchPlan) -> Layer:
    if plan.collective_timeout is not None:
        value, source = plan.collective_timeout, f"timeouts.collective={plan.collective_timeout:g}"
    elif uses_gpus(plan):
        value = TORCH_NCCL_TIMEOUT
        source = "torch's default for nccl (the workers have GPUs); set timeouts.collective to " \
                 "what your script passes init_process_group(timeout=...)"  # fmt: skip
    else:
        value = TORCH_GLOO_TIMEOUT
        source = "torch's default for gloo (no GPUs); set timeouts.collective to what your " \
                 "script passes init_process_group(timeout=...)"  # fmt: skip
    return Layer(
        name="collective", seconds=value, key="timeouts.collective", source=source,
        why="a collective that waits this long fails in the workers (NCCL's watchdog ends them)",
    )  # fmt: skip


def derive(plan: LaunchPlan) -> Timeouts:
    """Every layer of the plan and every pair that fires in the wrong order."""
    found = layers(plan)
    conflicts: list[Conflict] = []
    for lower, upper, refuse, cost, fix in _rules(plan):
        low, up = found.get(lower), found.get(upper)
        if low is None or up is None or low.seconds is None or up.seconds is None:
            continue
        if low.seconds < up.seconds:
            continue
        severity = Severity.REFUSE if refuse else Severity.WARN
        conflicts.append(Conflict(severity=severity, lower=low, upper=up, cost=cost, fix=fix))
    return Timeouts(layers=tuple(found.values()), conflicts=tuple(conflicts))


def _rules(plan: LaunchPlan) -> list[tuple[str, str, bool, str, str]]:
    """(lower, upper, refused?, what the wrong order costs, the fix) for each pair checked."""
    elastic = plan.nnodes.min < plan.nnodes.max
    no_restarts = plan.restart.max_restarts == 0
    return [
        ("last call", "join", True,
         "a round that gets fewer than the most nodes passes the join deadline while it waits "
         "for more, and the rendezvous fails every time",
         "Lower rdzv.last_call_timeout (e.g. 2) or raise rdzv.join_timeout."),
        ("preflight", "join", False,
         "a node that arrives while a round runs its battery waits for it on its join "
         "deadline, and fails its rendezvous (exit 3) when the battery outlasts it",
         "Lower preflight.timeout or raise rdzv.join_timeout."),
        ("heartbeat", "collective", elastic and no_restarts,
         "when a node dies, the survivors' collectives time out before the agents see it "
         "left: a worker failure" + (", and with restart.max_restarts=0 the end of an elastic "
                                     "job that could have gone on" if elastic and no_restarts
                                     else " that spends a restart"),
         "Lower rdzv.keep_alive_interval or rdzv.keep_alive_max_attempt, or raise "
         "timeouts.collective (and the timeout your script passes init_process_group)"),
        ("heartbeat", "hang", False,
         "a node that dies is reported as a hang before the others see it left",
         "Lower rdzv.keep_alive_interval or raise hang.timeout."),
        ("hang", "collective", False,
         "a stuck collective fails in the workers before the hang watch saves every rank's "
         "stack and names where they wait",
         "Lower hang.timeout below timeouts.collective, or raise the collective timeout "
         "(timeouts.collective and your script's init_process_group(timeout=...))"),
    ]  # fmt: skip


def check(plan: LaunchPlan) -> tuple[str, ...]:
    """The warnings of the plan's timeouts.

    Raises:
        ConfigError: a layer that breaks the job (the first one found).
    """
    timeouts = derive(plan)
    for conflict in timeouts.conflicts:
        if conflict.severity is Severity.REFUSE:
            low, up = conflict.lower, conflict.upper
            raise ConfigError(
                low.key,
                f"the {low.name} layer is not shorter than the {up.name} layer, {up.key} "
                f"({up.seconds:g} s)",
                low.seconds,
                f"expected {low.key} < {up.key}",
                f"{conflict.cost[:1].upper()}{conflict.cost[1:]}. {conflict.fix}",
            )
    return timeouts.warnings
