"""Metric definitions, statistics, and the Markdown/JSON reports."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from host import SHARED_CORES
from workloads import FLOOR, LAUNCHERS

TargetKind = Literal["ratio_at_most", "ratio_at_least", "ours_zero", "bound", "none"]
Samples = dict[str, dict[str, list[float]]]  # metric key -> launcher (or FLOOR) -> values

FLOOR_HOW = (
    "launch and restart gap, in the same rounds (elastic-hydra, torchrun, floor, ...): no "
    "launcher, a stdlib-only Python program (`python -c`, workloads.BARE) Popens nproc `python -u` "
    "workers with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, dummy MASTER_ADDR/MASTER_PORT "
    "and the BENCH_* env, and waits for all. Launch: Popen of that program to its exit. Restart "
    "gap: from a stamp it writes just before its Popen loop to the last worker's start stamp. "
    "What any launcher that starts fresh worker interpreters pays; above floor = (median "
    "elastic-hydra - median floor) / (median torchrun - median floor), the launchers' own "
    "overhead compared."
)


@dataclass(frozen=True)
class Metric:
    """What a metric key (`base@nproc` or `base`) means and what it must reach."""

    family: str  # the name `--only` selects
    label: str
    unit: str
    how: str  # how it is measured, for the report
    target: float = 0.0
    target_kind: TargetKind = "none"
    higher_is_better: bool = False


METRICS: dict[str, Metric] = {
    "launch": Metric(
        "launch", "launch: trivial job wall time", "s",
        "Popen of the launcher to its exit; every worker exits 0 at once.",
        0.25, "ratio_at_most",
    ),
    "restart_gap": Metric(
        "restart", "restart gap", "s",
        "rank 0 writes a failure stamp and exits 1 once all ranks run (max restarts 1); gap = "
        "that stamp to the last restarted worker's start stamp (its first line).",
        0.2, "ratio_at_most",
    ),
    "detection": Metric(
        "detection", "failure detection", "s",
        "failure stamp to the agent's record of it. elastic-hydra: the `time` of the "
        "`worker_exited` event in the run dir's events.jsonl; torchrun: the time printed on its "
        "`failed (exitcode: 1) local_rank: ...` log line (ms resolution, local time), which "
        "torchrun writes only after it has stopped the other workers.",
    ),
    "rss": Metric(
        "memory", "agent peak RSS", "MiB",
        "psutil RSS of the launcher process alone (not workers, not elastic-hydra's tiny "
        "/bin/sh group reaper), sampled every 5 ms; 4 workers sleep 5 s.",
        0.3, "ratio_at_most",
    ),
    "cpu_total": Metric(
        "memory", "agent CPU, start to workers' end", "s",
        "user+sys of the launcher process (psutil cpu_times), last sample before a worker "
        "wrote its end stamp; includes imports and spawn.",
    ),
    "cpu_monitor": Metric(
        "memory", "agent CPU while monitoring 5 s", "s",
        "the same, minus the reading when all 4 workers had started: the cost of supervising "
        "(psutil reports clock ticks: 0.01 s resolution).",
    ),
    "log_wall": Metric(
        "logs", "log throughput: wall time", "s",
        "4 workers print N lines each (`print(f'line {i}')`), console tee on (elastic-hydra "
        "`logs=tee`, torchrun `--tee 3`), launcher stdout a pipe the harness reads to EOF.",
    ),
    "log_rate": Metric(
        "logs", "log throughput: lines/s on console", "lines/s",
        "`line K` lines received on the launcher's stdout / wall time.",
        1.0, "ratio_at_least", higher_is_better=True,
    ),
    "log_lost": Metric(
        "logs", "log lines lost on console", "lines",
        "expected lines minus `line K` lines received on the launcher's stdout.",
        0.0, "ours_zero",
    ),
    "log_files_lost": Metric(
        "logs", "log lines lost in stdout.log files", "lines",
        "elastic-hydra only: expected lines minus lines in attempt_0/*/stdout.log.",
        0.0, "ours_zero",
    ),
    "shutdown": Metric(
        "shutdown", "shutdown after SIGTERM", "s",
        "SIGTERM to the launcher once 4 sleeping workers wrote start stamps, until the launcher "
        "exited and no worker pid is alive (psutil, polled every 1 ms).",
        1.0, "ratio_at_most",
    ),
    "rendezvous": Metric(
        "rendezvous", "c10d rendezvous of nproc agents", "s",
        "nproc agents on this host, started back to back, join one c10d rendezvous "
        "(127.0.0.1, a fresh port and run id per run) with 1 worker each that writes its start "
        "stamp and exits 0; from the Popen of the last agent to the last worker's start stamp. "
        "Both launchers' agents import torch for c10d, and nproc agents doing so at once share the "
        "machine's cores: that import dominates the time.",
        1.0, "ratio_at_most",
    ),
    "departure": Metric(
        "departure", "departure detection, 1 of nproc agents killed", "s",
        "elastic-hydra only (torchrun never notices a departure while its workers run): nproc "
        "agents, nnodes=1:nproc over c10d, rdzv.keep_alive_interval=1 keep_alive_max_attempt=3 "
        "last_call_timeout=1 (a node without a heartbeat for 3 s has left), workers that sleep; "
        "once every worker runs, SIGKILL to the last agent (its workers die with it), until the "
        "`time` of agent 0's `membership` event with `change: left` in its events.jsonl. The "
        "last heartbeat comes up to 1 s before the kill, torch re-reads the shared state at "
        "most once a second, and a departure counts when a second read confirms it, so expect "
        "2 to 5 s.",
        3.0, "bound",
    ),
}  # fmt: skip

FAMILIES = sorted({m.family for m in METRICS.values()})


def metric_of(key: str) -> Metric:
    """The definition behind a key such as `launch@16`."""
    return METRICS[key.split("@", maxsplit=1)[0]]


def nproc_of(key: str) -> str:
    """The key's nproc, or '4' for the fixed-size workloads."""
    return key.split("@")[1] if "@" in key else "4"


