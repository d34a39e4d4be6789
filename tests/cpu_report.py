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

KEY = "cpu_s"
START = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-top", type=int, default=0, metavar="N",
        help="show the N tests that used the most CPU (with their processes'); 0: none",
    )  # fmt: skip


def _cpu() -> float:
    used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    item.stash[START] = _cpu()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, object]:
    report = yield
    if report.when == "teardown" and START in item.stash:
        report.user_properties = [*report.user_properties, (KEY, _cpu() - item.stash[START])]
    return report


class Tally:
    """The controller's: each test's CPU, as its teardown report brings it."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            for key, value in report.user_properties:
                if key == KEY and isinstance(value, float):
                    self.cpu[report.nodeid] = value

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        top = int(terminalreporter.config.getoption("--cpu-top"))
        if not top or not self.cpu:
            return
        total = sum(self.cpu.values())
        terminalreporter.write_sep("=", f"top {top} CPU (tests and their processes)")
        for nodeid, seconds in sorted(self.cpu.items(), key=lambda kv: -kv[1])[:top]:
            terminalreporter.write_line(f"{seconds:7.2f}s cpu  {nodeid}")
        terminalreporter.write_line(f"{total:7.1f}s cpu in all, {len(self.cpu)} tests")
        files: dict[str, float] = {}
        for nodeid, seconds in self.cpu.items():
            path = nodeid.split("::", 1)[0]
            files[path] = files.get(path, 0.0) + seconds
        terminalreporter.write_sep("=", f"top {top} CPU by file")
        for path, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:top]:
            terminalreporter.write_line(f"{seconds:7.1f}s cpu  {path}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(Tally(), "cpu_report_tally")
