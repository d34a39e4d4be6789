"""What users type is shown as typed: rich markup in their words is text, never markup.

`[/x]` in a script argument, an override or an error message once made rich raise a
MarkupError inside `--plan`, the sweep table and the pool's live table (exit 70).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console
from rich.table import Table

from elastic_hydra.agent.events import Finish
from elastic_hydra.agent.outcome import Status
from elastic_hydra.records.summary import JobResult
from elastic_hydra.report import history, plan_view, render
from elastic_hydra.sweeps import view
from elastic_hydra.sweeps.pool import JobRow, PoolJob, State
from tests.report.test_render_golden import plan

HOSTILE = "[/x] [bold]b[/bold] [link=file:///etc]l"


def text_of(table: Table) -> str:
    out = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    out.print(table)
    return out.export_text()


def test_plan_shows_script_args_and_env_values_as_typed() -> None:
    base = plan()
    script = dataclasses.replace(base.entrypoint, args=(HOSTILE,))
    shown = text_of(
        plan_view.plan_table(dataclasses.replace(base, entrypoint=script, env=(("A", HOSTILE),)))
    )
    assert "'[/x] [bold]b[/bold] [link=file:///etc]l'" in shown  # the command
    assert f"A={HOSTILE}" in shown  # the extra env


def test_sweep_and_pool_tables_show_overrides_and_messages_as_typed() -> None:
    result = JobResult(overrides=(f"+tag={HOSTILE}",), exit_code=1, run_dir="/r", message=HOSTILE)
    assert f"+tag={HOSTILE}" in text_of(render.sweep_table([result])).replace("\n", "")
    job = PoolJob(number=0, overrides=(f"+tag={HOSTILE}",), run=lambda: 0, run_dir=Path("."))
    row = JobRow(job=job, state=State.FAILED, result=result)
    shown = text_of(view.pool_table([row], 0.0, lambda r: r.job.overrides[0], max_rows=5))
    assert f"+tag={HOSTILE}" in shown and f"exit 1: {HOSTILE}" in shown


def test_timeline_details_are_text() -> None:
    events = [
        Finish(
            wall_time=0.0,
            mono_time=0.0,
            status=Status.FAILED,
            exit_code=1,
            reason=HOSTILE,
            attempts=1,
        )
    ]
    assert f"reason={HOSTILE}" in text_of(history.timeline(events, plain=True))
    assert HOSTILE in text_of(history.attempts_table(events, plain=True))  # it never started
