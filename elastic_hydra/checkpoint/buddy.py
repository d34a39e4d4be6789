"""A copy of each node's snapshots on one other node: the buddy ring, over TCP between agents.

In a multi-node job each agent serves on the job's address (`Server`) and pushes the newest
snapshot of each of its ranks to the next node of the round (`Pusher`, a thread of its own):
node k's copies live in node k+1's snapshot area, under `buddy/`. A node that lacks a rank's
snapshot when an attempt begins (a replacement node; a survivor that took over a lost node's
rank) takes it from the node that holds it before its workers start (`fetch`): no read of
shared storage.

One request per connection:

    server -> client  MAGIC + a random nonce
    client -> server  one JSON line (at most LINE_LIMIT bytes): {"h": {op, job, rank, step,
                      size (put) or cnonce (get)}, "mac": HMAC(secret, nonce + h)}
    put:  server -> client  b"go\\n" (send it), b"have\\n" (held already), b"busy\\n" (between
                            rounds: later) or b"no <why>\\n"
          client -> server  `size` bytes, their SHA-256, HMAC(secret, nonce + that digest)
          server -> client  b"ok\\n" or b"no <why>\\n"
    get:  server -> client  one JSON line {"size": n} or {"error": why}, the bytes, their
                            SHA-256, HMAC(secret, cnonce + that digest)

Everything read from a socket is untrusted input: lines are capped, a snapshot's size is bounded
(`checkpoint.max_memory`), a push is taken only for the ranks of the ring's previous node (the
newest two of each are kept), bytes land beside their place and are renamed only when their
digest (and, with the job's secret, their MAC) checks; the worker reads a snapshot through the
codec, which runs nothing. With the job's secret (ELASTIC_HYDRA_RDZV_SECRET) a peer without it
can neither push nor fetch; without one, whoever reaches the port can, as whoever reaches the
rendezvous store can read and write what the nodes share there.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import json
import os
import socket
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, BinaryIO

from elastic_hydra.checkpoint.layout import Area
from elastic_hydra.plan import Endpoint
from elastic_hydra.rundir import PRIVATE_DIR, PRIVATE_FILE

MAGIC = b"EHB1"
NONCE = 16
DIGEST = 32  # SHA-256 and HMAC-SHA256
LINE_LIMIT = 64 << 10  # a push carries what it knows of every node: room for thousands
IO_TIMEOUT = 30.0  # seconds a peer may stall a transfer
MAX_CLIENTS = 8  # transfers served at once; more connections are closed
KEEP = 2  # copies of a rank's newest steps kept (as the worker keeps its own)
PUSH_POLL = 0.1  # seconds between looks for a new snapshot to push
RETRY = 2.0  # seconds before a push that failed is tried again
_CHUNK = 1 << 20
_parts = itertools.count()


class BuddyError(Exception):
    """A transfer refused or broken (the message says why)."""


class BuddyBusyError(BuddyError):
    """The peer takes no copy now: its nodes agree on what the next attempt resumes from."""


def mac(secret: bytes | None, *parts: bytes) -> bytes:
    """HMAC-SHA256 of `parts` with the job's secret; zeros without one."""
    if secret is None:
        return bytes(DIGEST)
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def _canonical(header: dict[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode()


def _read_line(src: BinaryIO) -> bytes:
    raw = src.readline(LINE_LIMIT + 1)
    if not raw.endswith(b"\n"):
        raise BuddyError("the peer's line is cut or longer than 64 KiB")
    return raw[:-1]


def _read_exact(src: BinaryIO, size: int) -> bytes:
    data = src.read(size)
    if len(data) != size:
        raise BuddyError("the peer hung up in the middle of a transfer")
    return data


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _stream(src: BinaryIO, size: int, dst: BinaryIO) -> bytes:
    """Copy `size` bytes from `src` to `dst`; their SHA-256."""
    digest, left = hashlib.sha256(), size
    while left:
        chunk = src.read(min(_CHUNK, left))
        if not chunk:
            raise BuddyError("the peer hung up in the middle of a transfer")
        digest.update(chunk)
        dst.write(chunk)
        left -= len(chunk)
    return digest.digest()


def _land(part: Path, final: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a file beside its place and rename it there; nothing is left when `write` raises."""
    part.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(part, final)
    finally:
        part.unlink(missing_ok=True)


def _part_of(area: Area, rank: int, step: int) -> Path:
    return area.partial(rank, step, os.getpid() * 1000 + next(_parts) % 1000)


# ------------------------------------------------------------------------------- the server
class Server:
    """Takes the ring's previous node's snapshots into `area.buddy`, and gives any snapshot the
    node holds (its own or a copy) to a node that lacks it.

    Args:
        area: this agent's snapshot area.
        job: the job's name (checkpoint spec's `job`): requests of another job are refused.
        host: the job's address on this node (never every interface).
        secret: the job's secret, or None.
        limit: bytes one snapshot may take (0: no limit).
    """

    def __init__(
        self,
        area: Area,
        *,
        job: str,
        host: str,
        secret: bytes | None,
        limit: int,
        on_take: Callable[[dict[str, Any]], None] = lambda header: None,
    ) -> None:
        self.area, self.job, self.secret, self.limit = area, job, secret, limit
        self.on_take = on_take  # after each copy taken, with its request
        self.accepting: frozenset[int] = frozenset()  # the ranks a push may bring
        self.paused = False  # between rounds: a push is answered "busy"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, 0), family=family)
        self._sock.settimeout(1.0)  # close() is seen within this where shutdown does not wake
        self.address = Endpoint(host=host, port=self._sock.getsockname()[1])
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="buddy-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
        self._thread.join(timeout=5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rb") as src:
                conn.settimeout(IO_TIMEOUT)
                nonce = os.urandom(NONCE)
                conn.sendall(MAGIC + nonce)
                try:
                    header = self._request(src, nonce)
                except BuddyError as exc:
                    conn.sendall(f"no {exc}\n".encode())
                    return
                if header["op"] == "put":
                    self._take(conn, src, header, nonce)
                else:
                    self._give(conn, header)
        except (OSError, BuddyError, ValueError):
            pass  # the peer is told what it can be told; a broken transfer leaves nothing
        finally:
            self._slots.release()

    def _request(self, src: BinaryIO, nonce: bytes) -> dict[str, Any]:
        try:
            data = json.loads(_read_line(src))
            header, signature = data["h"], bytes.fromhex(data["mac"])
            ok = (
                isinstance(header, dict)
                and header.get("op") in ("put", "get")
                and _is_count(header.get("rank"))
                and _is_count(header.get("step"))
                and (header["op"] == "get" or _is_count(header.get("size")))
                and (header["op"] == "put" or isinstance(header.get("cnonce"), str))
            )
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise BuddyError("not a request")
        if not hmac.compare_digest(signature, mac(self.secret, nonce, _canonical(header))):
            raise BuddyError("not signed with the job's secret")
        if header.get("job") != self.job:
            raise BuddyError("of another job")
        return dict(header)

    def _take(
        self, conn: socket.socket, src: BinaryIO, header: dict[str, Any], nonce: bytes
    ) -> None:
        rank, step, size = header["rank"], header["step"], header["size"]
        buddy = self.area.buddy
        if self.paused:
            conn.sendall(b"busy\n")
            return
        if rank not in self.accepting:
            conn.sendall(f"no rank {rank} is not the previous node's\n".encode())
            return
        if self.limit and size > self.limit:
            conn.sendall(f"no {size} bytes, over checkpoint.max_memory\n".encode())
            return
        held = buddy.steps(rank)
        if step in held or (len(held) >= KEEP and step < held[0]):
            conn.sendall(b"have\n")  # held, or older than what is kept
            return
        conn.sendall(b"go\n")

        def write(out: BinaryIO) -> None:
            digest = _stream(src, size, out)
            trailer = _read_exact(src, 2 * DIGEST)
            if not hmac.compare_digest(trailer[:DIGEST], digest):
                raise BuddyError("the bytes do not match their digest")
            if not hmac.compare_digest(trailer[DIGEST:], mac(self.secret, nonce, digest)):
                raise BuddyError("the digest is not signed with the job's secret")

        try:
            _land(_part_of(buddy, rank, step), buddy.snapshot(rank, step), write)
        except (BuddyError, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            conn.sendall(f"no {why}\n".encode())
            return
        for old in buddy.steps(rank)[:-KEEP]:
            buddy.snapshot(rank, old).unlink(missing_ok=True)
        self.on_take(header)
        conn.sendall(b"ok\n")

    def _give(self, conn: socket.socket, header: dict[str, Any]) -> None:
        rank, step, cnonce = header["rank"], header["step"], header["cnonce"].encode()
        for area in (self.area, self.area.buddy):
            try:
                src = open(area.snapshot(rank, step), "rb")  # noqa: SIM115 (closed below)
            except OSError:
                continue
            with src:
                size = os.fstat(src.fileno()).st_size
                conn.sendall(_canonical({"size": size}) + b"\n")
                with conn.makefile("wb") as out:
                    digest = _stream(src, size, out)
                    out.write(digest + mac(self.secret, cnonce, digest))
            return
        conn.sendall(_canonical({"error": f"no snapshot of rank {rank} at step {step}"}) + b"\n")


# ------------------------------------------------------------------------------- the client
def _connect(
    at: Endpoint, header: dict[str, Any], secret: bytes | None, timeout: float
) -> tuple[socket.socket, BinaryIO, bytes]:
    """A connection that sent its request; its reader, and the server's nonce."""
    conn = socket.create_connection((at.host, at.port), timeout=timeout)
    try:
        src = conn.makefile("rb")
        hello = _read_exact(src, len(MAGIC) + NONCE)
        if not hello.startswith(MAGIC):
            raise BuddyError("not an elastic-hydra agent")
        nonce = hello[len(MAGIC) :]
        signature = mac(secret, nonce, _canonical(header)).hex()
        conn.sendall(json.dumps({"h": header, "mac": signature}).encode() + b"\n")
        return conn, src, nonce
    except BaseException:
        conn.close()
        raise


def push(
    at: Endpoint,
    path: Path,
    *,
    job: str,
    rank: int,
    step: int,
    secret: bytes | None,
    reach: dict[int, int] | None = None,
    timeout: float = IO_TIMEOUT,
) -> bool:
    """Send the snapshot at `path` to the agent at `at`, with what the sender knows of how far
    each node's copies reach; False when the peer held it already.

    Raises:
        BuddyError: the peer refused it (the message says why) or the transfer broke.
        OSError: `path` is gone (the worker replaced it), or the network failed.
    """
    with open(path, "rb") as snap:  # held open: the worker may unlink it meanwhile
        size = os.fstat(snap.fileno()).st_size
        header = {"op": "put", "job": job, "rank": rank, "step": step, "size": size,
                  "reach": {str(k): v for k, v in (reach or {}).items()}}  # fmt: skip
        conn, src, nonce = _connect(at, header, secret, timeout)
        with conn, src:
            answer = _read_line(src)
            if answer == b"have":
                return False
            if answer == b"busy":
                raise BuddyBusyError("busy")
            if answer != b"go":
                raise BuddyError(_why(answer))
            with conn.makefile("wb") as out:
                digest = _stream(snap, size, out)
                out.write(digest + mac(secret, nonce, digest))
            answer = _read_line(src)
            if answer != b"ok":
                raise BuddyError(_why(answer))
    return True


def fetch(
    at: Endpoint,
    area: Area,
    *,
    job: str,
    rank: int,
    step: int,
    secret: bytes | None,
    limit: int,
    timeout: float = IO_TIMEOUT,
) -> int:
    """Take rank's snapshot of `step` from the agent at `at` into `area` (complete or absent);
    its size.

    Raises:
        BuddyError: the peer does not hold it, or what came is not it (the message says why).
        OSError: the network failed, or the area has no room.
    """
    cnonce = os.urandom(NONCE).hex()
    header = {"op": "get", "job": job, "rank": rank, "step": step, "cnonce": cnonce}
    conn, src, _ = _connect(at, header, secret, timeout)
    with conn, src:
        line = _read_line(src)
        try:
            answer = json.loads(line)
            size = answer["size"] if isinstance(answer, dict) and "size" in answer else None
        except ValueError:
            raise BuddyError(_why(line)) from None
        if not _is_count(size):
            raise BuddyError(str(answer.get("error", "not a snapshot"))[:200])
        assert isinstance(size, int)
        if limit and size > limit:
            raise BuddyError(f"{size} bytes, over checkpoint.max_memory")

        def write(out: BinaryIO) -> None:
            digest = _stream(src, size, out)
            trailer = _read_exact(src, 2 * DIGEST)
            if not hmac.compare_digest(trailer[:DIGEST], digest):
                raise BuddyError("the bytes do not match their digest")
            if not hmac.compare_digest(trailer[DIGEST:], mac(secret, cnonce.encode(), digest)):
                raise BuddyError("the digest is not signed with the job's secret")

        _land(_part_of(area, rank, step), area.snapshot(rank, step), write)
    return size


def _why(answer: bytes) -> str:
    text = answer.decode(errors="replace")[:200]
    return text.removeprefix("no ") if text.startswith("no ") else f"answered {text!r}"


# ------------------------------------------------------------------------------- the pusher
class Pusher:
    """A thread that pushes the newest snapshot of each of this node's ranks to the next node of
    the ring as the workers take them; a step taken while the link is busy is skipped for the
    newer one. A push that fails is said once per node and tried again every RETRY seconds."""

    def __init__(
        self,
        area: Area,
        *,
        job: str,
        secret: bytes | None,
        say: Callable[[str], None],
        reach: Callable[[], dict[int, int]] = dict,
    ) -> None:
        self.area, self.job, self.secret, self.say, self.reach = area, job, secret, say, reach
        self._lock = threading.Lock()
        self._target: Endpoint | None = None
        self._ranks: tuple[int, ...] = ()
        self._aimed = 0  # how many times aim() was called: a push of an older aim is not noted
        self._sent: dict[int, int] = {}  # rank -> the step the target holds
        self._told: set[Endpoint] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="buddy-pusher", daemon=True)
        self._thread.start()

    def aim(self, target: Endpoint | None, ranks: Collection[int]) -> None:
        """Push `ranks`' snapshots to `target` from now on (None: to no one)."""
        with self._lock:
            if target != self._target:
                self._sent = {}
            self._target, self._ranks = target, tuple(ranks)
            self._aimed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)  # a push under way ends with its socket's timeout

    def _run(self) -> None:
        while not self._stop.wait(PUSH_POLL):
            with self._lock:
                target, ranks, aimed, sent = self._target, self._ranks, self._aimed, self._sent
            if target is not None:
                self._push_newest(target, ranks, aimed, dict(sent))

    def _push_newest(
        self, target: Endpoint, ranks: tuple[int, ...], aimed: int, sent: dict[int, int]
    ) -> None:
        for rank in ranks:
            steps = self.area.steps(rank)
            if not steps or sent.get(rank) == steps[-1]:
                continue
            step = steps[-1]
            try:
                push(target, self.area.snapshot(rank, step), job=self.job, rank=rank, step=step,
                     secret=self.secret, reach=self.reach())  # fmt: skip
            except FileNotFoundError:
                continue  # the worker replaced it with a newer one meanwhile
            except BuddyBusyError:
                self._stop.wait(PUSH_POLL)  # its round begins: aimed again soon
                return
            except (OSError, BuddyError) as exc:
                if target not in self._told:
                    self._told.add(target)
                    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                    self.say(
                        f"checkpoint: the copy on the next node ({target}) failed: {why}; "
                        f"trying again every {RETRY:g} s"
                    )
                self._stop.wait(RETRY)
                return
            with self._lock:
                if self._aimed == aimed:
                    self._sent[rank] = step