def summarize(values: list[float]) -> dict[str, Any]:
    """min / median / max of the runs (an empty summary when there are none)."""
    if not values:
        return {"values": [], "min": None, "median": None, "max": None}
    return {
        "values": values,
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def verdict(metric: Metric, ours: list[float], theirs: list[float]) -> tuple[float | None, str]:
    """(ratio of medians ours/torchrun, 'met' | 'not met' | '-') for one metric."""
    ratio = None
    if ours and theirs and statistics.median(theirs) != 0:
        ratio = statistics.median(ours) / statistics.median(theirs)
    if metric.target_kind == "ours_zero":  # a ratio of lost-line counts means nothing
        return None, ("-" if not ours else "met" if max(ours) == 0 else "not met")
    if metric.target_kind in ("none", "bound") or ratio is None:
        return ratio, "-"
    ok = ratio <= metric.target if metric.target_kind == "ratio_at_most" else ratio >= metric.target
    return ratio, "met" if ok else "not met"


def above_floor(ours: list[float], theirs: list[float], floor: list[float]) -> float | None:
    """(median ours - median floor) / (median torchrun - median floor); None without a floor or
    when torchrun's median is not above it."""
    if not (ours and theirs and floor):
        return None
    base = statistics.median(floor)
    theirs_above = statistics.median(theirs) - base
    return None if theirs_above <= 0 else (statistics.median(ours) - base) / theirs_above


def target_text(metric: Metric) -> str:
    """The target as the table shows it."""
    return {
        "ratio_at_most": f"<= {metric.target:g}x",
        "ratio_at_least": f">= {metric.target:g}x",
        "ours_zero": "0 for elastic-hydra",
        "bound": f"configured bound {metric.target:g} {metric.unit}",
        "none": "-",
    }[metric.target_kind]


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("lines", "lines/s"):
        return f"{value:,.0f}"
    return f"{value:.1f}" if unit == "MiB" else f"{value:.3f}"


def _cell(values: list[float], unit: str) -> str:
    s = summarize(values)
    if not values:
        return "-"
    return " / ".join(_fmt(s[k], unit) for k in ("min", "median", "max"))


def rows(samples: Samples) -> list[dict[str, Any]]:
    """One JSON-able row per metric key, in the order of METRICS then nproc."""
    order = list(METRICS)

    def sort_key(key: str) -> tuple[int, int]:
        return order.index(key.split("@", maxsplit=1)[0]), int(nproc_of(key))

    out = []
    for key in sorted(samples, key=sort_key):
        metric = metric_of(key)
        ours, theirs = samples[key].get(LAUNCHERS[0], []), samples[key].get(LAUNCHERS[1], [])
        floor = samples[key].get(FLOOR, [])
        ratio, met = verdict(metric, ours, theirs)
        out.append(
            {
                "key": key,
                "label": metric.label,
                "family": metric.family,
                "nproc": int(nproc_of(key)),
                "unit": metric.unit,
                "elastic-hydra": summarize(ours),
                "torchrun": summarize(theirs),
                "floor": summarize(floor),
                "ratio": ratio,
                "ratio_above_floor": above_floor(ours, theirs, floor),
                "target": target_text(metric),
                "met": met,
            }
        )
    return out


def others_text(meta: dict[str, Any]) -> str:
    """What other processes used of the CPU over the run, and whether that made the machine
    shared; nothing for results from before it was measured."""
    cores = meta.get("others_cores")
    if cores is None:
        return ""
    shared = " (other work shared this machine)" if cores >= SHARED_CORES else ""
    return f"; other processes used {cores:.2f} cores on average over the run{shared}"


def markdown(meta: dict[str, Any], table: list[dict[str, Any]]) -> str:
    """The report: machine, versions, the table with targets, how each metric is measured."""
    lines = [
        "# elastic-hydra vs torchrun: launcher overhead",
        "",
        f"- Machine: {meta['cpu_model']}, {meta['cores']} cores; load average at start "
        f"{meta['loadavg']}{others_text(meta)}",
        f"- Date: {meta['date']}",
        f"- Python {meta['python']}, torch {meta['torch']}, elastic-hydra {meta['elastic_hydra']}",
        f"- Runs per metric: {meta['runs']} per launcher, alternating elastic-hydra / torchrun "
        f"(/ floor, for launch and restart) after one discarded warm-up round"
        f"{' (--quick)' if meta['quick'] else ''}; log throughput: {meta['lines']:,} lines per "
        "worker",
        f"- Bytecode: elastic-hydra ({meta['compiled']}) is byte-compiled before the "
        "runs, as pip install does (torch's was at its install)",
        f"- Command: `{meta['command']}`",
        "",
        "Cells are min / median / max; ratio = median elastic-hydra / median torchrun (targets "
        "are judged on it); above floor = (median elastic-hydra - median floor) / (median "
        "torchrun - median floor), where a floor (no launcher) was measured.",
        "",
        "| metric | nproc | unit | elastic-hydra | torchrun | floor (no launcher) | ratio "
        "| above floor | target | met? |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        above = "-" if row["ratio_above_floor"] is None else f"{row['ratio_above_floor']:.2f}x"
        ours, theirs, floor = (
            _cell(row[name]["values"], row["unit"]) for name in (*LAUNCHERS, FLOOR)
        )
        lines.append(
            f"| {row['label']} | {row['nproc']} | {row['unit']} | {ours} | {theirs} | {floor} "
            f"| {ratio} | {above} | {row['target']} | {row['met']} |"
        )
    lines += ["", "How each metric is measured:", ""]
    shown = {row["key"].split("@")[0] for row in table}
    lines += [f"- **{m.label}**: {m.how}" for k, m in METRICS.items() if k in shown]
    if any(row["floor"]["values"] for row in table):
        lines.append(f"- **floor (no launcher)**: {FLOOR_HOW}")
    if meta["errors"]:
        lines += ["", "Runs that produced no measurement (excluded above):", ""]
        lines += [f"- {e}" for e in meta["errors"]]
    if meta["leftovers"]:
        lines += [
            "",
            f"Processes left behind by a run and killed by the harness: {meta['leftovers']}",
        ]
    lines += ["", "![launch time, restart gap and rendezvous time](latest.svg)", ""]
    return "\n".join(lines)


def write(out_dir: Path, meta: dict[str, Any], samples: Samples) -> str:
    """Write latest.md and latest.json under `out_dir`; return the Markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = rows(samples)
    text = markdown(meta, table)
    (out_dir / "latest.md").write_text(text)
    doc = {"meta": meta, "metrics": table}
    (out_dir / "latest.json").write_text(json.dumps(doc, indent=2) + "\n")
    return text
