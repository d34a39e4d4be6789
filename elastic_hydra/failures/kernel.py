"""What the kernel log tells of an attempt: the OOM killer's kills and GPU Xid errors.

Read from `/dev/kmsg` (root, CAP_SYSLOG, or `kernel.dmesg_restrict=0`), the records since a
monotonic time: the kernel stamps each with the same clock as `time.monotonic()`. Where it cannot
be read (a container without the capability), `readable` is False and the classifier says it
cannot tell an OOM kill from another SIGKILL. Nothing here raises.
"""

from __future__ import annotations

import errno
import os
import re

from elastic_hydra.failures.classify import KernelSays

KMSG = "/dev/kmsg"
_MAX_RECORDS = 50_000  # a ring buffer of a few MiB at most; a bound all the same
_MARGIN = 1.0  # seconds before the attempt's start a record may carry (clock skew)
# The OOM killer's lines: `Out of memory: Killed process 123 (python) ...`, the memory cgroup's
# `Memory cgroup out of memory: Killed process 123 ...`, and `oom-kill:...,pid=123,...`.
_OOM = re.compile(r"Killed process (\d+)|oom-kill:.*\bpid=(\d+)")
_XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")


def since(mono: float, path: str = KMSG) -> KernelSays:
    """The kernel log's OOM kills and Xids stamped at `mono` (a `time.monotonic()`) or later."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return KernelSays()
    try:
        return parse(_records(fd), mono - _MARGIN)
    finally:
        os.close(fd)


def _records(fd: int) -> list[bytes]:
    """Every record in the ring buffer now, oldest first (one `read` returns one record)."""
    out: list[bytes] = []
    while len(out) < _MAX_RECORDS:
        try:
            out.append(os.read(fd, 8192))
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # overwritten while read: go on from the next one
                continue
            break  # EAGAIN: the end; anything else: what was read is what there is
    return out


def parse(records: list[bytes], after: float) -> KernelSays:
    """The OOM kills (by pid) and Xids (by code) of `records` stamped at `after` or later.

    A record is `PRI,SEQ,USEC,FLAGS;TEXT` and continuation lines (see the kernel's
    Documentation/ABI/testing/dev-kmsg)."""
    kills: list[tuple[int, str]] = []
    xids: list[tuple[int, str]] = []
    for record in records:
        head, _, rest = record.decode("utf-8", "replace").partition(";")
        fields = head.split(",")
        if len(fields) < 3 or not fields[2].isdigit() or int(fields[2]) / 1e6 < after:
            continue
        text = rest.split("\n", 1)[0].strip()[:300]
        if m := _OOM.search(text):
            kills.append((int(m.group(1) or m.group(2)), text))
        elif m := _XID.search(text):
            xids.append((int(m.group(1)), text))
    return KernelSays(readable=True, oom_kills=tuple(kills), xids=tuple(xids))
