"""Every benchmark figure that README.md and docs/ quote is the one in benchmarks/results/.

Each quote below is written from the results files (the JSON a benchmark wrote, or the Markdown
table it rendered from it) and must stand in its page word for word, line breaks aside. A new
benchmark run that changes a figure fails here with the text the page must now hold; paste it in.
What a page says a result shows (a target missed, a check that held) is asserted on the results
too. Figures measured once by hand, without a results file, are not quoted here.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from tests.conftest import REPO

RESULTS = REPO / "benchmarks" / "results"
EH, TR, FLOOR = "elastic-hydra", "torchrun", "floor"
LAUNCH = ["launch@1", "launch@4", "launch@16", "launch@64"]
GAP = ["restart_gap@2", "restart_gap@8"]
DETECTION = ["detection@2", "detection@8"]
RENDEZVOUS = ["rendezvous@2", "rendezvous@4", "rendezvous@8"]


def result(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def table(name: str) -> list[list[str]]:
    """The cells of a results Markdown table's rows (header and rule left out)."""
    rows = [line for line in (RESULTS / name).read_text().splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]


def keyed(rows: list[list[str]]) -> dict[str, list[str]]:
    """Rows by their first cell, which must be unique."""
    assert len({row[0] for row in rows}) == len(rows)
    return {row[0]: row for row in rows}


