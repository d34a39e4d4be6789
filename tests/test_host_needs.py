"""The session's header names what the host lacks; this host (CI's) lacks nothing."""

from __future__ import annotations

import os
from pathlib import Path

from tests.host_needs import missing


def test_this_host_meets_every_need_of_the_tests() -> None:
    assert missing() == []


def test_each_missing_need_is_one_line_naming_it(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    hosts.chmod(0o444)
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    lines = missing(cpu=tmp_path / "cpu", mounts=mounts, hosts=hosts, memory=tmp_path / "memory",
                    kmsg=tmp_path / "kmsg", euid=1000)  # fmt: skip
    assert lines[0].startswith("not root")
    assert lines[1].startswith(f"no cgroup v1 cpu controller at {tmp_path / 'cpu'}")
    assert lines[2].startswith(f"no cgroup v2 mount in {mounts}")
    assert lines[3].startswith(f"no cgroup v1 memory controller at {tmp_path / 'memory'}")
    assert lines[4].startswith(f"{tmp_path / 'kmsg'} is not readable and writable")
    # Root may write a 0444 file: only a non-root run is refused the write.
    assert lines[5:] == (
        [] if os.geteuid() == 0 else [f"{hosts} is not writable (the Slurm cluster and pod names)"]
    )
