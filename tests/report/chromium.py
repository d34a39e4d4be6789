"""Headless Chromium (Debian's `chromium`) for the HTML pages' tests: a screenshot and the DOM
after the page ran, each bounded in time, the browser's whole process group killed after.

`install_chromium.sh` in tests/services installs it where it is missing (the noxfile's `tests`
session runs it). The PNG is read with zlib (no imaging library): `png_colours` counts the
distinct colours of a screenshot, so a blank page (one colour) fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
TIMEOUT = 90.0
PROFILES = f"eh-chromium-{os.getpid()}-"  # this test process's browser profiles: find what is left
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars",
)  # fmt: skip


def browser() -> str:
    """The browser's path; installed by tests/services/install_chromium.sh when missing."""
    if not Path(CHROMIUM).exists():
        script = Path(__file__).parents[1] / "services" / "install_chromium.sh"
        subprocess.run(["bash", str(script)], check=True, timeout=900)
    return shutil.which("chromium") or CHROMIUM


def _chromium(*args: str) -> bytes:
    """Run the browser on `args` in its own process group; its stdout. Killed, group and all,
    when it ends or overruns."""
    with tempfile.TemporaryDirectory(prefix=PROFILES) as profile:
        proc = subprocess.Popen(
            [browser(), *FLAGS, f"--user-data-dir={profile}", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == 0, f"chromium exited with {proc.returncode}"
        return out


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1200, 900)) -> bytes:
    """The page rendered as PNG bytes."""
    _chromium(f"--screenshot={png}", f"--window-size={size[0]},{size[1]}", page.as_uri())
    return png.read_bytes()


def dump_dom(page: Path) -> str:
    """The page's DOM after it loaded (and ran whatever scripts it has: none, it should)."""
    return _chromium("--dump-dom", page.as_uri()).decode("utf-8", "replace")


def png_colours(data: bytes) -> int:
    """The number of distinct colours of an 8-bit RGB or RGBA PNG (what Chromium writes).

    Raises:
        AssertionError: it is no such PNG.
    """
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    previous, colours = bytearray(stride), set[bytes]()
    for y in range(height):
        at = y * (stride + 1)
        line = _unfilter(raw[at], bytearray(raw[at + 1 : at + 1 + stride]), previous, bpp)
        colours.update(bytes(line[i : i + bpp]) for i in range(0, stride, bpp * 4))
        previous = line
    return len(colours)


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> bytearray:
    """One scanline with its PNG filter undone (None, Sub, Up, Average, Paeth)."""
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + up) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        elif kind == 4:
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
            line[i] = (line[i] + best) & 0xFF
    return line
