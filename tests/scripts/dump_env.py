"""Writes its environment, working directory and argv as JSON.

dump_env.py DIR  ->  DIR/env_<RANK>_<TORCHELASTIC_RESTART_COUNT>.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "executable": sys.executable,
        "unbuffered": getattr(sys.stdout, "write_through", None),  # True under python -u
        "pid": os.getpid(),
    }
    name = f"env_{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
    tmp = out / (name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
