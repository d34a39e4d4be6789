"""Failure records shared through the rendezvous store: sealed by their node, checked by every node.

Whoever reaches the store can write into it, so a record read back is untrusted input: it is
size-capped (the whole record, each text, each list, each number, its depth), read through
`FailureRecord.from_json` (a malformed one is skipped, never a crash), accepted only from a node
that took part in the job's rounds, and, when the nodes share a secret
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

from elastic_hydra.records.failures import FailureRecord

SECRET_ENV = "ELASTIC_HYDRA_RDZV_SECRET"
MAX_RECORD_BYTES = 64 << 10
MAX_TEXT = 4096
MAX_ITEMS = 200
MAX_DEPTH = 6  # record > traceback > stack > frames > frame > value
MAX_INT = 1 << 62


@dataclass(frozen=True, slots=True)
class Checked:
    """The records that passed, and how many did not."""

    records: list[FailureRecord]
    ignored: int


def seal(record: FailureRecord, secret: bytes | None) -> str:
    """The stored form of a record: its JSON, with its HMAC when the nodes share a secret."""
    body = json.dumps(record.to_json(), sort_keys=True)
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
    and from no later round. A record that names no node or no round is from no member."""
    kept = []
    for raw in raws:
        record = check(raw, secret=secret)
        if record is None or record.node is None or record.rdzv_round is None:
            continue
        if record.rdzv_round <= last_round and (nodes is None or record.node in nodes):
            kept.append(record)
    return Checked(records=kept, ignored=len(raws) - len(kept))


def check(raw: bytes, *, secret: bytes | None) -> FailureRecord | None:
    """One stored record, validated; None when it is malformed, too large or wrongly signed."""
    if not isinstance(raw, bytes) or len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        data = json.loads(raw)
        if secret is not None:
            data = _unsealed(data, secret)
        _capped(data, MAX_DEPTH)
        return FailureRecord.from_json(data)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


def _unsealed(data: Any, secret: bytes) -> Any:
    body, mac = data["record"], data["hmac"]
    if not isinstance(body, str) or not isinstance(mac, str):
        raise TypeError("not a sealed record")
    expected = hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, mac):
        raise ValueError("bad signature")
    return json.loads(body)


def _capped(value: Any, depth: int) -> None:
    """TypeError where the JSON is larger than a failure record can be: a text over MAX_TEXT, a
    list or object over MAX_ITEMS, an integer over MAX_INT, a number that is not finite, or
    nesting deeper than MAX_DEPTH. Its schema is FailureRecord's."""
    if depth < 0:
        raise TypeError("nested too deep")
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise TypeError("not a short text")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > MAX_INT:
            raise TypeError("not a short integer")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError("not a finite number")
    elif isinstance(value, list | dict):
        if len(value) > MAX_ITEMS:
            raise TypeError("not a short list")
        items = value.values() if isinstance(value, dict) else value
        for item in items:
            _capped(item, depth - 1)
        if isinstance(value, dict):
            for key in value:
                _capped(key, depth - 1)
