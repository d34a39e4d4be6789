"""A snapshot's bytes: written whole, read back without running anything that names code."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastic_hydra.checkpoint import codec


class Payload:
    """What an intruder would put in a snapshot: unpickling it runs a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_plain_state_round_trips_and_the_file_is_private(tmp_path: Path) -> None:
    state = {"step": 3, "rng": [1, 2.5, "x", None, True], "nested": {"t": (1, 2), "s": {3}}}
    path = tmp_path / "s.snap"
    size = codec.write(state, path)
    assert size == path.stat().st_size > 0
    assert path.stat().st_mode & 0o777 == 0o600
    assert codec.read(path) == state


def test_a_pickle_that_names_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.snap"
    path.write_bytes(pickle.dumps({"step": 1, "x": Payload(marker)}, protocol=5))
    with pytest.raises(codec.SnapshotReadError, match=r"names posix\.system"):
        codec.read(path)
    assert not marker.exists()
    for junk in (b"", b"PK", b"hello", pickle.dumps([1, 2])):  # cut, not ours, not a dict
        path.write_bytes(junk)
        with pytest.raises(codec.SnapshotReadError):
            codec.read(path)


def test_a_value_that_cannot_be_copied_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    path = tmp_path / "s.snap"
    with open(os.devnull) as handle:
        state = {"model": [1, 2], "opt": {"groups": [{"lr": 0.1, "fn": lambda: 0}]}, "f": handle}
        with pytest.raises(codec.UncopyableStateError) as err:
            codec.write(state, path)
    assert "state['opt']['groups'][0]['fn'] (function) cannot be copied" in str(err.value)
    assert not path.exists()
    with pytest.raises(FileExistsError):  # never over another file: the caller names a new one
        path.write_bytes(b"x")
        codec.write({"a": 1}, path)


def test_torch_states_round_trip_through_weights_only_and_an_intruder_runs_nothing(
    tmp_path: Path,
) -> None:
    """In a process of its own: the codec uses torch only where the script imported it."""
    marker = tmp_path / "ran"
    code = textwrap.dedent(
        f"""
        import os, pickle, sys, torch
        from pathlib import Path
        from elastic_hydra.checkpoint import codec
        tmp = Path({str(tmp_path)!r})
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(1, 3)).sum().backward(); opt.step()
        state = {{"model": model.state_dict(), "optim": opt.state_dict(), "step": 4}}
        codec.write(state, tmp / "t.snap")
        assert (tmp / "t.snap").read_bytes()[:2] == b"PK"
        back = codec.read(tmp / "t.snap")
        assert all(torch.equal(back["model"][k], v) for k, v in model.state_dict().items())
        assert back["optim"]["param_groups"] == opt.state_dict()["param_groups"]
        class Payload:
            def __reduce__(self):
                return (os.system, ("touch {marker}",))
        torch.save({{"x": Payload()}}, tmp / "evil.snap")
        try:
            codec.read(tmp / "evil.snap")
        except codec.SnapshotReadError as exc:
            print("refused:", exc)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "evil.snap" in proc.stdout
    assert not marker.exists()
