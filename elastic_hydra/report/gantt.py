"""`report SWEEP_DIR --html FILE`: a sweep as one self-contained page, the pool's Gantt chart.
Pure: pool.json's object and the jobs' results in, the page's text out.

A row per slot of the pool (from pool.json: which job ran in which slot, when), each job a bar
on its slot from its start to its end, coloured by how it ended and named `job N`; then a row
per job with its overrides, status, exit code and ledger. A sweep that the pool did not run (no
pool.json) draws a row per job from its summary's start and duration.

pool.json and the results are read back as untrusted data: a row that does not read is skipped
and counted, never fatal; every string reaches the page through `timeline.esc`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from elastic_hydra.records.goodput import Phase
from elastic_hydra.records.summary import JobResult
from elastic_hydra.report.timeline import EXIT_COLOURS, WIDTH, document, esc

LABEL, ROW, TOP = 150, 22, 26
STATE_COLOURS = {
    "succeeded": EXIT_COLOURS["ok"], "failed": EXIT_COLOURS["failed"], "stopped": "#6d4c41",
    "running": EXIT_COLOURS["no exit recorded"], "queued": "#bdbdbd",
}  # fmt: skip
_MAX_ROWS = 100_000  # more jobs than any pool.json we write holds: the rest is not read


@dataclass(frozen=True, slots=True, kw_only=True)
class JobBar:
    """One job of the sweep on the chart: its slot (None: not known) and seconds from the
    sweep's start."""

    number: int
    slot: int | None
    where: str
    state: str
    start: float | None
    end: float | None
    overrides: tuple[str, ...] = ()
    exit_code: int | None = None


def pool_bars(pool: object) -> tuple[list[JobBar], int]:
    """pool.json's jobs as bars, and how many of its rows did not read (skipped)."""
    jobs = pool.get("jobs") if isinstance(pool, Mapping) else None
    if not isinstance(jobs, list):
        return [], 0
    bars, bad = [], 0
    for row in jobs[:_MAX_ROWS]:
        bar = _bar(row)
        if bar is None:
            bad += 1
        else:
            bars.append(bar)
    return bars, bad


def _bar(row: object) -> JobBar | None:
    """One row of pool.json, every field checked; None where it does not read."""
    if not isinstance(row, Mapping):
        return None
    number, slot, state = row.get("number"), row.get("slot"), row.get("state")
    start, end, code = row.get("start_s"), row.get("end_s"), row.get("exit_code")
    overrides = row.get("overrides", [])
    if type(number) is not int:
        return None
    ok = (
        (slot is None or type(slot) is int)
        and state in STATE_COLOURS
        and all(t is None or type(t) in (int, float) for t in (start, end))
        and (code is None or type(code) is int)
        and isinstance(overrides, list)
        and all(isinstance(o, str) for o in overrides)
    )
    if not ok:
        return None
    where = row.get("where")
    return JobBar(
        number=number, slot=slot, where=where if isinstance(where, str) else "",
        state=str(state), start=start, end=end, overrides=tuple(overrides), exit_code=code,
    )  # fmt: skip


def result_bars(results: Sequence[JobResult]) -> list[JobBar]:
    """A sweep the pool did not run: each job from its summary, on a row of its own."""
    timed = [r.summary.started for r in results if r.summary and r.summary.started]
    origin = min(timed) if timed else 0.0
    bars = []
    for number, r in enumerate(results):
        s = r.summary
        start = s.started - origin if s and s.started else None
        bars.append(JobBar(
            number=number, slot=None, where="", state="succeeded" if r.exit_code == 0 else "failed",
            start=start, end=None if start is None or s is None else start + s.duration_s,
            overrides=r.overrides, exit_code=r.exit_code,
        ))  # fmt: skip
    return bars


def sweep_page(
    title: str, bars: Sequence[JobBar], results: Sequence[JobResult], bad: int, source: str = ""
) -> str:
    """The sweep's page: the Gantt chart, then the jobs' table (`bad`: rows of the pool's
    record, the file `source`, that did not read)."""
    parts = [f"<h1>{esc(title)}</h1>"]
    failed = [b for b in bars if b.state == "failed" or (b.exit_code or 0) != 0]
    parts.append(
        f'<div class="cause{"" if failed else " ok"}" id="ending">{len(bars)} job(s), '
        f"{len(failed)} failed"
        + (f"; {bad} row(s) of {esc(source)} did not read and are left out" if bad else "")
        + "</div>"
    )
    parts.append("<h2>jobs on the pool's slots</h2>" + _legend())
    parts.append(_chart(bars))
    parts.append(_table(bars, results))
    return document(title, "\n".join(parts))


