"""torch's rendezvous state is read from the store through a loader that admits only what that
state is made of: an intruder who can write to the store runs no code in any agent, and the
agents end with one line that says what they refused."""

from __future__ import annotations

import base64
import os
import pickle
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from elastic_hydra.rendezvous.torch_handler import ForeignStateError, _StateCodec, foreign_state
from tests.conftest import WORKERS, wait_for
from tests.multinode import FAST, job, rdzv_server


class Payload:
    """Runs `touch MARKER` when unpickled by a loader that admits any callable."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def a_state() -> Any:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc,
        _RendezvousState,
    )

    state = _RendezvousState()
    a, b = _NodeDesc("node-a", 10, 0), _NodeDesc("node-b", 11, 0)
    state.round, state.complete, state.deadline = 3, True, datetime(2026, 1, 1, tzinfo=UTC)
    state.participants, state.wait_list, state.redundancy_list = {a: 0, b: 1}, {b}, set()
    state.last_heartbeats = {
        a: datetime(2026, 1, 1, tzinfo=UTC),
        b: datetime(2026, 1, 2, tzinfo=UTC),
    }
    return state


def test_torchs_own_state_reads_back_as_it_was() -> None:
    state = a_state()
    back = _StateCodec.loads(pickle.dumps(state))
    assert vars(back) == vars(state)


def forged(field: str, value: Any) -> bytes:
    state = a_state()
    setattr(state, field, value)
    return pickle.dumps(state)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x80\x04\x95", "it does not read"),
        (pickle.dumps({"round": 1}), "not torch's rendezvous state (its type)"),
        (pickle.dumps(print), "it holds builtins.print"),
        (pickle.dumps(datetime(2026, 1, 1)), "not torch's rendezvous state (its type)"),
    ],
)
def test_anything_else_is_refused_naming_what(data: bytes, why: str) -> None:
    with pytest.raises(ForeignStateError) as refused:
        _StateCodec.loads(data)
    assert str(refused.value).startswith(why)
    assert isinstance(refused.value, pickle.PickleError)  # torch turns it into its state error


@pytest.mark.parametrize(
    ("field", "value"),
    [("round", "3"), ("participants", {"node-a": 0}), ("wait_list", ["x"]),
     ("last_heartbeats", {}), ("deadline", 5), ("deadline", datetime(2026, 1, 1)),
     ("closed", 1)],
)  # fmt: skip
def test_a_state_with_a_field_of_another_shape_is_refused(field: str, value: Any) -> None:
    if field == "last_heartbeats":  # a dict of the wrong values
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

        value = {_NodeDesc("n", 1, 0): "yesterday"}
    with pytest.raises(ForeignStateError, match=field):
        _StateCodec.loads(forged(field, value))


def test_a_pickle_that_changes_torchs_classes_is_refused_and_they_are_restored() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    before = dict(vars(_NodeDesc))

    # BUILD onto the class itself, with slot state {"__repr__": None, "planted": 1}.
    def text(value: str) -> bytes:
        return pickle.SHORT_BINUNICODE + bytes([len(value)]) + value.encode()

    data = (
        pickle.PROTO + b"\x04" + text(_NodeDesc.__module__) + text("_NodeDesc")
        + pickle.STACK_GLOBAL + pickle.NONE + pickle.EMPTY_DICT + pickle.MARK
        + text("__repr__") + pickle.NONE + text("planted") + pickle.BININT1 + b"\x01"
        + pickle.SETITEMS + pickle.TUPLE2 + pickle.BUILD + pickle.STOP
    )  # fmt: skip
    with pytest.raises(ForeignStateError, match="changes torch's rendezvous classes"):
        _StateCodec.loads(data)
    assert dict(vars(_NodeDesc)) == before


def test_a_state_too_big_is_refused_unread() -> None:
    with pytest.raises(ForeignStateError, match="more than"):
        _StateCodec.loads(b"\x80" * (17 << 20))


def test_a_payload_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(ForeignStateError, match=r"it holds posix\.system"):
        _StateCodec.loads(pickle.dumps(Payload(marker)))
    assert not marker.exists()
    try:  # found behind torch's own error, as `_lost` looks for it
        raise RuntimeError("the rendezvous state is corrupt") from ForeignStateError("it holds x")
    except RuntimeError as exc:
        assert str(foreign_state(exc)) == "it holds x"


def test_an_intruder_who_writes_the_state_runs_no_code_in_any_agent(tmp_path: Path) -> None:
    from torch.distributed import TCPStore

    marker, out = tmp_path / "intruder-ran", tmp_path / "out"
    with rdzv_server(tmp_path) as (port, _server), job(tmp_path, "c10d", f"127.0.0.1:{port}") as j:
        for _ in range(2):
            argv = j.command("nnodes=2", "nproc_per_node=1", "rdzv.is_host=false", *FAST,
                             script=WORKERS / "sleeper.py")  # fmt: skip
            j.start(argv=[*argv, "--", "--dir", str(out)])
        wait_for(lambda: len(list(out.glob("ready_*"))) == 2, 120, "both nodes' workers")
        store = TCPStore("127.0.0.1", port, is_master=False, use_libuv=True)
        key = f"torch.rendezvous.{j.run_id}"
        assert store.check([key])  # the state the agents keep in sync, where torch keeps it
        store.set(key, base64.b64encode(pickle.dumps(Payload(marker))))
        assert j.finish(60) == [3, 3], j.explain()
    assert not marker.exists(), "an agent ran the intruder's code"
    for agent in j.agents:
        (line,) = [ln for ln in agent.text().splitlines() if "refused the rendezvous state" in ln]
        assert "it holds posix.system; none of it ran" in line, line
