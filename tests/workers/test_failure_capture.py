"""Failure capture end to end: the bootstrap, error files, crash dumps, stderr tails, the report.

Every launch runs the real CLI (`python -m elastic_hydra`) in a subprocess with real worker
processes; each is bounded by a timeout and nothing sleeps to wait for it. Most workers are
`tests/scripts/fail.py` (plain Python: one rank fails in a chosen way, the others sleep until the
launcher stops them) or small scripts written into `tmp_path`. Only the `@record` test imports
torch (in its worker).

The report is checked with `logs=quiet`, so the agent's stderr holds nothing but the report (plain
text, as stderr is not a terminal); worker output is only in the run dir's files.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, WORKERS
from tests.harness import launcher_env, run_raw

pytestmark = pytest.mark.timeout(60)

FAIL = str(WORKERS / "fail.py")
BOOTSTRAP = str(REPO / "elastic_hydra" / "workers" / "bootstrap.py")
TORCH_RECORD_FILE = "torch/distributed/elastic/multiprocessing/errors/__init__.py"
LAUNCH_TIMEOUT = 30  # seconds for one launch that ends by itself
PLAIN_TIMEOUT = 20  # seconds for one plain `python script.py`
TRACEBACK_HEADER = "Traceback (most recent call last):"


# ------------------------------------------------------------------------------------- helpers
class Launch:
    """One finished launch: the process, its run dir, summary.json and the printed report."""

    def __init__(self, proc: subprocess.CompletedProcess[bytes], logs_root: Path) -> None:
        self.proc = proc
        self.report = proc.stderr.decode(errors="replace")
        found = list(logs_root.glob("*/*/summary.json"))
        assert len(found) == 1, (found, self.report)
        self.run_dir = found[0].parent
        self.summary: dict[str, Any] = json.loads(found[0].read_text())

    @property
    def cause(self) -> dict[str, Any]:
        cause = self.summary["root_cause"]
        assert isinstance(cause, dict), self.summary
        return cause

    def failure(self, rank: int) -> dict[str, Any]:
        (record,) = [f for f in self.summary["failures"] if f["rank"] == rank]
        return dict(record)

    def rank_file(self, local_rank: int, name: str, attempt: int = 0) -> Path:
        return self.run_dir / f"attempt_{attempt}" / str(local_rank) / name


def launch(
    tmp_path: Path,
    *overrides: str,
    args: tuple[str, ...] = (),
    cwd: Path | None = None,
    quiet: bool = True,
) -> Launch:
    """`python -m elastic_hydra OVERRIDES -- ARGS` to its end; run dir under tmp_path/eh_logs."""
    logs_root = tmp_path / "eh_logs"
    proc = run_raw(
        *overrides,
        f"logs.root={logs_root}",
        "stop_grace=2",
        *(["logs=quiet"] if quiet else []),
        *(["--", *args] if args else []),
        cwd=cwd or tmp_path,
        timeout=LAUNCH_TIMEOUT,
    )
    return Launch(proc, logs_root)


def launch_fail(tmp_path: Path, mode: str, *extra: str, nproc: int = 2, **kw: Any) -> Launch:
    return launch(tmp_path, f"script={FAIL}", f"nproc_per_node={nproc}", args=(mode, *extra), **kw)


def line_of(path: str | Path, source: str) -> int:
    """The 1-based number of the one line of `path` whose stripped text is `source`."""
    lines = Path(path).read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if line.strip() == source]
    assert len(found) == 1, (path, source, found)
    return found[0]


def frame(path: str | Path, name: str, source: str) -> dict[str, Any]:
    """A traceback frame as summary.json stores it."""
    return {"filename": str(path), "lineno": line_of(path, source), "name": name, "line": source}


def python_frame_line(fr: dict[str, Any]) -> str:
    return f'  File "{fr["filename"]}", line {fr["lineno"]}, in {fr["name"]}'


RAISE_LINE = 'raise ValueError(f"boom from rank {rank}")'


def fail_raise_frames() -> list[dict[str, Any]]:
    """fail.py's frames from the module down to its `raise` in `fail`."""
    return [
        frame(FAIL, "<module>", "main()"),
        frame(FAIL, "main", "run(opts.mode, rank)"),
        frame(FAIL, "fail", RAISE_LINE),
    ]


def is_launcher_file(filename: str) -> bool:
    return (
        filename == BOOTSTRAP
        or filename.endswith(("/runpy.py", "<frozen runpy>", TORCH_RECORD_FILE))
        or "bootstrap.py" in filename
    )


def all_frames(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for stack in record["traceback"] for f in stack["frames"]]


