"""The console tee: collateral tracebacks folded into one line, the log files kept whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from elastic_hydra.workers.console import LinePrefixer
from tests.harness import run_raw

pytestmark = pytest.mark.timeout(60)

GLOO = (
    b"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
    b"peer [127.0.0.1]:41234"
)
COLLATERAL_TB = (
    b"Traceback (most recent call last):\n"
    b'  File "/job/train.py", line 38, in <module>\n'
    b"    dist.all_reduce(t)\n"
    b'  File "/site/torch/distributed/c10d_logger.py", line 81, in wrapper\n'
    b"    return func(*args, **kwargs)\n"
    b"           ^^^^^^^^^^^^^^^^^^^^^\n" + GLOO + b"\n"
)
REAL_TB = (
    b"Traceback (most recent call last):\n"
    b'  File "/job/train.py", line 12, in <module>\n'
    b"    raise ValueError('bad batch')\n"
    b"ValueError: bad batch\n"
)


class Sink:
    """A console that keeps what it is given."""

    def __init__(self) -> None:
        self.text = b""

    def lines(
        self, stream: int, units: list[list[bytes]], rank: int, prefix: bytes, group: object
    ) -> None:
        self.text += b"".join(prefix + line + b"\n" for unit in units for line in unit)


def shown(*chunks: bytes, fold: str | None = "/run/attempt_0/1/stderr.log") -> bytes:
    sink = Sink()
    prefixer = LinePrefixer(b"[r1]:", sink, 2, fold_into=fold)  # type: ignore[arg-type]
    for chunk in chunks:
        prefixer.feed(chunk)
    prefixer.flush()
    return sink.text


def test_a_collateral_traceback_is_one_line_naming_the_log() -> None:
    text = shown(b"step 3\n" + COLLATERAL_TB + b"after\n")
    assert text.splitlines() == [
        b"[r1]:step 3",
        b"[r1]:" + GLOO + b"  (collateral: a peer went away; traceback of 7 lines folded, whole "
        b"in /run/attempt_0/1/stderr.log)",
        b"[r1]:after",
    ]


def test_a_traceback_that_torch_tagged_with_its_rank_folds_the_same() -> None:
    """torch.distributed's excepthook starts every line with "[rank0]: " (measured: a survivor
    of a node killed mid all_reduce, gloo's "Connection reset by peer")."""
    tagged = b"".join(b"[rank0]: " + ln + b"\n" for ln in COLLATERAL_TB.splitlines())
    (line,) = shown(tagged).splitlines()
    assert line.startswith(b"[r1]:[rank0]: " + GLOO + b"  (collateral: a peer went away;")
    untagged = b"[rank0]: Traceback (most recent call last):\n[rank0]:   File x\n[rank0]: E: y\n"
    assert len(shown(untagged).splitlines()) == 3  # not collateral: whole


def test_the_same_traceback_in_pieces_folds_the_same() -> None:
    whole = shown(COLLATERAL_TB)
    pieces = [COLLATERAL_TB[i : i + 7] for i in range(0, len(COLLATERAL_TB), 7)]
    assert shown(*pieces) == whole
    assert len(whole.splitlines()) == 1


def test_other_tracebacks_and_unfolded_streams_pass_whole() -> None:
    assert shown(REAL_TB) == b"".join(b"[r1]:" + ln + b"\n" for ln in REAL_TB.splitlines())
    assert shown(COLLATERAL_TB, fold=None).count(b"\n") == 7  # stdout: never folded
    # A traceback cut short by the end of the stream is shown as far as it went.
    assert shown(COLLATERAL_TB[:60]).startswith(b"[r1]:Traceback (most recent call last):\n")


RANKS = """
import os, sys, time, traceback
marker = sys.argv[2]
if os.environ["RANK"] == "0":  # a traceback that is not collateral, then wait to be stopped
    try:
        raise ValueError("shown whole")
    except ValueError:
        traceback.print_exc()
    open(marker, "w").close()
    time.sleep(30)
while not os.path.exists(marker):
    time.sleep(0.01)
raise RuntimeError(sys.argv[1])
"""


def test_the_console_folds_a_survivors_collateral_traceback_and_the_log_keeps_it(
    tmp_path: Path,
) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    logs = tmp_path / "logs"
    proc = run_raw(
        f"script={script}", "nproc_per_node=2", f"logs.root={logs}",
        "--", GLOO.decode().removeprefix("RuntimeError: "), str(tmp_path / "marker"),
        cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr.decode()
    console = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("[default1]:")]
    (line,) = console  # one line instead of the traceback
    assert "Connection closed by peer" in line and re.search(r"traceback of \d+ lines folded", line)
    assert "attempt_0/1/stderr.log" in line
    (summary,) = logs.rglob("summary.json")
    log = (summary.parent / "attempt_0/1/stderr.log").read_text()
    assert log.startswith("Traceback (most recent call last):") and "raise RuntimeError" in log
    rank0 = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("[default0]:")]
    assert rank0[0] == "[default0]:Traceback (most recent call last):", rank0
    assert rank0[-1] == "[default0]:ValueError: shown whole", rank0
    assert json.loads(summary.read_text())["root_cause"]["rank"] == 1
