"""`--cpu-top=N`: the N tests that cost the most CPU, beside pytest's `--durations`.

On a host with few cores the suite is bound by CPU, not by waiting: a test that waits 20 s for a
rendezvous costs the run little, one that starts four interpreters that import torch costs it
8 s of CPU. Each test's cost is this process's CPU plus its reaped descendants' (the launches,
their agents' workers), from setup to teardown. Processes that some other process reaps (a
Slurm job's, under slurmd) are not counted. Works under xdist: the workers send each test's
figures with its report.
"""

from __future__ import annotations

import resource
from collections.abc import Generator

import pytest

KEY, SELF_KEY = "cpu_s", "cpu_self_s"
START = pytest.StashKey[tuple[float, float]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-top", type=int, default=0, metavar="N",
        help="show the N tests that used the most CPU (with their processes'); 0: none",
    )  # fmt: skip


def _cpu() -> tuple[float, float]:
    """The CPU of this process and its reaped descendants, and of this process alone."""
    used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    own = used[0].ru_utime + used[0].ru_stime
    return own + used[1].ru_utime + used[1].ru_stime, own


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    item.stash[START] = _cpu()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, object]:
    report = yield
    if report.when == "teardown" and START in item.stash:
        (total, own), (total0, own0) = _cpu(), item.stash[START]
        report.user_properties = [
            *report.user_properties, (KEY, total - total0), (SELF_KEY, own - own0),
        ]  # fmt: skip
    return report


class Tally:
    """The controller's: each test's CPU, as its teardown report brings it."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.own: dict[str, float] = {}  # of it, in the test's own process (not its children)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            for key, value in report.user_properties:
                if key == KEY and isinstance(value, float):
                    self.cpu[report.nodeid] = value
                elif key == SELF_KEY and isinstance(value, float):
                    self.own[report.nodeid] = value

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        top = int(terminalreporter.config.getoption("--cpu-top"))
        if not top or not self.cpu:
            return
        total = sum(self.cpu.values())
        terminalreporter.write_sep("=", f"top {top} CPU (tests and their processes)")
        for nodeid, seconds in sorted(self.cpu.items(), key=lambda kv: -kv[1])[:top]:
            terminalreporter.write_line(f"{seconds:7.2f}s cpu  {nodeid}")
        own = sum(self.own.values())
        terminalreporter.write_line(
            f"{total:7.1f}s cpu in all, {own:.1f}s of it in the test processes themselves, "
            f"{len(self.cpu)} tests"
        )
        files: dict[str, tuple[float, float]] = {}
        for nodeid, seconds in self.cpu.items():
            path = nodeid.split("::", 1)[0]
            was, was_own = files.get(path, (0.0, 0.0))
            files[path] = (was + seconds, was_own + self.own.get(nodeid, 0.0))
        terminalreporter.write_sep("=", f"top {top} CPU by file (in the test process itself)")
        for path, (seconds, mine) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
            terminalreporter.write_line(f"{seconds:7.1f}s cpu ({mine:6.1f}s)  {path}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(Tally(), "cpu_report_tally")
