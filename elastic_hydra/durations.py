"""Durations as people write them: `90`, `90s`, `30m`, `24h`, `7d`, `1h30m`. Pure.

One reader for every key and flag that takes a span of time longer than a few seconds
(`quarantine.cooldown`, `elastic-hydra quarantine add --cooldown`), and one writer that shows
a span back the same way (`23h59m`).
"""

from __future__ import annotations

import math
import re

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
DURATION_FORM = "expected seconds or a duration such as 90s, 30m, 24h, 7d or 1h30m"


def parse_duration(text: object) -> float:
    """Seconds in `text`: a number (seconds) or parts such as `1h30m`.

    Raises:
        ValueError: not a duration, or not a positive finite one.
    """
    if isinstance(text, bool):
        raise ValueError("not a duration")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        word = str(text).strip().lower().replace(" ", "")
        try:
            seconds = float(word)
        except ValueError:
            parts = _PART.findall(word)
            if not parts or "".join(n + u for n, u in parts) != word:
                raise ValueError("not a duration") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("not a positive duration")
    return seconds


def show_duration(seconds: float) -> str:
    """A span as `2d3h`, `23h59m`, `5m`, `42s` (the two largest units; under a second: `0s`)."""
    left = max(0, round(seconds))
    if left < 60:
        return f"{left}s"
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        count, left = divmod(left, int(_UNITS[unit]))
        if count or parts:
            parts.append(f"{count}{unit}")
        if len(parts) == 2:
            break
    return "".join(p for p in parts if not p.startswith("0")) or "0s"
