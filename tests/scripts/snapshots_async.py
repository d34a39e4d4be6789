"""Test worker: `ckpt.snapshot` of torch states in one process, the writer held where a scenario
needs it (`codec.write` wrapped). Run as `snapshots_async.py SCENARIO`, with the snapshot area
in ELASTIC_HYDRA_SNAPSHOTS; each scenario asserts what it sees and prints "ok".

- in_place: tensors changed in place (`add_`, `.data`, BatchNorm's running statistics, an
  optimizer's step) while their write is held never reach the snapshot of the step before;
- save_requested: it waits for the write of the step asked, and for no other;
- at_exit: the writer starts only once the main thread has ended; the process waits for it;
  a snapshot taken in an atexit hook is written there;
- as_is: which states are written on the training thread (before `snapshot` returns);
- errors: what the writer finds wrong is one line each (the test reads the rest: which
  snapshots are kept, from the floor on).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from elastic_hydra.checkpoint import api, codec
from elastic_hydra.checkpoint.layout import Area

AREA = Area(Path(os.environ["ELASTIC_HYDRA_SNAPSHOTS"]))
DEADLINE = 60.0
real_write = codec.write


def until(predicate: Callable[[], object], what: str) -> None:
    """Poll `predicate` until it holds; fail after DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class HeldWriter:
    """`codec.write`, held until the test lets each write go; which thread wrote each step."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.threads: dict[int, threading.Thread] = {}

    def __call__(self, state: Mapping[str, Any], path: Path) -> int:
        step = int(path.name.split(".")[1].removeprefix("step-"))
        self.threads[step] = threading.current_thread()
        self.entered.release()
        assert self.go.acquire(timeout=DEADLINE), "the write was never let go"
        return real_write(state, path)


def kept(step: int) -> bool:
    return AREA.snapshot(0, step).exists()


def in_place() -> None:
    held = HeldWriter()
    codec.write = held
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    base = torch.arange(10.0)

    def train() -> None:
        opt.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()

    train()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "view": base[2:5],
             "base": base, "rng": (1, 2.5, "x", None)}  # fmt: skip
    at_call = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in opt.state_dict()["state"].values()]
    assert api.snapshot(state, step=1)  # taken: the write is held
    assert held.entered.acquire(timeout=DEADLINE)
    assert held.threads[1] is not threading.current_thread()
    train()  # the next step changes every tensor in place, BatchNorm's statistics too
    with torch.no_grad():
        for p in model.parameters():
            p.data.mul_(3.0)  # through .data: no version counted
    base.add_(100.0)
    assert not kept(1)
    held.go.release()
    until(lambda: kept(1), "the snapshot of step 1")
    back = codec.read(AREA.snapshot(0, 1))
    for key, value in at_call.items():
        assert torch.equal(back["model"][key], value), key
        assert not torch.equal(model.state_dict()[key], value), key  # changed since
    assert back["model"]["1.num_batches_tracked"].item() == 1
    got = [s["momentum_buffer"] for s in back["optim"]["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(got, momentum, strict=True))
    assert back["optim"]["param_groups"] == opt.state_dict()["param_groups"]
    assert torch.equal(back["base"], torch.arange(10.0)) and back["rng"] == (1, 2.5, "x", None)
    # Views stay views of one storage, as torch.save writes them: the file is torch.save's.
    assert torch.equal(back["view"], torch.arange(2.0, 5.0))
    assert back["view"].untyped_storage().data_ptr() == back["base"].untyped_storage().data_ptr()
    assert type(back["model"]) is type(model.state_dict())
    assert back["model"]._metadata == model.state_dict()._metadata  # load_state_dict's versions


def save_requested() -> None:
    held = HeldWriter()
    codec.write = held
    weights = torch.zeros(1000)
    AREA.save_request.write_text(json.dumps({"step": 4}))
    assert api.snapshot({"w": weights}, step=3)
    assert held.entered.acquire(timeout=DEADLINE)
    rescue = threading.Timer(DEADLINE, held.go.release)  # had it waited, it would be let go
    rescue.start()
    assert not api.save_requested()  # step 3 cannot be the step asked: no wait
    assert not kept(3)
    rescue.cancel()
    held.go.release()
    assert api.snapshot({"w": weights}, step=4)  # waits for step 3's write first
    assert kept(3)
    assert held.entered.acquire(timeout=DEADLINE)
    main = threading.get_ident()
    absent_while_waiting: list[bool] = []

    def release_once_waiting() -> None:
        def waiting() -> bool:
            frame = sys._current_frames().get(main)  # the main thread's stack
            while frame is not None and frame.f_code.co_name != "_wait":
                frame = frame.f_back
            return frame is not None

        until(waiting, "save_requested to wait for the write")
        absent_while_waiting.append(not kept(4))
        held.go.release()

    helper = threading.Thread(target=release_once_waiting)
    helper.start()
    assert api.save_requested()  # step 4 is asked: it waits for that write, then says so
    helper.join()
    assert absent_while_waiting == [True] and kept(4)


def at_exit() -> None:
    def after_main(state: Mapping[str, Any], path: Path) -> int:
        until(lambda: not threading.main_thread().is_alive(), "the main thread to end")
        return real_write(state, path)

    def last() -> None:  # after the writer: one taken in an atexit hook is written there
        assert kept(7)
        assert api.snapshot({"w": torch.full((1000,), 8.0)}, step=8) and kept(8)

    codec.write = after_main
    atexit.register(last)
    assert api.snapshot({"w": torch.full((1000,), 7.0)}, step=7)
    assert not kept(7)
    print("ok", flush=True)  # and the main thread ends: the process waits for the write


def as_is() -> None:
    held = HeldWriter()
    codec.write = held
    for _ in range(8):
        held.go.release()  # no write is held here
    model = nn.Linear(2, 2)
    grad = torch.ones(2, requires_grad=True)
    states: list[dict[str, Any]] = [
        {"w": torch.ones(2), "seen": {1, 2}},  # a set: anything but dicts, lists, tuples
        {"model": model.state_dict(keep_vars=True)},  # nn.Parameter: a tensor subclass
        {"g": grad},  # a tensor that needs grad
        {"n": 3, "lr": [0.1, 0.2]},  # no tensor at all
    ]
    for step, state in enumerate(states):
        assert api.snapshot(state, step=step)
        assert kept(step) and held.threads[step] is threading.current_thread(), step
    assert api.snapshot({"w": torch.ones(2), "fn": lambda: 0}, step=4) is False
    assert api.snapshot({"model": model.state_dict()}, step=5)  # the writer's thread
    until(lambda: 5 in held.threads, "the write of step 5")
    assert held.threads[5] is not threading.current_thread()


def errors() -> None:
    def failing(state: Mapping[str, Any], path: Path) -> int:
        if path.name.startswith(".step-3."):  # a full /dev/shm
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(state, path)

    codec.write = failing
    AREA.floor.write_text(json.dumps({"step": 3}))
    for step in range(12):
        size = 1 << 20 if step == 2 else 10  # step 2's is over checkpoint.max_memory
        assert api.snapshot({"w": torch.zeros(size // 4 + 1)}, step=step), step  # taken


SCENARIOS: dict[str, Callable[[], None]] = {
    "in_place": in_place,
    "save_requested": save_requested,
    "at_exit": at_exit,
    "as_is": as_is,
    "errors": errors,
}

if __name__ == "__main__":
    name = sys.argv[1]
    SCENARIOS[name]()
    if name != "at_exit":
        print("ok", flush=True)
