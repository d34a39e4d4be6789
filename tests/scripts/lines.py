"""Prints LINES numbered lines on stdout, then exits 0 (forever, with LINES = 0).

lines.py LINES
"""

from __future__ import annotations

import itertools
import sys

count = int(sys.argv[1])
out = sys.stdout
for i in itertools.count() if count == 0 else range(count):
    out.write(f"line {i} of a worker that writes a lot\n")
