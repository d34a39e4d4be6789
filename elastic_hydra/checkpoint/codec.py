"""A snapshot's bytes: a rank's state written to a file and read back, never run.

With torch imported by the script, a state is written by `torch.save` and read by `torch.load`
with `weights_only=True`: tensors, the standard containers and numbers, nothing that names code.
Without torch, it is a pickle of the standard containers, read by an unpickler that resolves no
name at all. Either way a file someone else put there cannot run code in the worker that reads it.

A state that cannot be copied (an open file, a lambda, a socket) is refused before anything is
written, with the path of the first value that cannot (`state['sampler']['fn']`).
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

_TORCH_MAGIC = b"PK"  # torch.save's zip container
_PLAIN_MAGIC = b"\x80"  # a pickle's protocol opcode
PRIVATE_FILE = 0o600


class UncopyableStateError(ValueError):
    """A value of the state cannot be copied (the message names its path and type)."""


class SnapshotReadError(ValueError):
    """A snapshot file that does not read as one (cut short, not ours, or naming code)."""


class _NoNames(pickle.Unpickler):
    """Reads the standard containers and numbers; refuses any global (a class, a function)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}")


def write(state: Mapping[str, Any], path: Path) -> int:
    """Write `state` to a new file at `path` (private); its size in bytes.

    Raises:
        UncopyableStateError: a value cannot be copied; nothing is left at `path`.
        OSError: the file could not be written (a full /dev/shm); nothing is left at `path`.
    """
    torch = sys.modules.get("torch")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as out:
            if torch is not None:
                torch.save(dict(state), out)
            else:
                pickle.dump(dict(state), out, protocol=5)
            return out.tell()
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as exc:
        path.unlink(missing_ok=True)
        where = uncopyable(state)
        raise UncopyableStateError(where or f"the state cannot be copied ({exc})") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def read(path: Path) -> dict[str, Any]:
    """A snapshot read back.

    Raises:
        SnapshotReadError: not a snapshot (cut short, another format, or it names code).
        OSError: it cannot be opened.
    """
    with open(path, "rb") as src:
        return _read(src, str(path))


def _read(src: IO[bytes], name: str) -> dict[str, Any]:
    head = src.read(2)
    src.seek(0)
    try:
        if head == _TORCH_MAGIC:
            import torch  # a torch snapshot: the script that wrote it had torch

            state = torch.load(src, weights_only=True, map_location="cpu")
        elif head[:1] == _PLAIN_MAGIC:
            state = _NoNames(src).load()
        else:
            raise SnapshotReadError(f"{name}: not a snapshot")
    except SnapshotReadError:
        raise
    except Exception as exc:  # torch's unpickler and pickle raise many kinds
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SnapshotReadError(f"{name}: {first}") from None
    if not isinstance(state, dict):
        raise SnapshotReadError(f"{name}: a {type(state).__name__}, not a dict")
    return state


def uncopyable(state: Mapping[str, Any]) -> str | None:
    """The path and type of the first value of `state` that cannot be copied, or None."""
    return _first_bad(state, "state", depth=0)


def _first_bad(value: Any, path: str, depth: int) -> str | None:
    if depth > 32:
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if (bad := _first_bad(item, f"{path}[{key!r}]", depth + 1)) is not None:
                return bad
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (bad := _first_bad(item, f"{path}[{i}]", depth + 1)) is not None:
                return bad
        return None
    if _is_tensor(value):
        return None
    try:
        pickle.dump(value, io.BytesIO(), protocol=5)
    except Exception:  # what pickle refuses: open files, lambdas, locks, sockets ...
        return f"{path} ({type(value).__name__}) cannot be copied"
    return None


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)