def row_text(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def line_of(name: str, prefix: str) -> str:
    """The line of a results Markdown file that starts with `prefix`."""
    return next(ln for ln in (RESULTS / name).read_text().splitlines() if ln.startswith(prefix))


@cache
def latest() -> dict[str, Any]:
    """benchmarks/results/latest.json's rows by key, and its meta under "meta"."""
    doc = result("latest.json")
    return {"meta": doc["meta"], **{row["key"]: row for row in doc["metrics"]}}


def medians(keys: list[str], runner: str, fmt: str) -> str:
    return " / ".join(format(latest()[k][runner]["median"], fmt) for k in keys)


def ratios(keys: list[str], field: str = "ratio") -> str:
    return " / ".join(f"{latest()[k][field]:.2f}" for k in keys) + "x"


# ------------------------------------------------------------------------------ README, benchmarks


def readme() -> list[str]:
    gap, rss = latest()["restart_gap@2"], latest()["rss"]
    runs = result("membership.json")["runs"]
    changes = ("join: 3 nodes running", "loss: 2 nodes running")
    assert max(r[m] for r in runs["defaults"] for m in changes) < 10
    assert min(r[m] for r in runs["torchrun's timings"] for m in changes) > 30
    return [
        f"restart gap {gap[EH]['median']:.3f} s vs torchrun's {gap[TR]['median']:.3f} s (2 "
        f"workers), agent memory {rss[EH]['median']:.0f} MiB vs {rss[TR]['median']:.0f} MiB",
        "a lost or new node's job running again within 10 s, where torchrun's timings take over "
        "30 s",
    ]


def both(key: str, fmt: str, unit: str) -> str:
    """The median of each launcher, as two cells."""
    row = latest()[key]
    return f"{row[EH]['median']:{fmt}} {unit} | {row[TR]['median']:{fmt}} {unit} | "


def console(runner: str) -> str:
    """A launcher's console throughput and the lines it lost (min-max over the runs)."""
    rate, lost = latest()["log_rate"][runner], latest()["log_lost"][runner]
    low, high = f"{lost['min']:.0f}", f"{lost['max']:.0f}"
    return f"{rate['median'] / 1000:.0f}k lines/s, {low if low == high else f'{low}-{high}'} lost"


def benchmarks_table() -> list[str]:
    """The table of docs/benchmarks.md, row by row."""
    m = latest()
    bound = m["departure@2"]["target"].removeprefix("configured bound ")
    return [
        f"| launch, trivial job, nproc 1 / 4 / 16 / 64 | {medians(LAUNCH, EH, '.2f')} s | "
        f"{medians(LAUNCH, TR, '.2f')} s | {medians(LAUNCH, FLOOR, '.2f')} s | {ratios(LAUNCH)} | "
        f"{ratios(LAUNCH, 'ratio_above_floor')} |",
        f"| restart gap, nproc 2 / 8 | {medians(GAP, EH, '.3f')} s | {medians(GAP, TR, '.3f')} s "
        f"| {medians(GAP, FLOOR, '.3f')} s | {ratios(GAP)} | {ratios(GAP, 'ratio_above_floor')} |",
        f"| failure detection, nproc 2 / 8 | {medians(DETECTION, EH, '.3f')} s | "
        f"{medians(DETECTION, TR, '.3f')} s | | {ratios(DETECTION)} | |",
        f"| agent peak RSS (4 workers) | {both('rss', '.0f', 'MiB')}| {m['rss']['ratio']:.2f}x | |",
        f"| agent CPU, start to workers' end (4 workers) | {both('cpu_total', '.2f', 's')}| "
        f"{m['cpu_total']['ratio']:.2f}x | |",
        f"| agent CPU while monitoring 4 workers for 5 s | {both('cpu_monitor', '.2f', 's')}| | |",
        f"| console log throughput, 4 x {m['meta']['lines'] // 1000}k lines | {console(EH)} | "
        f"{console(TR)} | | {m['log_rate']['ratio']:.1f}x | |",
        f"| shutdown after SIGTERM (4 workers) | {both('shutdown', '.3f', 's')}| "
        f"{m['shutdown']['ratio']:.2f}x | |",
        f"| c10d rendezvous, 2 / 4 / 8 agents x 1 worker, last start to all workers running | "
        f"{medians(RENDEZVOUS, EH, '.2f')} s | {medians(RENDEZVOUS, TR, '.2f')} s | | "
        f"{ratios(RENDEZVOUS)} | |",
        f"| departure noticed, an agent SIGKILLed (bound {bound}) | "
        f"{m['departure@2'][EH]['median']:.2f} s | never | | | |",
    ]


def benchmarks() -> list[str]:
    m, meta = latest(), latest()["meta"]
    floor64, floor8 = m["launch@64"][FLOOR]["median"], m["restart_gap@8"][FLOOR]["median"]
    missed = {m[k]["met"] for k in [*LAUNCH, "restart_gap@8", *RENDEZVOUS]}
    assert missed == {"not met"}  # "where elastic-hydra misses a target"
    return [
        *benchmarks_table(),
        f"Medians from `nox -s bench -- --runs {meta['runs']}` on a {meta['cores']}-core "
        f"{meta['cpu_model']} (load average {meta['loadavg'].split()[0]} at the start), torch "
        f"{meta['torch']}",
        f"(launch {m['launch@1']['target']}, restart gap {m['restart_gap@8']['target']} at nproc "
        f"8, rendezvous {m['rendezvous@2']['target']})",
        f"Of a trivial launch's {m['launch@1'][EH]['median']:.2f} s,",
        f"starting 64 fresh Python interpreters takes {floor64:.2f} s, already "
        f"{floor64 / m['launch@64'][TR]['median']:.2f}x of torchrun's whole launch, and "
        f"restarting 8 takes {floor8:.3f} s, already "
        f"{floor8 / m['restart_gap@8'][TR]['median']:.2f}x of torchrun's gap; above that floor, "
        "the restart gap is "
        f"{m['restart_gap@8']['ratio_above_floor']:.2f}x torchrun's.",
    ]


# -------------------------------------------------------------------------------- the other pages


def hangs() -> list[str]:
    data = result("hang_watch.json")
    cost = data["cost"]

    def watch(every: str) -> str:
        c = cost[every]
        return f"{c['watch_cpu_s'] * 1000:.2f} ms, {c['watch_share']:.3%}".replace("%", " %")

    rss = {c["rss_mib"] for c in cost.values()}
    assert len(rss) == 1 and not data["torchrun_spoke"]  # "both"; torchrun said nothing
    return [
        f"looking every 1 s (default for timeouts of 5 s and more) | {watch('1 s')} of the "
        "worker's CPU | no watch |",
        f"| the same, looking every 0.05 s (the fastest) | {watch('0.05 s')} | |",
        f"| the worker's peak RSS, watch on and off | {rss.pop():.1f} MiB both | |",
        f"(`hang.timeout=10`) | {data['verdict_s']:.1f} s, every rank's stack saved | nothing in "
        f"{data['torchrun_silent_s']:.0f} s",
    ]


SWEEP_LABELS = {"joblib": "hydra-joblib-launcher (`n_jobs=4`)", "basic": "basic (sequential)"}


def sweeps() -> list[str]:
    head = re.fullmatch(
        r"Sweep of (\d+) jobs \((\d+) s of work in all\) on (\d+) slots, (\d+) CPUs\.",
        (RESULTS / "sweep_pool.md").read_text().splitlines()[0],
    )
    assert head is not None
    jobs, work, slots, cpus = head.groups()
    rows = keyed(table("sweep_pool.md"))
    joblib = next(r for r in result("sweep_pool.json")["rows"] if r["launcher"] == "joblib")
    return [
        f"{jobs} jobs of 1 to 6 s ({work} s of work), {slots} slots, on a shared {cpus}-core "
        "machine",
        *(row_text([SWEEP_LABELS.get(name, name), *row[1:]]) for name, row in rows.items()),
        f"Its {joblib['left_running']} loky workers outlive the command",
    ]


def warm() -> list[str]:
    rows = keyed(table("warm.md"))
    load = re.search(r"load average (\S+) before, (\S+) after", (RESULTS / "warm.md").read_text())
    assert load is not None

    def cell(metric: str, column: int) -> str:
        return rows[metric][column]

    warm_launch = [float(cell(f"launch@{n}", 3).split()[0]) for n in (2, 4, 8)]
    restart = sorted(float(cell(f"restart@{n}", 5).rstrip("x")) for n in (2, 4, 8))
    pss = {c: float(cell("worker_pss@4", c).split()[0]) for c in (1, 2, 3)}
    rounds = len(result("warm.json")["warm"]["launch@2"])
    return [
        *(row_text(row) for row in rows.values()),
        f"Medians of {rounds} rounds after a warm-up round, on a 2-core machine (load average "
        f"{load[1]} before the run, {load[2]} after it)",
        f"**Launch to the first all_reduce: {cell('launch@4', 5)} of torchrun's at 4 workers, "
        f"{cell('launch@8', 5)} at 8**",
        f"gloo's own rendezvous: {min(warm_launch):.2f} to {max(warm_launch):.2f} s",
        f"(two imports in parallel on two cores), hence {cell('launch@2', 5)}.",
        f"**Restart gap: {restart[0]:.2f}x to {restart[-1]:.2f}x of torchrun's**",
        f"(PSS) is {pss[3]:.0f} MiB against {pss[2]:.0f} MiB cold ({pss[1]:.0f} MiB under "
        f"torchrun): the pages of torch are shared with the template "
        f"({float(cell('template_pss@4', 3).split()[0]):.0f} MiB)",
    ]


def multi_node() -> list[str]:
    rows = result("restart_rate.json")
    assert {r["trials"] for r in rows} == {5}  # `--trials 5`
    membership = result("membership.json")
    assert membership["meta"]["runs"] == 3  # `--runs 3`
    # The goals the page claims: a loss, a join and a start each running again within 10 s.
    for metric in ("first round", "join: 3 nodes running", "loss: 2 nodes running"):
        assert max(r[metric] for r in membership["runs"]["defaults"]) < 10, metric
        assert min(r[metric] for r in membership["runs"]["torchrun's timings"]) > 30, metric
    return [
        *(
            f"| {r['case'].removeprefix('collateral: ')} | {r['ok']}/{r['trials']}"
            + (" |" if not r["case"].startswith("collateral: ") else "")
            for r in rows
        ),
        *(row_text(cells) for cells in table("membership.md")),
    ]


OBSERVE_LABELS = {
    "status": "status records (the default)",
    "status + metrics": "status + metrics, scraped every second",
}


def observe() -> list[str]:
    data = result("observe_cost.json")
    args, med = data["args"], data["median"]
    return [
        f"({args['nproc']} plain-Python workers)",
        f"over {args['seconds']:.0f}-second windows (medians of {args['runs']},",
        *(
            f"| {OBSERVE_LABELS.get(s, s)} | {v:.3f} | "
            + ("|" if s == "off" else f"{v - med['off']:+.3f} |")
            for s, v in med.items()
        ),
    ]


def stragglers() -> list[str]:
    rows = result("stragglers.json")["results"]
    by = {(r["ranks"], r["run"].split()[0]): r for r in rows}
    quotes = []
    for r in rows:
        named = ", ".join(f"rank {n}" for n in r["named"]) or "none"
        took = "-" if r["steps_to_name"] is None else str(r["steps_to_name"])
        quotes.append(f"| {r['ranks']} | {r['run']} | {'yes' if r['right'] else 'NO'} | {named} |"
                      f" {took} | {r['hang_verdicts']} |")  # fmt: skip
    quotes.append(
        f"named {by[(4, 'slowed')]['steps_to_name']} (4 ranks) and"
        f" {by[(8, 'slowed')]['steps_to_name']} (8 ranks) of its steps"
    )
    return quotes


def healthy(name: str) -> list[dict[str, Any]]:
    """The healthy 4-node runs of a preflight results file."""
    runs: list[dict[str, Any]] = result(f"{name}.json")["healthy"]
    return runs


def named(name: str) -> tuple[int, int]:
    """(nodes named, runs that named one) over a preflight results file's healthy runs."""
    runs = healthy(name)
    return sum(len(r["bad_nodes"]) for r in runs), sum(1 for r in runs if r["bad_nodes"])


def load_at_end(name: str) -> str:
    found = re.search(r"load average at the end: (\S+)", (RESULTS / f"{name}.md").read_text())
    assert found is not None
    return found[1]


def percents(finding: str) -> list[str]:
    return re.findall(r"at (\d+) %", finding)


def preflight_confirmation() -> list[str]:
    """The figures of the confirmation: the two tables' second run, the healthy runs with it."""
    jobs = {(r["nodes"], r["mode"]): r for j in result("preflight_confirmed_table.json")["jobs"]
            for r in j}  # fmt: skip
    kept = next(f for f in jobs[4, "quick"]["findings"] if "not confirmed" in f)
    slow = [percents(jobs[n, "throttled"]["findings"][0])[0] for n in (2, 4)]
    confirmed = healthy("preflight_confirmed")
    warned = [f for r in confirmed for f in r["findings"] if "not confirmed" in f]
    assert named("preflight_confirmed")[0] == 0 and len(confirmed) == 20  # "**no** node ... 20"
    return [
        *(row_text(row) for row in table("preflight_confirmed_table.md")),
        f"`python benchmarks/preflight.py --nodes 2,4 --healthy-runs 0 --name "
        f"preflight_confirmed_table`, load average {load_at_end('preflight_confirmed_table')} at "
        f"the end). The healthy 4-node job had a node at {percents(kept)[0]} % of the median GEMM "
        f"rate whose best window was at {percents(kept)[1]} %",
        f"The throttled nodes ({slow[0]} % and {slow[1]} %, slow in every window)",
        f"load average {load_at_end('preflight_confirmed')} at the end",
        f"{len(warned)} slow findings in {sum(1 for r in confirmed if r['findings'])} runs were "
        "printed as *not confirmed* and kept",
        f"battery median {statistics.median(r['battery_s'] for r in confirmed):.1f} s over the 20 "
        "runs with the confirmation, "
        f"{statistics.median(r['battery_s'] for r in healthy('preflight')):.1f} s over the 20 "
        "without",
        example(warned),
    ]


def example(warned: list[str]) -> str:
    """The warning the page shows: one of these (the first, when it shows none of them)."""
    page = flat((REPO / "docs" / "preflight.md").read_text())
    return next((line for line in warned if flat(line) in page), warned[0])


def preflight() -> list[str]:
    quick = [r["battery_s"] for j in result("preflight.json")["jobs"] for r in j
             if r["mode"] == "quick"]  # fmt: skip
    load = re.search(r"load average [\d.]+ to [\d.]+", line_of("preflight.md", "preflight."))
    rejected = re.search(r": (\d+) in", line_of("preflight_best_vs_best.md", "Slow findings"))
    first, other = named("preflight"), named("preflight_best_vs_best")
    assert named("preflight_ratio_0.5") == (0, 0)  # "at `--min-ratio 0.5`: none in 20"
    assert {len(healthy(n)) for n in ("preflight", "preflight_best_vs_best")} == {20}
    assert load is not None and rejected is not None
    return [
        *(row_text(row) for row in table("preflight.md")),
        line_of("preflight.md", "False exclusions over"),
        f"({load[0]}):",
        f"the battery took {min(quick):.1f} to {max(quick):.1f} s per round (below)",
        f"**The cost** is the battery column: {min(quick):.1f} to {max(quick):.1f} s per round",
        f"{first[0]} nodes were named in {first[1]} of the 20 healthy runs above",
        f"that first form named a healthy node in {other[1]} of 20 runs here",
        f"named {other[0]} node in 20 runs and warned of {rejected[1]}",
        *preflight_confirmation(),
    ]


# ------------------------------------------------------------------------------------- the check


def failures() -> list[str]:
    s = result("failure_matrix.json")["summary"]
    return [
        *(row_text(cells) for cells in table("failure_matrix.md")),
        f"the right class in {s['right']} of {s['rows']}; attempts spent on deterministic user "
        f"errors: elastic-hydra {s['user_error_attempts_eh']}, torchrun "
        f"{s['user_error_attempts_torchrun']} ({s['user_error_rows']} injections)",
    ]


def checkpoints() -> list[str]:
    recovery = [ln for ln in (RESULTS / "recovery.md").read_text().splitlines()
                if ln.startswith("- ") and (" against torchrun + disk" in ln or "costs" in ln
                                            or "did not recover" in ln)]  # fmt: skip
    trials = result("preemptions.json")["trials"]
    took = [t["signal to exit (s)"] for t in trials]
    ok = sum(t["passed"] for t in trials)
    return [
        row_text(["what", *result("recovery.json")["runs"]]),
        *(row_text(cells) for cells in table("recovery.md")),
        *(line.removeprefix("- ") for line in recovery),
        *(row_text(cells) for cells in table("node_loss.md")),
        f"{ok}/{len(trials)} exited 75 with every rank stopped after the same step and the "
        f"relaunch resumed every rank there; the signal to the agent's exit took "
        f"{statistics.median(took):.1f} s at the median, {max(took):.1f} s at most.",
    ]


PAGES: dict[str, Callable[[], list[str]]] = {
    "README.md": readme,
    "docs/benchmarks.md": benchmarks,
    "docs/hangs.md": hangs,
    "docs/sweeps.md": sweeps,
    "docs/warm.md": warm,
    "docs/multi-node.md": multi_node,
    "docs/observe.md": observe,
    "docs/preflight.md": preflight,
    "docs/stragglers.md": stragglers,
    "docs/runs-and-failures.md": failures,
    "docs/checkpoints.md": checkpoints,
}


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("page", PAGES)
def test_the_page_quotes_the_benchmark_results(page: str) -> None:
    text = flat((REPO / page).read_text())
    missing = [quote for quote in PAGES[page]() if flat(quote) not in text]
    assert missing == [], f"{page} must now read:\n" + "\n".join(missing)


# Each page's tables of results, by the start of their header: every row must hold a quote, so a
# row added to a page without one in PAGES fails too.
TABLES = {
    "docs/benchmarks.md": "| metric | elastic-hydra |",
    "docs/hangs.md": "| measure (2 ranks",
    "docs/sweeps.md": "| launcher |",
    "docs/warm.md": "| metric | torchrun |",
    "docs/multi-node.md": "| job (rank 0 fails once;",
    "docs/observe.md": "| setting |",
    "docs/preflight.md": "| nodes | preflight |",
    "docs/stragglers.md": "| ranks | run | right |",
    "docs/runs-and-failures.md": "| injection | how |",
    "docs/checkpoints.md": "| what | torchrun + disk |",
}


def result_rows(page: str) -> list[str]:
    """The body rows of every table of `page` whose header starts with TABLES[page]."""
    rows: list[str] = []
    inside = False
    for line in (REPO / page).read_text().splitlines():
        if line.startswith(TABLES[page]):
            inside = True
        elif not line.startswith("|"):
            inside = False
        elif inside and not line.startswith("|---"):
            rows.append(line)
    return rows


@pytest.mark.parametrize("page", TABLES)
def test_every_row_of_a_results_table_is_quoted(page: str) -> None:
    quotes = [flat(quote) for quote in PAGES[page]()]
    rows = result_rows(page)
    assert rows, f"{page}: no table starts with {TABLES[page]!r}"
    assert [row for row in rows if not any(q in flat(row) for q in quotes)] == []
