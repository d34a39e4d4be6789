"""torchrun's log flags as elastic-hydra keys: --log-dir, -r/--redirects, -t/--tee,
--local-ranks-filter, and the TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE variable. Pure.

Here every worker's output is always written to its files; the console gets what torch's
DefaultLogsSpecs would print. A stream is off the console when it is redirected and not teed, or
its rank is filtered out: whole ranks off become `logs.ranks` (all of them: `logs.tee=false`); one
stream of a rank without the other cannot be told apart here and is refused.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

from elastic_hydra.errors import ConfigError
from elastic_hydra.torchrun.rdzv import Builder, Given

_STD_VALUE = frozenset("0123")  # torch's Std: 0 none, 1 stdout, 2 stderr, 3 both


def is_std_spec(text: str) -> bool:
    """torch's `Std.from_str` forms: `0`..`3`, or a map of local rank to one, `0:3,1:1`."""
    if text in _STD_VALUE:
        return True
    pairs = [p.split(":") for p in text.split(",")]
    return all(
        len(p) == 2 and len(p[0]) == 1 and p[0].isdigit() and p[1] in _STD_VALUE for p in pairs
    )


def logs(b: Builder, v: Mapping[str, Given], nproc: int | None, env: Mapping[str, str]) -> None:
    """--log-dir, -r/--redirects, -t/--tee, --local-ranks-filter and torchrun's prefix template."""
    if (g := v.get("log_dir")) is not None and str(g.value).strip():  # empty: unset, as torchrun
        b.set("logs.root", str(g.value), g)
    red, tee, only = v.get("redirects"), v.get("tee"), v.get("local_ranks_filter")
    if red is not None or tee is not None or only is not None:
        shown = _console_ranks(red, tee, only, nproc)
        source = next(g for g in (red, tee, only) if g is not None)
        b.set("logs.tee", shown != frozenset(), source)
        if shown:
            b.set("logs.ranks", sorted(shown), source)
    if template := env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", ""):
        name = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
        source = Given(name=name, value=template, shown=f"{name}={template}", explicit=False)
        b.set("logs.prefix", prefix_from_template(template), source)


def _console_ranks(
    red: Given | None, tee: Given | None, only: Given | None, nproc: int | None
) -> frozenset[int] | None:
    """The local ranks whose output reaches the console (None: all), as torch's DefaultLogsSpecs
    decides it: a stream is off the console when redirected and not teed, or filtered out."""
    specs = {g.name: _std_map(g) for g in (red, tee) if g is not None}
    ranks: set[int] | None = None
    if only is not None and str(only.value).strip():
        try:
            ranks = {int(r) for r in str(only.value).split(",")}
        except ValueError:
            raise ConfigError(
                only.name, "not a list of local ranks", only.shown, "expected e.g. 0,1"
            ) from None
    per_rank = any(isinstance(m, dict) for m in specs.values())
    if per_rank and nproc is None:
        raise ConfigError(
            "--redirects/--tee", "a per-rank map needs the number of workers",
            " ".join(g.shown for g in (red, tee) if g), "give --nproc-per-node as a number",
        )  # fmt: skip
    every = range(nproc) if nproc is not None else range(1)
    on = set()
    for rank in every:
        r = _std_of(specs.get(red.name) if red else 0, rank)
        t = _std_of(specs.get(tee.name) if tee else 0, rank)
        off = r & ~t  # redirected and not teed: torch writes it to the file only
        if off not in (0, 3):
            source = red or tee
            assert source is not None
            raise ConfigError(
                source.name, "stdout and stderr cannot be split here", source.shown,
                "expected both streams alike (0 or 3)",
                "logs.tee=false keeps both off the console.",
            )  # fmt: skip
        if off == 0:
            on.add(rank)
    if nproc is None:  # one spec for every rank: rank 0 stands for all
        return frozenset() if not on else None if ranks is None else frozenset(ranks)
    kept = on & ranks if ranks is not None else on
    return None if kept == set(every) else frozenset(kept)


def _std_map(g: Given) -> int | dict[int, int]:
    text = str(g.value).strip()
    if not is_std_spec(text):
        raise ConfigError(g.name, "not a redirect spec", g.shown, "expected 0-3 or e.g. 0:3,1:0")
    if text in _STD_VALUE:
        return int(text)
    return {int(k): int(s) for k, s in (p.split(":") for p in text.split(","))}


def _std_of(spec: int | dict[int, int] | None, rank: int) -> int:
    if isinstance(spec, dict):
        return spec.get(rank, 0)
    return spec or 0


def prefix_from_template(template: str) -> str:
    """torchrun's `${role_name} ${rank} ${local_rank}` template as our `logs.prefix` format."""
    fields = {"role_name": "{role}", "rank": "{rank}", "local_rank": "{local_rank}"}
    out, pos = [], 0
    for m in string.Template.pattern.finditer(template):
        out.append(template[pos : m.start()].replace("{", "{{").replace("}", "}}"))
        name = m.group("named") or m.group("braced")
        if m.group("escaped") is not None:
            out.append("$")
        elif name in fields:
            out.append(fields[name])
        else:  # safe_substitute keeps what it does not know
            out.append(m.group(0).replace("{", "{{").replace("}", "}}"))
        pos = m.end()
    out.append(template[pos:].replace("{", "{{").replace("}", "}}"))
    return "".join(out)
