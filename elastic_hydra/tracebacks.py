"""Python tracebacks as data: parsed from text, from faulthandler dumps, or from our error files.

Pure: strings in, frozen data out. A traceback is a chain of `Stack`s, oldest first (the order
Python prints them); the launcher's own frames (the bootstrap, runpy, torch's `@record` wrapper)
are hidden. One JSON form (`to_json`/`from_json`, checked field by field) serves the bootstrap's
error file, summary.json and the rendezvous store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

# Frames that belong to the launching machinery, not to the user's program.
_LAUNCHER_FILES = (
    "elastic_hydra/workers/bootstrap.py",
    "elastic_hydra/warm/template.py",  # a warm worker's bottom frame (see warm/)
    "/runpy.py",
    "<frozen runpy>",
    "torch/distributed/elastic/multiprocessing/errors/__init__.py",
)
_LINKS = {
    "cause": "The above exception was the direct cause of the following exception:",
    "context": "During handling of the above exception, another exception occurred:",
}
_TB_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+), in (?P<name>.*)$')
_FAULT_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_FATAL = re.compile(r"^Fatal Python error: (?P<what>.*)$")
_T = TypeVar("_T")
_MISSING: Any = object()  # no default: the field is required


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    filename: str
    lineno: int
    name: str
    line: str = ""

    def to_json(self) -> dict[str, Any]:
        """Its JSON object (summary.json, the rendezvous store, the bootstrap's error file)."""
        return {
            "filename": self.filename,
            "lineno": self.lineno,
            "name": self.name,
            "line": self.line,
        }

    @classmethod
    def from_json(cls, data: object) -> Frame:
        """A frame read back; ValueError when a field is missing or of the wrong type (a frame
        without its source line, or with null for it, has none)."""
        obj = _object("Frame", data)
        return cls(
            filename=_field(obj, "Frame", "filename", str),
            lineno=_field(obj, "Frame", "lineno", int),
            name=_field(obj, "Frame", "name", str),
            line=_field(obj, "Frame", "line", str, default=""),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """One exception of a chain and the frames it unwound through, outermost first."""

    exc_type: str
    exc_value: str
    frames: tuple[Frame, ...] = ()
    link: str | None = None  # "cause" / "context": how it led to the next exception printed

    def to_json(self) -> dict[str, Any]:
        """Its JSON object: the frames as a list, outermost first."""
        return {
            "exc_type": self.exc_type,
            "exc_value": self.exc_value,
            "frames": [f.to_json() for f in self.frames],
            "link": self.link,
        }

    @classmethod
    def from_json(cls, data: object) -> Stack:
        """A stack read back; ValueError when a field is missing or of the wrong type."""
        obj = _object("Stack", data)
        frames = _field(obj, "Stack", "frames", list, default=[])
        return cls(
            exc_type=_field(obj, "Stack", "exc_type", str),
            exc_value=_field(obj, "Stack", "exc_value", str),
            frames=tuple(Frame.from_json(f) for f in frames),
            link=_field(obj, "Stack", "link", str, default=None),
        )


def to_json(stacks: Iterable[Stack]) -> list[dict[str, Any]]:
    """A chain of stacks as JSON, oldest first."""
    return [s.to_json() for s in stacks]


def from_json(data: object) -> tuple[Stack, ...]:
    """A chain of stacks read back (as the bootstrap writes them, and records keep them);
    ValueError when it is not a list of stacks."""
    if not isinstance(data, list | tuple):
        raise ValueError(f"stacks: expected a list, got {type(data).__name__}")
    return tuple(Stack.from_json(s) for s in data)


def _object(what: str, data: object) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: expected an object, got {type(data).__name__}")
    return data


def _field(
    data: Mapping[str, Any], what: str, key: str, kind: type[_T], default: Any = _MISSING
) -> _T:
    """data[key] if it is a `kind` (null or absent: `default`, where there is one)."""
    value = data.get(key)
    if value is None and default is not _MISSING:
        return default  # type: ignore[no-any-return]
    if type(value) is not kind and not (kind is list and isinstance(value, tuple)):
        raise ValueError(f"{what}.{key}: expected {kind.__name__}, got {value!r:.60}")
    return value  # type: ignore[return-value]


def is_launcher_frame(frame: Frame) -> bool:
    path = frame.filename.replace("\\", "/")
    return any(path.endswith(suffix) for suffix in _LAUNCHER_FILES)


def hide_launcher_frames(stacks: Iterable[Stack]) -> tuple[Stack, ...]:
    return tuple(
        replace(s, frames=tuple(f for f in s.frames if not is_launcher_frame(f))) for s in stacks
    )


def parse_python(text: str) -> tuple[Stack, ...]:
    """The last traceback Python printed in `text` (with its chain), or () if there is none."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == _TB_HEADER]
    if not starts:
        return ()
    # Walk back over chained exceptions printed before the last header.
    first = starts[-1]
    for earlier in reversed(starts[:-1]):
        before = [ln for ln in lines[earlier:first] if ln.strip()]
        if not before or before[-1] not in _LINKS.values():
            break
        first = earlier
    stacks: list[Stack] = []
    i = first
    while i < len(lines):
        if lines[i] != _TB_HEADER:
            break
        stack, i = _parse_one(lines, i + 1)
        while i < len(lines) and not lines[i].strip():
            i += 1
        link = next((k for k, v in _LINKS.items() if i < len(lines) and lines[i] == v), None)
        stacks.append(replace(stack, link=link))
        if link is None:
            break
        i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
    return tuple(stacks)


def _parse_one(lines: list[str], i: int) -> tuple[Stack, int]:
    frames: list[Frame] = []
    while i < len(lines) and (m := _FRAME.match(lines[i])):
        i += 1
        source = ""
        # The source line, then (3.11+) a line of ^ and ~ markers; both indented by 4.
        while i < len(lines) and lines[i].startswith("    "):
            if not source:
                source = lines[i].strip()
            i += 1
        frames.append(Frame(filename=m["file"], lineno=int(m["line"]), name=m["name"], line=source))
    message: list[str] = []
    while i < len(lines) and lines[i].strip() and lines[i] not in _LINKS.values():
        if lines[i] == _TB_HEADER:
            break
        message.append(lines[i])
        i += 1
    exc_type, _, exc_value = "\n".join(message).partition(": ")
    return Stack(exc_type=exc_type, exc_value=exc_value, frames=tuple(frames)), i


def parse_fault(text: str) -> Stack | None:
    """The crashing thread's stack from a faulthandler dump (`Fatal Python error: ...`)."""
    lines = text.splitlines()
    fatal = next((i for i, ln in enumerate(lines) if _FATAL.match(ln)), None)
    if fatal is None:
        return None
    what = _FATAL.match(lines[fatal])
    assert what is not None
    # The current thread is listed first unless it is marked explicitly.
    heads = [i for i, ln in enumerate(lines) if "(most recent call first):" in ln and i > fatal]
    current = next((i for i in heads if lines[i].startswith("Current thread")), None)
    start = current if current is not None else (heads[0] if heads else None)
    frames: list[Frame] = []
    if start is not None:
        for ln in lines[start + 1 :]:
            m = _FAULT_FRAME.match(ln)
            if m is None:
                break
            frames.append(Frame(filename=m["file"], lineno=int(m["line"]), name=m["name"]))
    return Stack(
        exc_type="Fatal Python error",
        exc_value=what["what"],
        frames=tuple(reversed(frames)),  # faulthandler lists the innermost call first
    )


_THREAD = re.compile(
    r"^(?:Current thread|Thread) (?P<id>0x[0-9a-fA-F]+) \(most recent call first\):$"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadStack:
    """One thread of a faulthandler dump (`dump_traceback(all_threads=True)`)."""

    thread_id: int
    frames: tuple[Frame, ...] = ()  # outermost first


def parse_threads(text: str) -> tuple[ThreadStack, ...]:
    """Every thread of one faulthandler dump: a `Thread 0x...` line, then its frames, each
    `File "...", line N in NAME`, innermost first."""
    found: list[tuple[int, list[Frame]]] = []
    for line in text.splitlines():
        if (head := _THREAD.match(line)) is not None:
            found.append((int(head["id"], 16), []))
        elif found and (m := _FAULT_FRAME.match(line)) is not None:
            found[-1][1].append(Frame(filename=m["file"], lineno=int(m["line"]), name=m["name"]))
    return tuple(ThreadStack(thread_id=t, frames=tuple(reversed(f))) for t, f in found)


def exception_line(stack: Stack) -> str:
    return f"{stack.exc_type}: {stack.exc_value}" if stack.exc_value else stack.exc_type


def format_stacks(stacks: Sequence[Stack]) -> str:
    """Python's own text form, for logs and terminals without rich."""
    out: list[str] = []
    for stack in stacks:
        if stack.exc_type == "Fatal Python error":
            out.append(f"Fatal Python error: {stack.exc_value}")
            out.append("Python stack at the crash (most recent call last):")
        else:
            out.append(_TB_HEADER)
        for f in stack.frames:
            out.append(f'  File "{f.filename}", line {f.lineno}, in {f.name}')
            if f.line:
                out.append(f"    {f.line}")
        if stack.exc_type != "Fatal Python error":
            out.append(exception_line(stack))
        if stack.link in _LINKS:
            out += ["", _LINKS[stack.link], ""]
    return "\n".join(out)


def parse_error_record(data: Mapping[str, Any]) -> tuple[str, tuple[Stack, ...], float | None]:
    """(message, stacks, time) from a `TORCHELASTIC_ERROR_FILE` in any of torch's formats.

    torch's `@record` writes `{"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}}`
    (time in whole seconds); its newer form is `{"message": str, "timestamp": int}`. The
    bootstrap adds the exception chain as frames and a precise time under `elastic_hydra`.
    """
    body = data.get("message")
    ours = data.get("elastic_hydra")
    if isinstance(body, dict):
        message = str(body.get("message", ""))
        callstack = str((body.get("extraInfo") or {}).get("py_callstack", ""))
    else:
        message, callstack = str(body or ""), ""
    # torch's timestamps have whole-second resolution: too coarse to order failures by.
    reported: float | None = None
    if isinstance(ours, dict):
        stacks = from_json(ours.get("stacks") or [])
        reported = float(ours["time"]) if isinstance(ours.get("time"), (int, float)) else None
    else:
        stacks = parse_python(callstack) or parse_python(message)
    return message, hide_launcher_frames(stacks), reported
