"""Fails on one rank in a chosen way; the other ranks sleep until the launcher stops them.

    fail.py MODE [--rank R] [--attempt K] [--torch-record]

MODE: raise (ValueError "boom from rank R" inside main()), segv, abrt, fpe, kill (SIGKILL to
itself), exit3 (sys.exit(3) after writing to stderr), os_exit (os._exit(4), no traceback), ok.
--torch-record wraps main() in torch's @record (torch's own error file). Other ranks wait at most
60 s, so a broken launcher cannot leave them running for long. With --attempt K it fails only on
attempt K (TORCHELASTIC_RESTART_COUNT); every rank of any other attempt exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time


def fail(mode: str, rank: int) -> None:
    if mode == "raise":
        raise ValueError(f"boom from rank {rank}")
    if mode == "segv":
        ctypes.string_at(0)
    if mode == "abrt":
        os.abort()
    if mode == "fpe":
        os.kill(os.getpid(), signal.SIGFPE)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit3":
        print(f"rank {rank}: giving up with exit code 3", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "os_exit":
        print(f"rank {rank}: leaving through os._exit(4)", file=sys.stderr, flush=True)
        os._exit(4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--attempt", type=int, default=None)
    parser.add_argument("--torch-record", action="store_true")
    opts = parser.parse_args()
    rank = int(os.environ["RANK"])
    if opts.attempt is not None and opts.attempt != int(os.environ["TORCHELASTIC_RESTART_COUNT"]):
        return
    if rank == opts.rank and opts.mode != "ok":
        run = fail
        if opts.torch_record:
            from torch.distributed.elastic.multiprocessing.errors import record

            run = record(fail)
        run(opts.mode, rank)
    elif opts.mode != "ok":
        time.sleep(60)


if __name__ == "__main__":
    main()