class Ring:
    """This node's place in the buddy ring: the server that holds the previous node's copies and
    gives snapshots to the nodes that lack them, the pusher that feeds the next node, and the
    floor: the oldest step any other node's copies reach, which this node's workers keep their
    snapshots from (api.KEEP_WHILE_COPIES_LAG at most), so that every rank still holds the step
    a lost node's copy is of.

    How far node L's copies reach (the oldest of its ranks' newest copies on its next node) is
    known first to that next node, which tells it with each push, with everything it heard; so
    after one turn of the ring each node knows every node's, a little late (late is safe: the
    floor is then lower, and more is kept)."""

    def __init__(
        self,
        area: Area,
        *,
        job: str,
        host: str,
        secret: bytes | None,
        limit: int,
        say: Callable[[str], None],
    ) -> None:
        self.area, self.job, self.secret, self.limit = area, job, secret, limit
        self._lock = threading.Lock()
        self._me, self._before = -1, -1  # node ranks in this round: this node, the previous one
        self._reach: dict[int, int] = {}  # node rank -> the step its copies reach
        self._floor: int | None = None
        self.server = Server(area, job=job, host=host, secret=secret, limit=limit,
                             on_take=self._taken)  # fmt: skip
        self.pusher = Pusher(area, job=job, secret=secret, say=say, reach=self.reach)

    @property
    def address(self) -> Endpoint:
        return self.server.address

    def reach(self) -> dict[int, int]:
        with self._lock:
            return dict(self._reach)

    def pause(self) -> None:
        """Take no push while the nodes agree on what the next attempt resumes from."""
        self.server.paused = True

    def aim(
        self,
        after: Endpoint | None,
        ranks: Collection[int],
        before: Collection[int],
        *,
        me: int = -1,
        before_node: int = -1,
    ) -> None:
        """Push `ranks` to the node at `after`; take the pushes of the ranks `before` (those of
        node `before_node`). A new round: what was known of the copies' reach is forgotten."""
        with self._lock:
            self._me, self._before, self._reach, self._floor = me, before_node, {}, None
            self.area.floor.unlink(missing_ok=True)
        self.server.accepting = frozenset(before)
        self.server.paused = False
        self.pusher.aim(after, ranks)

    def stop_pushing(self) -> None:
        """No more copies to the next node: the job saves or ends here."""
        self.pusher.aim(None, ())

    def _taken(self, header: dict[str, Any]) -> None:
        """After a copy of the previous node's is taken: how far its copies reach now, what its
        push said of the others', and the floor that follows."""
        with self._lock:
            newest = [self.area.buddy.steps(r) for r in sorted(self.server.accepting)]
            if newest and all(newest) and self._before >= 0:
                reached = min(steps[-1] for steps in newest)
                self._reach[self._before] = max(self._reach.get(self._before, -1), reached)
            told = header.get("reach")
            if isinstance(told, dict) and len(told) <= 4096:
                for key, step in told.items():
                    if isinstance(key, str) and key.isdigit() and len(key) < 10 and _is_count(step):
                        node = int(key)
                        if node != self._me:
                            self._reach[node] = max(self._reach.get(node, -1), step)
            others = [step for node, step in self._reach.items() if node != self._me]
            floor = min(others) if others else None
            if floor is not None and floor != self._floor:
                self._floor = floor
                body = _canonical({"step": floor})
                _land(self.area.root / f".floor.{os.getpid()}.part", self.area.floor,
                      lambda out: out.write(body))  # fmt: skip

    def fetch(self, at: Endpoint, rank: int, step: int) -> int:
        """`fetch` of rank's snapshot of `step` from `at` into this node's area; its size."""
        return fetch(at, self.area, job=self.job, rank=rank, step=step, secret=self.secret,
                     limit=self.limit)  # fmt: skip

    def close(self) -> None:
        self.pusher.close()
        self.server.close()
