"""The agent's status publisher: an Observer beside the timeline, and a thread that writes the
node's record every `period` seconds.

The events arrive on the agent's loop (`emit`); the thread builds the record under a lock, writes
it to the run dir (atomic replace, private) and hands it to the sinks (the job's store). Nothing
it does can stop the agent: a file that cannot be written, or a sink that fails, costs that
record only. `close` stops the thread and writes the last record (phase done), so that a node
that ended is not taken for one that died.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from elastic_hydra.agent.events import Event
from elastic_hydra.observe.sample import Sampler
from elastic_hydra.observe.status import Counts, NodeStatus, Tracker, encode
from elastic_hydra.records.stragglers import Score
from elastic_hydra.rundir import write_private

PERIOD = 2.0  # seconds between records
CLOSE_WAIT = 5.0  # seconds `close` waits for the thread (a sink blocked on a store)

Sink = Callable[[bytes], None]


class Publisher:
    """Feeds the tracker, publishes its record (see the module's docstring)."""

    def __init__(
        self,
        tracker: Tracker,
        *,
        path: Path,
        progress: Callable[[], Mapping[int, float]] = dict,
        how: Callable[[], Mapping[int, str]] = dict,
        stragglers: Callable[[], Mapping[int, tuple[Score, bool]]] = dict,
        sampler: Sampler | None = None,
        sinks: Sequence[Sink] = (),
        after: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.tracker = tracker
        self.path = path
        self.progress, self.how, self.stragglers = progress, how, stragglers
        self.sampler = sampler or Sampler()
        self.sinks = list(sinks)
        self.after = list(after)  # run after each record (the metrics' textfile)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def emit(self, event: Event) -> None:
        with self.lock:
            self.tracker.emit(event)

    def current(self) -> NodeStatus:
        """The record as of now."""
        return self.state()[0]

    def state(self) -> tuple[NodeStatus, Counts]:
        """The record as of now, and what happened so far (a scrape of the metrics)."""
        with self.lock:
            samples = self.sampler.sample(self.tracker.live_pids())
            progress, how = self.progress(), self.how()
            record = self.tracker.record(
                now=time.time(), samples=samples, progress=progress, how=how,
                stragglers=self.stragglers(),
            )  # fmt: skip
            return record, copy.deepcopy(self.tracker.counts)

    def publish(self) -> None:
        """One record, to the run dir and every sink; failures cost this record only."""
        raw = encode(self.current())
        with contextlib.suppress(OSError):  # a full disk, a removed run dir
            write_private(self.path, raw.decode())
        for sink in self.sinks:
            with contextlib.suppress(Exception):  # a sink that fails is its own business
                sink(raw)
        for then in self.after:
            with contextlib.suppress(Exception):
                then()

    def start(self) -> None:
        """Publish now, then every `tracker.period` seconds on a daemon thread."""
        self.thread = threading.Thread(target=self._run, name="elastic-hydra-status", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.publish()
            if self.stopped.wait(self.tracker.period):
                return

    def close(self) -> None:
        """Stop the thread, publish the last record, release NVML (nothing if never started)."""
        self.stopped.set()
        if self.thread is None:
            return
        self.thread.join(CLOSE_WAIT)
        if self.thread.is_alive():  # a sink stuck on a store: the record on disk suffices
            self.sinks = []
        self.publish()
        self.sampler.close()
