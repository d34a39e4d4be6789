"""elastic-hydra: a declarative, config-driven elastic job launcher.

The folders, from the user down (each `__init__` says what it owns):

    cli/         what the user types: the command, its subcommands, argv
    torchrun/    torchrun's flags and PET_* as our keys (pure)
    config/      Hydra: composition, schema, errors explained (the only hydra/omegaconf user)
    resolve/     composed config -> frozen LaunchPlan (the only validator of user values)
    launch/      one launch wired: plan -> run dir -> agent -> result
    agent/       the loop and its contract: executor, seams, restart policy, worker env, events
    workers/     this node's processes: supervise, spawn, contain, console, bootstrap, /proc
    rendezvous/  how nodes meet and what they share (the only torch user)
    hangs/       progress watch and verdict, across nodes
    stragglers/  the rank that arrives last at the collectives, named while the job runs
    failures/    a failure's class (user_error, oom_host, comm, hardware ...) and its evidence
    report/      failure files, summary, rendering, notices
    sweeps/      the pool launcher's engine and its view
    observe/     a running job watched: status records, `top`, metrics
    preflight/   the checks of a round's nodes before the workers start, and their verdict
    quarantine/  bad hosts and GPUs kept out of later rounds and jobs: the ledger, the gate
    schedulers/  what a scheduler tells a node (Slurm, Kubeflow, JobSet ...); the manifests
    warm/        warm starts: workers forked from a template that imported the job's modules
    checkpoint/  snapshots of the workers' state kept by the agent; the job's durable copies
    records/     the typed records of a run: failures, hangs, stragglers, goodput, preflight,
                 summary

The shared words every folder may use are `records/` and the modules at the root: `errors`,
`plan`, `jsonrecord`, `tracebacks`, `rundir`, `redact`, `stopsignals`, `gpus`, `durations`,
`nvml`. The root imports no folder, `records/` included; `records/` imports the root only.
"""

from __future__ import annotations

import os
import time

_PROGRESS_FILE = "ELASTIC_HYDRA_PROGRESS_FILE"  # set by the launcher for its workers
_SCRIPT_SAID = 4 * 21  # the line of the progress file it writes (workers/bootstrap.py)
_EVERY = 0.25  # seconds: calls closer together than this write nothing
_said = 0.0


def progress() -> None:
    """Tell the hang watch that this rank is making progress.

    For code that runs minutes inside one C call without a collective, output or a Python
    line that moves (a long compilation, a checkpoint written by a C library). Cheap enough to
    call every step: calls closer together than a quarter of a second write nothing. A no-op
    outside an elastic-hydra worker (or with `hang.timeout: null`), and it never raises.
    """
    global _said
    now = time.time()
    path = os.environ.get(_PROGRESS_FILE)
    if not path or now - _said < _EVERY:
        return
    _said = now
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return
    try:
        os.pwrite(fd, b"%-20.3f\n" % now, _SCRIPT_SAID)
    except OSError:
        pass
    finally:
        os.close(fd)
