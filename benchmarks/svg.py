"""A hand-written SVG: grouped bars (median, min-max whisker) of launch time, restart gap and
rendezvous time; a thin gray line marks the floor's median (no launcher) where it was measured."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

from workloads import FLOOR, LAUNCHERS

COLORS = {"elastic-hydra": "#2a9d8f", "torchrun": "#e76f51", FLOOR: "#888"}
PANEL_W, PANEL_H = 430, 300
LEFT, TOP, BOTTOM = 56, 40, 48


def _nice_max(value: float) -> float:
    """A round axis maximum at or above `value`."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    nice: float = next(
        m * exp for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * exp >= value
    )
    return nice


def _panel(x0: float, title: str, rows: list[dict[str, Any]], unit: str, group: str) -> list[str]:
    """One chart: a group of two bars per size, labelled `group` with {n} the size."""
    out = [
        f'<text x="{x0 + PANEL_W / 2}" y="22" text-anchor="middle" font-weight="bold">'
        f"{escape(title)}</text>"
    ]
    plot_w, plot_h = PANEL_W - LEFT - 10, PANEL_H - TOP - BOTTOM
    base_y = TOP + plot_h
    highs = [r[n]["max"] or 0.0 for r in rows for n in LAUNCHERS]
    top = _nice_max(max([*highs, *(r[FLOOR]["median"] or 0.0 for r in rows)], default=1.0))
    for i in range(5):
        value = top * i / 4
        y = base_y - plot_h * i / 4
        out.append(
            f'<line x1="{x0 + LEFT}" y1="{y:.1f}" x2="{x0 + LEFT + plot_w}" y2="{y:.1f}" '
            f'stroke="#ddd"/><text x="{x0 + LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" '
            f'font-size="11">{value:g}</text>'
        )
    out.append(
        f'<text transform="translate({x0 + 14},{TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle" font-size="12">{escape(unit)}</text>'
    )
    group_w = plot_w / max(len(rows), 1)
    bar_w = min(group_w * 0.35, 48)
    for g, row in enumerate(rows):
        center = x0 + LEFT + group_w * (g + 0.5)
        for b, name in enumerate(LAUNCHERS):
            stats = row[name]
            if stats["median"] is None:
                continue
            x = center - bar_w + b * bar_w
            h = plot_h * stats["median"] / top
            y_lo = base_y - plot_h * stats["min"] / top
            y_hi = base_y - plot_h * stats["max"] / top
            mid = x + bar_w / 2
            out += [
                f'<rect x="{x:.1f}" y="{base_y - h:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                f'fill="{COLORS[name]}"><title>{name} nproc {row["nproc"]}: median '
                f"{stats['median']:.3f} s</title></rect>",
                f'<line x1="{mid - 1:.1f}" y1="{y_lo:.1f}" x2="{mid - 1:.1f}" y2="{y_hi:.1f}" '
                f'stroke="#333"/>',
                f'<text x="{mid - 1:.1f}" y="{min(y_hi, base_y - h) - 4:.1f}" '
                f'text-anchor="middle" font-size="10">{stats["median"]:.2f}</text>',
            ]
        floor = row[FLOOR]["median"]
        if floor is not None:
            y = base_y - plot_h * floor / top
            out.append(
                f'<line x1="{center - bar_w - 4:.1f}" y1="{y:.1f}" x2="{center + bar_w + 2:.1f}" '
                f'y2="{y:.1f}" stroke="{COLORS[FLOOR]}" stroke-width="1.5" stroke-dasharray="4 2">'
                f"<title>floor (no launcher) nproc {row['nproc']}: median {floor:.3f} s</title>"
                "</line>"
            )
        out.append(
            f'<text x="{center:.1f}" y="{base_y + 16}" text-anchor="middle" font-size="11">'
            f"{escape(group.format(n=row['nproc']))}</text>"
        )
    out.append(
        f'<line x1="{x0 + LEFT}" y1="{base_y}" x2="{x0 + LEFT + plot_w}" y2="{base_y}" '
        f'stroke="#333"/>'
    )
    return out


def _pick(table: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [row for row in table if row["key"].startswith(prefix)]


def write_svg(path: Path, table: list[dict[str, Any]]) -> None:
    """Launch time and restart gap per nproc, rendezvous time per agent count, both launchers,
    side by side."""
    panels = [
        ("Launch: trivial job wall time", _pick(table, "launch@"), "nproc {n}"),
        ("Restart gap: failure to all restarted", _pick(table, "restart_gap@"), "nproc {n}"),
        ("Rendezvous: last agent to all running", _pick(table, "rendezvous@"), "{n} agents"),
    ]
    panels = [panel for panel in panels if panel[1]]
    width = PANEL_W * max(len(panels), 1)
    height = PANEL_H + 24
    body: list[str] = []
    for i, (title, rows, group) in enumerate(panels):
        body += _panel(i * PANEL_W, title, rows, "seconds (median, min-max)", group)
    legend_y = PANEL_H + 10
    for i, name in enumerate(LAUNCHERS):
        x = 20 + i * 150
        body.append(
            f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="{COLORS[name]}"/>'
            f'<text x="{x + 18}" y="{legend_y}" font-size="12">{name}</text>'
        )
    if any(row[FLOOR]["median"] is not None for _, rows, _ in panels for row in rows):
        x = 20 + len(LAUNCHERS) * 130  # fits a one-panel chart (430 px)
        body.append(
            f'<line x1="{x}" y1="{legend_y - 4}" x2="{x + 12}" y2="{legend_y - 4}" '
            f'stroke="{COLORS[FLOOR]}" stroke-width="1.5" stroke-dasharray="4 2"/>'
            f'<text x="{x + 18}" y="{legend_y}" font-size="12">floor (no launcher)</text>'
        )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(svg)
