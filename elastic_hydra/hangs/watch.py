"""The agent's watch on its workers' progress (`hang.timeout`): `seams.HangWatch` for one node.

At each look (every `hang.sample` seconds) it reads every running worker's progress note (what
its bootstrap saw of the main thread, the collectives it issued, `elastic_hydra.progress()`), the
size of its output files and its CPU time (`workers.procfs`).
When no rank made progress for `hang.timeout`, every rank is asked for its stacks before anything
else happens: DUMP_SIGNAL to ranks run through the bootstrap (faulthandler answers from C, with
or without the GIL), py-spy for the others where it is installed. A SIGSTOPped rank cannot
answer and is named as stopped.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from elastic_hydra.agent.seams import JobShare, NodeAssignment
from elastic_hydra.agent.worker_env import DUMP_SIGNAL
from elastic_hydra.hangs import verdict
from elastic_hydra.plan import LaunchPlan
from elastic_hydra.records.hangs import GroupState, HangRank, HangRecord, RankState
from elastic_hydra.rundir import RunDir, write_private
from elastic_hydra.tracebacks import Frame, ThreadStack, parse_threads
from elastic_hydra.workers import procfs

DUMP_WAIT = 3.0  # seconds the ranks get to write their stacks


@dataclass(frozen=True, slots=True, kw_only=True)
class Workers:
    """One attempt's workers on this node, as the watch and `elastic-hydra stacks` see them."""

    run: RunDir
    attempt: int
    pids: tuple[int, ...]  # by local rank
    ranks: tuple[int, ...]  # global rank by local rank
    host: str
    node_rank: int | None = None
    bootstrapped: bool = True


class LocalHangWatch:
    """Progress and stacks of this node's workers (and, with `job`, the job's)."""

    def __init__(
        self, plan: LaunchPlan, run: RunDir, host: str, job: JobShare | None = None
    ) -> None:
        self.spec, self.run, self.host, self.job = plan.hang, run, host, job
        self.bootstrapped = plan.entrypoint_bootstrapped
        self.workers = Workers(run=run, attempt=0, pids=(), ranks=(), host=host)
        self.started, self.reported = 0.0, False
        self.ranks: dict[int, verdict.RankProgress] = {}
        self.rhythm = verdict.Rhythm()

    def start(self, pids: list[int], node: NodeAssignment, attempt: int) -> None:
        now = time.time()
        self.workers = Workers(
            run=self.run, attempt=attempt, pids=tuple(pids), host=self.host,
            ranks=tuple(node.base_rank + lr for lr in range(len(pids))),
            node_rank=node.group_rank, bootstrapped=self.bootstrapped,
        )  # fmt: skip
        self.started, self.reported = now, False
        self.rhythm = verdict.Rhythm()
        self.ranks = {lr: verdict.RankProgress(last_progress=now) for lr in range(len(pids))}

    def check(self, running: list[int]) -> HangRecord | None:
        now = time.time()
        running = [lr for lr in running if lr < len(self.workers.pids)]
        for lr in running:
            self._look(lr, now)
        idle = verdict.idle_for([self.ranks[lr] for lr in running], now)
        if self.job is not None:  # any rank on any node counts
            idle = now - self.job.share_progress(now - idle)
        timeout = self.timeout(idle, now)
        if idle < timeout:
            self.reported = False  # progress again: the next hang is a new one
            return None
        if self.reported or now - self.started < self.spec.warmup:
            return None
        self.reported = True
        record = replace(self.evidence(running, idle, now), timeout_s=round(timeout, 3))
        after = time.time()
        for lr in running:  # the CPU time the ranks spent on their dumps is no progress
            rank = self.ranks[lr]
            rank.cpu, rank.looked = procfs.cpu_seconds(self.workers.pids[lr]), after
        return record

    def timeout(self, idle: float, now: float) -> float:
        """The timeout of this look: hang.timeout, or the one learned from the gaps between the
        job's progress events (`verdict.Rhythm`), counted once the attempt is past its warm-up."""
        assert self.spec.timeout is not None
        if not self.spec.learned:
            return self.spec.timeout
        if now - self.started >= self.spec.warmup:
            self.rhythm.see(idle, now)
        return self.rhythm.timeout(self.spec.timeout)

    def last_progress(self) -> float | None:
        """seams.HangWatch: the latest progress of any rank of this attempt, as last seen."""
        return max((r.last_progress for r in self.ranks.values()), default=None)

    def _look(self, local_rank: int, now: float) -> None:
        attempt = self.workers.attempt
        notes = read_notes(self.run.progress_file(attempt, local_rank))
        output = _size(self.run.stdout(attempt, local_rank)) + _size(
            self.run.stderr(attempt, local_rank)
        )
        pid, rank = self.workers.pids[local_rank], self.ranks[local_rank]
        rank.gpu = rank.gpu or uses_gpu(pid)
        rank.observe(now=now, notes=notes, cpu=procfs.cpu_seconds(pid), output=output)

    def evidence(self, running: list[int], idle: float, now: float) -> HangRecord:
        """Every rank's place, its stacks saved first (with `job`: every node's ranks); the
        verdict."""
        told = frozenset(lr for lr, p in self.ranks.items() if p.collectives is not None)
        ranks, missing = dump_ranks(self.workers, running, told), 0
        if self.job is not None:
            ranks, missing = self.job.share_hang(ranks)
        text, odd = verdict.verdict(ranks, idle)
        if missing:
            text += f" ({missing} node(s) did not say where their ranks are)"
        return HangRecord(
            verdict=text,
            idle_s=round(idle, 3),
            timeout_s=self.spec.timeout or 0.0,
            action=self.spec.action,
            attempt=self.workers.attempt,
            time=now,
            ranks=tuple(replace(r, odd=r.rank in odd) for r in ranks),
        )


