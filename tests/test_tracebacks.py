"""Tracebacks as data: Python's text, faulthandler dumps and error files parsed back into frames."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastic_hydra.tracebacks import (
    Frame,
    Stack,
    format_stacks,
    from_json,
    hide_launcher_frames,
    parse_error_record,
    parse_fault,
    parse_python,
    to_json,
)

CHAINED = """\
some output before
Traceback (most recent call last):
  File "/job/train.py", line 7, in step
    1 / 0
    ~~^~~
ZeroDivisionError: division by zero

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/job/train.py", line 12, in <module>
    main()
  File "/job/train.py", line 9, in main
    raise ValueError("bad step") from exc
ValueError: bad step
"""


def test_parse_python_reads_a_chain_oldest_first() -> None:
    stacks = parse_python(CHAINED)
    assert [(s.exc_type, s.exc_value, s.link) for s in stacks] == [
        ("ZeroDivisionError", "division by zero", "cause"),
        ("ValueError", "bad step", None),
    ]
    assert stacks[0].frames == (
        Frame(filename="/job/train.py", lineno=7, name="step", line="1 / 0"),
    )
    assert [f.name for f in stacks[1].frames] == ["<module>", "main"]
    assert stacks[1].frames[1].line == 'raise ValueError("bad step") from exc'


def test_parse_python_takes_the_last_traceback_and_context_links() -> None:
    text = textwrap.dedent(
        """\
        Traceback (most recent call last):
          File "old.py", line 1, in <module>
        KeyError: 'logged earlier'
        more output
        Traceback (most recent call last):
          File "a.py", line 2, in f
        OSError: disk

        During handling of the above exception, another exception occurred:

        Traceback (most recent call last):
          File "a.py", line 4, in f
        RuntimeError
        """
    )
    stacks = parse_python(text)
    assert [(s.exc_type, s.exc_value, s.link) for s in stacks] == [
        ("OSError", "disk", "context"),
        ("RuntimeError", "", None),
    ]


def test_parse_python_keeps_a_multiline_message_and_finds_nothing_in_plain_text() -> None:
    text = 'Traceback (most recent call last):\n  File "a.py", line 1, in <module>\nE: one\ntwo\n'
    (stack,) = parse_python(text)
    assert (stack.exc_type, stack.exc_value) == ("E", "one\ntwo")
    assert parse_python("no traceback here\n") == ()


def test_format_stacks_round_trips_through_the_parser() -> None:
    stacks = parse_python(CHAINED)
    assert parse_python(format_stacks(stacks)) == stacks


def test_real_python_traceback_is_parsed() -> None:
    code = (
        "def f():\n    raise KeyError('k')\n"
        "try:\n    f()\nexcept KeyError as e:\n    raise RuntimeError('x') from e\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    stacks = parse_python(proc.stderr)
    assert [(s.exc_type, s.link) for s in stacks] == [("KeyError", "cause"), ("RuntimeError", None)]
    assert [f.name for f in stacks[0].frames] == ["<module>", "f"]


FAULT = """\
Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/job/crash.py", line 5 in crash
  File "/job/crash.py", line 9 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/site/elastic_hydra/workers/bootstrap.py", line 57 in main

Extension modules: numpy.core._multiarray_umath (total: 1)
"""


def test_parse_fault_reads_the_crashing_thread_innermost_last() -> None:
    stack = parse_fault(FAULT)
    assert stack is not None
    assert (stack.exc_type, stack.exc_value) == ("Fatal Python error", "Segmentation fault")
    (visible,) = hide_launcher_frames([stack])
    assert [(f.filename, f.name) for f in visible.frames] == [
        ("/job/crash.py", "<module>"),
        ("/job/crash.py", "crash"),
        ("/usr/lib/python3.11/ctypes/__init__.py", "string_at"),
    ]
    assert parse_fault("Traceback (most recent call last):\n") is None


def test_real_faulthandler_dump_is_parsed(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import faulthandler, ctypes\nfaulthandler.enable()\n\n"
        "def go():\n    ctypes.string_at(0)\n\ngo()\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == -11
    stack = parse_fault(proc.stderr)
    assert stack is not None and stack.exc_value == "Segmentation fault"
    assert [f.name for f in stack.frames if f.filename == str(script)] == ["<module>", "go"]


TORCH_WRAPPER = "/venv/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py"
TORCH_CALLSTACK = f"""Traceback (most recent call last):
  File "{TORCH_WRAPPER}", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/job/fail_record.py", line 10, in main
    raise ValueError(f"boom from rank {{rank}}")
