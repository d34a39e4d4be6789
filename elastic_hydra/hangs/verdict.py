"""Hangs as data: when a job counts as hung, where each rank is, and the one-line verdict.

Pure. Progress is what the agent observes of each rank (`RankProgress`): a collective issued
(torch's sequence numbers, read by the bootstrap), a call to `elastic_hydra.progress()`, output,
Python code that ran in the user's own frame (a loop that passes the same line again, however
long it sleeps there), a changed stack, and CPU time. A rank blocked in a collective, a lock,
`sleep` or a read shows none of them; a rank computing, in Python or in a long C call, shows CPU
time. On a rank that uses a GPU, CPU time counts only if its main thread also ran Python code
since the last look: a host thread waiting for the GPU (`.item()`, `synchronize`, behind an NCCL
collective that never ends) spins a whole core in one C call. The job is hung when no rank made
progress for the timeout (and the attempt is past its warm-up).

The verdict groups the ranks by where their main thread is (the innermost frame in the user's
code, and the innermost call below it) and tells waiters from suspects. A waiter waits for its
peers or has finished: it is inside a collective or a wait (torch.distributed, FSDP, DDP's
forward, autograd's engine, whose DDP/FSDP hooks run collectives, `torch.cuda.synchronize`, a
C call such as `work.wait()` or `store.wait()` straight from the user's line) or has exited. A
suspect is anywhere else: sleeping or blocked in the user's code, in a data loader, stopped
(SIGSTOP), or not dumped. The verdict names a group as stuck only when the suspects are all in
one place and some rank waits; otherwise (every rank waits, suspects in two places, every rank
in one place) it says it cannot tell which rank, rather than guess.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elastic_hydra.plan import LEARN_FLOOR, LEARN_GAPS, LEARN_MULTIPLE
from elastic_hydra.records.hangs import GroupState, HangRank, RankState
from elastic_hydra.tracebacks import Frame, ThreadStack, is_launcher_frame

# Where a frame belongs to a library or to Python itself rather than to the user's program.
_LIBRARY = re.compile(
    r"/(site|dist)-packages/|/lib/python\d+\.\d+/|^<|elastic_hydra/workers/bootstrap\.py$"
)
CPU_BUSY = 0.1  # a process that used this share of a core since the last look is computing


NOTE_LINE = 21  # bytes of one line of a progress note (workers/bootstrap.py's _LINE)
MAX_NOTE = 4096  # bytes of a progress note read at most


@dataclass(frozen=True, slots=True, kw_only=True)
class Notes:
    """A rank's progress note, as its bootstrap (and `elastic_hydra.progress()`) wrote it:
    each field None where it is not written (yet), cannot be read, or is not a number."""

    stack_moved: float | None = None  # the last look at which the main thread's stack changed
    ran: float | None = None  # the last look that found it had run Python code (0: not yet)
    user_ran: float | None = None  # ... in the user's own frame (0: not yet)
    collectives: int | None = None  # collectives its process groups issued
    script_said: float | None = None  # the last `elastic_hydra.progress()`

    @classmethod
    def parse(cls, data: bytes) -> Notes:
        """The fixed-width lines of a note; a line half written, blank or not a finite number
        is None (the file is the worker's, so untrusted: anything else is ignored)."""
        fields: list[float | None] = []
        for n in range(5):
            word = data[n * NOTE_LINE : (n + 1) * NOTE_LINE].strip(b" \n\x00")
            try:
                value: float | None = float(word) if word else None
            except ValueError:
                value = None
            fields.append(value if value is not None and 0 <= value < 1e15 else None)
        count = fields[3]
        return cls(
            stack_moved=fields[0], ran=fields[1], user_ran=fields[2],
            collectives=int(count) if count is not None else None, script_said=fields[4],
        )  # fmt: skip


@dataclass(slots=True)
class RankProgress:
    """What the agent knows of one rank's progress (mutable: updated at each look)."""

    last_progress: float  # wall clock
    how: str = "started"  # what its last progress was, for people (`top`, status records)
    cpu: float | None = None  # the process's CPU seconds at the last look
    looked: float | None = None  # when (wall clock)
    gpu: bool = False  # it uses a GPU
    collectives: int | None = None  # the count at the last look
    output: int | None = None  # bytes of its output at the last look

    def observe(
        self, *, now: float, notes: Notes, cpu: float | None, output: int | None = None
    ) -> None:
        """One look: the rank's progress note, its process's CPU seconds and the size of its
        output so far (None: not known). Each of these counts as progress: a collective issued,
        `elastic_hydra.progress()`, output, Python code that ran in the user's frame, a changed
        stack, CPU time (on a GPU rank only while its main thread also runs Python)."""
        seen: list[tuple[float | None, str]] = []
        if notes.collectives is not None and notes.collectives != self.collectives:
            if self.collectives is not None:
                seen.append((now, f"collective #{notes.collectives}"))
            self.collectives = notes.collectives
        seen.append((notes.script_said, "progress()"))
        if output is not None and self.output is not None and output > self.output:
            seen.append((now, "output"))
        self.output = output if output is not None else self.output
        seen += [(notes.user_ran, "python"), (notes.stack_moved, "python")]
        if self._busy(now, notes.ran, cpu):
            seen.append((now, "cpu"))
        self.cpu, self.looked = cpu, now
        for at, how in seen:  # the most telling first, among those of one time
            if at is not None and min(at, now) > self.last_progress:
                self.last_progress, self.how = min(at, now), how

    def _busy(self, now: float, ran: float | None, cpu: float | None) -> bool:
        """Whether the process used CPU_BUSY of a core since the last look (on a GPU rank: and
        its main thread ran Python code, since spinning in one C call is no progress)."""
        if cpu is None or self.cpu is None or self.looked is None:
            return False
        # The bootstrap finds out at its own looks, as often as the agent's: one look's lag.
        if self.gpu and ran is not None and ran <= self.looked - (now - self.looked):
            return False
        return cpu - self.cpu >= CPU_BUSY * max(now - self.looked, 1e-3)


@dataclass(slots=True)
class Rhythm:
    """hang.timeout=auto: the gaps between a job's progress events, from each look's idle time.

    A look knows the job's last progress (`now - idle`). When it moved since the previous look,
    a gap ended: from the previous look's last progress to this one's, which is the longest the
    gap can have been (a job that progresses between every two looks has gaps of about one look
    interval; the events in between are not seen, only that there were some)."""

    longest: float = 0.0  # the longest gap seen
    gaps: int = 0  # gaps seen
    last: float | None = None  # the last progress as of the previous look

    def see(self, idle: float, now: float) -> None:
        last = now - idle
        if self.last is not None and last > self.last:
            self.longest, self.gaps = max(self.longest, last - self.last), self.gaps + 1
        self.last = last if self.last is None else max(self.last, last)

    def timeout(self, cap: float) -> float:
        """LEARN_MULTIPLE times the longest gap, between LEARN_FLOOR and `cap`; `cap` until
        LEARN_GAPS gaps were seen."""
        if self.gaps < LEARN_GAPS:
            return cap
        return min(cap, max(LEARN_FLOOR, LEARN_MULTIPLE * self.longest))


def idle_for(ranks: Sequence[RankProgress], now: float) -> float:
    """Seconds since any of `ranks` made progress (0 when there are none)."""
    return now - max(r.last_progress for r in ranks) if ranks else 0.0


def is_library(filename: str) -> bool:
    return bool(_LIBRARY.search(filename.replace("\\", "/")))


def locate(frames: Sequence[Frame]) -> tuple[Frame | None, Frame | None]:
    """(the innermost frame of the user's code, the innermost frame of all when it is below
    that one in a library); frames outermost first."""
    user = next((f for f in reversed(frames) if not is_library(f.filename)), None)
    inner = frames[-1] if frames else None
    return user, (inner if inner is not None and inner is not user else None)


def library_call(frame: Frame) -> str:
    """`torch.distributed.distributed_c10d.all_reduce` from a frame in a package's file."""
    path = frame.filename.replace("\\", "/")
    m = re.search(r"/(?:site|dist)-packages/(.+?)\.py$", path) or re.search(
        r"/lib/python\d+\.\d+/(.+?)\.py$", path
    )
    module = m.group(1).replace("/", ".").removesuffix(".__init__") if m else _base(path)
    return f"{module}.{frame.name}"


def place(rank: HangRank) -> str:
    """Where a rank is, for people: `torch...all_reduce called from train.py:42` or
    `data.py:88 (time.sleep(60))`."""
    if rank.state is not RankState.DUMPED:
        return rank.state.replace("_", " ")
    user = f"{_base(rank.file)}:{rank.line}" if rank.file else ""
    if rank.call:
        return f"in {rank.call} called from {user}" if user else f"in {rank.call}"
    code = f" ({rank.code})" if rank.code else ""
    return f"at {user}{code}" if user else "at an unknown place"


def main_stack_lines(rank: HangRank) -> list[str] | None:
    """The rank's main-thread frames as Python prints a traceback's (outermost first), the
    launcher's own hidden; None when no main thread was dumped."""
    main = next((t for t in rank.threads if t.get("main")), None)
    if main is None:
        return None
    frames = (
        Frame(filename=f["filename"], lineno=f["lineno"], name=f["name"]) for f in main["frames"]
    )
    return [
        f'  File "{f.filename}", line {f.lineno}, in {f.name}'
        for f in frames
        if not is_launcher_frame(f)
    ]


def _base(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


# Library calls that wait for the other ranks (module.function, as `library_call` names them).
_WAITS = re.compile(
    r"^torch\.distributed\."  # collectives, barriers, store waits, FSDP's own collectives
    r"|^torch\.nn\.parallel\.distributed\."  # DDP's forward (buffer sync, join)
    r"|^torch\.autograd\.(graph\._engine_run_backward|backward|grad)$"  # DDP/FSDP hooks inside
    r"|^torch\._tensor\.backward$"
    r"|^torch\.cuda\..*synchronize$"
    r"|^torch\.futures\."
)
# A call into C on the user's line that waits for peers or the GPU: Work.wait(), store.wait(),
# torch.cuda.synchronize(), .item() behind a collective on a GPU.
_WAIT_CODE = re.compile(r"\.(wait|synchronize|item)\(")


def waits_for_peers(rank: HangRank) -> bool:
    """A waiter: inside a collective or a wait, or exited; a victim of the hang more likely than
    its cause. Stopped, undumped and every other place are suspects."""
    if rank.state is RankState.EXITED:
        return True
    if rank.state is not RankState.DUMPED:
        return False
    below = _calls_below_user(rank)
    if not below and not rank.call:
        return bool(_WAIT_CODE.search(rank.code))
    return any(_WAITS.search(call) for call in (*below, rank.call) if call)


def _calls_below_user(rank: HangRank) -> list[str]:
    """The library calls between the innermost frame of the user's code and the innermost one,
    from the main thread's stack (what `call` names is the last). Another node's ranks come
    from the store: a stack that does not read as one counts as none."""
    try:
        main = next((t for t in rank.threads if t.get("main")), None)
        if main is None:
            return []
        frames = [
            Frame(filename=str(f["filename"]), lineno=int(f["lineno"]), name=str(f["name"]))
            for f in main["frames"]
        ]
    except (AttributeError, KeyError, TypeError, ValueError):
        return []
    user = max((i for i, f in enumerate(frames) if not is_library(f.filename)), default=-1)
    return [library_call(f) for f in frames[user + 1 :]]


def groups(ranks: Sequence[HangRank]) -> list[tuple[str, list[HangRank]]]:
    """The ranks grouped by place, suspects before waiters, then the smallest group first."""
    by_place: dict[str, list[HangRank]] = {}
    for r in sorted(ranks, key=lambda r: r.rank):
        by_place.setdefault(place(r), []).append(r)
    return sorted(
        by_place.items(),
        key=lambda kv: (waits_for_peers(kv[1][0]), len(kv[1]), [r.rank for r in kv[1]]),
    )


def who(members: Sequence[HangRank]) -> str:
    return f"rank{'s' if len(members) > 1 else ''} {','.join(str(r.rank) for r in members)}"


def suspects(grouped: Sequence[tuple[str, list[HangRank]]]) -> tuple[frozenset[int], str]:
    """The ranks the evidence singles out, or none and why it cannot tell."""
    found = [members for _, members in grouped if not waits_for_peers(members[0])]
    if sum(len(members) for _, members in grouped) < 2:
        return frozenset(), ""
    if len(grouped) == 1:
        return frozenset(), "every rank is in one place"
    if not found:
        return frozenset(), "every rank waits for the others or has exited"
    if len(found) > 1:
        return frozenset(), f"ranks in {len(found)} places are not waiting for the others"
    return frozenset(r.rank for r in found[0]), ""


def verdict(ranks: Sequence[HangRank], idle: float) -> tuple[str, frozenset[int]]:
    """The one-line verdict and the ranks it names as stuck (none when it cannot tell): where
    each rank is, then the collective the waiting ranks are in and who never entered it."""
    grouped = groups(ranks)
    odd, why = suspects(grouped)
    in_collective, late = collectives(ranks)
    if late and not odd and why:  # the stacks cannot tell; the sequence numbers can
        odd, why = late, ""
    elif late and odd and late != odd:
        why = f"the stacks point at {_ranks(odd)}, the collectives at {_ranks(late)}"
        odd = frozenset()
    parts = [
        f"{who(members)} {where}" + (" (stuck here)" if members[0].rank in odd else "")
        for where, members in grouped
    ]
    head = f"hang after {idle:.0f} s without progress"
    if why:
        head += f"; cannot tell which rank ({why})"
    tail = f"; {in_collective}" if in_collective else ""
    return f"{head}: " + "; ".join(parts) + tail, odd


def collectives(ranks: Sequence[HangRank]) -> tuple[str, frozenset[int]]:
    """Per process group with a collective not every rank finished: its number, op and sizes,
    the ranks in it and those that never entered it (they issued fewer) or entered another op
    under the same number; and the ranks to blame when one group alone points at some and every
    rank not exited told its collectives. ("", none) when no rank told any."""
    states: dict[str, dict[int, GroupState]] = {}
    for r in ranks:
        for g in r.groups:
            states.setdefault(g.group, {})[r.rank] = g
    parts, late = [], []
    for name in sorted(states, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)):
        if (found := _in_group(name, states[name])) is not None:
            parts.append(found[0])
            if found[1]:
                late.append(found[1])
    told = all(r.groups or r.state is RankState.EXITED for r in ranks)
    return "; ".join(parts), late[0] if len(late) == 1 and told else frozenset()


def _in_group(name: str, by_rank: dict[int, GroupState]) -> tuple[str, frozenset[int]] | None:
    """One group's line and the ranks it points at (None: every rank finished its last)."""
    top = max(g.issued for g in by_rank.values())
    inside = sorted(k for k, g in by_rank.items() if g.issued == top and g.completed != top)
    behind = sorted(k for k, g in by_rank.items() if g.issued < top)
    if top == 0 or not (inside or behind):
        return None
    by_op: dict[str, list[int]] = {}
    for k in inside:
        by_op.setdefault(by_rank[k].op, []).append(k)
    lead = by_rank[inside[0] if inside else max(by_rank, key=lambda k: by_rank[k].issued)]
    text = f"collective #{top}" + (f" {lead.op}" if lead.op else "") + f" of group {name}"
    text += f" (sizes {lead.sizes})" if lead.sizes else ""
    odd: frozenset[int] = frozenset()
    if len(by_op) > 1 and "" not in by_op:  # one number, several ops: not the same collective
        text = f"collective #{top} of group {name}: " + ", ".join(
            f"{_ranks(k)} in {op}" for op, k in sorted(by_op.items(), key=lambda kv: kv[1])
        )
        sizes = sorted(len(k) for k in by_op.values())
        if sizes[0] < sizes[1]:  # a minority in another op
            odd = frozenset(next(k for k in by_op.values() if len(k) == sizes[0]))
        text += " (not the same collective)"
    else:
        text += f": {_ranks(inside)} in it" if inside else ": every rank finished it"
    if behind:
        at = {by_rank[k].issued for k in behind}
        gaps = ", ".join(f"{k} at #{by_rank[k].issued}" for k in behind)
        text += f", {_ranks(behind)} never entered it"
        text += f" (at #{at.pop()})" if len(at) == 1 else f" ({gaps})"
        odd = frozenset(behind)
    return text, odd


def no_collectives(ranks: Sequence[HangRank]) -> str:
    """One line on the ranks whose collectives are not known, and why ("" when all are)."""
    why: dict[str, list[int]] = {}
    for r in ranks:
        if not r.groups and r.state is not RankState.EXITED:
            why.setdefault(r.no_groups or "not asked", []).append(r.rank)
    return "; ".join(f"no collectives from {_ranks(k)}: {w}" for w, k in why.items())


def _ranks(numbers: Iterable[int]) -> str:
    listed = sorted(numbers)
    return f"rank{'s' if len(listed) > 1 else ''} {','.join(map(str, listed))}"


MAX_GROUPS_NOTE = 64 << 10  # bytes of a collectives file read at most


def parse_groups(data: bytes) -> tuple[tuple[GroupState, ...], str]:
    """A worker's collectives file (untrusted: every field checked, at most 64 groups), and
    why there are none."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return (), "its collectives file does not read as JSON"
    if not isinstance(raw, dict):
        return (), "its collectives file does not read as JSON"
    found = []
    groups_ = raw.get("groups")
    for name, g in list(groups_.items() if isinstance(groups_, dict) else ())[:64]:
        if not isinstance(g, dict):
            continue
        issued, completed = _count(g.get("issued")), _count(g.get("completed"))
        if issued is None:
            continue
        op, sizes = g.get("op"), g.get("sizes")
        found.append(
            GroupState(
                group=_text(name), issued=issued, completed=completed,
                op=_text(op) if isinstance(op, str) else "",
                sizes=_text(json.dumps(sizes)) if isinstance(sizes, list) else "",
            )
        )  # fmt: skip
    missing = raw.get("missing")
    return tuple(found), (_text(missing) if isinstance(missing, str) and not found else "")


def _count(value: object) -> int | None:
    """A sequence number: an int or a decimal string (the recorder writes both), else None."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62:
        return value
    return None


def _text(value: object) -> str:
    """Printable, at most 80 characters."""
    return "".join(c if c.isprintable() else "?" for c in str(value))[:80]


_SPY_THREAD = re.compile(
    r'^Thread (?P<id>0x[0-9a-fA-F]+|\d+) \((?P<state>[^)]*)\)(?:: "(?P<name>.*)")?'
)
_SPY_FRAME = re.compile(r"^\s+(?P<name>.+) \((?P<file>.+):(?P<line>\d+)\)$")


def parse_py_spy(text: str) -> tuple[ThreadStack, ...]:
    """`py-spy dump`'s threads, the main thread first (frames innermost first in its output)."""
    found: list[tuple[int, bool, list[Frame]]] = []
    for line in text.splitlines():
        if (head := _SPY_THREAD.match(line)) is not None:
            tid = int(head["id"], 16) if head["id"].startswith("0x") else int(head["id"])
            found.append((tid, head["name"] == "MainThread", []))
        elif found and (m := _SPY_FRAME.match(line)) is not None:
            found[-1][2].append(Frame(filename=m["file"], lineno=int(m["line"]), name=m["name"]))
    found.sort(key=lambda t: not t[1])
    return tuple(ThreadStack(thread_id=t, frames=tuple(reversed(f))) for t, _, f in found)