def dump_ranks(
    workers: Workers, running: list[int], torch_ranks: frozenset[int] = frozenset()
) -> list[HangRank]:
    """Ask every running rank for its stacks at once, and those of `torch_ranks` (local ranks
    whose torch.distributed has a process group) for their collectives too, then read them
    (DUMP_WAIT at most)."""
    asked: dict[int, tuple[Path, int]] = {}
    ranks: dict[int, HangRank] = {}
    collectives = {
        lr: workers.run.collectives_file(workers.attempt, lr)
        for lr in running
        if lr in torch_ranks and workers.bootstrapped and procfs.state(workers.pids[lr]) not in "Tt"
    }
    for path in collectives.values():
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)  # an earlier hang's
            write_private(Path(f"{path}.request"), "")
    for lr, pid in enumerate(workers.pids):
        base = HangRank(
            rank=workers.ranks[lr], local_rank=lr, pid=pid, host=workers.host,
            node_rank=workers.node_rank, state=RankState.EXITED,
        )  # fmt: skip
        path = workers.run.stacks_file(workers.attempt, lr)
        if lr not in running:
            ranks[lr] = base
        elif procfs.state(pid) in ("T", "t"):
            ranks[lr] = replace(base, state=RankState.STOPPED)
        elif workers.bootstrapped and _size(path) > 0:
            asked[lr] = (path, _size(path))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, DUMP_SIGNAL)
            ranks[lr] = base
        else:
            ranks[lr] = _with_threads(replace(base, state=RankState.NO_DUMP), py_spy(pid), None)
    deadline = time.monotonic() + DUMP_WAIT
    for lr, text in _read_dumps(asked, deadline).items():
        ranks[lr] = _with_threads(ranks[lr], parse_threads(text), _main_thread(asked[lr][0]))
    for lr, (groups, why) in _read_collectives(collectives, deadline).items():
        ranks[lr] = replace(ranks[lr], groups=groups, no_groups=why)
    for lr, rank in ranks.items():
        if lr not in collectives and lr in running:
            ranks[lr] = replace(
                rank, no_groups=_why_no_collectives(rank, workers, lr in torch_ranks)
            )
    return [ranks[lr] for lr in sorted(ranks)]


