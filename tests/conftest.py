"""Shared fixtures: no test may leave a live child process behind. And the parallel run's rules:
which tests share a worker (XDIST_GROUPS), which run alone (ALONE), whose ports (free_port)."""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psutil
import pytest
from xdist.scheduler import LoadGroupScheduling

# `--cpu-top`: the tests that cost the most CPU, in every run (pyproject's addopts).
pytest_plugins = ["tests.cpu_report"]

if TYPE_CHECKING:  # slurm_cluster uses wait_for from here: imported where it is needed
    from tests.slurm_cluster import SlurmCluster

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "scripts"
ELASTIC_HYDRA = [sys.executable, "-m", "elastic_hydra"]


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What this host lacks of what the tests need, one line each (see tests/host_needs.py)."""
    from tests.host_needs import missing

    lines = missing()
    return [f"host: MISSING {line}" for line in lines] or ["host: every need of the tests is met"]


# The host's temporary folder, as it was before the run's own (the port locks live there: they
# are shared with every other test run on the host); the xdist workers get it from the controller.
HOST_TMPDIR = os.environ.setdefault("ELASTIC_HYDRA_TESTS_HOST_TMPDIR", tempfile.gettempdir())
SESSION_TMPDIR = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the package once, as pip does on install: under PYTHONDONTWRITEBYTECODE=1 each
    launcher the tests start would compile its source again (about 0.05 s per launch).

    And one temporary folder for the run (TMPDIR, inherited by the xdist workers and everything
    the tests start), removed at its end when it passed: torchrun's agents leave a
    `torchelastic_*` folder in the temporary folder at every launch (about 20 a run)."""
    compileall.compile_dir(REPO / "elastic_hydra", quiet=1)
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # the controller, or a run without workers
        tmp = Path(tempfile.mkdtemp(prefix="elastic-hydra-tests-", dir=HOST_TMPDIR))
        config.stash[SESSION_TMPDIR] = tmp
        os.environ["TMPDIR"] = str(tmp)
        tempfile.tempdir = str(tmp)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run's temporary folder goes when the run passed (kept for a look when it failed)."""
    tmp = session.config.stash.get(SESSION_TMPDIR, None)
    if tmp is not None and exitstatus == 0:
        shutil.rmtree(tmp, ignore_errors=True)


# The tests run on xdist workers (pyproject's addopts: `-n 4 --dist loadgroup`). The tests of a
# group run on one worker, one after another: module -> group, and why.
XDIST_GROUPS = {
    # /etc/hosts, read, edited and written back whole by the Slurm test cluster (tests/
    # slurm_cluster.py: ctl, n1, n2 on 127.0.77.x; a session fixture, so each worker with one of
    # these tests would start a cluster of those names, and the second refuses) and by the
    # Kubernetes stand-in (tests/schedulers/harness.py: pods and machines on 127.0.78.x): two
    # writers at once can drop each other's lines.
    "tests/test_slurm_cluster.py": "etc-hosts",
    "tests/test_slurm_real.py": "etc-hosts",
    "tests/quarantine/test_slurm_ledger.py": "etc-hosts",
    "tests/schedulers/test_harness.py": "etc-hosts",
    # Module-scoped fixtures that launch real jobs (torch workers, under torchrun and ours) or a
    # server: the module's tests on one worker run them once, not once per worker.
    "tests/agent/test_torch_parity.py": "torch-parity",
    "tests/torchrun/test_torchrun_dropin.py": "torchrun-dropin",
    "tests/torchrun/test_torchrun_errors.py": "torchrun-errors",
    "tests/test_faults_vs_torchrun.py": "faults-vs-torchrun",  # and its table: every row in one
    "tests/config/test_one_composition.py": "one-composition",  # its etcd server
    "tests/checkpoint/test_snapshots_real.py": "snapshots-real",  # the clean run they compare to
}


ALONE_GROUP = "alone"

# The units (groups, modules, tests) that take the longest, longest first: the workers start
# with them, so that none is left to run by itself at the end of the run. Measured with
# `--durations=0`; one missing from here, or one that got cheaper, costs only time.
HEAVY_FIRST = (
    "etc-hosts",  # the Slurm cluster's tests and the Kubernetes stand-in's, one after another
    "torchrun-dropin",
    "one-composition",
    "tests/test_packaging.py",
    "tests/warm/test_examples_warm.py",
    "snapshots-real",
    "tests/stragglers/test_stragglers.py",
    "torchrun-errors",
    "tests/test_ddp_example.py",
    "tests/rendezvous/test_status_keys.py",
    "torch-parity",
    "faults-vs-torchrun",
    "tests/rendezvous/test_multinode.py",
)


