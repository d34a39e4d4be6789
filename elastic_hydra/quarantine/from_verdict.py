"""A preflight verdict turned into this node's ledger entries, and the line that says so. Pure.

Who writes: the bad node itself, for itself only. Every node of a round holds the same verdict,
so any one of them could write every entry; the bad node is chosen because

- it names itself by what it knows of itself (its Slurm node name, else its host name), never by
  a host name read from another node's report through the store, which is untrusted input: no
  node can put another host into a ledger that many jobs read;
- each entry is written once, by one writer (the `Ledger` merges duplicates anyway), and no
  healthy node touches the shared file;
- its own console, where the job's operator looks for why it left, says that it was quarantined,
  until when and how to let it back.

A node that published nothing (a dead agent) is not written: nobody can name it for sure, and
a node that vanished is not known to be bad.

What goes in: a fatal finding with a GPU quarantines that GPU of the host; any other fatal
finding quarantines the whole host (then its GPU entries would add nothing).
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime

from elastic_hydra.durations import show_duration
from elastic_hydra.quarantine.ledger import QuarantineEntry
from elastic_hydra.records.preflight import PreflightVerdict


def entries(
    verdict: PreflightVerdict,
    *,
    node_rank: int,
    host: str,
    job: str,
    now: float,
    cooldown: float,
) -> list[QuarantineEntry]:
    """The entries this node adds for itself after `verdict` ([] when it passed).

    Raises:
        ValueError: a host or job that an entry cannot hold (see `QuarantineEntry`).
    """
    if node_rank not in verdict.bad_nodes:
        return []
    mine = [f for f in verdict.findings if f.fatal and f.node == node_rank]
    whole = [f for f in mine if f.gpu is None]
    if whole or not mine:
        evidence = whole[0].line if whole else f"preflight: node {node_rank} ({host}) failed"
        return [
            QuarantineEntry.new(
                host=host, gpu=None, evidence=evidence, now=now, cooldown=cooldown, job=job
            )
        ]
    first: dict[int, str] = {}
    for f in mine:
        if f.gpu is not None:
            first.setdefault(f.gpu, f.line)
    return [
        QuarantineEntry.new(host=host, gpu=gpu, evidence=line, now=now, cooldown=cooldown, job=job)
        for gpu, line in sorted(first.items())
    ]


def quarantined_line(added: list[QuarantineEntry], *, ledger: str, cooldown: float) -> str:
    """The console's line after the entries went into the ledger."""
    until = max(e.until for e in added)
    when = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M UTC")
    what = ", ".join(e.target for e in added)
    host = added[0].host
    clear = f"elastic-hydra quarantine clear {host} --ledger {shlex.quote(ledger)}"
    return (
        f"elastic-hydra: quarantined {what} until {when} "
        f"(quarantine.cooldown={show_duration(cooldown)}) in {ledger}: later rounds and jobs "
        f"that read it leave it out. To let it back: {clear}"
    )
