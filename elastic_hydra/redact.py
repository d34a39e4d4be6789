"""Secret-looking values never reach a file we write.

A value is secret when its key looks like a credential's name (`WANDB_API_KEY`, `HF_TOKEN`,
`DB_PASSWORD`, ...): in a mapping under that key, or in a `key=value` override. The way to hand
a secret to workers without writing it anywhere is the agent's own environment, which every
worker inherits (`WANDB_API_KEY=... elastic-hydra job.yaml`).
"""

from __future__ import annotations

import re
from typing import Any

MASK = "<redacted>"
_SECRET_NAME = re.compile(
    r"secret|token|passw|passphrase|api_?key|access_?key|private_?key|credential|(^|_)auth($|_)",
    re.IGNORECASE,
)


def is_secret_name(name: object) -> bool:
    """Whether a key (or the last part of a dotted key) names a credential."""
    return bool(_SECRET_NAME.search(str(name).rsplit(".", 1)[-1]))


def redact_override(text: str) -> str:
    """`env.HF_TOKEN=abc` -> `env.HF_TOKEN=<redacted>`; other overrides unchanged."""
    key, sep, _ = text.partition("=")
    if sep and is_secret_name(key.lstrip("+~")):
        return f"{key}={MASK}"
    return text


def redact(value: Any) -> Any:
    """A copy of plain data (dicts, lists, strings) with every secret value masked."""
    if isinstance(value, dict):
        return {k: MASK if is_secret_name(k) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str) and "=" in value:  # an override, or Hydra's override_dirname
        return ",".join(redact_override(part) for part in value.split(","))
    return value


def redact_env(pairs: tuple[tuple[str, str], ...]) -> list[list[str]]:
    """A plan's extra environment as JSON-ready pairs, secret values masked."""
    return [[k, MASK if is_secret_name(k) else v] for k, v in pairs]