def traceback_block(text: str) -> list[str]:
    """The lines of the last Python traceback in `text` (header to exception line), without the
    `^~~~` marker lines of Python 3.11+."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line == TRACEBACK_HEADER)
    block = []
    for line in lines[start:]:
        if line.strip() and set(line.strip()) <= set("^~"):
            continue
        block.append(line)
        if not line.startswith((" ", TRACEBACK_HEADER)):
            break  # the exception line
    return block


def assert_terminated_peer(record: dict[str, Any]) -> None:
    assert record["terminated_by_launcher"] is True
    assert record["returncode"] == -signal.SIGTERM
    assert record["signal"] == "SIGTERM"
    assert record["exit"] == "terminated (SIGTERM)"
    assert record["source"] == "none"
    assert record["traceback"] == []


def assert_root_rank(launch: Launch, rank: int = 1) -> None:
    s = launch.summary
    assert s["status"] == "failed", s
    assert s["exit_code"] == 1 == launch.proc.returncode, launch.report
    assert s["attempts"] == 1
    assert s["run_dir"] == str(launch.run_dir)
    cause = launch.cause
    assert cause["rank"] == rank and cause["local_rank"] == rank
    assert cause["terminated_by_launcher"] is False
    assert cause["attempt"] == 0 and cause["restart_count"] == 0
    # The root cause is also the failure record of that rank, as is.
    assert launch.failure(rank) == cause
    assert re.search(rf"root cause\W+rank {rank} \(local rank {rank}\)", launch.report)
    assert f"pid {cause['pid']}" in launch.report
    assert cause["exit"] in launch.report
    assert f"run dir: {launch.run_dir}" in launch.report
    assert cause["stderr_log"] in launch.report


def assert_report_peers(report: str, peers: list[dict[str, Any]]) -> None:
    assert "other ranks" in report
    for peer in peers:
        pattern = (
            rf"^{peer['rank']}\s+{peer['local_rank']}\s+{peer['pid']}\s+"
            r"terminated by launcher \(SIGTERM\)$"
        )
        assert re.search(pattern, report, re.MULTILINE), (pattern, report)


# ------------------------------------------------------------- 1 bootstrap = `python script.py`
FACTS_HELPER = "eh_facts_helper"
FACTS_SOURCE = f'''\
"""Dumps what the interpreter gave this script (or module) to DIR/facts_<RANK>.json."""

import json
import multiprocessing
import os
import pickle
import sys

import {FACTS_HELPER}


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)


def square(x):
    return x * x, os.getpid(), __name__


def make_point(x):
    return Point(x, -x)


def facts():
    point = pickle.loads(pickle.dumps(Point(2, 3)))
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        squares = pool.map(square, [1, 2, 3])
        points = pool.map(make_point, [1, 2])
    return {{
        "name": __name__,
        "file": __file__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "path": sys.path,
        "cwd": os.getcwd(),
        "main_is_this_module": sys.modules["__main__"].__dict__ is globals(),
        "spec": getattr(__spec__, "name", None),
        "helper": {FACTS_HELPER}.VALUE,
        "helper_file": {FACTS_HELPER}.__file__,
        "class": f"{{Point.__module__}}.{{Point.__qualname__}}",
        "pickle_round_trip": type(point) is Point and point == Point(2, 3),
        "pool_squares": [s for s, _, _ in squares],
        "pool_in_other_processes": all(pid != os.getpid() for _, pid, _ in squares),
        "pool_main_name": sorted({{name for _, _, name in squares}}),
        "pool_points": [p == Point(x, -x) for x, p in zip([1, 2], points)],
    }}


if __name__ == "__main__":
    out = os.path.join(sys.argv[1], "facts_" + os.environ.get("RANK", "plain") + ".json")
    with open(out, "w") as f:
        json.dump(facts(), f)
'''
FACTS_ARGS = ("--flag", "two words", "k=v,w")


def write_helper(directory: Path) -> Path:
    helper = directory / f"{FACTS_HELPER}.py"
    helper.write_text("VALUE = 'helper beside the entrypoint'\n")
    return helper


def read_facts(out: Path, who: str) -> dict[str, Any]:
    return dict(json.loads((out / f"facts_{who}.json").read_text()))


def start_options(bootstrap: bool | str) -> list[str]:
    """Cold through the bootstrap or without it, or forked warm from a template (`warm/`)."""
    if bootstrap == "warm":
        return ["bootstrap=true", "warm.imports=[json]"]
    return [f"bootstrap={bootstrap}"]


def run_plain(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-u", *argv],
        cwd=cwd,
        env=launcher_env(),
        capture_output=True,
        timeout=PLAIN_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")


@pytest.mark.parametrize("bootstrap", [True, False, "warm"])
def test_script_sees_what_python_script_gives_it(tmp_path: Path, bootstrap: bool | str) -> None:
    tmp_path = tmp_path.resolve()
    app = tmp_path / "app"
    elsewhere = tmp_path / "elsewhere"  # the cwd: the helper is importable only via sys.path[0]
    app.mkdir()
    elsewhere.mkdir()
    script = app / "facts.py"
    script.write_text(FACTS_SOURCE)
    helper = write_helper(app)
    out = tmp_path / "out"
    out.mkdir()
    args = (str(out), *FACTS_ARGS)

    run = launch(
        tmp_path, f"script={script}", "nproc_per_node=2", *start_options(bootstrap),
        args=args, cwd=elsewhere,
    )  # fmt: skip
    assert run.proc.returncode == 0, run.report
    assert run.summary["status"] == "succeeded"
    run_plain([str(script), *args], cwd=elsewhere)
    plain = read_facts(out, "plain")

    for rank in (0, 1):
        facts = read_facts(out, str(rank))  # exists: the `__main__` block ran
        assert facts["name"] == "__main__"
        assert facts["file"] == str(script)
        assert facts["argv"] == [str(script), *args]
        assert facts["path0"] == str(app)
        assert str(elsewhere) not in facts["path"]
        assert not any(p.rstrip("/").endswith("elastic_hydra") for p in facts["path"])
        assert facts["cwd"] == str(elsewhere)
        assert facts["main_is_this_module"] is True
        assert facts["spec"] is None
        assert facts["helper"] == "helper beside the entrypoint"
        assert facts["helper_file"] == str(helper)
        assert facts["class"] == "__main__.Point"
        assert facts["pickle_round_trip"] is True
        assert facts["pool_squares"] == [1, 4, 9]
        assert facts["pool_in_other_processes"] is True
        assert facts["pool_main_name"] == ["__mp_main__"]
        assert facts["pool_points"] == [True, True]
        # Fact for fact what `python -u script.py ARGS` gives, sys.path included.
        assert facts == plain


@pytest.mark.parametrize("bootstrap", [True, False, "warm"])
def test_module_sees_what_python_m_gives_it(tmp_path: Path, bootstrap: bool | str) -> None:
    tmp_path = tmp_path.resolve()
    project = tmp_path / "project"  # the cwd: `-m` puts it first on sys.path
    package = project / "facts_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    module = package / "mod.py"
    module.write_text(FACTS_SOURCE)
    helper = write_helper(project)
    out = tmp_path / "out"
    out.mkdir()
    args = (str(out), *FACTS_ARGS)

    run = launch(
        tmp_path, "module=facts_pkg.mod", "nproc_per_node=2", *start_options(bootstrap),
        args=args, cwd=project,
    )  # fmt: skip
    assert run.proc.returncode == 0, run.report
    run_plain(["-m", "facts_pkg.mod", *args], cwd=project)
    plain = read_facts(out, "plain")

    for rank in (0, 1):
        facts = read_facts(out, str(rank))
        assert facts["name"] == "__main__"
        assert facts["file"] == str(module)
        assert facts["argv"] == [str(module), *args]
        assert facts["path0"] == str(project)
        assert facts["cwd"] == str(project)
        assert facts["main_is_this_module"] is True
        assert facts["spec"] == "facts_pkg.mod"
        assert facts["helper_file"] == str(helper)
        assert facts["class"] == "__main__.Point"
        assert facts["pickle_round_trip"] is True
        assert facts["pool_squares"] == [1, 4, 9]
        assert facts["pool_main_name"] == ["__mp_main__"]
        assert facts["pool_points"] == [True, True]
        assert facts == plain


def test_bootstrap_exits_like_python_on_sys_exit_and_success(tmp_path: Path) -> None:
    """Exit codes pass through the bootstrap untouched (SystemExit is not a failure to record)."""
    script = tmp_path / "exits.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]) if sys.argv[1:] else None)\n")
    error_file = tmp_path / "error.json"
    for args, code in (([], 0), (["0"], 0), (["7"], 7)):
        proc = subprocess.run(
            [sys.executable, "-u", BOOTSTRAP, str(script), *args],
            env=launcher_env(TORCHELASTIC_ERROR_FILE=str(error_file)),
            capture_output=True,
            timeout=PLAIN_TIMEOUT,
            check=False,
        )
        assert (proc.returncode, proc.stderr) == (code, b"")
        assert not error_file.exists()


# ------------------------------------------------------------------------ 2 a raise in one rank
def test_raise_in_rank_1_of_3_is_the_root_cause_with_its_traceback(tmp_path: Path) -> None:
    run = launch_fail(tmp_path, "raise", nproc=3)
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == 1
    assert cause["signal"] is None
    assert cause["exit"] == "exit code 1"
    assert cause["source"] == "exception"
    assert cause["message"] == "ValueError: boom from rank 1"
    error_file = run.rank_file(1, "error.json")
    assert cause["error_file"] == str(error_file)
    assert cause["stderr_log"] == str(run.rank_file(1, "stderr.log"))
    assert cause["stdout_log"] == str(run.rank_file(1, "stdout.log"))
    assert cause["traceback"] == [
        {
            "exc_type": "ValueError",
            "exc_value": "boom from rank 1",
            "link": None,
            "frames": fail_raise_frames(),
        }
    ]
    assert not any(is_launcher_file(f["filename"]) for f in all_frames(cause))

    # The error file: torch's @record format plus the bootstrap's own key.
    record = json.loads(error_file.read_text())
    assert record["message"]["message"] == "ValueError: boom from rank 1"
    callstack = record["message"]["extraInfo"]["py_callstack"]
    assert callstack.startswith(TRACEBACK_HEADER)
    assert "bootstrap.py" not in callstack and "runpy" not in callstack
    assert int(record["message"]["extraInfo"]["timestamp"]) == int(record["elastic_hydra"]["time"])
    assert record["elastic_hydra"]["stacks"] == cause["traceback"]
    assert cause["time"] == record["elastic_hydra"]["time"]  # the worker's own time

    # Ranks 0 and 2 were stopped by the launcher: failure records, never the cause.
    failures = run.summary["failures"]
    assert failures[0] == cause  # the failure seen first, then the ranks stopped because of it
    assert sorted(f["rank"] for f in failures[1:]) == [0, 2]
    for rank in (0, 2):
        peer = run.failure(rank)
        assert_terminated_peer(peer)
        assert peer["error_file"] is None
        assert peer["time"] >= cause["time"]
    exits = {e["rank"]: e for e in run.summary["exits"]}
    assert sorted(exits) == [0, 1, 2]
    assert exits[1]["terminated_by_launcher"] is False
    assert exits[0]["terminated_by_launcher"] and exits[2]["terminated_by_launcher"]

    # The worker printed the traceback as Python does, without the bootstrap's or runpy's frames.
    stderr_log = run.rank_file(1, "stderr.log").read_text()
    expected = [
        TRACEBACK_HEADER,
        *[line for f in fail_raise_frames() for line in (python_frame_line(f), f"    {f['line']}")],
        "ValueError: boom from rank 1",
    ]
    assert traceback_block(stderr_log) == expected
    assert "bootstrap.py" not in stderr_log and "runpy" not in stderr_log
    assert cause["stderr_tail"] == stderr_log.splitlines()

    # The report: the same traceback text, and the other ranks as stopped by the launcher.
    assert traceback_block(run.report) == expected
    assert "bootstrap.py" not in run.report and "runpy" not in run.report
    assert_report_peers(run.report, [run.failure(0), run.failure(2)])
    assert "[default" not in run.report  # logs=quiet: no worker line on the console


def test_report_on_console_with_tee(tmp_path: Path) -> None:
    """With worker output teed to the console, the report still follows with the traceback."""
    run = launch_fail(tmp_path, "raise", quiet=False)
    assert_root_rank(run, 1)
    assert "[default1]:ValueError: boom from rank 1" in run.report  # the worker's own line
    report = run.report[run.report.index("elastic-hydra: failed") :]
    assert python_frame_line(fail_raise_frames()[-1]) in report.splitlines()
    assert "ValueError: boom from rank 1" in report.splitlines()
    assert_report_peers(report, [run.failure(0)])


# ---------------------------------------------------------------------------- 3 a -m entrypoint
MODULE_SOURCE = """\
import os
import time


