"""A worker's collectives, as its bootstrap reads them from torch.distributed in its own process.

Loaded by the bootstrap by path (the standard library only, like it): the count of collectives
issued at each look (torch's own sequence numbers), every group's last collective when the agent
asks after a hang, with torch's Flight Recorder dump beside it for `torchfrtrace`, and the times
the rank arrived at its recent collectives (`Arrivals`, for the straggler score).
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing is not imported at run time: the bootstrap starts every worker
if TYPE_CHECKING:
    from typing import Any

MAX_GROUPS = 64  # process groups read at one look
FR_FILE = "flight_recorder_rank_"  # + the rank: torch's own dump, as torchfrtrace reads it


def collectives() -> int | None:
    """The collectives this process's groups have issued, by torch's sequence numbers; None
    before torch.distributed is imported and has a group. Read without importing anything."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return None
    try:
        groups = list(c10d._world.pg_map)[:MAX_GROUPS]
        if not groups:
            return None
        return sum(int(pg._get_sequence_number_for_group()) for pg in groups)
    except Exception:  # torch changed, a group torn down meanwhile: no count this time
        return None


def write_collectives(path: str) -> None:
    """`collective_state()` as JSON in `path` and, where the flight recorder has entries, its
    own dump (a pickle) beside it for torchfrtrace; each file written whole; the request gone."""
    import json

    state, dump = collective_state()
    if dump:
        name = os.path.join(os.path.dirname(path), FR_FILE + os.environ.get("RANK", "0"))
        write_whole(name, dump)
    write_whole(path, json.dumps(state, default=repr).encode())
    try:  # noqa: SIM105 (contextlib is one more import in every worker's start)
        os.unlink(path + ".request")
    except OSError:
        pass


def collective_state() -> tuple[dict[str, Any], bytes]:
    """This process's collectives, per process group: the last issued (torch's sequence number)
    and, from the flight recorder, the last completed, the op and its sizes; and the recorder's
    own dump (b"" without one). `missing` says what is not known and why."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return {"missing": "torch.distributed is not imported"}, b""
    try:
        world = c10d._world
        groups = {
            str(world.pg_names.get(pg, "?")): {"issued": int(pg._get_sequence_number_for_group())}
            for pg in list(world.pg_map)[:MAX_GROUPS]
        }
    except Exception as exc:
        return {"missing": f"torch.distributed's groups cannot be read ({exc!r:.80})"}, b""
    if not groups:
        return {"missing": "torch.distributed has no process group"}, b""
    import json

    try:
        recorder = sys.modules["torch._C._distributed_c10d"]
        dump = recorder._dump_fr_trace(True, False, False)  # no C++ stacks: seconds
        fr = json.loads(recorder._dump_fr_trace_json(True, False))
    except Exception as exc:
        return {"groups": groups, "missing": f"the flight recorder cannot dump ({exc!r:.80})"}, b""
    entries = fr.get("entries") or []
    for entry in entries:
        group = groups.get(str((entry.get("process_group") or ["?"])[0]))
        if group is not None and not entry.get("is_p2p"):
            group.update(
                seq=entry.get("collective_seq_id"), op=entry.get("profiling_name"),
                sizes=entry.get("input_sizes"), done=entry.get("retired"),
            )  # fmt: skip
    for pg_id, status in (fr.get("pg_status") or {}).items():
        group = groups.get(str(pg_id))
        if group is not None:
            group["completed"] = status.get("last_completed_collective")
    on = bool(entries or fr.get("pg_config"))  # an empty config: the recorder is off
    if on:
        dump = _for_torchfrtrace(dump, world)
    missing = "" if on else "the flight recorder is off (TORCH_FR_BUFFER_SIZE=0)"
    return {"groups": groups, "missing": missing}, dump if on else b""


def _plain(dump: bytes) -> Any:
    """torch's dump (a pickle torch made in this process) read as the plain data it is: no class
    is admitted. Raises on anything else."""
    import io
    import pickle

    class _PlainData(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    return _PlainData(io.BytesIO(dump)).load()


def _for_torchfrtrace(dump: bytes, world: Any) -> bytes:
    """torch's own dump as torchfrtrace reads it: with `entries` even before the first
    collective, and each group's members in `pg_config`, which gloo's recorder leaves empty."""
    import pickle

    try:
        data = _plain(dump)
    except Exception:  # not the plain data it was: torch's own dump, as it is
        return dump
    data.setdefault("entries", [])
    data["pg_config"] = {
        str(name): {"name": str(name), "desc": str(getattr(pg, "group_desc", "")),
                    "ranks": str(sorted(world.pg_group_ranks.get(pg, {})))}
        for pg, name in list(world.pg_names.items())[:MAX_GROUPS]
    }  # fmt: skip
    return pickle.dumps(data)


class Arrivals:
    """The times this rank arrived at its recent collectives (the Flight Recorder's
    `time_created_ns`: when the call was made, before any wait for the other ranks), kept in
    `path` as JSON lines `[group, sequence number, op, time]`, the last KEEP, written whole.

    The recorder is read when the rank issued collectives since the last read, and no more
    often than COST_SHARE of the time its reads take (a dump of 2,000 entries costs tens of ms
    on a loaded core), and EVERY seconds at most: the arrivals of a straggler's steps are all in
    the recorder's ring of recent entries when it is read."""

    KEEP = 1000  # about 50 KB: what a fast job issues between two throttled reads
    EVERY = 1.0  # seconds between reads at least
    COST_SHARE = 0.005  # of the time: a read that takes 10 ms waits 2 s before the next

    def __init__(self, path: str) -> None:
        self.path, self.seen, self.next_read = path, -1, 0.0
        self.kept: list[list[Any]] = []

    def look(self, now: float) -> None:
        if now < self.next_read:
            return
        recorder = sys.modules.get("torch._C._distributed_c10d")
        if recorder is None:
            return
        started = time.perf_counter()
        try:
            entries = _plain(recorder._dump_fr_trace(True, False, False)).get("entries") or []
        except Exception:  # no recorder (off, torch changed): none this time
            entries = []
        newest = self.seen
        for entry in entries:
            record = entry.get("record_id", -1)
            if not isinstance(record, int) or record <= self.seen or entry.get("is_p2p"):
                continue
            newest = max(newest, record)
            group = (entry.get("process_group") or ["?"])[0]
            created = entry.get("time_created_ns")
            if isinstance(created, int) and created > 0:
                seq = entry.get("collective_seq_id")
                self.kept.append([str(group), seq, str(entry.get("profiling_name")), created / 1e9])
        cost = time.perf_counter() - started
        self.next_read = now + max(self.EVERY, cost / self.COST_SHARE)
        if newest != self.seen:
            self.seen, self.kept = newest, self.kept[-self.KEEP :]
            import json

            write_whole(self.path, "\n".join(json.dumps(a) for a in self.kept).encode())


def write_whole(path: str, data: bytes) -> None:
    """`data` in `path`, whole or not at all: a reader never sees a half-written file."""
    part = f"{path}.{os.getpid()}.part"
    try:
        with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        os.replace(part, path)
    except OSError:
        try:  # noqa: SIM105 (contextlib is one more import in every worker's start)
            os.unlink(part)
        except OSError:
            pass
        raise
