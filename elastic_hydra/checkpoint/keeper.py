"""The agent's side: the node's snapshot area, what each attempt's workers resume from, and the
durable copies in the job's checkpoint home.

- The area lives in memory (/dev/shm), private to the agent's user, one per agent; the workers
  write their snapshots into it and a worker that dies takes nothing along. An area left by an
  agent that was killed is removed by the next agent of the same user on that machine.
- Before each attempt's workers start, the nodes agree (through the round's store) on the newest
  step every rank of the new world holds: in memory when every node has it, else the newest copy
  in the home that every node found complete and sound. The offer goes into the area
  (`restore.json`); snapshots newer than it are dropped (they belong to a timeline that ended).
- When the agent ends (success, failure, a stop signal, preemption), each node copies its ranks'
  newest snapshots that every local rank holds into the home, each part checked as it is
  written, and writes its manifest (sizes, SHA-256) last. A copy is complete when the manifests
  of its nodes name every rank of its world, and sound when the parts match them: only such a
  copy is ever offered. The newest `keep` complete copies stay.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_hydra.agent.seams import NodeAssignment, NodeExchange
from elastic_hydra.checkpoint.buddy import BuddyError, Ring
from elastic_hydra.checkpoint.layout import AREA_PREFIX, Area, Home
from elastic_hydra.errors import RendezvousError
from elastic_hydra.plan import CheckpointSpec, Endpoint
from elastic_hydra.rundir import PRIVATE_DIR, PRIVATE_FILE
from elastic_hydra.workers import procfs

FORMAT = 1
GATHER_TOPIC = "checkpoint"
GATHER_LIMIT = 16384
# Seconds a node waits for the others' word: every node asks right after the same round (a
# torchrun agent among them says nothing, and is not waited for).
GATHER_TIMEOUT = 30.0
PLACED_TOPIC = "checkpoint-placed"
# Seconds the nodes wait for those that take a rank's snapshot from another node's memory.
PLACE_TIMEOUT = 120.0
MANIFEST_LIMIT = 1 << 20  # bytes: a manifest of 4096 ranks is about 400 KiB
_CHUNK = 1 << 20
MEMORY = "memory"
SAVE_TOPIC = "checkpoint-save"
SAVE_AGREE_TIMEOUT = 5.0  # seconds a signalled node waits for the first one's proposal
SAVE_POLL = 0.05
# Seconds the other nodes of a job may take to see a save request (their agents look at the
# round's store every monitor_interval, 0.1 s by default): the step asked for is as many steps
# further as the ranks train in that time, at most SAVE_MAX_LEAD further.
SAVE_NOTICE = 0.5
SAVE_MAX_LEAD = 64


class CopyError(ValueError):
    """A copy in the home that is not complete, not sound, or another job's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """What an attempt's workers resume from."""

    step: int | None  # None: a fresh start
    source: str = ""  # "memory", or the home copy's directory
    world_size: int = 0  # of the copy (a home copy's; the job's for memory)


def open_area(base: Path) -> Area:
    """A new, private snapshot area under `base` (after removing those of dead agents)."""
    remove_stale_areas(base)
    root = base / f"{AREA_PREFIX}{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(mode=PRIVATE_DIR)
    return Area(root)


def remove_stale_areas(base: Path) -> list[Path]:
    """Remove the areas under `base` of this user's agents that are gone; those removed."""
    removed = []
    with contextlib.suppress(OSError):
        for path in base.iterdir():
            if not path.name.startswith(AREA_PREFIX):
                continue
            pid = path.name.removeprefix(AREA_PREFIX).split("-", 1)[0]
            try:
                mine = path.stat().st_uid == os.getuid()
                if not mine or not pid.isdigit() or procfs.stat(int(pid)) is not None:
                    continue
            except OSError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class Keeper:
    """One agent's snapshots: the area, the offers, the copies.

    Args:
        spec: checkpoint.* as resolved.
        area: this agent's snapshot area.
        say: one line for the user (a copy refused, a copy kept, nothing to keep).
    """

    def __init__(
        self,
        spec: CheckpointSpec,
        area: Area,
        *,
        say: Callable[[str], None],
        hurry: Callable[[], bool] = lambda: False,
        ring: Ring | None = None,
    ) -> None:
        self.spec, self.area, self.job, self.say = spec, area, spec.job, say
        self.ring = ring  # checkpoint.buddy on several nodes: the copies on the next node
        self.hurry = hurry  # a second Ctrl-C: stop waiting for the agreed snapshot
        self.exchange: NodeExchange | None = None
        self.home = Home(Path(spec.home))
        self.node: NodeAssignment | None = None
        self.nproc = 0
        self.offered: Offer = Offer(step=None)
        self._refused: set[int] = set()

    # ------------------------------------------------------------------------ each attempt
    def offer(self, node: NodeAssignment, nproc: int, exchange: NodeExchange) -> Offer:
        """Agree with the round's other nodes on what the attempt's workers resume from, take
        the snapshots of this node's ranks that another node holds, and write the offer into
        the area."""
        self.node, self.nproc, self.exchange = node, nproc, exchange
        self.area.save_request.unlink(missing_ok=True)
        ranks = self._ranks()
        if self.ring is not None:
            self.ring.pause()
        home = self.sound_copies(node.world_size, ranks) if self.spec.resume else []
        mine = Said(
            holds=self._holdings(), ranks=ranks, home=frozenset(home),
            at=self.ring.address if self.ring is not None else None,
        )  # fmt: skip
        theirs = exchange.gather(
            GATHER_TOPIC, mine.encode(), limit=GATHER_LIMIT, timeout=GATHER_TIMEOUT
        )
        said = [Said.decode(raw, node.world_size) for raw in theirs]
        # Without an exchange (static nodes share no store) this node's ranks are all it knows.
        required = range(node.world_size) if len(said) == node.group_world_size else ranks
        me = node.group_rank if len(said) == node.group_world_size else 0
        step = in_memory(said, required)
        if step is not None and not self._placed(step, said, me, exchange):
            step = None
        offer = Offer(step=step, source=MEMORY) if step is not None else _from_home(said, self.home)
        self._aim(said, me)
        self._write_offer(offer, ranks)
        self.offered = offer
        return offer

    def _holdings(self) -> dict[int, frozenset[int]]:
        """The steps of every rank this node holds a snapshot of: its own ranks' (now or
        before), and its copies of the ring's previous node's."""
        holds: dict[int, set[int]] = {}
        for area in (self.area, self.area.buddy):
            for rank in area.ranks():
                holds.setdefault(rank, set()).update(area.steps(rank))
        return {rank: frozenset(steps) for rank, steps in holds.items() if steps}

    def _placed(
        self, step: int, said: Sequence[Said | None], me: int, exchange: NodeExchange
    ) -> bool:
        """Put this node's ranks' snapshots of `step` in place: from its own copies of another
        node's, else from the node that holds it; whether every node did (they tell each other
        only when one of them had to take one from another node)."""
        ok = True
        for rank in self._ranks():
            if step in self.area.steps(rank):
                continue
            try:
                self._take(rank, step, said, me)
            except (OSError, BuddyError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                self.say(f"checkpoint: rank {rank}'s snapshot of step {step} did not come: {why}")
                ok = False
                break
        if not any(needs_other(s, step) for s in said if s is not None):
            return ok
        votes = exchange.gather(PLACED_TOPIC, b"1" if ok else b"0", limit=1, timeout=PLACE_TIMEOUT)
        return all(v == b"1" for v in votes)

    def _take(self, rank: int, step: int, said: Sequence[Said | None], me: int) -> None:
        buddy = self.area.buddy
        if step in buddy.steps(rank):
            self.area.rank_dir(rank).mkdir(mode=PRIVATE_DIR, exist_ok=True)
            os.replace(buddy.snapshot(rank, step), self.area.snapshot(rank, step))
            self.say(f"checkpoint: rank {rank}'s snapshot of step {step} came from this node's "
                     "copy of it (checkpoint.buddy)")  # fmt: skip
            return
        holder = next(
            (k for k, s in enumerate(said)
             if k != me and s is not None and s.at is not None and step in s.holds.get(rank, ())),
            None,
        )  # fmt: skip
        if holder is None or self.ring is None:
            raise BuddyError("no node that holds it can be reached")
        at = said[holder].at  # type: ignore[union-attr]
        assert at is not None
        size = self.ring.fetch(at, rank, step)
        self.say(f"checkpoint: rank {rank}'s snapshot of step {step} came from node {holder} "
                 f"({at}, {size} bytes): no read of the checkpoint home")  # fmt: skip

    def _aim(self, said: Sequence[Said | None], me: int) -> None:
        """Push this node's snapshots to the next node of the round that takes copies, and take
        those of the previous one."""
        if self.ring is None:
            return
        ring = [k for k, s in enumerate(said) if s is not None and s.at is not None]
        if me not in ring or len(ring) < 2:
            self.ring.aim(None, (), ())
            return
        at = ring.index(me)
        after, before = said[ring[(at + 1) % len(ring)]], said[ring[at - 1]]
        assert after is not None and before is not None
        self.ring.aim(after.at, self._ranks(), before.ranks, me=me, before_node=ring[at - 1])

    def _ranks(self) -> range:
        assert self.node is not None
        return range(self.node.base_rank, self.node.base_rank + self.nproc)

    def _held(self, ranks: Sequence[int]) -> list[int]:
        """The steps every rank in `ranks` holds a complete snapshot of, in this area."""
        held: set[int] | None = None
        for rank in ranks:
            steps = set(self.area.steps(rank))
            held = steps if held is None else held & steps
        return sorted(held or ())

    def _write_offer(self, offer: Offer, ranks: Sequence[int]) -> None:
        newest = -1 if offer.step is None else offer.step
        # Newer than the offer: a timeline that ended, never resumed, kept or copied.
        for area, held in ((self.area, ranks), (self.area.buddy, self.area.buddy.ranks())):
            for rank in held:
                for step in area.steps(rank):
                    if step > newest:
                        area.snapshot(rank, step).unlink(missing_ok=True)
        body = {"format": FORMAT, "step": offer.step, "source": offer.source}
        _write_whole(self.area.restore, json.dumps(body).encode())

    # ---------------------------------------------------------------------------- the home
    def sound_copies(self, world_size: int, ranks: Sequence[int]) -> list[int]:
        """The steps of the home's copies that are complete, this job's, of this world size, and
        whose parts of `ranks` match their manifest (newest `keep`, newest last)."""
        sound: list[int] = []
        for step in reversed(self.home.copies()):
            if len(sound) >= self.spec.keep:
                break
            try:
                copy_world = self.check(step, ranks)
            except CopyError as exc:
                if step not in self._refused:
                    self._refused.add(step)
                    self.say(f"checkpoint: the copy of step {step} is not resumed: {exc}")
                continue
            if copy_world != world_size:
                if step not in self._refused:
                    self._refused.add(step)
                    self.say(
                        f"checkpoint: the copy of step {step} is of {copy_world} ranks, this "
                        f"job has {world_size}: not resumed"
                    )
                continue
            sound.append(step)
        return sorted(sound)

    def check(self, step: int, ranks: Sequence[int]) -> int:
        """`check_copy` of this job's home."""
        return check_copy(self.home, self.job, step, ranks)

    # ----------------------------------------------------------------------- a stop signal
    def asked(self) -> bool:
        """seams.Saver: a node of this multi-node round proposed a step to save at (a stop
        signal reached its agent, `save`): every node saves it, not only the signalled one."""
        if self.exchange is None or self.node is None or self.node.group_world_size == 1:
            return False
        try:
            return self.exchange.offered(SAVE_TOPIC, limit=32) is not None
        except RendezvousError:
            return False  # the store is gone: the membership check says so

    def save(self, node: NodeAssignment, grace: float, running: Callable[[], bool]) -> int | None:
        """seams.Saver: every rank is asked (`ckpt.save_requested`) to stop after its snapshot
        of one step, agreed with the job's other nodes (the first node asked proposes it, the
        others see it in the round's store, `asked`): `_lead` steps past the newest any rank
        here holds. The agent waits for that snapshot on every rank here, then keeps the newest
        step they all hold."""
        self._stop_copies()
        ranks = self._ranks() if self.node is not None else range(0)
        newest = max((s for rank in ranks for s in self.area.steps(rank)), default=None)
        if newest is None:
            self.say(
                "checkpoint: a stop signal came and no rank holds a snapshot: nothing was saved"
            )
            return None
        target = None
        if grace > 0 and running():
            target = self._agreed(newest + self._lead(ranks))
            body = json.dumps({"format": FORMAT, "step": target}).encode()
            _write_whole(self.area.save_request, body)
            deadline = time.monotonic() + grace
            while target not in self._held(ranks) and running() and not self.hurry():
                if time.monotonic() >= deadline:
                    break
                time.sleep(SAVE_POLL)
        kept = self.persist()
        if target is not None and kept != target:
            self.say(
                f"checkpoint: the snapshot of step {target} did not come within {grace:g} s "
                "(stop_grace)" + (f"; step {kept} was kept instead" if kept is not None else "")
            )
        return kept

    def _lead(self, ranks: Sequence[int]) -> int:
        """Steps past the newest snapshot here to save at: two (the ranks of a job are at most
        a step apart), and on several nodes as many more as a rank trains in SAVE_NOTICE
        seconds (the median gap between its snapshots), so that the other nodes see the request
        before their ranks are past the step."""
        if self.node is None or self.node.group_world_size == 1 or not ranks:
            return 2
        times = []
        for step in self.area.steps(ranks[0]):
            with contextlib.suppress(OSError):  # a snapshot the worker has just replaced
                times.append(self.area.snapshot(ranks[0], step).stat().st_mtime)
        times.sort()
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        if not gaps:
            return 2
        step_time = max(statistics.median(gaps), 1e-6)
        return 2 + min(SAVE_MAX_LEAD, math.ceil(SAVE_NOTICE / step_time))

    def _agreed(self, mine: int) -> int:
        """The step to save at: the first signalled node's proposal (a node asked later is at
        most a step from it: its ranks and the first node's are in the same collectives), the
        same on every node that asks; `mine` where no node's is readable."""
        if self.exchange is None:
            return mine
        try:
            said = self.exchange.first(
                SAVE_TOPIC, str(mine).encode(), limit=32, timeout=SAVE_AGREE_TIMEOUT
            )
        except RendezvousError:
            return mine
        return int(said) if said.isdigit() and len(said) < 19 else mine

    def persist(self) -> int | None:
        """Copy the newest step every local rank holds into the home (and the one before, when
        held: another node may hold only that); the newest step copied, None when none."""
        if self.node is None:
            return None
        self._stop_copies()
        node, ranks = self.node, self._ranks()
        held = self._held(ranks)
        if not held:
            if any(self.area.steps(rank) for rank in ranks):
                self.say("checkpoint: the ranks here hold no step in common: nothing was kept")
            return None
        copied = False
        for step in held[-2:]:
            if self.home.manifest(step, node.group_rank).exists():
                continue  # kept already (a save request, then the agent's end)
            try:
                self._copy(step, node, ranks)
            except OSError as exc:
                self.say(f"checkpoint: step {step} could not be kept in {self.home.root}: {exc}")
                return None
            copied = True
        if not copied:
            return held[-1]  # said when it was kept
        self.say(
            f"checkpoint: step {held[-1]} of rank{'s' if len(ranks) > 1 else ''} "
            f"{_span(ranks)} kept in {self.home.copy_dir(held[-1])}"
        )
        self._prune()
        return held[-1]

    def _copy(self, step: int, node: NodeAssignment, ranks: Sequence[int]) -> None:
        target = self.home.copy_dir(step)
        target.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        parts = {}
        for rank in ranks:
            size, digest = _copy_file(self.area.snapshot(rank, step), self.home.partial(step, rank))
            os.replace(self.home.partial(step, rank), self.home.part(step, rank))
            parts[str(rank)] = {"size": size, "sha256": digest}
        manifest = {
            "format": FORMAT, "job": self.job, "step": step, "world_size": node.world_size,
            "node_rank": node.group_rank, "ranks": parts,
        }  # fmt: skip
        _write_whole(self.home.manifest(step, node.group_rank), json.dumps(manifest).encode())
        _fsync_dir(target)

    def _stop_copies(self) -> None:
        """The job ends here (or saves and stops): no more copies to the next node, whose agent
        may be gone first."""
        if self.ring is not None:
            self.ring.stop_pushing()

    def _prune(self) -> None:
        """Keep the newest `keep` complete copies; remove the copies older than those."""
        complete = [s for s in self.home.copies() if self._complete(s)]
        if len(complete) <= self.spec.keep:
            return
        oldest_kept = complete[-self.spec.keep]
        for step in self.home.copies():
            if step < oldest_kept:
                shutil.rmtree(self.home.copy_dir(step), ignore_errors=True)

    def _complete(self, step: int) -> bool:
        try:
            self.check(step, ())
        except CopyError:
            return False
        return True

    def close(self) -> None:
        """Stop the ring, and remove the area (after `persist`): its memory is the machine's
        again."""
        if self.ring is not None:
            self.ring.close()
        shutil.rmtree(self.area.root, ignore_errors=True)


def check_copy(home: Home, job: str, step: int, ranks: Sequence[int]) -> int:
    """The world size of the copy of `step` in `home`: complete (its manifests name each rank of it
    once), this job's, each part the size its manifest says, and the parts of `ranks`
    their digest.

    Raises:
        CopyError: it is not (the message says why).
    """
    parts: dict[int, dict[str, Any]] = {}
    world: int | None = None
    manifests = home.manifests(step)
    if not manifests:
        raise CopyError("no manifest: it was not completed")
    for path in manifests:
        manifest = _read_manifest(path)
        if manifest["job"] != job:
            raise CopyError(f"{path.name} is of another job ({manifest['job']!r})")
        if manifest["step"] != step or (world is not None and manifest["world_size"] != world):
            raise CopyError(f"{path.name} does not match the copy")
        world = manifest["world_size"]
        for rank, part in manifest["ranks"].items():
            if rank in parts:
                raise CopyError(f"rank {rank} is in two manifests")
            parts[rank] = part
    assert world is not None
    missing = sorted(set(range(world)) - set(parts))
    if missing:
        raise CopyError(f"no part of rank {missing[0]} ({len(missing)} missing)")
    for rank, part in parts.items():
        path = home.part(step, rank)
        try:
            size = path.stat().st_size
        except OSError:
            raise CopyError(f"{path.name} is missing") from None
        if size != part["size"]:
            raise CopyError(f"{path.name} is {size} bytes, its manifest says {part['size']}")
        if rank in ranks and _sha256(path) != part["sha256"]:
            raise CopyError(f"{path.name} does not match its digest")
    return world


@dataclass(frozen=True, slots=True)
class Copy:
    """The newest complete copy in a job's home."""

    step: int
    world_size: int
    size: int  # bytes, every rank's part


def newest_copy(spec: CheckpointSpec) -> Copy | None:
    """The newest complete copy in the job's home (sizes checked; the digests are checked when
    a launch offers it), or None."""
    home = Home(Path(spec.home))
    for step in reversed(home.copies()):
        with contextlib.suppress(CopyError, OSError):
            world = check_copy(home, spec.job, step, ())
            size = sum(home.part(step, rank).stat().st_size for rank in range(world))
            return Copy(step=step, world_size=world, size=size)
    return None


@dataclass(frozen=True, slots=True)
class Said:
    """What a node tells the others before an attempt: the snapshots it holds, its ranks, the
    home copies it found sound, where its buddy server listens."""

    holds: dict[int, frozenset[int]]  # rank -> steps, its own and its copies of another node's
    ranks: range
    home: frozenset[int]
    at: Endpoint | None

    def encode(self) -> bytes:
        return json.dumps({
            "holds": {str(r): sorted(s) for r, s in sorted(self.holds.items())},
            "ranks": [self.ranks.start, len(self.ranks)], "home": sorted(self.home),
            "at": None if self.at is None else [self.at.host, self.at.port],
        }).encode()  # fmt: skip

    @classmethod
    def decode(cls, raw: bytes | None, world_size: int) -> Said | None:
        """A node's word, or None: it said nothing, or nothing well-formed (untrusted input:
        every count bounded by the world)."""
        try:
            data = json.loads(raw or b"")
            holds = {
                int(r): frozenset(_steps(s))
                for r, s in data["holds"].items()
                if r.isdigit() and len(r) < 10 and int(r) < world_size
            }
            start, count = data["ranks"]
            at = data["at"]
            if at is not None:
                host, port = at
                if not (isinstance(host, str) and 0 < len(host) < 256 and _is_count(port)):
                    return None
                at = Endpoint(host=host, port=port)
            if not (_is_count(start) and _is_count(count) and start + count <= world_size):
                return None
            return cls(holds=holds, ranks=range(start, start + count),
                       home=frozenset(_steps(data["home"])), at=at)  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def in_memory(said: Sequence[Said | None], required: Sequence[int]) -> int | None:
    """The newest step of which some node holds a snapshot of every rank in `required`; None
    when there is none, or when a node said nothing (what it holds is unknown)."""
    if not said or any(s is None for s in said):
        return None
    common: set[int] | None = None
    for rank in required:
        held = set().union(*(s.holds.get(rank, ()) for s in said if s is not None))
        common = held if common is None else common & held
    return max(common) if common else None


def needs_other(node: Said, step: int) -> bool:
    """Whether `node` holds no snapshot of `step` of one of its ranks (it takes it from another
    node)."""
    return any(step not in node.holds.get(rank, ()) for rank in node.ranks)


def _from_home(said: Sequence[Said | None], at: Home) -> Offer:
    """The newest home copy every node found sound; a node that said nothing found none."""
    copies: set[int] | None = None
    for node in said:
        found = node.home if node is not None else frozenset()
        copies = set(found) if copies is None else copies & found
    if copies:
        step = max(copies)
        return Offer(step=step, source=str(at.copy_dir(step)))
    return Offer(step=None)


def _steps(value: object) -> set[int]:
    if not isinstance(value, list) or len(value) > 64:
        raise TypeError("not a short list")
    return {v for v in value if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as src:
            raw = src.read(MANIFEST_LIMIT + 1)
        if len(raw) > MANIFEST_LIMIT:
            raise CopyError(f"{path.name} is larger than {MANIFEST_LIMIT} bytes")
        data = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise CopyError(f"{path.name} cannot be read ({exc})") from None
    ok = (
        isinstance(data, dict)
        and data.get("format") == FORMAT
        and isinstance(data.get("job"), str)
        and _is_count(data.get("step"))
        and _is_count(data.get("world_size"))
        and isinstance(data.get("ranks"), dict)
    )
    if not ok:
        raise CopyError(f"{path.name} is not a manifest of this format")
    ranks: dict[int, dict[str, Any]] = {}
    for key, part in data["ranks"].items():
        good = (
            key.isdigit()
            and int(key) < data["world_size"]
            and isinstance(part, dict)
            and _is_count(part.get("size"))
            and isinstance(part.get("sha256"), str)
            and len(part["sha256"]) == 64
        )
        if not good:
            raise CopyError(f"{path.name}: the part of rank {key[:20]!r} is not one")
        ranks[int(key)] = part
    data["ranks"] = ranks
    return dict(data)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _copy_file(src_path: Path, dst_path: Path) -> tuple[int, str]:
    """Copy, digesting as it goes, synced to disk; the size and SHA-256 of what was written."""
    digest, size = hashlib.sha256(), 0
    fd = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        with open(src_path, "rb") as src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    except BaseException:
        dst_path.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


def _write_whole(path: Path, data: bytes) -> None:
    """A file written whole or not at all (beside, then renamed)."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _span(ranks: Sequence[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
