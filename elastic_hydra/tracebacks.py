"""Python tracebacks as data: parsed from text, from faulthandler dumps, or from our error files.

Pure: strings in, frozen data out. A traceback is a chain of `Stack`s, oldest first (the order
Python prints them); the launcher's own frames (the bootstrap, runpy, torch's `@record` wrapper)
are hidden.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

# Frames that belong to the launching machinery, not to the user's program.
_LAUNCHER_FILES = (
    "elastic_hydra/workers/bootstrap.py",
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    filename: str
    lineno: int
    name: str
    line: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """One exception of a chain and the frames it unwound through, outermost first."""

    exc_type: str
    exc_value: str
    frames: tuple[Frame, ...] = ()
    link: str | None = None  # "cause" / "context": how it led to the next exception printed


def is_launcher_frame(frame: Frame) -> bool:
    path = frame.filename.replace("\\", "/")
    return any(path.endswith(suffix) for suffix in _LAUNCHER_FILES)


def hide_launcher_frames(stacks: Iterable[Stack]) -> tuple[Stack, ...]:
    return tuple(
        replace(s, frames=tuple(f for f in s.frames if not is_launcher_frame(f))) for s in stacks
    )


def from_json(stacks: Sequence[Mapping[str, Any]]) -> tuple[Stack, ...]:
    """Stacks as the bootstrap writes them (and summary.json keeps them)."""
    return tuple(
        Stack(
            exc_type=str(s["exc_type"]),
            exc_value=str(s["exc_value"]),
            link=s.get("link"),
            frames=tuple(
                Frame(
                    filename=str(f["filename"]),
                    lineno=int(f["lineno"]),
                    name=str(f["name"]),
                    line=str(f.get("line") or ""),
                )
                for f in s.get("frames", ())
            ),
        )
        for s in stacks
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
