"""`report RUN_DIR --html FILE`: a run as one self-contained HTML page (inline SVG, inline CSS,
no script, nothing fetched). Pure: records and events in, the page's text out; the command
writes it.

The page leads with how the run ended and its root cause, then the goodput ledger as one bar,
then one row per rank across attempts on a shared time axis (wall clock, so the nodes of a
multi-node run line up): each attempt of a rank is a bar from its start to its exit, coloured by
how it ended; restarts, membership changes, hang verdicts and stops are vertical marks with
their details on hover; each node's phases (from the ledger) run above its ranks.

Everything a run wrote is untrusted text here (worker names, script arguments, tracebacks): it
reaches the page only through `html.escape`, so `<script>` in a traceback is shown, never run.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastic_hydra import tracebacks
from elastic_hydra.agent.events import (
    Event,
    Hang,
    MembershipChange,
    Restart,
    SignalReceived,
    Stop,
    WorkerExited,
    WorkersStarted,
)
from elastic_hydra.records.goodput import Ledger, Phase
from elastic_hydra.records.summary import RunStatus, RunSummary
from elastic_hydra.report import goodput

WIDTH, LABEL, ROW, TOP = 1100, 190, 18, 24  # svg px: width, label column, row height, axis band
PHASE_COLOURS = {
    Phase.STARTUP: "#90a4ae", Phase.RENDEZVOUS: "#7e57c2", Phase.PREFLIGHT: "#26a69a",
    Phase.RUNNING: "#43a047", Phase.RESTART: "#e53935", Phase.HUNG: "#fb8c00",
    Phase.STOPPING: "#546e7a", Phase.UNATTRIBUTED: "#eeeeee",
}  # fmt: skip
EXIT_COLOURS = {
    "ok": "#2e7d32", "failed": "#c62828", "stopped by the launcher": "#9e9e9e",
    "stopped after a hang": "#ef6c00", "no exit recorded": "#64b5f6",
}  # fmt: skip
MARKS = {"restart": "#c62828", "membership": "#6a1b9a", "hang": "#ef6c00", "stop": "#212121"}
_CSS = """body{font:14px system-ui,sans-serif;margin:16px;color:#212121}
h1{font-size:20px}h2{font-size:16px;margin-top:20px}
.cause{border-left:4px solid #c62828;background:#fff3f3;padding:8px 12px}
.ok{border-left-color:#2e7d32;background:#f1f8e9}
pre{white-space:pre-wrap;font-size:12px;max-height:320px;overflow:auto}
.legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right}
td:first-child,th:first-child,.l{text-align:left}td:first-child{white-space:nowrap}
svg text{font:11px system-ui,sans-serif}"""


def esc(text: object) -> str:
    """Any text from a run, safe in HTML text and attribute values."""
    return html.escape(str(text), quote=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """One node's run as the page shows it."""

    name: str
    summary: RunSummary | None  # None: the node left no summary (`missing` says why)
    events: Sequence[Event] = ()
    missing: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One rank's attempt: from its start to its exit (wall clock), and how it ended."""

    rank: int
    attempt: int
    start: float
    end: float | None
    how: str  # a key of EXIT_COLOURS
    detail: str


def page(title: str, nodes: Sequence[NodeView]) -> str:
    """The whole page of a run (one node) or of a multi-node run (each node's run)."""
    span = _extent(nodes)
    parts = [f"<h1>{esc(title)}</h1>", _ending(nodes), _ledger_section(nodes)]
    parts.append("<h2>ranks across attempts</h2>" + _legend(EXIT_COLOURS) + _legend(MARKS, "mark"))
    for node in nodes:
        parts.append(_node_svg(node, span))
    return document(title, "\n".join(parts))


def document(title: str, body: str) -> str:
    """A complete page around `body` (already escaped), with its style and nothing external."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def _ending(nodes: Sequence[NodeView]) -> str:
    """How the run ended, and its root cause (the earliest real failure) with its traceback."""
    summaries = [n.summary for n in nodes if n.summary is not None]
    lines = [f"{n.name}: {n.missing}" for n in nodes if n.summary is None]
    for s in summaries:
        lines.insert(0, f"{s.host or 'node'}: {s.status.value} (exit {s.exit_code}) {s.message}")
    causes = [s.root_cause for s in summaries if s.root_cause is not None]
    cause = min(causes, key=lambda c: c.time) if causes else None
    ok = bool(summaries) and all(s.status is RunStatus.SUCCEEDED for s in summaries)
    text = "<br>".join(esc(line) for line in lines)
    if cause is None:
        return f'<div class="cause{" ok" if ok else ""}" id="ending">{text}</div>'
    trace = tracebacks.format_stacks(cause.traceback) or cause.error_text
    head = f"root cause: rank {cause.rank} on {cause.host}, attempt {cause.attempt}: {cause.exit}"
    return (
        f'<div class="cause" id="ending"><b>{esc(head)}</b><br>{esc(cause.message)}<br>'
        f"{text}<pre>{esc(trace)}</pre></div>"
    )


def _ledger_section(nodes: Sequence[NodeView]) -> str:
    """The ledger as one stacked bar (the job's: the sum of the nodes shown), then a table."""
    counted = [n for n in nodes if n.summary is not None and n.summary.ledger is not None]
    led = goodput.job_ledger([n.summary.ledger for n in counted if n.summary and n.summary.ledger])
    if led is None:
        return "<h2>goodput ledger</h2><p>no ledger in these summaries</p>"
    names = ", ".join(n.name for n in counted)
    whose = f"node {names}" if len(counted) == 1 else f"the sum of nodes {names}, in node-seconds"
    if left := [n.name for n in nodes if n not in counted]:
        whose += f"; not counted, no ledger: {', '.join(left)}"
    return (
        f"<h2>goodput ledger ({esc(whose)}; {led.wall_s:.1f} s wall)</h2>"
        + _ledger_bar(led)
        + _ledger_table(led)
    )


def _ledger_bar(led: Ledger) -> str:
    width, x, out = WIDTH - 20, 0.0, []
    for row in led.phases:
        if row.wall_s <= 0 or led.wall_s <= 0:
            continue
        w = width * row.wall_s / led.wall_s
        tip = f"{row.phase.value}: {row.wall_s:.3f} s ({row.wall_s / led.wall_s:.1%})"
        out.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="22" '
            f'fill="{PHASE_COLOURS[row.phase]}"><title>{esc(tip)}</title></rect>'
        )
        x += w
    return f'<svg width="{width}" height="24" role="img" id="ledger">{"".join(out)}</svg>'


def _ledger_table(led: Ledger) -> str:
    rows = ["<tr><th>phase</th><th>wall (s)</th><th>share</th><th>GPU-s</th></tr>"]
    for p in led.phases:
        share = p.wall_s / led.wall_s if led.wall_s > 0 else 0.0
        swatch = f'<span class="sw" style="background:{PHASE_COLOURS[p.phase]}"></span>'
        rows.append(
            f"<tr><td>{swatch}{esc(p.phase.value)}</td><td>{p.wall_s:.3f}</td>"
            f"<td>{share:.1%}</td><td>{p.gpu_s:.1f}</td></tr>"
        )
    for w in led.lost:
        lost = "not known" if w.lost_s is None else f"{w.lost_s:.3f}"
        rows.append(f"<tr><td>lost: attempt {w.attempt}, {esc(w.cause)}</td><td>{lost}</td></tr>")
    gpus = f"{led.gpus} GPU(s)" if led.gpus else "no GPU held: GPU-seconds are 0"
    return f"<table>{''.join(rows)}</table><p>{esc(gpus)}</p>"


def _legend(colours: dict[str, str], kind: str = "exit") -> str:
    items = "".join(
        f'<span><i class="sw" style="background:{c}"></i>{esc(name)}</span>'
        for name, c in colours.items()
    )
    return f'<p class="legend">{kind}s: {items}</p>'


def bars(events: Sequence[Event]) -> list[Bar]:
    """Each rank's attempts: started with the group, ended by its own exit."""
    out: dict[tuple[int, int], Bar] = {}
    starts: dict[int, WorkersStarted] = {}
    hung: set[int] = set()
    base: dict[int, int] = {}
    for ev in events:
        match ev:
            case WorkersStarted():
                starts[ev.attempt] = ev
            case Hang():
                hung.add(ev.attempt)
            case WorkerExited() if ev.attempt in starts:
                base[ev.attempt] = ev.rank - ev.local_rank
                how = _how(ev, ev.attempt in hung)
                detail = f"rank {ev.rank} (pid {ev.pid}), attempt {ev.attempt}: {ev.exit}"
                out[(ev.attempt, ev.local_rank)] = Bar(
                    rank=ev.rank, attempt=ev.attempt, start=starts[ev.attempt].wall_time,
                    end=ev.wall_time, how=how, detail=detail,
                )  # fmt: skip
    for attempt, st in starts.items():  # ranks whose exit the timeline lacks
        for lr, pid in enumerate(st.pids):
            if (attempt, lr) not in out:
                rank = base.get(attempt, 0) + lr
                out[(attempt, lr)] = Bar(
                    rank=rank, attempt=attempt, start=st.wall_time, end=None,
                    how="no exit recorded", detail=f"rank {rank} (pid {pid}), attempt {attempt}",
                )  # fmt: skip
    return sorted(out.values(), key=lambda b: (b.rank, b.attempt))


def _how(ev: WorkerExited, hung: bool) -> str:
    if ev.returncode == 0:
        return "ok"
    if not ev.terminated_by_launcher:
        return "failed"
    return "stopped after a hang" if hung else "stopped by the launcher"


def marks(events: Sequence[Event]) -> list[tuple[float, str, str]]:
    """(wall time, kind of mark, what it says) for restarts, membership changes, hangs, stops."""
    out = []
    for ev in events:
        match ev:
            case Restart():
                out.append((ev.wall_time, "restart", f"restart {ev.restart}: {ev.reason}"))
            case MembershipChange():
                out.append((ev.wall_time, "membership", f"{ev.change.value}: {ev.reason}"))
            case Hang():
                out.append(
                    (ev.wall_time, "hang", f"hang verdict ({ev.action.value}): {ev.verdict}")
                )
            case SignalReceived():
                out.append((ev.wall_time, "stop", f"received {ev.signal}"))
            case Stop():
                out.append((ev.wall_time, "stop", f"workers stopped ({ev.signal}): {ev.reason}"))
    return out


def _extent(nodes: Sequence[NodeView]) -> tuple[float, float]:
    """The time axis: the earliest agent start to the latest end, wall clock."""
    starts, ends = [], []
    for n in nodes:
        if n.summary is not None and n.summary.started:
            starts.append(n.summary.started)
            ends.append(n.summary.started + n.summary.duration_s)
        starts += [e.wall_time for e in n.events[:1]]
        ends += [e.wall_time for e in n.events[-1:]]
    if not starts:
        return 0.0, 1.0
    return min(starts), max(*ends, min(starts) + 1e-3)


def _node_svg(node: NodeView, span: tuple[float, float]) -> str:
    """The node's phase band, then a row per rank, marks across them, a time axis on top."""
    t0, t1 = span
    plot = WIDTH - LABEL - 10

    def x(t: float) -> float:
        return LABEL + plot * min(max((t - t0) / (t1 - t0), 0.0), 1.0)

    found = bars(node.events)
    ranks = sorted({b.rank for b in found})
    height = TOP + ROW * (len(ranks) + 1) + 6
    out = [_axis(t0, t1, x, height)]
    out.append(f'<text x="4" y="{TOP + 13}">node {esc(node.name)}: phases</text>')
    for s in _phase_spans(node):
        out.append(_rect(x(s.start), x(s.end), TOP + 2, PHASE_COLOURS[s.phase],
                         f"{s.phase.value}: {s.end - s.start:.3f} s"))  # fmt: skip
    rows = {rank: TOP + ROW * (i + 1) for i, rank in enumerate(ranks)}
    for rank, y in rows.items():
        out.append(f'<text x="4" y="{y + 13}" class="rank">rank {rank}</text>')
    for b in found:
        end = b.end if b.end is not None else t1
        out.append(_rect(x(b.start), x(end), rows[b.rank] + 2, EXIT_COLOURS[b.how],
                         f"{b.detail} ({b.how})"))  # fmt: skip
    for at, kind, text in marks(node.events):
        out.append(
            f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{TOP}" y2="{height}" '
            f'stroke="{MARKS[kind]}" stroke-width="2" stroke-dasharray="4 2">'
            f"<title>{esc(text)}</title></line>"
        )
    title = f"node {node.name}" + (f": {node.missing}" if node.missing else "")
    return (
        f'<h3>{esc(title)}</h3><svg width="{WIDTH}" height="{height}" role="img" '
        f'class="node">{"".join(out)}</svg>'
    )


def _phase_spans(node: NodeView) -> list[goodput.Span]:
    """The ledger's phases of the node, on the wall clock (its events carry both clocks)."""
    s = node.summary
    if s is None or not node.events or not s.started:
        return []
    offset = node.events[0].wall_time - node.events[0].mono_time
    cut = goodput.spans(
        node.events, start=s.started - offset, end=s.started + s.duration_s - offset
    )
    return [goodput.Span(phase=c.phase, start=c.start + offset, end=c.end + offset) for c in cut]


def _rect(x0: float, x1: float, y: float, fill: str, tip: str) -> str:
    return (
        f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1.5):.1f}" height="{ROW - 4}" '
        f'fill="{fill}"><title>{esc(tip)}</title></rect>'
    )


def _axis(t0: float, t1: float, x: Callable[[float], float], height: int) -> str:
    """Ticks every 'nice' number of seconds along the top."""
    length = t1 - t0
    step = next((s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300, 600, 3600)
                 if length / s <= 12), 7200)  # fmt: skip
    out, tick = [], 0.0
    while tick <= length:
        px = x(t0 + tick)
        out.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP - 6}" y2="{height}" stroke="#e0e0e0"/>'
            f'<text x="{px + 2:.1f}" y="{TOP - 10}">{tick:g} s</text>'
        )
        tick = round(tick + step, 6)
    return "".join(out)