def explode():
    raise OSError("disk on fire in rank " + os.environ["RANK"])


def main():
    if os.environ["RANK"] == "1":
        explode()
    time.sleep(60)


if __name__ == "__main__":
    main()
"""


def test_module_entrypoint_raise_has_its_traceback(tmp_path: Path) -> None:
    package = tmp_path / "boompkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    module = package / "boom.py"
    module.write_text(MODULE_SOURCE)
    run = launch(tmp_path, "module=boompkg.boom", "nproc_per_node=2")
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["source"] == "exception"
    assert cause["message"] == "OSError: disk on fire in rank 1"
    frames = [
        frame(module, "<module>", "main()"),
        frame(module, "main", "explode()"),
        frame(module, "explode", 'raise OSError("disk on fire in rank " + os.environ["RANK"])'),
    ]
    assert cause["traceback"] == [
        {
            "exc_type": "OSError",
            "exc_value": "disk on fire in rank 1",
            "link": None,
            "frames": frames,
        }
    ]
    assert_terminated_peer(run.failure(0))
    for text in (run.report, run.rank_file(1, "stderr.log").read_text()):
        block = traceback_block(text)
        assert block[0] == TRACEBACK_HEADER
        assert [line for line in block if line.startswith('  File "')] == [
            python_frame_line(f) for f in frames
        ]
        assert block[-1] == "OSError: disk on fire in rank 1"
        assert "runpy" not in text and "bootstrap.py" not in text


# ------------------------------------------------------------------------- 4 chained exceptions
CHAINED_SOURCE = """\
import os
import sys
import time