class GroupScheduling(LoadGroupScheduling):  # type: ignore[misc]  # xdist has no type hints
    """xdist's loadgroup with the groups of XDIST_GROUPS, looked up by the test's module, and
    the tests that run alone (ALONE) in a group of their own.

    Not `xdist_group` marks: loadgroup sends a mark to the controller as a suffix of the test's
    node id, which pytest 9.2 no longer lets a plugin change, and the tests of a mark then run
    on any worker, silently (pytest-xdist issue 1386)."""

    def _split_scope(self, nodeid: str) -> str:
        if runs_alone(nodeid):
            return ALONE_GROUP
        group = XDIST_GROUPS.get(nodeid.split("::", 1)[0])
        return group if group is not None else str(super()._split_scope(nodeid))

    def schedule(self) -> None:
        """As loadgroup, with the units in order (`unit_order`) instead of by their number of
        tests: the alone group first, then the heavy units."""
        self.config.option.loadscopereorder = False
        super().schedule()


def unit_order(nodeid: str) -> int:
    """Where a test's unit goes in the run: the tests that run alone first, as one block while
    nothing else has started (no other test's end to wait for), then HEAVY_FIRST in its order,
    then the rest as collected."""
    if runs_alone(nodeid):
        return 0
    module = nodeid.split("::", 1)[0]
    keys = (module, XDIST_GROUPS.get(module))
    return next((1 + n for n, unit in enumerate(HEAVY_FIRST) if unit in keys), len(HEAVY_FIRST) + 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests in `unit_order` (a stable sort: collected order within each place)."""
    items.sort(key=lambda item: unit_order(item.nodeid))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would make a plain loadgroup
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return GroupScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


# Tests that measure one of their processes against another: a node's GEMM rate or link against
# the other nodes' (preflight), workers' failures against their agent's heartbeats. The load of a
# test beside them lands on some of their processes more than on others and changes what they
# measure, so each runs with no other test beside it: module, or module::test.
ALONE = (
    "tests/preflight/test_preflight_jobs.py",
    "tests/preflight/test_preflight_links.py",
    "tests/rendezvous/test_multinode.py"
    "::test_survivors_whose_collectives_a_dead_node_broke_spend_no_restart",
)


def runs_alone(nodeid: str) -> bool:
    return any(nodeid == key or nodeid.startswith((f"{key}::", f"{key}[")) for key in ALONE)


class AloneBlock:
    """The exclusive hold on the host of the worker that runs the alone group, from its first
    test to its last; `done` is written when it lets go."""

    def __init__(self) -> None:
        self.held: contextlib.ExitStack | None = None

    def enter(self, run_dir: Path) -> None:
        if self.held is not None:
            return
        self.held = contextlib.ExitStack()
        turn = self.held.enter_context((run_dir / "host-turn.lock").open("a"))
        host = self.held.enter_context((run_dir / "host.lock").open("a"))
        fcntl.flock(turn, fcntl.LOCK_EX)  # in turn: a test waiting to run alone goes first
        fcntl.flock(host, fcntl.LOCK_EX)  # `turn` too, until the block ends: nobody starts

    def leave(self, run_dir: Path) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None
        (run_dir / ALONE_DONE).touch()


_alone = AloneBlock()
ALONE_DONE = "alone.done"
ALONE_WAIT = 900.0  # seconds another test waits for the alone block before it starts anyway
HAS_ALONE = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)  # after the sort: the tests this worker's run holds
def pytest_collection_finish(session: pytest.Session) -> None:
    session.stash[HAS_ALONE] = any(runs_alone(item.nodeid) for item in session.items)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's: a wait is no test time
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """On an xdist worker, each test (setup to teardown) holds the run's lock on the host: shared,
    or alone (ALONE) exclusive.

    The tests that run alone are one group, scheduled first (`unit_order`). Its worker holds the
    exclusive lock from the first of them to the last, and the other workers' tests wait for
    the block to end before they start: the block never waits for another test to end, and
    the host is never half idle while one does."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process, one test at a time
        return (yield)
    run_dir = Path(item.config.getoption("basetemp")).parent  # the workers' basetemps are in it
    if runs_alone(item.nodeid):
        _alone.enter(run_dir)
        try:
            return (yield)
        finally:
            if nextitem is None or not runs_alone(nextitem.nodeid):
                _alone.leave(run_dir)
    if item.session.stash.get(HAS_ALONE, False):
        with contextlib.suppress(AssertionError):  # its worker died: go on, in turn
            wait_for((run_dir / ALONE_DONE).exists, ALONE_WAIT, "the alone block", interval=0.1)
    with contextlib.ExitStack() as held:
        turn = held.enter_context((run_dir / "host-turn.lock").open("a"))
        host = held.enter_context((run_dir / "host.lock").open("a"))
        fcntl.flock(turn, fcntl.LOCK_EX)  # in turn: a test waiting to run alone goes first
        fcntl.flock(turn, fcntl.LOCK_UN)
        fcntl.flock(host, fcntl.LOCK_SH)
        return (yield)


# The ports free_port hands out: a block of _PORT_BLOCK per test process (each xdist worker, or
# the one process of a run without workers), claimed by a lock file, so that no other worker, nor
# another test run on the host, hands out the same port between the pick and the server's bind;
# all below the kernel's ephemeral range (ip_local_port_range: 32768 up by default), where
# bind(0) and a connect() take theirs, and below torch's default ports (29400, 29500).
_PORTS_FROM, _PORTS_TO, _PORT_BLOCK = 10_000, 29_000, 500
_ports: Iterator[int] | None = None


def _claim_ports() -> Iterator[int]:
    """The ports of the first block no other process holds, in turn (a port comes back after
    the block's others: long after the server of its last test closed it)."""
    for start in range(_PORTS_FROM, _PORTS_TO, _PORT_BLOCK):
        lock = os.path.join(HOST_TMPDIR, f"elastic-hydra-test-ports-{start}.lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return itertools.cycle(range(start, start + _PORT_BLOCK))  # fd held: ours until we exit
    raise RuntimeError(f"every block of test ports in {_PORTS_FROM}..{_PORTS_TO} is claimed")


def free_port() -> int:
    """A port on 127.0.0.1 that is free now and that no other test process hands out (for
    servers the test starts)."""
    global _ports
    if _ports is None:
        _ports = _claim_ports()
    for port in itertools.islice(_ports, _PORT_BLOCK):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:  # no SO_REUSEADDR: a port still in TIME_WAIT is skipped too
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in this process's block of {_PORT_BLOCK}")


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.02,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` until it returns a truthy value; fail the test after `timeout` seconds
    (with `detail()` appended: a log tail, say). `predicate` may raise to give up at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            more = f"; {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{more}")
        time.sleep(interval)


def rewrite(path: Path, text: str) -> None:
    """Make `text` the content of `path` at once, by renaming a new file over it: a reader (the
    resolver of a test running beside, for /etc/hosts) sees the old content or the new, never a
    file emptied for the write. Where `path` cannot be replaced (a bind mount), it is written."""
    new = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        new.write_text(text)
        shutil.copymode(path, new)
        os.replace(new, path)
    except OSError:
        new.unlink(missing_ok=True)
        path.write_text(text)


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A small tmpfs mounted at `path` for the test (root: a full disk, a read-only mount)."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` still running and not zombies (one that ends meanwhile is not)."""
    found = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail any test that leaves a descendant of this process alive (and kill it)."""
    me = psutil.Process(os.getpid())
    before = {p.pid for p in me.children(recursive=True)}

    def leftovers() -> list[psutil.Process]:
        return alive([p for p in me.children(recursive=True) if p.pid not in before])

    yield
    try:
        wait_for(lambda: not leftovers(), 5.0, "the test's processes to end", interval=0.05)
        return
    except AssertionError:
        left = leftovers()
    names = [(p.pid, " ".join(p.cmdline()[:4])) for p in left]
    for p in left:
        p.kill()
    pytest.fail(f"test left live processes behind: {names}")


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _ignored_and_blocked() -> tuple[str, str]:
    """This process's ignored signals and its main thread's blocked ones, as the kernel has them."""
    with open(f"/proc/self/task/{os.getpid()}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return fields["SigIgn"].strip(), fields["SigBlk"].strip()


@pytest.fixture(autouse=True)
def no_signal_state_left() -> Iterator[None]:
    """Fail any test that leaves this process ignoring or blocking a stop signal (and restore it):
    every process the later tests start would inherit it, and a Ctrl-C they send would be lost."""
    handlers = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    before_c = _ignored_and_blocked()
    yield
    now_blocked = signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    changed = {}
    for sig, handler in handlers.items():
        if (now := signal.getsignal(sig)) != handler and handler is not None:
            changed[sig.name] = str(now)
            signal.signal(sig, handler)
    if now_blocked != blocked:
        changed["blocked"] = str(sorted(now_blocked - blocked))
    if changed:
        pytest.fail(f"test left the stop signals changed: {changed}")
    # What C code set, which Python's own record does not show: warned, then put back.
    if (now_c := _ignored_and_blocked()) != before_c:
        warnings.warn(f"the C-level signal state changed: {before_c} -> {now_c}", stacklevel=1)
        for sig in _STOP_SIGNALS:
            signal.signal(sig, handlers[sig] or signal.SIG_DFL)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real two-node Slurm cluster (nodes n1, n2) for the whole session, stopped at its end."""
    from tests.slurm_cluster import slurm_cluster

    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