def _legend() -> str:
    items = "".join(
        f'<span><i class="sw" style="background:{c}"></i>{esc(n)}</span>'
        for n, c in STATE_COLOURS.items()
    )
    return f'<p class="legend">jobs: {items}</p>'


def _chart(bars: Sequence[JobBar]) -> str:
    """A row per slot (a row per job where the slot is not known), bars on one time axis."""
    lanes: dict[str, int] = {}
    for b in sorted(bars, key=lambda b: (b.slot is None, b.slot or 0, b.number)):
        lanes.setdefault(_lane(b), len(lanes))
    end = max([b.end or b.start or 0.0 for b in bars] + [1e-3])
    plot = WIDTH - LABEL - 10
    height = TOP + ROW * len(lanes) + 6

    def x(t: float) -> float:
        return LABEL + plot * min(max(t / end, 0.0), 1.0)

    out = [_ticks(end, x, height)]
    for lane, i in lanes.items():
        out.append(f'<text x="4" y="{TOP + ROW * i + 15}">{esc(lane)}</text>')
    for b in bars:
        if b.start is None:
            continue
        y, x0 = TOP + ROW * lanes[_lane(b)] + 2, x(b.start)
        x1 = x(b.end if b.end is not None else end)
        tip = f"job {b.number}: {b.state} (exit {b.exit_code}) {' '.join(b.overrides)}"
        out.append(
            f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1.5):.1f}" height="{ROW - 4}" '
            f'fill="{STATE_COLOURS[b.state]}" stroke="#fff"><title>{esc(tip)}</title></rect>'
            f'<text x="{x0 + 3:.1f}" y="{y + 13}" fill="#fff">job {b.number}</text>'
        )
    return f'<svg width="{WIDTH}" height="{height}" role="img" id="gantt">{"".join(out)}</svg>'


def _lane(b: JobBar) -> str:
    if b.slot is None:
        return f"job {b.number}"
    return f"slot {b.slot}" + (f" ({b.where})" if b.where and b.where != f"slot {b.slot}" else "")


def _ticks(end: float, x: Callable[[float], float], height: int) -> str:
    steps = (0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300, 600, 3600)
    step = next((s for s in steps if end / s <= 12), 7200)
    out, t = [], 0.0
    while t <= end:
        out.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP - 6}" y2="{height}" '
            f'stroke="#e0e0e0"/><text x="{x(t) + 2:.1f}" y="{TOP - 10}">{t:g} s</text>'
        )
        t = round(t + step, 6)
    return "".join(out)


def _table(bars: Sequence[JobBar], results: Sequence[JobResult]) -> str:
    """A row per job: its overrides, status, exit, slot, times and the share of its wall time
    its workers ran (the ledger's `running`)."""
    by_dir = {r.run_dir: r for r in results}
    rows = [
        '<tr><th>job</th><th class="l">overrides</th><th>status</th><th>exit</th><th>slot</th>'
        "<th>start (s)</th><th>took (s)</th><th>running</th></tr>"
    ]
    for b in sorted(bars, key=lambda b: b.number):
        mine = (r for d, r in by_dir.items() if d.rstrip("/").endswith(f"/{b.number}"))
        result = next(mine, None)
        led = result.summary.ledger if result and result.summary else None
        running = 0.0 if led is None else led.seconds(Phase.RUNNING)
        share = "-" if led is None or not led.wall_s else f"{running / led.wall_s:.0%}"
        took = "-" if b.start is None or b.end is None else f"{b.end - b.start:.2f}"
        start = "-" if b.start is None else f"{b.start:.2f}"
        slot = "-" if b.slot is None else str(b.slot)
        swatch = f'<span class="sw" style="background:{STATE_COLOURS[b.state]}"></span>'
        overrides = esc(" ".join(b.overrides) or "(none)")
        rows.append(
            f'<tr><td>job {b.number}</td><td class="l">{overrides}</td>'
            f"<td>{swatch}{esc(b.state)}</td><td>{esc(b.exit_code)}</td><td>{slot}</td>"
            f"<td>{start}</td><td>{took}</td><td>{share}</td></tr>"
        )
    return f"<h2>jobs</h2><table>{''.join(rows)}</table>"