def load():
    raise KeyError("missing")


def main(link):
    try:
        load()
    except KeyError as err:
        if link == "cause":
            raise RuntimeError("could not load") from err
        raise RuntimeError("could not load while handling")


if __name__ == "__main__":
    if os.environ["RANK"] == "1":
        main(sys.argv[1])
    time.sleep(60)
"""
LINK_TEXT = {
    "cause": "The above exception was the direct cause of the following exception:",
    "context": "During handling of the above exception, another exception occurred:",
}


@pytest.mark.parametrize("bootstrap", [True, False])
@pytest.mark.parametrize("link", ["cause", "context"])
def test_chained_exceptions_keep_every_stack(tmp_path: Path, link: str, bootstrap: bool) -> None:
    script = tmp_path / "chained.py"
    script.write_text(CHAINED_SOURCE)
    run = launch(
        tmp_path, f"script={script}", "nproc_per_node=2", f"bootstrap={bootstrap}", args=(link,)
    )
    assert_root_rank(run, 1)
    cause = run.cause
    # Without the bootstrap the same chain is parsed back from what Python printed.
    assert cause["source"] == ("exception" if bootstrap else "stderr")
    last_line = (
        'raise RuntimeError("could not load") from err'
        if link == "cause"
        else 'raise RuntimeError("could not load while handling")'
    )
    message = "could not load" if link == "cause" else "could not load while handling"
    assert cause["message"] == f"RuntimeError: {message}"
    assert cause["traceback"] == [
        {
            "exc_type": "KeyError",
            "exc_value": "'missing'",
            "link": link,
            "frames": [
                frame(script, "main", "load()"),
                frame(script, "load", 'raise KeyError("missing")'),
            ],
        },
        {
            "exc_type": "RuntimeError",
            "exc_value": message,
            "link": None,
            "frames": [
                frame(script, "<module>", "main(sys.argv[1])"),
                frame(script, "main", last_line),
            ],
        },
    ]
    lines = run.report.splitlines()
    first = lines.index("KeyError: 'missing'")
    assert lines[first + 1 : first + 4] == ["", LINK_TEXT[link], ""]
    assert lines[first + 4] == TRACEBACK_HEADER
    assert f"RuntimeError: {message}" in lines[first + 4 :]
    assert lines.count(TRACEBACK_HEADER) == 2


# -------------------------------------------------------------------------- 5 torch's @record
def test_torch_record_error_file_is_read_and_its_wrapper_hidden(tmp_path: Path) -> None:
    run = launch_fail(tmp_path, "raise", "--torch-record")
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["source"] == "error_file"
    assert "boom from rank 1" in cause["message"]
    assert cause["error_file"] == str(run.rank_file(1, "error.json"))
    # torch wrote the file (the bootstrap kept it): its call stack has the wrapper's frame...
    record = json.loads(run.rank_file(1, "error.json").read_text())
    assert "elastic_hydra" not in record
    assert TORCH_RECORD_FILE in record["message"]["extraInfo"]["py_callstack"]
    # ...which the summary and the report hide.
    (stack,) = cause["traceback"]
    assert (stack["exc_type"], stack["exc_value"], stack["link"]) == (
        "ValueError", "boom from rank 1", None,
    )  # fmt: skip
    assert stack["frames"], stack
    assert stack["frames"][-1] == frame(FAIL, "fail", RAISE_LINE)
    assert not any(is_launcher_file(f["filename"]) for f in stack["frames"])
    assert TORCH_RECORD_FILE not in run.report
    block = traceback_block(run.report)
    assert block[0] == TRACEBACK_HEADER
    assert block[-3:] == [
        python_frame_line(frame(FAIL, "fail", RAISE_LINE)), f"    {RAISE_LINE}",
        "ValueError: boom from rank 1",
    ]  # fmt: skip
    assert_terminated_peer(run.failure(0))
    assert_report_peers(run.report, [run.failure(0)])


# ---------------------------------------------------------------------------------- 6 crashes
CRASHES = {
    # mode: (signal, exit text, faulthandler's words, fail.py's line)
    "segv": (signal.SIGSEGV, "segmentation fault (SIGSEGV)", "Segmentation fault",
             "ctypes.string_at(0)"),
    "abrt": (signal.SIGABRT, "aborted (SIGABRT)", "Aborted", "os.abort()"),
    "fpe": (signal.SIGFPE, "floating-point exception (SIGFPE)", "Floating point exception",
            "os.kill(os.getpid(), signal.SIGFPE)"),
}  # fmt: skip


@pytest.mark.parametrize("mode", sorted(CRASHES))
def test_crash_stack_comes_from_the_fault_file(tmp_path: Path, mode: str) -> None:
    sig, exit_text, what, source_line = CRASHES[mode]
    run = launch_fail(tmp_path, mode)
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == -sig
    assert cause["signal"] == sig.name
    assert cause["exit"].startswith(exit_text)
    if mode == "segv":
        assert cause["exit"] == "segmentation fault (SIGSEGV)"
    assert cause["source"] == "crash"
    assert cause["message"] == f"Fatal Python error: {what}"
    assert cause["error_file"] is None
    (stack,) = cause["traceback"]
    assert (stack["exc_type"], stack["exc_value"]) == ("Fatal Python error", what)
    crash_frame = {"filename": FAIL, "lineno": line_of(FAIL, source_line), "name": "fail"}
    frames = [{k: f[k] for k in crash_frame} for f in stack["frames"]]
    assert crash_frame in frames
    assert frames[:2] == [  # oldest first
        {"filename": FAIL, "lineno": line_of(FAIL, "main()"), "name": "<module>"},
        {"filename": FAIL, "lineno": line_of(FAIL, "run(opts.mode, rank)"), "name": "main"},
    ]
    assert not any(is_launcher_file(f["filename"]) for f in stack["frames"])
    # Read from the worker's faulthandler file.
    dump = run.rank_file(1, "fault.log").read_text()
    assert f"Fatal Python error: {what}" in dump
    assert f'File "{FAIL}", line {crash_frame["lineno"]} in fail' in dump
    assert cause["stderr_tail"] == []
    assert Path(cause["stderr_log"]).exists()
    # The report: the crash and its Python stack.
    assert f"Fatal Python error: {what}" in run.report
    assert python_frame_line(crash_frame) in run.report.splitlines()
    assert exit_text in run.report
    assert_terminated_peer(run.failure(0))
    assert_report_peers(run.report, [run.failure(0)])


def test_sigkill_is_explained_as_a_likely_oom_kill(tmp_path: Path) -> None:
    run = launch_fail(tmp_path, "kill")
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == -signal.SIGKILL
    assert cause["signal"] == "SIGKILL"
    assert "OOM" in cause["exit"] and "SIGKILL" in cause["exit"]
    assert cause["source"] == "none"
    assert cause["message"] == ""
    assert cause["traceback"] == []
    assert cause["error_file"] is None
    assert isinstance(cause["stderr_tail"], list)
    assert Path(cause["stderr_log"]).exists()
    assert cause["stderr_log"] == str(run.rank_file(1, "stderr.log"))
    assert cause["exit"] in run.report
    assert_terminated_peer(run.failure(0))


# ------------------------------------------------------------------- 8 exits without traceback
EXITS = {
    "exit3": (3, "rank 1: giving up with exit code 3"),
    "os_exit": (4, "rank 1: leaving through os._exit(4)"),
}


@pytest.mark.parametrize("mode", sorted(EXITS))
def test_exit_code_without_traceback_shows_the_stderr_tail(tmp_path: Path, mode: str) -> None:
    code, last_line = EXITS[mode]
    run = launch_fail(tmp_path, mode)
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == code
    assert cause["signal"] is None
    assert cause["exit"] == f"exit code {code}"
    assert cause["source"] == "none"
    assert cause["message"] == ""
    assert cause["traceback"] == []
    assert cause["error_file"] is None
    assert not run.rank_file(1, "error.json").exists()
    assert cause["stderr_tail"] == [last_line]
    assert TRACEBACK_HEADER not in run.report
    lines = run.report.splitlines()
    head = lines.index(f"last 1 line(s) of {cause['stderr_log']}:")
    assert lines[head + 1] == f"  {last_line}"
    assert_report_peers(run.report, [run.failure(0)])


# ------------------------------------------------------------------------ 9 non-Python programs
TAIL_SH = """\
#!/bin/sh
if [ "$RANK" = "1" ]; then
  echo "stdout noise"
  for i in 1 2 3 4 5 6; do echo "line $i of rank $RANK" >&2; done
  exit 5
