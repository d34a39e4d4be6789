"""Test worker for the goodput ledger, no torch: each attempt works a while (Python arithmetic,
progress the hang watch sees), then does what the attempt's word says.

    goodput.py SECONDS WORD_FOR_ATTEMPT_0 WORD_FOR_ATTEMPT_1 ...

Words: `fail` (rank 1 raises, the others wait to be stopped), `hang` (every rank blocks in a
read nobody answers), `ok` (exit 0). Attempts beyond the words exit 0 at once. Nothing waits
longer than 60 s.
"""

from __future__ import annotations

import os
import sys
import time


def work(seconds: float) -> None:
    deadline, total = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        total += sum(i * i for i in range(1000))


def main() -> None:
    seconds, words = float(sys.argv[1]), sys.argv[2:]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    word = words[attempt] if attempt < len(words) else "ok"
    work(seconds)
    if word == "fail" and os.environ["RANK"] == "1":
        raise RuntimeError(f"rank 1 fails on attempt {attempt}")
    if word == "fail":
        time.sleep(60)  # stopped by the launcher after rank 1's failure
    if word == "hang":
        read_end, _write_end = os.pipe()
        os.read(read_end, 1)  # nobody writes: stuck (the launcher stops it)


if __name__ == "__main__":
    main()
