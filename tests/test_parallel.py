"""The parallel run's groups, the tests that run alone and the heavy units scheduled first
(tests/conftest.py's XDIST_GROUPS, ALONE, HEAVY_FIRST): each names a test module (or a test in
it), and every module that uses the host's /etc/hosts, the Slurm test cluster with it, is in one
group."""

from __future__ import annotations

import re

from tests.conftest import (
    ALONE,
    ALONE_GROUP,
    HEAVY_FIRST,
    REPO,
    XDIST_GROUPS,
    GroupScheduling,
    runs_alone,
    unit_order,
)

# What puts a module in the etc-hosts group: the session's Slurm cluster (the `slurm` fixture),
# or the Kubernetes stand-in, which writes its pods' names into /etc/hosts.
HOSTS_USERS = re.compile(r"\bslurm: SlurmCluster\b|\bfrom tests\.schedulers import harness\b")


def test_every_group_names_a_test_module() -> None:
    missing = [module for module in XDIST_GROUPS if not (REPO / module).is_file()]
    assert missing == []


def test_every_test_that_runs_alone_is_there() -> None:
    for key in ALONE:
        module, _, test = key.partition("::")
        assert (REPO / module).is_file(), key
        assert not test or f"def {test}(" in (REPO / module).read_text(), key


def test_alone_means_the_module_or_the_test_and_its_parameters() -> None:
    module = "tests/preflight/test_preflight_links.py"
    assert module in ALONE and runs_alone(f"{module}::test_x") and runs_alone(f"{module}::t[a]")
    assert not runs_alone("tests/preflight/test_preflight_links_x.py::test_x")
    test = next(key for key in ALONE if "::" in key)
    assert runs_alone(test) and runs_alone(f"{test}[a]") and not runs_alone(f"{test}_x")


def test_a_test_runs_in_its_modules_group_or_as_a_unit_of_its_own() -> None:
    scheduler = object.__new__(GroupScheduling)  # the scope is a pure function of the node id
    slurm = "tests/test_slurm_real.py::test_a_job_across_two_hosts[x@y]"
    assert scheduler._split_scope(slurm) == "etc-hosts"
    single = "tests/cli/test_cli.py::test_help"
    assert scheduler._split_scope(single) == single


def test_every_module_that_edits_etc_hosts_is_in_one_group() -> None:
    users = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("test_*.py")
        if HOSTS_USERS.search(path.read_text())
    }
    assert "tests/test_slurm_real.py" in users  # the pattern finds them
    assert {module: XDIST_GROUPS.get(module) for module in users} == dict.fromkeys(
        users, "etc-hosts"
    )


def test_the_alone_tests_are_one_group_scheduled_first_then_the_heavy_units() -> None:
    scheduler = object.__new__(GroupScheduling)
    alone = [key if "::" in key else f"{key}::test_x" for key in ALONE]
    assert {scheduler._split_scope(nodeid) for nodeid in alone} == {ALONE_GROUP}
    heavy = ["tests/torchrun/test_torchrun_dropin.py::t[a]", "tests/test_packaging.py::test_x"]
    light = "tests/cli/test_cli.py::test_help"
    ordered = sorted([light, *reversed(heavy), *alone], key=unit_order)
    assert ordered == [*alone, *heavy, light]


def test_every_heavy_unit_names_a_module_or_a_group() -> None:
    units = {*XDIST_GROUPS.values(), *XDIST_GROUPS}
    assert [u for u in HEAVY_FIRST if u not in units and not (REPO / u).is_file()] == []
