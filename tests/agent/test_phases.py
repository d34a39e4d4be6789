"""The agent's phase machine, and the two readers it keeps in agreement: `top`'s phase
(observe.status) and the goodput ledger's spans (report.goodput)."""

from __future__ import annotations

from elastic_hydra.agent import events as ev
from elastic_hydra.agent.events import ChangeKind
from elastic_hydra.agent.outcome import Status
from elastic_hydra.agent.phases import AgentPhase, PhaseMachine
from elastic_hydra.observe.status import JobPhase, Tracker
from elastic_hydra.plan import HangAction
from elastic_hydra.records.goodput import Phase
from elastic_hydra.report import goodput

WALL = 1_000_000.0


def at(t: float) -> ev.Stamp:
    return ev.Stamp(wall_time=WALL + t, mono_time=t)


def round_at(t: float, attempt: int) -> list[ev.Event]:
    return [
        ev.Joining(**at(t), attempt=attempt),
        ev.RendezvousRound(
            **at(t + 0.5), attempt=attempt, node_rank=0, nodes=2, world_size=4, master="h:1"
        ),
    ]


def exited(t: float, rank: int, code: int, attempt: int, by_us: bool = False) -> ev.WorkerExited:
    return ev.WorkerExited(
        **at(t), rank=rank, local_rank=rank, pid=100 + rank, returncode=code,
        exit=f"exited with code {code}", terminated_by_launcher=by_us, attempt=attempt,
    )  # fmt: skip


# A run with a failure and its restart, a reported hang, a lost node, a hang that restarts, and
# a stop signal: every transition the machine knows, with the phase it is in after each event.
TIMELINE: list[tuple[ev.Event, AgentPhase]] = [
    (round_at(1.0, 0)[0], AgentPhase.RENDEZVOUS),
    (round_at(1.0, 0)[1], AgentPhase.STARTUP),  # the first round to its workers: start-up
    (ev.WorkersStarted(**at(2.0), pids=(100, 101), attempt=0), AgentPhase.RUNNING),
    (exited(5.0, 1, 1, 0), AgentPhase.FAILED),
    (exited(5.2, 0, -15, 0, by_us=True), AgentPhase.FAILED),
    (ev.Restart(**at(5.3), reason="r", delay=0.0, restart=1, rank=1), AgentPhase.RESTART),
    (round_at(5.4, 1)[0], AgentPhase.RESTART),
    (round_at(5.4, 1)[1], AgentPhase.RESTART),
    (ev.WorkersStarted(**at(6.0), pids=(102, 103), attempt=1), AgentPhase.RUNNING),
    (ev.Hang(**at(9.0), verdict="v", action=HangAction.REPORT, idle=2.0, attempt=1),
     AgentPhase.RUNNING),
    (ev.MembershipChange(**at(10.0), change=ChangeKind.LEFT, reason="r", nodes=1),
     AgentPhase.RENDEZVOUS),
    (round_at(10.5, 2)[0], AgentPhase.RENDEZVOUS),
    (round_at(10.5, 2)[1], AgentPhase.RENDEZVOUS),
    (ev.WorkersStarted(**at(11.5), pids=(104, 105), attempt=2), AgentPhase.RUNNING),
    (ev.Hang(**at(20.0), verdict="v", action=HangAction.RESTART, idle=5.0, attempt=2),
     AgentPhase.FAILED),
    (ev.Stopping(**at(20.1), signal="SIGTERM", workers=2, grace=1.0, hung=True),
     AgentPhase.FAILED),
    (ev.Restart(**at(21.0), reason="r", delay=0.0, restart=2, rank=None), AgentPhase.RESTART),
    (round_at(21.1, 3)[0], AgentPhase.RESTART),
    (round_at(21.1, 3)[1], AgentPhase.RESTART),
    (ev.WorkersStarted(**at(22.0), pids=(106, 107), attempt=3), AgentPhase.RUNNING),
    (ev.SignalReceived(**at(30.0), signal="SIGTERM"), AgentPhase.STOPPING),
    (ev.Stopping(**at(30.2), signal="SIGTERM", workers=2, grace=1.0), AgentPhase.STOPPING),
    (ev.Finish(**at(31.0), status=Status.STOPPED, exit_code=143, reason="r", attempts=4),
     AgentPhase.DONE),
]  # fmt: skip


def test_the_machine_walks_every_transition() -> None:
    machine = PhaseMachine()
    seen = []
    for event, _ in TIMELINE:
        machine.see(event)
        seen.append(machine.phase)
    assert seen == [phase for _, phase in TIMELINE]
    assert machine.attempt == 3


def test_a_success_stops_at_the_last_exit_and_a_stop_after_a_failure_stays_failed() -> None:
    machine = PhaseMachine()
    for event in [*round_at(0.0, 0), ev.WorkersStarted(**at(1.0), pids=(1, 2), attempt=0)]:
        machine.see(event)
    assert not machine.see(exited(2.0, 0, 0, 0))  # one of two: still running
    assert machine.see(exited(3.0, 1, 0, 0)) and machine.phase is AgentPhase.STOPPING
    failed = PhaseMachine()
    start = ev.WorkersStarted(**at(1.0), pids=(1,), attempt=0)
    for event in [*round_at(0.0, 0), start, exited(2.0, 0, 1, 0)]:
        failed.see(event)
    failed.see(ev.SignalReceived(**at(2.1), signal="SIGTERM"))
    assert failed.phase is AgentPhase.FAILED  # what ended the attempt was the failure


def test_a_preflight_battery_is_its_own_phase_only_where_one_is_expected() -> None:
    verdict = ev.Preflight(**at(2.0), passed=True, nodes=2, bad_nodes=(), seconds=1.0, attempt=0)
    on, off = PhaseMachine(preflight=True), PhaseMachine()
    for event in [*round_at(0.0, 0), verdict]:
        on.see(event)
        off.see(event)
        if isinstance(event, ev.RendezvousRound):
            assert on.phase is AgentPhase.PREFLIGHT and off.phase is AgentPhase.STARTUP
    assert on.phase is off.phase is AgentPhase.STARTUP  # the verdict returns to the round's


def test_top_and_the_ledger_tell_the_same_phase_after_every_event() -> None:
    """The live record's phase and the last span of the ledger cut at that moment agree: they
    are the same machine, in the record's words and the ledger's."""
    in_words = {
        JobPhase.RENDEZVOUS: {Phase.STARTUP, Phase.RENDEZVOUS},
        JobPhase.RUNNING: {Phase.RUNNING, Phase.HUNG},
        JobPhase.RESTARTING: {Phase.RESTART},
        JobPhase.STOPPING: {Phase.STOPPING},  # a failure, as far as anyone knows yet, ends it
        JobPhase.DONE: {Phase.STOPPING},
    }
    tracker = Tracker(node="h", nproc=2, agent_pid=1, period=1.0)
    timeline = [event for event, _ in TIMELINE]
    for i, event in enumerate(timeline):
        tracker.emit(event)
        # The ledger of what was known by the next event, looked at between the two.
        upto = timeline[: i + 2]
        now = (event.mono_time + upto[-1].mono_time) / 2 if i + 1 < len(timeline) else 40.0
        cut = goodput.spans(upto, start=0.0, end=40.0)
        (span,) = [s for s in cut if s.start <= now < s.end] or cut[-1:]
        live = tracker.record(now=WALL + now, samples={}, progress={}).phase
        assert span.phase in in_words[live], (event.kind, live, span.phase)