fi
exec sleep 60
"""
PY_TRACEBACK_SH = """\
#!/bin/sh
if [ "$RANK" = "1" ]; then
  echo "about to fail" >&2
  "$1" -c 'raise KeyError(1)'
  exit
fi
exec sleep 60
"""


def write_program(tmp_path: Path, name: str, text: str) -> Path:
    program = tmp_path / name
    program.write_text(text)
    program.chmod(0o755)
    return program


def test_cmd_failure_shows_the_last_tail_lines_of_stderr(tmp_path: Path) -> None:
    program = write_program(tmp_path, "tail.sh", TAIL_SH)
    run = launch(tmp_path, f"cmd={program}", "nproc_per_node=2", "logs.tail_lines=3")
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == 5
    assert cause["exit"] == "exit code 5"
    assert cause["source"] == "none"
    assert cause["traceback"] == []
    assert cause["stderr_tail"] == [f"line {i} of rank 1" for i in (4, 5, 6)]
    assert run.rank_file(1, "stderr.log").read_text().count("\n") == 6  # the file has them all
    assert run.rank_file(1, "stdout.log").read_text() == "stdout noise\n"
    lines = run.report.splitlines()
    head = lines.index(f"last 3 line(s) of {cause['stderr_log']}:")
    assert lines[head + 1 : head + 4] == [f"  line {i} of rank 1" for i in (4, 5, 6)]
    assert "line 3 of rank 1" not in run.report
    assert "stdout noise" not in run.report
    assert_report_peers(run.report, [run.failure(0)])


def test_cmd_printing_a_python_traceback_is_parsed_from_stderr(tmp_path: Path) -> None:
    program = write_program(tmp_path, "pytb.sh", PY_TRACEBACK_SH)
    run = launch(tmp_path, f"cmd={program}", "nproc_per_node=2", args=(sys.executable,))
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == 1
    assert cause["source"] == "stderr"
    assert cause["message"] == "KeyError: 1"
    assert cause["error_file"] is None
    (stack,) = cause["traceback"]
    assert (stack["exc_type"], stack["exc_value"], stack["link"]) == ("KeyError", "1", None)
    (fr,) = stack["frames"]
    assert (fr["filename"], fr["lineno"], fr["name"]) == ("<string>", 1, "<module>")
    assert fr["line"] in ("", "raise KeyError(1)")  # Python 3.13 shows -c source lines
    assert cause["stderr_tail"][0] == "about to fail"
    assert cause["stderr_tail"][-1] == "KeyError: 1"
    block = traceback_block(run.report)
    assert block[0] == TRACEBACK_HEADER
    assert block[1] == '  File "<string>", line 1, in <module>'
    assert block[-1] == "KeyError: 1"


# ------------------------------------------------------------------------ 10 bootstrap=false
def test_without_bootstrap_the_traceback_is_found_in_stderr(tmp_path: Path) -> None:
    run = launch(tmp_path, f"script={FAIL}", "nproc_per_node=2", "bootstrap=false", args=("raise",))
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == 1
    assert cause["source"] == "stderr"
    assert cause["message"] == "ValueError: boom from rank 1"
    # No bootstrap, no @record: nobody wrote the error file.
    assert cause["error_file"] is None
    assert not run.rank_file(1, "error.json").exists()
    assert cause["traceback"] == [
        {
            "exc_type": "ValueError",
            "exc_value": "boom from rank 1",
            "link": None,
            "frames": fail_raise_frames(),
        }
    ]
    block = traceback_block(run.report)
    assert block == traceback_block(run.rank_file(1, "stderr.log").read_text())
    assert block[-2:] == [f"    {RAISE_LINE}", "ValueError: boom from rank 1"]
    assert_report_peers(run.report, [run.failure(0)])


# ------------------------------------------------------------------ 11 a shell's 128+N exit
KILLED_SH = {
    "exit_137": '#!/bin/sh\nif [ "$RANK" = "1" ]; then exit 137; fi\nexec sleep 60\n',
    "child_sigkilled": (
        '#!/bin/sh\nif [ "$RANK" = "1" ]; then\n  sh -c \'kill -9 $$\'\n  exit\nfi\nexec sleep 60\n'
    ),
}


@pytest.mark.parametrize("how", sorted(KILLED_SH))
def test_shell_exit_137_is_decoded_as_sigkill(tmp_path: Path, how: str) -> None:
    program = write_program(tmp_path, "killed.sh", KILLED_SH[how])
    run = launch(tmp_path, f"cmd={program}", "nproc_per_node=2")
    assert_root_rank(run, 1)
    cause = run.cause
    assert cause["returncode"] == 137
    assert cause["signal"] == "SIGKILL"
    assert cause["exit"].startswith("exit code 137: killed (SIGKILL)")
    assert "OOM" in cause["exit"]
    assert cause["source"] == "none"
    assert "137" in run.summary["message"]
    assert cause["exit"] in run.report
    assert_terminated_peer(run.failure(0))


# ----------------------------------------------------------------------------- __main__ edges
ATEXIT_PICKLE_SOURCE = """\
import atexit
import pickle
import sys