ValueError: boom from rank 1
"""


@pytest.mark.parametrize(
    "record",
    [
        {
            "message": {
                "message": "ValueError: boom from rank 1",
                "extraInfo": {"py_callstack": TORCH_CALLSTACK, "timestamp": "1795307044"},
            }
        },
        {
            "message": {
                "message": "ValueError: boom from rank 1",
                "extraInfo": {"py_callstack": TORCH_CALLSTACK, "timestamp": "1795307044"},
                "errorCode": 1,
            }
        },
    ],
    ids=["record", "record-with-error-code"],
)
def test_torch_record_files_are_read_without_torchs_wrapper_frame(
    record: dict[str, object],
) -> None:
    message, stacks, when = parse_error_record(json.loads(json.dumps(record)))
    assert message == "ValueError: boom from rank 1"
    assert [(f.filename, f.name) for f in stacks[-1].frames] == [("/job/fail_record.py", "main")]
    assert when is None  # whole seconds: too coarse to order failures by


def test_torchs_new_format_and_our_own_record() -> None:
    message, stacks, when = parse_error_record({"message": "RuntimeError: plain", "timestamp": 1})
    assert (message, stacks, when) == ("RuntimeError: plain", (), None)
    ours = Stack(
        exc_type="KeyError", exc_value="'k'", frames=(Frame(filename="/j.py", lineno=3, name="f"),)
    )
    record = {
        "message": {"message": "KeyError: 'k'"},
        "elastic_hydra": {"time": 12.5, "stacks": to_json((ours,))},
    }
    message, stacks, when = parse_error_record(json.loads(json.dumps(record)))
    assert (message, stacks, when) == ("KeyError: 'k'", (ours,), 12.5)
    assert from_json(to_json((ours,))) == (ours,)


def test_stacks_read_back_from_json_are_checked_field_by_field() -> None:
    chain = (
        Stack(exc_type="KeyError", exc_value="'k'", link="cause",
              frames=(Frame(filename="/j.py", lineno=3, name="f", line="d['k']"),)),
        Stack(exc_type="ValueError", exc_value="v"),
    )  # fmt: skip
    assert from_json(json.loads(json.dumps(to_json(chain)))) == chain
    # A frame whose source was not found: no line, or null for it.
    bare = {"filename": "/j.py", "lineno": 3, "name": "f"}
    assert Frame.from_json(bare) == Frame.from_json({**bare, "line": None})
    assert Frame.from_json(bare) == Frame(filename="/j.py", lineno=3, name="f", line="")
    good = chain[0].to_json()
    for key, bad, field in [
        ("exc_type", 7, "Stack.exc_type"),
        ("exc_value", None, "Stack.exc_value"),
        ("link", ["cause"], "Stack.link"),
        ("frames", "f", "Stack.frames"),
        ("frames", [{**bare, "lineno": "3"}], "Frame.lineno"),
        ("frames", [{**bare, "lineno": True}], "Frame.lineno"),
        ("frames", [7], "Frame"),
    ]:
        with pytest.raises(ValueError, match=field):
            Stack.from_json({**good, key: bad})
    with pytest.raises(ValueError, match="stacks"):
        from_json({"exc_type": "E"})


def test_lines_after_a_traceback_in_a_log_do_not_join_its_message(tmp_path: Path) -> None:
    from elastic_hydra.records.failures import WorkerExit
    from elastic_hydra.report.failure_files import read_failure
    from elastic_hydra.rundir import RunDir

    run = RunDir(tmp_path)
    run.stderr(0, 1).parent.mkdir(parents=True)
    run.stderr(0, 1).write_text(
        'Traceback (most recent call last):\n  File "t.py", line 4, in <module>\n'
        "ValueError: boom\n[W] process group has NOT been destroyed\n"
    )
    exit_ = WorkerExit(
        local_rank=1, rank=1, pid=9, returncode=1, wall_time=0.0, mono_time=0.0, attempt=0
    )
    found = read_failure(run, exit_, host="h", tail_lines=5)
    assert (found.source, found.message) == ("stderr", "ValueError: boom")
    assert found.stderr_tail[-1] == "[W] process group has NOT been destroyed"


@pytest.mark.parametrize(
    "record",
    [
        {"elastic_hydra": {"stacks": [{}]}},  # a stack without its keys
        {"elastic_hydra": {"stacks": 5}},
        {"message": {"message": "x", "extraInfo": 7}},
    ],
)
def test_an_error_file_of_no_known_form_is_passed_over(
    tmp_path: Path, record: dict[str, object]
) -> None:
    # A worker may write anything to its error file; the stderr tail tells what happened.
    from elastic_hydra.records.failures import WorkerExit
    from elastic_hydra.report.failure_files import read_failure
    from elastic_hydra.rundir import RunDir

    run = RunDir(tmp_path)
    run.error_file(0, 0).parent.mkdir(parents=True)
    run.error_file(0, 0).write_text(json.dumps(record))
    run.stderr(0, 0).write_text("Traceback (most recent call last):\nValueError: boom\n")
    exit_ = WorkerExit(
        local_rank=0, rank=0, pid=9, returncode=1, wall_time=0.0, mono_time=0.0, attempt=0
    )
    found = read_failure(run, exit_, host="h", tail_lines=5)
    assert (found.source, found.message) == ("stderr", "ValueError: boom")