def _why_no_collectives(rank: HangRank, workers: Workers, has_groups: bool) -> str:
    if rank.state is RankState.STOPPED:
        return "it is stopped"
    if not workers.bootstrapped:
        return "not run through the bootstrap (bootstrap=false or cmd=)"
    return "" if has_groups else "torch.distributed has no process group"


def _read_collectives(
    paths: dict[int, Path], deadline: float
) -> dict[int, tuple[tuple[GroupState, ...], str]]:
    """Each asked rank's collectives file, once written (until `deadline`)."""
    found: dict[int, tuple[tuple[GroupState, ...], str]] = {}
    while True:
        for lr, path in paths.items():
            if lr not in found:
                with contextlib.suppress(OSError), open(path, "rb") as f:
                    found[lr] = verdict.parse_groups(f.read(verdict.MAX_GROUPS_NOTE))
        if len(found) == len(paths) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for lr, path in paths.items():
        with contextlib.suppress(OSError):
            Path(f"{path}.request").unlink(missing_ok=True)
        found.setdefault(lr, ((), f"no answer within {DUMP_WAIT:g} s"))
    return found


def _read_dumps(asked: dict[int, tuple[Path, int]], deadline: float) -> dict[int, str]:
    """What each asked rank appended to its stacks file, once it stopped growing."""
    sizes = {lr: offset for lr, (_, offset) in asked.items()}
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = {lr: _size(path) for lr, (path, _) in asked.items()}
        grown = all(now[lr] > offset for lr, (_, offset) in asked.items())
        if grown and now == sizes:
            break
        sizes = now
    texts = {}
    for lr, (path, offset) in asked.items():
        with contextlib.suppress(OSError), open(path, "rb") as f:
            f.seek(offset)
            texts[lr] = f.read().decode(errors="replace")
    return texts


def _with_threads(rank: HangRank, threads: tuple[ThreadStack, ...], main: int | None) -> HangRank:
    if not threads:
        return rank
    first = next((t for t in threads if t.thread_id == main), threads[0])
    user, inner = verdict.locate(first.frames)
    return replace(
        rank,
        state=RankState.DUMPED,
        file=user.filename if user else "",
        line=user.lineno if user else 0,
        function=user.name if user else "",
        code=_source(user) if user else "",
        call=verdict.library_call(inner) if inner else "",
        threads=tuple(
            {
                "thread_id": f"0x{t.thread_id:x}",
                "main": t is first,
                "frames": [
                    {"filename": f.filename, "lineno": f.lineno, "name": f.name} for f in t.frames
                ],
            }
            for t in threads
            if not all(verdict.is_library(f.filename) for f in t.frames) or t is first
        ),
    )


def read_notes(path: Path) -> verdict.Notes:
    """A rank's progress note (see `verdict.Notes`); empty before the worker's first note, where
    the bootstrap keeps none, or when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return verdict.Notes.parse(f.read(verdict.MAX_NOTE))
    except OSError:
        return verdict.Notes()


def _source(frame: Frame) -> str:
    """The frame's line of code, without its comment (best effort: `  #` starts one)."""
    return linecache.getline(frame.filename, frame.lineno).split("  #")[0].strip()


def _main_thread(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open(path) as f:
        return int(f.readline().split()[2], 16)  # "main thread 0x..."
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


GPU_DEVICES = "/dev/nvidia"  # + the GPU's number: a process with a CUDA context holds it open


def uses_gpu(pid: int) -> bool:
    """Whether the process holds a GPU's device file open: it initialised CUDA (measured with
    torch on an H100: `torch.cuda.is_available()` opens /dev/nvidia0 already; importing torch
    does not)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fds)
    except OSError:  # gone
        return False
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(fds / name)
            if target.startswith(GPU_DEVICES) and target[len(GPU_DEVICES) :].isdigit():
                return True
    return False


def py_spy(pid: int) -> tuple[ThreadStack, ...]:
    """The stacks py-spy reads from outside, for ranks without the bootstrap; () without it."""
    exe = shutil.which("py-spy")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=10,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return verdict.parse_py_spy(out.stdout)
