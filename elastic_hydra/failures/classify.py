"""A failed worker's class (`FailureClass`) from what it left and what its node tells. Pure.

The facts, in the order they decide: a GPU Xid of a hardware kind or an ECC error (hardware), the
kernel's OOM kill of the worker or of a process it names (oom_host), CUDA's out-of-memory error
(oom_gpu), a full disk (infra), a lost peer or an NCCL/gloo error (comm), an exception that fails
the same way every time (user_error: an import or syntax error, a missing name or file, a bad
argument). Anything else is `unknown`: a SIGKILL that no OOM kill explains is not called an OOM.
`Classifier` adds the repeat: a failure of the same class, at the same frame of the same
exception, as one of an earlier attempt is marked as its repeat (`repeat_of`), and a repeated
exception nothing else explains is a user_error: the script fails the same way every time.
Exceptions that are transient by nature (a connection, a timeout, an OS error) are never called
so. The restart policy acts on the class and the repeat (`restart.on_class`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from elastic_hydra.plan import FailureClass
from elastic_hydra.records.failures import FailureRecord, describe_returncode, lost_peer_at

# Exceptions that a new attempt raises again, at the same place: nothing outside the script
# changes between two attempts of a launch.
_DETERMINISTIC = frozenset({
    "ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError", "TabError",
    "NameError", "UnboundLocalError", "FileNotFoundError", "NotADirectoryError",
    "IsADirectoryError", "ArgumentError",
})  # fmt: skip
# Python's own words for a script it cannot open, argparse's for a bad argument (exit code 2).
_BAD_COMMAND = re.compile(
    r"can't open file .*\[Errno 2\]|: error: (unrecognized|the following|argument)|^usage: ", re.M
)
_GPU_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|NCCL.*out of memory"
)
# CUDA's sentence that says how much memory the GPU had, in its own words.
_GPU_OOM_DETAIL = re.compile(
    r"(Tried to allocate [\d.]+ \w+\. GPU \d+ has a total capacity of [\d.]+ \w+ of which "
    r"[\d.]+ \w+ is free(?:\. Including non-PyTorch memory, this process has [\d.]+ \w+ memory "
    r"in use)?)"
)
_ECC = re.compile(r"uncorrectable ECC error|ECC error encountered", re.I)
_DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]")
# NCCL's and torch.distributed's own errors; a broken connection only in their words (Python's
# own `ConnectionResetError: [Errno 104] Connection reset by peer` of a download is not comm).
_COMM = re.compile(
    r"ncclInternalError|ncclSystemError|ncclRemoteError|ncclUnhandledCudaError|NCCL error|"
    r"DistBackendError|DistNetworkError|ProcessGroupNCCL|ProcessGroupGloo"
)
_CRASH = "Fatal Python error"  # a faulthandler dump's "exception" (tracebacks.parse_fault)
_TRANSIENT = re.compile(
    r"Connection|Timeout|^OSError$|^IOError$|^BrokenPipeError$|^InterruptedError$"
)
# Xid codes that point at the GPU, its memory or its links rather than at the program (NVIDIA's
# Xid catalog: 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high
# single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 unrecovered ECC).
# 13, 31, 43 (a program's illegal access) and 45 (a killed context) are not.
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 68, 69, 73, 74, 79, 92, 94, 95, 119, 120, 140})


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelSays:
    """What the node's kernel log tells of the attempt's time (`failures.kernel`).

    Attributes:
        readable: whether the kernel log could be read at all.
        oom_kills: the OOM killer's lines, with the pid each killed.
        xids: GPU Xid lines, with their code.
    """

    readable: bool = False
    oom_kills: tuple[tuple[int, str], ...] = ()
    xids: tuple[tuple[int, str], ...] = ()


NOTHING = KernelSays()


def classify(record: FailureRecord, kernel: KernelSays = NOTHING) -> tuple[FailureClass, str]:
    """The class of `record`'s failure and the evidence that decided it (one line). The
    exception that ended the rank speaks first (every exception of its chain); the last lines of
    its stderr only where it left none (a crash, `os._exit`, a C++ abort)."""
    chain = [f"{s.exc_type}: {s.exc_value}" for s in record.traceback]
    text = "\n".join(chain or [record.message]) if chain or record.message else ""
    text = text or "\n".join(record.stderr_tail[-20:])
    if hw := [line for code, line in kernel.xids if code in HARDWARE_XIDS]:
        return FailureClass.HARDWARE, f"the kernel log: {hw[-1]}"
    if m := _ECC.search(text):
        return FailureClass.HARDWARE, _line_of(text, m.start())
    named = {record.pid} | {int(p) for p in re.findall(r"pid\(?s?\)? ?(\d+)", text)}
    if kills := [line for pid, line in kernel.oom_kills if pid in named]:
        return FailureClass.OOM_HOST, f"the kernel's OOM killer: {kills[-1]}"
    if _GPU_OOM.search(text):
        detail = _GPU_OOM_DETAIL.search(text)
        return FailureClass.OOM_GPU, detail.group(1) if detail else _line_of(text, 0)
    if _exc(record) == "MemoryError":
        return FailureClass.OOM_HOST, "MemoryError: Python could not allocate"
    if _exc(record) in _DETERMINISTIC:
        return FailureClass.USER_ERROR, record.signature or record.message
    if m := _DISK_FULL.search(text):
        return FailureClass.INFRA, _line_of(text, m.start())
    if (m := _COMM.search(text)) is not None:
        return FailureClass.COMM, _line_of(text, m.start())
    if (at := lost_peer_at(text)) is not None:  # the collateral check's own rule
        return FailureClass.COMM, _line_of(text, at)
    said = sorted(_BAD_COMMAND.finditer(text), key=lambda m: m.group(0).startswith("usage"))
    if record.returncode == 2 and said:  # argparse's error line before its usage line
        return FailureClass.USER_ERROR, _line_of(text, said[0].start())
    return FailureClass.UNKNOWN, _unknown(record, kernel)


def _exc(record: FailureRecord) -> str:
    """The type of the exception that ended it, unqualified (`torch.OutOfMemoryError` ->
    `OutOfMemoryError`), or ""."""
    if not record.traceback:
        return ""
    return record.traceback[-1].exc_type.rsplit(".", 1)[-1]


def _unknown(record: FailureRecord, kernel: KernelSays) -> str:
    if describe_returncode(record.returncode).signal != "SIGKILL":
        return ""  # its exit and its traceback tell all there is
    if not kernel.readable:
        return "killed by SIGKILL; the kernel log is not readable here: an OOM kill cannot be told"
    if kernel.oom_kills:
        return (
            f"killed by SIGKILL; the kernel killed another process for memory then "
            f"({_pids(kernel.oom_kills)}): cannot tell it was this one"
        )
    return "killed by SIGKILL, not by the kernel's OOM killer: by a person or a program"


def _pids(kills: Sequence[tuple[int, str]]) -> str:
    """The last three pids killed (the kernel names each twice: `oom-kill:` and `Killed`)."""
    pids = list(dict.fromkeys(pid for pid, _ in kills))
    return "pid " + ", ".join(map(str, pids[-3:]))


def _line_of(text: str, at: int) -> str:
    """The line of `text` that holds position `at`, stripped, at most 200 characters."""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return text[start : end if end >= 0 else len(text)].strip()[:200]


class Classifier:
    """Classes a launch's failures one by one, each with the memory of the attempts before it
    (see the module's docstring). One per launch, on the agent's thread."""

    def __init__(self) -> None:
        self._seen: dict[tuple[FailureClass, str], int] = {}  # -> the first attempt it ended

    def __call__(self, record: FailureRecord, kernel: KernelSays = NOTHING) -> FailureRecord:
        """`record` with its class, the evidence and, for a repeat, the attempt it repeats."""
        found, evidence = classify(record, kernel)
        signature = record.signature
        if found is FailureClass.UNKNOWN:
            # A crash in native code (a faulthandler dump) may come from the machine as well as
            # from the program, a connection or a timeout from the world: a repeat tells nothing.
            if not signature or _TRANSIENT.search(_exc(record)) or _exc(record) == _CRASH:
                return replace(record, failure_class=found, evidence=evidence)
            key = (FailureClass.USER_ERROR, signature)  # unexplained: deterministic if repeated
        else:
            key = (found, signature)
        earlier = self._seen.setdefault(key, record.attempt)
        if earlier >= record.attempt:
            return replace(record, failure_class=found, evidence=evidence)
        what = signature or found.value
        again = f"the same {what} as attempt {earlier}"
        return replace(
            record,
            failure_class=key[0],
            evidence=again if evidence in ("", signature) else f"{again}: {evidence}",
            repeat_of=earlier,
        )
