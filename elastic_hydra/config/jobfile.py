"""Checks of a job file before Hydra reads it: what Hydra would take badly, or silently."""

from __future__ import annotations

import re
from pathlib import Path

import yaml  # type: ignore[import-untyped]

from elastic_hydra.errors import ConfigError

MAX_JOB_BYTES = 1 << 20
MAX_JOB_NODES = 100_000


def check_job_file(path: str) -> None:
    """What Hydra would take badly or silently from a job file, as one line each.

    A file that is too large, not UTF-8, a YAML "billion laughs" (aliases that expand to millions
    of nodes: composing it takes minutes and gigabytes), and YAML 1.1's base-60 reading of an
    unquoted `nnodes: 2:4` (the integer 124).
    """
    raw = Path(path).read_bytes()
    if len(raw) > MAX_JOB_BYTES:
        raise ConfigError(
            "job", f"{path} is {len(raw)} bytes, more than a job file may be", path,
            f"expected at most {MAX_JOB_BYTES} bytes; keep data out of job files",
        )  # fmt: skip
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "job", f"{path} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})",
            path, "save the job file as UTF-8",
        ) from None  # fmt: skip
    _check_yaml_size(path, text)
    found = re.search(r"^\s*nnodes:\s*(\d+):(\d+)\s*(#.*)?$", text, re.MULTILINE)
    if found:
        lo, hi = found.group(1), found.group(2)
        value = int(lo) * 60 + int(hi)
        raise ConfigError(
            "nnodes", f"YAML reads the unquoted {lo}:{hi} in {path} as the integer {value}",
            value, f'quote it: nnodes: "{lo}:{hi}"',
        )  # fmt: skip


def _check_yaml_size(path: str, text: str) -> None:
    """Count the nodes the YAML expands to, aliases included, without expanding them."""
    if "*" not in text:  # no alias: the size is the file's
        return
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return  # Hydra reports the syntax error with its position
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) not in sizes:
            sizes[id(node)] = 0  # a recursive alias counts once
            children: list[yaml.Node] = []
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [part for pair in node.value for part in pair]
            sizes[id(node)] = 1 + sum(size(c) for c in children)
        return sizes[id(node)]

    expanded = size(root) if root is not None else 0
    if expanded > MAX_JOB_NODES:
        raise ConfigError(
            "job", f"{path} expands to {expanded} YAML nodes through its aliases", path,
            f"expected at most {MAX_JOB_NODES}; use fewer nested aliases (&name / *name)",
        )  # fmt: skip


def locate_key(path: Path, dotted: str) -> int | None:
    """The line (1-based) of a dotted key in a job file, or None where the file does not hold it."""
    try:
        node = yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    line = None
    for part in dotted.split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        found = [(k, v) for k, v in node.value if getattr(k, "value", None) == part]
        if not found:
            return None
        key, node = found[-1]
        line = key.start_mark.line + 1
    return line