class Config:
    pass


def save_at_exit(path):
    try:
        pickle.dumps(Config())
        result = "ok"
    except Exception as exc:
        result = f"{type(exc).__name__}: {exc}"
    with open(path, "w") as f:
        f.write(result)


if __name__ == "__main__":
    atexit.register(save_at_exit, sys.argv[1])
"""


def test_atexit_handler_can_pickle_a_class_of_the_script(tmp_path: Path) -> None:
    script = tmp_path / "atexit_pickle.py"
    script.write_text(ATEXIT_PICKLE_SOURCE)
    results = {}
    for how, prefix in (("plain", []), ("bootstrap", [BOOTSTRAP])):
        out = tmp_path / f"{how}.txt"
        run_plain([*prefix, str(script), str(out)], cwd=tmp_path)
        results[how] = out.read_text()
    assert results["plain"] == "ok"
    assert results["bootstrap"] == results["plain"]


UNPRINTABLE_SOURCE = """\
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


def fail():
    raise Unprintable()


fail()
"""


def test_exception_with_failing_str_is_still_recorded(tmp_path: Path) -> None:
    script = tmp_path / "unprintable.py"
    script.write_text(UNPRINTABLE_SOURCE)
    error_file = tmp_path / "error.json"
    proc = subprocess.run(
        [sys.executable, "-u", BOOTSTRAP, str(script)],
        env=launcher_env(TORCHELASTIC_ERROR_FILE=str(error_file)),
        capture_output=True,
        timeout=PLAIN_TIMEOUT,
        check=False,
    )
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1, stderr
    # What `python unprintable.py` prints, and nothing of the bootstrap's.
    assert traceback_block(stderr)[-1] == "Unprintable: <exception str() failed>"
    assert "bootstrap.py" not in stderr
    assert error_file.exists()


# ------------------------------------------------------------------------------ Ctrl-C, quietly
INTERRUPTED = """
import atexit, sys, time
atexit.register(lambda: open(sys.argv[2], "w").write("atexit ran"))
open(sys.argv[1], "w").close()

