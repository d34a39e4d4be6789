"""Typed values to JSON and back, every field checked: the one reader of what we wrote.

Pure. `summary.json`, the failure records in the rendezvous store (untrusted: another node, or
anyone who reaches the store, wrote them) and the lines of `events.jsonl` are read back through
`checked`, which turns a JSON value into the field's type hint or raises `ValueError` naming the
field in JSON's words (`summary.exit_code: expected integer, got '1'`). `JsonRecord` gives a frozen
dataclass its `to_json`/`from_json`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

R = TypeVar("R", bound="JsonRecord")
_NAMES: dict[object, str] = {
    type(None): "null", float: "number", int: "integer", str: "string", bool: "boolean"
}  # fmt: skip


def plain(value: Any) -> Any:
    """A field's value in JSON: records by their `to_json`, enums by value, tuples as lists."""
    if hasattr(value, "to_json") and not isinstance(value, type):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


def checked(name: str, value: Any, hint: Any) -> Any:
    """`value` as a field of type `hint` (a JSON-like type hint), or ValueError naming `name`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return checked(name, value, option)
            except ValueError:
                continue
    elif hint is type(None):
        if value is None:
            return None
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        if type(value) in (str, int) and value in [m.value for m in hint]:
            return hint(value)
        known = ", ".join(str(m.value) for m in hint)
        raise ValueError(f"{name}: expected one of {known}, got {value!r:.40}")
    elif isinstance(hint, type) and hasattr(hint, "from_json"):
        try:
            return hint.from_json(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    elif origin is tuple and isinstance(value, list):
        return tuple(checked(f"{name}[{i}]", v, args[0]) for i, v in enumerate(value))
    elif hint is float and type(value) in (int, float):
        return float(value)
    elif (
        (hint in (int, str, bool) and type(value) is hint)
        or hint is Any
        or (origin is dict and isinstance(value, dict))
    ):
        return value
    raise ValueError(f"{name}: expected {json_name(hint)}, got {value!r:.40}")


def json_name(hint: Any) -> str:
    """A type hint in JSON's words: `integer or null`, `list`, `object`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(json_name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return "list"
    if typing.get_origin(hint) is dict:
        return "object"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


class JsonRecord:
    """to_json/from_json for a frozen dataclass; from_json checks each field's type. Derived
    fields (init=False) are written, and recomputed on reading rather than read."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[R], data: object) -> R:
        """The record of `data`; ValueError names the field at fault."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if not f.init:
                continue
            if f.name in data:
                values[f.name] = checked(f"{cls.__name__}.{f.name}", data[f.name], hints[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__}.{f.name}: missing")
        return cls(**values)
