"""Failure records shared through the rendezvous store: sealed by their node, checked by every node.

Whoever reaches the store can write into it, so a record read back is untrusted input: it is
size-capped, type-checked field by field (a malformed one is skipped, never a crash), accepted only
from a node that took part in the job's rounds, and, when the nodes share a secret
(`ELASTIC_HYDRA_RDZV_SECRET`, from the agents' environment only), only with a valid HMAC-SHA256.
Pure: no I/O; the caller reads the store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

SECRET_ENV = "ELASTIC_HYDRA_RDZV_SECRET"
MAX_RECORD_BYTES = 64 << 10
MAX_TEXT = 4096
MAX_ITEMS = 200

_INT = (
    "rank",
    "local_rank",
    "pid",
    "attempt",
    "restart_count",
    "returncode",
    "node_rank",
    "rdzv_round",
)
_TEXT = ("host", "exit", "source", "message", "error_file", "stdout_log", "stderr_log", "node")
_OPTIONAL_TEXT = ("signal", "message", "error_file", "stdout_log", "stderr_log", "source")
_FRAME = {"filename": str, "lineno": int, "name": str, "line": str}
_STACK_TEXT = ("exc_type", "exc_value")


@dataclass(frozen=True, slots=True)
class Checked:
    """The records that passed, and how many did not."""

    records: list[dict[str, Any]]
    ignored: int


def seal(record: dict[str, Any], secret: bytes | None) -> str:
    """The stored form of a record: JSON, with its HMAC when the nodes share a secret."""
    body = json.dumps(record, sort_keys=True, default=str)
    if secret is None:
        return body
    mac = hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
    return json.dumps({"record": body, "hmac": mac})


def check_all(
    raws: list[bytes],
    *,
    secret: bytes | None,
    nodes: Collection[str] | None,
    last_round: int,
) -> Checked:
    """Keep the records that are well-formed, signed (with a secret), from a member node
    (`nodes`: every node this agent saw in the job's rounds; None where the backend does not say)
    and from no later round."""
    kept = []
    for raw in raws:
        record = check(raw, secret=secret)
        if record is None or record["rdzv_round"] > last_round:
            continue
        if nodes is None or record["node"] in nodes:
            kept.append(record)
    return Checked(records=kept, ignored=len(raws) - len(kept))


def check(raw: bytes, *, secret: bytes | None) -> dict[str, Any] | None:
    """One stored record, validated; None when it is malformed, too large or wrongly signed."""
    if not isinstance(raw, bytes) or len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        data = json.loads(raw)
        if secret is not None:
            data = _unsealed(data, secret)
        return _valid(data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _unsealed(data: Any, secret: bytes) -> Any:
    body, mac = data["record"], data["hmac"]
    if not isinstance(body, str) or not isinstance(mac, str):
        raise TypeError("not a sealed record")
    expected = hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, mac):
        raise ValueError("bad signature")
    return json.loads(body)


def _valid(data: Any) -> dict[str, Any]:
    """The record with every known field checked; unknown fields are dropped."""
    if not isinstance(data, dict):
        raise TypeError("not an object")
    out: dict[str, Any] = {}
    for key in _INT:
        out[key] = _int(data[key])
    for key in _TEXT:
        value = data.get(key)
        if value is None and key in _OPTIONAL_TEXT:
            out[key] = None
        else:
            out[key] = _text(value)
    out["signal"] = None if data.get("signal") is None else _text(data["signal"])
    out["time"] = _number(data["time"])
    out["terminated_by_launcher"] = _bool(data.get("terminated_by_launcher", False))
    out["stderr_tail"] = [_text(line) for line in _list(data.get("stderr_tail", []))]
    out["traceback"] = [_stack(s) for s in _list(data.get("traceback", []))]
    return out


def _stack(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError("not a stack")
    stack: dict[str, Any] = {key: _text(data[key]) for key in _STACK_TEXT}
    stack["link"] = None if data.get("link") is None else _text(data["link"])
    stack["frames"] = [_frame(f) for f in _list(data.get("frames", []))]
    return stack


def _frame(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError("not a frame")
    return {
        k: _int(data[k]) if kind is int else _text(data.get(k, "")) for k, kind in _FRAME.items()
    }


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 1 << 62:
        raise TypeError("not an integer")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError("not a number")
    return float(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("not a boolean")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise TypeError("not a short text")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise TypeError("not a short list")
    return value
