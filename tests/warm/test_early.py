"""The template started at the agent's first instant (`warm/early.py`).

The guess from the command line is pure and tested against the plan the composition makes of
the same command line: equal where the command line says it plainly, None where it does not.
End to end, a launch adopts the early template (one import, made before the composition was
saved), and a launch that fails its configuration leaves no template behind.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from elastic_hydra.warm.early import BOOTSTRAP, TemplateArgs, guess
from elastic_hydra.warm.pool import template_args
from tests.conftest import WORKERS, wait_for
from tests.harness import plan_of, run_raw

pytestmark = pytest.mark.timeout(120)

FACTS = str(WORKERS / "process_facts.py")
ENVIRON = {"PATH": "/usr/bin", "HOME": "/root", "PYTHONPATH": "/src"}


def _no_file(path: str) -> str | None:
    raise AssertionError(f"read {path}")


def _guess(*argv: str, cwd: str = "/", files: dict[str, str] | None = None) -> TemplateArgs | None:
    return guess(argv, cwd, ENVIRON, (files or {}).get if files is not None else _no_file)


# ------------------------------------------------------------------------- the guess, pure
def test_a_plain_command_line_says_the_whole_template() -> None:
    args = _guess(f"script={FACTS}", "nproc_per_node=4", "warm.imports=[torch, 'json']",
                  "env.MKL_NUM_THREADS=2", "--", "--lr", "0.1")  # fmt: skip
    assert args is not None
    assert args.imports == ("torch", "json")
    assert args.python == sys.executable and args.bootstrap == BOOTSTRAP
    assert args.path0 == str(WORKERS)
    env = args.env
    assert env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "2"
    assert env["PYTHONPATH"] == "/src" and "LOCAL_WORLD_SIZE" not in env


def test_one_worker_gets_no_thread_default_and_a_module_runs_from_the_cwd() -> None:
    args = _guess("module=pkg.train", "warm.imports=[torch]", cwd="/work")
    assert args is not None
    assert args.path0 == "/work" and "OMP_NUM_THREADS" not in args.env


@pytest.mark.parametrize(
    "argv",
    [
        (f"script={FACTS}",),  # no warm.imports: cold
        (f"script={FACTS}", "warm.imports=[]"),
        ("cmd=./train", "warm.imports=[torch]"),
        (f"script={FACTS}", "warm.imports=[torch]", "bootstrap=false"),
        (f"script={FACTS}", "warm.imports=[torch nn]"),  # refused by the resolver later
        ("script=/no/such.py", "warm.imports=[torch]"),
        (f"script={FACTS}", "module=x", "warm.imports=[torch]"),
        ("-m", f"script={FACTS}", "warm.imports=[torch]"),  # a sweep
        ("--plan", f"script={FACTS}", "warm.imports=[torch]"),
        ("--nproc-per-node=2", FACTS, "warm.imports=[torch]"),  # torchrun's form
        (f"script={FACTS}", "warm.imports=[torch]", "hydra.job.chdir=true"),
        (f"script={FACTS}", "warm.imports=[torch]", "env.X=${oc.env:HOME}"),
        (f"script={FACTS}", "warm.imports=[torch]", "~env"),
    ],
)
def test_a_command_line_that_does_not_say_it_plainly_starts_nothing(argv: tuple[str, ...]) -> None:
    assert _guess(*argv) is None


def test_a_job_files_top_level_says_it_and_the_command_line_wins() -> None:
    job = f"script: {FACTS}\nnproc_per_node: 1\nwarm:\n  imports: [torch]\nenv:\n  A: b\n"
    args = _guess("/jobs/j.yaml", "nproc_per_node=2", files={"/jobs/j.yaml": job})
    assert args is not None
    assert args.imports == ("torch",)
    assert args.env["A"] == "b" and args.env["OMP_NUM_THREADS"] == "1"
    assert _guess("/jobs/j.yaml", "warm.imports=[]", files={"/jobs/j.yaml": job}) is None
    for bad in ("[unclosed", "- a list", "env: [1]", f"script: {FACTS}\n"):
        assert _guess("/jobs/j.yaml", files={"/jobs/j.yaml": bad}) is None, bad
    assert _guess("/jobs/missing.yaml", files={}) is None


@pytest.mark.parametrize(
    "argv",
    [
        (f"script={FACTS}", "nproc_per_node=4", "warm.imports=[json]"),
        (f"script={FACTS}", "warm.imports=[json,csv]", "env.MKL_NUM_THREADS=2"),
        ("module=json.tool", "nproc_per_node=2", "+warm.imports=[json]", "restart=on_failure"),
    ],
)
def test_the_guess_is_the_template_the_plan_asks_for(argv: tuple[str, ...]) -> None:
    """What makes adoption happen: the guess equals what the plan computes, field by field."""
    environ = dict(os.environ)
    planned = template_args(plan_of(*argv), environ, os.getcwd())
    assert planned is not None
    assert guess(argv, os.getcwd(), environ, _no_file) == planned


# -------------------------------------------------------------------------- end to end
COUNTED = (
    "import os, time\n"
    "with open(os.environ['COUNTED_FILE'], 'a') as f:\n"
    "    f.write(f'{time.time()!r}\\n')\n"
)


def test_the_launch_adopts_the_template_started_before_the_composition(tmp_path: Path) -> None:
    (tmp_path / "counted.py").write_text(COUNTED)
    counted = tmp_path / "imports.txt"
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    proc = run_raw(
        f"script={FACTS}", "nproc_per_node=2", "warm.imports=[counted]", f"logs.root={logs}",
        "logs=quiet", "--", str(out), cwd=tmp_path, timeout=60,
        env={"PYTHONPATH": str(tmp_path), "COUNTED_FILE": str(counted),
             "FACTS_PROBE_MODULE": "counted"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    imported = [float(t) for t in counted.read_text().split()]
    assert len(imported) == 1, imported  # one template: the early one, adopted
    (config,) = logs.glob("*/*/.hydra/config.yaml")
    assert imported[0] < config.stat().st_mtime  # it imported before the composition was saved
    for rank in (0, 1):
        facts = json.loads((out / f"facts_{rank}_0.json").read_text())
        assert facts["probe_imported"] is True  # forked from it


def _templates_of(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(marker in c for c in cmd):
            found.append(p)
    return found


def test_a_configuration_error_leaves_no_early_template(tmp_path: Path) -> None:
    script = tmp_path / "train.py"  # the template's command line names its directory
    script.write_text("pass\n")
    started = tmp_path / "started"  # the template got to its imports: it was started early
    (tmp_path / "slow.py").write_text(
        f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(30)\n"
    )
    proc = run_raw(
        f"script={script}", "warm.imports=[slow]", "restart.max_restarts=-3",
        f"logs.root={tmp_path / 'logs'}", cwd=tmp_path, timeout=60,
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr.decode()
    assert not (tmp_path / "logs").exists()
    assert started.exists()
    wait_for(lambda: not _templates_of(str(tmp_path)), 10, "the early template to be gone")
