"""The console entry point. It imports nothing heavy before it owns the stop signals.

From the first instruction, SIGINT/SIGTERM/SIGHUP are recorded instead of raising in the middle of
Hydra's composition (see `stopsignals`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def main() -> NoReturn:
    """`elastic-hydra` and `python -m elastic_hydra`."""
    from elastic_hydra import stopsignals

    stopsignals.record_early()
    _bytes_as_typed()
    try:
        if sys.argv[1:2] == ["rdzv-server"]:  # no Hydra: the store process stays small
            from elastic_hydra.cli import rdzv_server

            sys.exit(rdzv_server.main(sys.argv[2:]))
        if sys.argv[1:2] == ["top"]:  # no Hydra: a viewer that starts at once
            from elastic_hydra.cli import top

            sys.exit(top.run(sys.argv[2:]))
        if sys.argv[1:2] == ["logs"]:  # no Hydra: a reader of files
            from elastic_hydra.cli import logs

            sys.exit(logs.run(sys.argv[2:]))
        if sys.argv[1:2] == ["quarantine"]:  # Hydra only for a job file that names the ledger
            from elastic_hydra.cli import quarantine

            sys.exit(quarantine.main(sys.argv[2:]))
        from elastic_hydra.warm import early

        early.begin(sys.argv[1:])  # the warm template imports while we compose (warm/early)
        from elastic_hydra.cli import run

        run.main()
    except SystemExit as exc:
        _leave(exc)


def _bytes_as_typed() -> None:
    """An argument that is not UTF-8 (`-- $'\\xff'`) is a str with lone surrogates here
    (`os.fsdecode`): print it back as the bytes it was, as Python's own C locale does, rather
    than fail on it (`--plan`, the report)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # replaced, or closed
            stream.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]


def _leave(exc: SystemExit) -> NoReturn:
    """Exit without the interpreter's teardown.

    By then every file the launcher wrote is closed, every worker reaped and the rendezvous shut
    down: the teardown would only free thousands of modules, about 0.6 s of CPU per agent once
    torch is loaded (0.05 s without), paid by every node at the end of every job. The logging
    handlers (a log file a job may configure) and the standard streams are flushed first.
    """
    code = 0 if exc.code is None else exc.code
    if not isinstance(code, int):  # sys.exit("message"): Python prints it
        raise exc
    if (early := sys.modules.get("elastic_hydra.warm.early")) is not None:
        early.discard()  # a template no launch claimed (a configuration error...)
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe loses nothing more
            stream.flush()
    os._exit(code)
