"""The console entry point: imports nothing heavy before it can answer Ctrl-C quietly."""

from __future__ import annotations

import sys


def main() -> None:
    """`elastic-hydra` and `python -m elastic_hydra`."""
    try:
        from elastic_hydra.cli import main as cli_main
    except KeyboardInterrupt:  # Ctrl-C while Hydra is being imported
        sys.exit(130)
    cli_main()
