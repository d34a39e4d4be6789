"""What the tests need of the host, checked once at the session's start (`pytest_report_header`)
and named one line per missing item: root, cgroup v1's `cpu` controller and a cgroup v2 mount,
a memory cgroup (v1's `memory` controller), a readable kernel log (`/dev/kmsg`), `tc` with htb,
network namespaces, `mount`, and a writable /etc/hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
KMSG = Path("/dev/kmsg")
MOUNTS = Path("/proc/self/mounts")
HOSTS = Path("/etc/hosts")


def missing(
    *,
    cpu: Path = CGROUP_V1_CPU,
    mounts: Path = MOUNTS,
    hosts: Path = HOSTS,
    memory: Path = CGROUP_V1_MEMORY,
    kmsg: Path = KMSG,
    euid: int | None = None,
) -> list[str]:
    """One line per need this host does not meet (empty: every test can run here)."""
    lines = []
    if (os.geteuid() if euid is None else euid) != 0:
        lines.append("not root: the tests make cgroups, network namespaces and mounts")
    if not (cpu / "cpu.cfs_quota_us").exists():
        lines.append(f"no cgroup v1 cpu controller at {cpu} (the throttled-node preflight tests)")
    try:
        kinds = {line.split()[2] for line in mounts.read_text().splitlines() if line.count(" ") > 2}
    except OSError:
        kinds = set()
    if "cgroup2" not in kinds:
        lines.append(f"no cgroup v2 mount in {mounts} (containment's cgroup=on tests)")
    if not (memory / "memory.limit_in_bytes").exists():
        lines.append(f"no cgroup v1 memory controller at {memory} (the host OOM tests)")
    if not os.access(kmsg, os.R_OK | os.W_OK):
        lines.append(f"{kmsg} is not readable and writable (the kernel log of failure classes)")
    if shutil.which("tc") is None or not _runs(["tc", "qdisc", "add", "htb", "help"], "htb"):
        lines.append("no `tc` with htb (iproute2: the slow-link preflight tests)")
    if shutil.which("ip") is None or not _runs(["ip", "netns", "list"]):
        lines.append("no network namespaces (`ip netns`: the multi-host preflight tests)")
    if shutil.which("mount") is None:
        lines.append("no `mount` (the read-only path preflight test)")
    if not os.access(hosts, os.W_OK):
        lines.append(f"{hosts} is not writable (the Slurm cluster and pod names)")
    return lines


def _runs(argv: list[str], expect: str = "") -> bool:
    """Whether `argv` runs (exit 0, or its help naming `expect`)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 or bool(expect and expect in proc.stdout + proc.stderr)
