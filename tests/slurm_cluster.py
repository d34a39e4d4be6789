"""A real two-node Slurm cluster on this one host, for tests: started and always stopped here.

Debian's Slurm 22.05 is built with multiple-slurmd support, so `slurmd -N n1` and `slurmd -N n2`
run side by side. Each daemon runs in its own UTS namespace (hostname ctl, n1, n2) and each name
gets its own loopback address in /etc/hosts, so the nodes look like separate hosts to the jobs
(a rendezvous that keys on host names or addresses can tell them apart). Nothing is installed
here (tests/services/install_slurm.sh does that); the configuration lives in a temp directory and
every client and daemon finds it through SLURM_CONF, so the host's /etc/slurm is left alone.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import rewrite, wait_for
from tests.servers import free_ports, log_tail, stop_group

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
JOBS_END_TIMEOUT = 20.0
COMMAND_TIMEOUT = 10.0
_POLL_INTERVAL = 0.1

NODES = ("n1", "n2")
CONTROLLER = "ctl"
ADDRESSES = {CONTROLLER: "127.0.77.10", "n1": "127.0.77.1", "n2": "127.0.77.2"}
PARTITION = "debug"

HOSTS_FILE = Path("/etc/hosts")
_HOSTS_MARK = "# elastic-hydra test Slurm cluster, pid"

MUNGE_USER = "munge"
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN_DIR = Path("/run/munge")
MUNGE_DIRS = (Path("/etc/munge"), Path("/var/lib/munge"), Path("/var/log/munge"))

# Where Debian puts each binary; the installer is tests/services/install_slurm.sh.
_BINARIES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "srun": "slurm-client",
    "sbatch": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "munged": "munge",
    "munge": "munge",
    "unmunge": "munge",
    "unshare": "util-linux",
    "hostname": "hostname",
}
_SBIN_DIRS = ("/usr/sbin", "/sbin")


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: controller `controller`, compute nodes `nodes`, partition `partition`.

    Merge `env` (SLURM_CONF, PATH) into the environment of every Slurm command; `run` and `popen`
    do that for you.
    """

    workdir: Path
    conf: Path
    env: dict[str, str]
    nodes: tuple[str, ...] = NODES
    controller: str = CONTROLLER
    partition: str = PARTITION
    addresses: Mapping[str, str] = field(default_factory=lambda: dict(ADDRESSES))

    def full_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with the cluster's `env` (and `extra`) on top."""
        return {**os.environ, **self.env, **(extra or {})}

    def run(
        self,
        cmd: Sequence[str],
        timeout: float,
        *,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (srun, sbatch --wait, squeue, scancel, ...) to its end.

        Its output is captured as text; with `check`, a non-zero exit raises a RuntimeError that
        carries the command's output.
        """
        proc = subprocess.run(
            list(cmd),
            env=self.full_env(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(cmd)} exited with status {proc.returncode}:\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def popen(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start a Slurm command (say `srun ... sleep 300`) without waiting for it (text mode)."""
        env = self.full_env(kwargs.pop("env", None))
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(list(cmd), env=env, text=True, **kwargs)

    def job_ids(self) -> list[str]:
        """The ids of the jobs squeue lists (pending, running or completing)."""
        out = self.run(["squeue", "-h", "-o", "%i"], timeout=COMMAND_TIMEOUT).stdout
        return out.split()

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo reports it ("idle", "mixed", "down*", ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=COMMAND_TIMEOUT).stdout
        return dict(line.split(maxsplit=1) for line in out.splitlines() if line.strip())


def find_binaries() -> dict[str, str]:
    """The path of every binary the cluster runs, or a RuntimeError naming what is missing."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *_SBIN_DIRS])
    found: dict[str, str] = {}
    missing: list[str] = []
    for name in _BINARIES:
        path = shutil.which(name, path=search)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    if missing:
        packages = sorted({_BINARIES[name] for name in missing})
        raise RuntimeError(
            f"the Slurm test cluster needs {', '.join(missing)}, which are not installed: run "
            f"tests/services/install_slurm.sh as root (apt-get install -y "
            f"--no-install-recommends {' '.join(packages)}), as the nox tests session does"
        )
    return found


def _uts_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def _kill_namespace_members(namespaces: set[str], timeout: float = STOP_TIMEOUT) -> None:
    """SIGKILL every process left in one of `namespaces` (job steps, tasks) and wait for them.

    Only this cluster's daemons and what they started live in those UTS namespaces: slurmstepd
    detaches from slurmd, so its process tree does not find them.
    """
    namespaces.discard(_uts_namespace(os.getpid()) or "")
    if not namespaces:
        return

    def all_gone() -> bool:
        """SIGKILL the members still there; True once only zombies (or none) are left."""
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or _uts_namespace(int(entry.name)) not in namespaces:
                continue
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                os.kill(int(entry.name), signal.SIGKILL)
                if (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
                    alive.append(entry.name)
        return not alive

    wait_for(all_gone, timeout, "the Slurm test cluster's processes to end", _POLL_INTERVAL)


@contextlib.contextmanager
def _hosts_entries() -> Iterator[None]:
    """Map ctl, n1 and n2 to their loopback addresses in /etc/hosts; take exactly that back out.

    A block a dead earlier run left behind is removed first; a live one means another cluster
    with the same names is running, and that is an error.
    """
    text = HOSTS_FILE.read_text()
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.startswith(_HOSTS_MARK)]
    if begins:
        first, last = begins[0], begins[-1]
        owner = lines[first][len(_HOSTS_MARK) :].split()[0]
        if owner.isdigit() and Path(f"/proc/{owner}").exists() and int(owner) != os.getpid():
            raise RuntimeError(
                f"{HOSTS_FILE} holds the names of another Slurm test cluster (pid {owner}, "
                "still running): only one can run on a host at a time"
            )
        text = "".join(lines[:first] + lines[last + 1 :])
        rewrite(HOSTS_FILE, text)
    mark = f"{_HOSTS_MARK} {os.getpid()}"
    block = "".join(
        [
            "" if not text or text.endswith("\n") else "\n",
            f"{mark} (begin)\n",
            *(f"{address} {name}\n" for name, address in ADDRESSES.items()),
            f"{mark} (end)\n",
        ]
    )
    rewrite(HOSTS_FILE, text + block)
    try:
        for name, address in ADDRESSES.items():
            resolved = socket.gethostbyname(name)
            if resolved != address:
                raise RuntimeError(
                    f"{name} resolves to {resolved}, not {address}: another entry for {name} "
                    f"comes first in {HOSTS_FILE} (or in another name service)"
                )
        yield
    finally:
        current = HOSTS_FILE.read_text()
        rewrite(HOSTS_FILE, current.replace(block, "", 1))


def _munge_works(binaries: Mapping[str, str]) -> bool:
    """Whether a munged answers on the default socket (a credential made there decodes)."""
    try:
        cred = subprocess.run(
            [binaries["munge"], "-n"], capture_output=True, timeout=COMMAND_TIMEOUT, check=False
        )
        if cred.returncode != 0:
            return False
        decoded = subprocess.run(
            [binaries["unmunge"]],
            input=cred.stdout,
            capture_output=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return decoded.returncode == 0


@contextlib.contextmanager
def _munged(binaries: Mapping[str, str], err_path: Path) -> Iterator[None]:
    """A working munged on the default socket: one already running, or one started (and stopped)
    here as the munge user, laid out as Debian's service lays it out (its stderr to `err_path`)."""
    if _munge_works(binaries):
        yield
        return
    user = pwd.getpwnam(MUNGE_USER)
    for directory in MUNGE_DIRS:
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chown(directory, user.pw_uid, user.pw_gid)
    created_run_dir = not MUNGE_RUN_DIR.exists()
    MUNGE_RUN_DIR.mkdir(mode=0o755, exist_ok=True)
    os.chown(MUNGE_RUN_DIR, user.pw_uid, user.pw_gid)
    if not MUNGE_KEY.exists():
        subprocess.run(
            [str(Path(binaries["munged"]).with_name("mungekey")), "--create"],
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            capture_output=True,
            timeout=COMMAND_TIMEOUT,
            check=True,
        )
    log_path = Path("/var/log/munge/munged.log")
    with err_path.open("ab") as err:
        proc = subprocess.Popen(
            [binaries["munged"], "--foreground"],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            start_new_session=True,
        )

    def answers() -> bool:
        if (code := proc.poll()) is not None:
            raise RuntimeError(
                f"munged exited with status {code}: {log_tail(err_path).strip()}; "
                f"log {log_path} ends with:\n{log_tail(log_path)}"
            )
        return _munge_works(binaries)

    try:
        wait_for(
            answers, START_TIMEOUT, "munged to answer", _POLL_INTERVAL,
            detail=lambda: f"log {log_path} ends with:\n{log_tail(log_path)}",
        )  # fmt: skip
        yield
    finally:
        stop_group(proc, STOP_TIMEOUT)
        if created_run_dir:
            with contextlib.suppress(OSError):
                MUNGE_RUN_DIR.rmdir()


def _hardware(slurmd: str) -> str:
    """This host's layout and memory as `slurmd -C` reports them ("CPUs=2 ... RealMemory=N")."""
    out = subprocess.run(
        [slurmd, "-C"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=True
    ).stdout
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    fields = dict(
        item.split("=", 1) for item in out.split() if item.split("=", 1)[0] in keys and "=" in item
    )
    missing = [key for key in keys if key not in fields]
    if missing:
        raise RuntimeError(f"`slurmd -C` did not report {', '.join(missing)}: {out!r}")
    return " ".join(f"{key}={fields[key]}" for key in keys)


def write_config(workdir: Path, slurmd: str) -> Path:
    """Write slurm.conf (and cgroup.conf, plugstack.conf) under `workdir`; return slurm.conf."""
    conf_dir = workdir / "etc"
    for sub in ("etc", "state", "spool", "log", "run"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    for node in NODES:
        (workdir / "spool" / node).mkdir(exist_ok=True)
    ctld_port, *node_ports = free_ports(1 + len(NODES))
    hardware = _hardware(slurmd)
    nodes = "\n".join(
        f"NodeName={node} NodeAddr={ADDRESSES[node]} NodeHostname={node} Port={port} "
        f"{hardware} State=UNKNOWN"
        for node, port in zip(NODES, node_ports, strict=True)
    )
    conf = f"""\
# Written by tests/slurm_cluster.py: a two-node cluster on one host.
ClusterName=ehtest
SlurmctldHost={CONTROLLER}({ADDRESSES[CONTROLLER]})
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A job credential lives 120 s by default, and a requeued job starts no sooner than that after its
# batch script ends; 15 s (5 is the least Slurm takes) still leaves a loaded host its margin.
AuthInfo=cred_expire=15
CommunicationParameters=NoCtldInAddrAny
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool/%n
SlurmctldPidFile={workdir}/run/slurmctld.pid
SlurmdPidFile={workdir}/run/slurmd-%n.pid
SlurmctldLogFile={workdir}/log/slurmctld.log
SlurmdLogFile={workdir}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={conf_dir}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=5
KillWait=2
MinJobAge=2
InactiveLimit=0
Waittime=0
{nodes}
PartitionName={PARTITION} Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP \
OverSubscribe=FORCE:8
"""
    (conf_dir / "slurm.conf").write_text(conf)
    # slurmd loads a cgroup plugin even when no other plugin uses one; 22.05 has no "disabled".
    (conf_dir / "cgroup.conf").write_text(
        "CgroupPlugin=autodetect\nCgroupAutomount=no\nIgnoreSystemd=yes\n"
    )
    (conf_dir / "plugstack.conf").write_text("")
    return conf_dir / "slurm.conf"


def _in_uts_namespace(binaries: Mapping[str, str], hostname: str, cmd: Sequence[str]) -> list[str]:
    """`cmd` run in a UTS namespace of its own whose host name is `hostname` (same pid)."""
    script = f"{shlex.quote(binaries['hostname'])} {hostname} && exec {shlex.join(cmd)}"
    return [binaries["unshare"], "--uts", "sh", "-c", script]


def _start_daemon(
    cmd: Sequence[str], env: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(cmd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_until_ready(
    cluster: SlurmCluster, daemons: Mapping[str, tuple[subprocess.Popen[bytes], Path]]
) -> None:
    """Poll sinfo until every node is idle; fail with the logs if a daemon dies or time runs out."""
    states: dict[str, str] = {}

    def idle() -> bool:
        for name, (proc, log_path) in daemons.items():
            if (code := proc.poll()) is not None:
                raise RuntimeError(
                    f"{name} exited with status {code} while the Slurm test cluster started; "
                    f"log {log_path} ends with:\n{log_tail(log_path)}"
                )
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            states.update(cluster.node_states())
        return all(states.get(node) == "idle" for node in cluster.nodes)

    def logs() -> str:
        tails = (f"--- {path} ---\n{log_tail(path)}" for _, path in daemons.values())
        return f"node states {states}:\n" + "\n".join(tails)

    wait_for(idle, START_TIMEOUT, "the Slurm test cluster's nodes to be idle", _POLL_INTERVAL, logs)


def _cancel_jobs(cluster: SlurmCluster) -> None:
    """Cancel every job still known and wait until squeue lists none (best effort)."""

    def none_left() -> bool:
        if ids := cluster.job_ids():
            cluster.run(["scancel", *ids], timeout=COMMAND_TIMEOUT, check=False)
        return not ids

    with contextlib.suppress(AssertionError, RuntimeError, subprocess.TimeoutExpired):
        wait_for(none_left, JOBS_END_TIMEOUT, "the jobs to end", _POLL_INTERVAL)


@contextlib.contextmanager
def slurm_cluster(workdir: Path) -> Iterator[SlurmCluster]:
    """Run a Slurm controller and two compute nodes (n1, n2) for the body of the `with`.

    Config, state, spool and logs live under `workdir`. On exit, also when the body raises: the
    jobs left are cancelled, the daemons started here are stopped (SIGTERM, SIGKILL after a
    grace period), any process left in the nodes' namespaces is killed, a munged started here is
    stopped, and the /etc/hosts lines are taken out again.
    """
    binaries = find_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = write_config(workdir, binaries["slurmd"])
    path_dirs = list(dict.fromkeys(str(Path(p).parent) for p in binaries.values()))
    env = {
        "SLURM_CONF": str(conf),
        "PATH": os.pathsep.join([*path_dirs, os.environ.get("PATH", os.defpath)]),
    }
    cluster = SlurmCluster(workdir=workdir, conf=conf, env=env)
    daemon_env = cluster.full_env()
    log_dir = workdir / "log"
    daemons: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    namespaces: set[str] = set()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_hosts_entries())
        stack.enter_context(_munged(binaries, log_dir / "munged.out"))

        def stop_all() -> None:
            for proc, _ in daemons.values():
                if (ns := _uts_namespace(proc.pid)) is not None:
                    namespaces.add(ns)
            _cancel_jobs(cluster)
            for proc, _ in reversed(daemons.values()):
                stop_group(proc, STOP_TIMEOUT)
            _kill_namespace_members(namespaces)

        stack.callback(stop_all)
        ctld_cmd = [binaries["slurmctld"], "-D", "-i"]
        ctld_log = log_dir / "slurmctld.out"
        daemons["slurmctld"] = (
            _start_daemon(_in_uts_namespace(binaries, CONTROLLER, ctld_cmd), daemon_env, ctld_log),
            ctld_log,
        )
        for node in NODES:
            node_cmd = [binaries["slurmd"], "-D", "-N", node]
            node_log = log_dir / f"slurmd-{node}.out"
            daemons[f"slurmd {node}"] = (
                _start_daemon(_in_uts_namespace(binaries, node, node_cmd), daemon_env, node_log),
                node_log,
            )
        _wait_until_ready(cluster, daemons)
        for proc, _ in daemons.values():
            if (ns := _uts_namespace(proc.pid)) is not None:
                namespaces.add(ns)
        yield cluster
