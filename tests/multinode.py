"""Helpers for multi-node tests: agents as separate processes on 127.0.0.1, one job dir each."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_hydra.agent.events import Event
from elastic_hydra.report.events_file import read_events
from tests.conftest import ELASTIC_HYDRA, WORKERS, wait_for

# Small torch rendezvous timings so that membership changes take seconds, not minutes.
FAST = (
    "rdzv.last_call_timeout=1",
    "rdzv.keep_alive_interval=1",
    "rdzv.keep_alive_max_attempt=3",
)


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen[bytes]
    root: Path  # logs.root
    output: Path  # stdout + stderr

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def summary(self) -> dict[str, Any]:
        (path,) = self.root.glob("**/summary.json")
        return json.loads(path.read_text())  # type: ignore[no-any-return]

    def events(self) -> list[Event]:
        """This agent's events so far (a line it is writing now is skipped)."""
        paths = list(self.root.glob("**/events.jsonl"))
        if not paths:
            return []
        return list(read_events(paths[0]).events)


@dataclass
class Job:
    """Agents of one job: same backend, endpoint and run id; a records file shared by workers.

    The workers (tests/scripts/elastic.py) sum their ranks through files, without torch, unless
    `gloo`: then through a gloo all_reduce, for the tests about torch's side of a job (the
    workers' store, torchrun agents' workers)."""

    tmp: Path
    backend: str
    endpoint: str
    gloo: bool = False
    run_id: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}")
    agents: list[Agent] = field(default_factory=list)

    @property
    def out(self) -> Path:
        path = self.tmp / "out"
        path.mkdir(exist_ok=True)
        return path

    def command(self, *overrides: str, script: Path = WORKERS / "elastic.py") -> list[str]:
        return [
            *ELASTIC_HYDRA,
            f"script={script}",
            f"rdzv={self.backend}",
            f"rdzv.endpoint={self.endpoint}",
            f"rdzv.id={self.run_id}",
            "local_addr=127.0.0.1",
            *overrides,
        ]

    def start(
        self, *overrides: str, env: dict[str, str] | None = None, argv: Sequence[str] = ()
    ) -> Agent:
        name = f"agent{len(self.agents)}"
        root = self.tmp / name
        output = self.tmp / f"{name}.out"
        cmd = list(argv) or self.command(*overrides, f"logs.root={root}")
        base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        with output.open("wb") as sink:
            proc = subprocess.Popen(
                cmd,
                cwd=self.tmp,
                env=base
                | {"OUT_DIR": str(self.out), "GLOO": "1" if self.gloo else "0"}
                | (env or {}),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        agent = Agent(name=name, proc=proc, root=root, output=output)
        self.agents.append(agent)
        return agent

    def records(self) -> list[dict[str, Any]]:
        path = self.out / "records.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def world(self, size: int) -> list[dict[str, Any]]:
        """The records of a complete round of `size` ranks (the latest one), or []."""
        latest: dict[int, dict[str, Any]] = {}
        for record in self.records():
            if record["world_size"] == size:
                latest[record["rank"]] = record
        return sorted(latest.values(), key=lambda r: r["rank"]) if len(latest) == size else []

    def wait_world(self, size: int, timeout: float) -> list[dict[str, Any]]:
        return wait_for(lambda: self.world(size), timeout, f"a round with world size {size}",
                        detail=self.explain)  # fmt: skip

    def finish(self, timeout: float) -> list[int]:
        """Exit codes of all agents; past the deadline every agent is stopped and it fails."""
        try:
            wait_for(lambda: all(a.proc.poll() is not None for a in self.agents), timeout,
                     "the agents to exit", interval=0.1)  # fmt: skip
        except AssertionError:
            self.stop()
            logs = "\n".join(f"--- {a.name}\n{a.text()[-3000:]}" for a in self.agents)
            raise AssertionError(f"agents still running after {timeout} s\n{logs}") from None
        return [a.proc.returncode for a in self.agents]

    def stop(self) -> None:
        for agent in self.agents:
            if agent.proc.poll() is None:
                agent.proc.send_signal(signal.SIGTERM)
        for agent in self.agents:
            try:
                agent.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                agent.proc.kill()
                agent.proc.wait()

    def explain(self) -> str:
        return "\n".join(
            f"--- {a.name} (exit {a.proc.poll()})\n{a.text()[-4000:]}" for a in self.agents
        )


@contextlib.contextmanager
def job(tmp: Path, backend: str, endpoint: str, *, gloo: bool = False) -> Iterator[Job]:
    """A job whose agents are all stopped when the test ends, however it ends."""
    j = Job(tmp=tmp, backend=backend, endpoint=endpoint, gloo=gloo)
    try:
        yield j
    finally:
        j.stop()


@contextlib.contextmanager
def rdzv_server(tmp: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`elastic-hydra rdzv-server --port 0`: the c10d store in its own process."""
    log = tmp / "rdzv-server.out"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*ELASTIC_HYDRA, "rdzv-server", "--port", "0"], stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        found = wait_for(
            lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text()) or proc.poll(),
            60,
            "the rendezvous server to listen",
        )
        assert isinstance(found, re.Match), log.read_text()
        yield int(found.group(1)), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