def train():  # short sleeps, as a training loop's steps: Python runs a signal's handler between
    for _ in range(300):  # two calls, so one that came just before a sleep began waits 0.1 s,
        time.sleep(0.1)  # not the whole sleep (CPython's race: 1 SIGINT in ~300 missed 30 s here)

train()
"""


def _as_from_a_shell() -> None:
    """In the child, before exec: SIGINT as a shell gives it (default, not blocked), whatever
    this test process inherited or a library it loaded set at the C level (a Python that
    starts with SIGINT ignored installs no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.mark.parametrize("bootstrap", [False, True], ids=["python", "bootstrap"])
def test_sigint_ends_the_worker_as_python_does_without_the_traceback(
    tmp_path: Path, bootstrap: bool
) -> None:
    """Python's own ending on SIGINT (atexit handlers, then killed by SIGINT), compared fact by
    fact with plain `python script.py`; only the KeyboardInterrupt traceback is gone."""
    from tests.conftest import wait_for

    script, ready, done = tmp_path / "interrupted.py", tmp_path / "ready", tmp_path / "done"
    script.write_text(INTERRUPTED)
    argv = [sys.executable, "-u", *([BOOTSTRAP] if bootstrap else []), str(script)]
    proc = subprocess.Popen(
        [*argv, str(ready), str(done)], env=launcher_env(), stderr=subprocess.PIPE,
        preexec_fn=_as_from_a_shell,  # noqa: PLW1509 (two signal calls, no lock taken)
    )  # fmt: skip
    try:
        wait_for(ready.exists, PLAIN_TIMEOUT, "the script to start")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=PLAIN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGINT
    assert done.read_text() == "atexit ran"
    if bootstrap:
        assert err == b""
    else:
        assert b"KeyboardInterrupt" in err and b"in train" in err  # what the bootstrap hides
