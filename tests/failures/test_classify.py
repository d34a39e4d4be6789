"""A failed worker's class from what it left and what its node's kernel says: the rules, each on
healthy look-alikes too (a SIGKILL no OOM kill explains is not an OOM; a transient error that
repeats is not a user error), and the kernel log read back from the real /dev/kmsg."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace

import pytest

from elastic_hydra.failures import kernel
from elastic_hydra.failures.classify import NOTHING, Classifier, KernelSays, classify
from elastic_hydra.plan import FailureClass
from elastic_hydra.records.failures import FailureRecord
from elastic_hydra.tracebacks import Frame, Stack

C = FailureClass


def failed(
    exc: str = "",
    value: str = "",
    *,
    at: tuple[str, int] = ("/job/train.py", 3),
    returncode: int = 1,
    stderr: tuple[str, ...] = (),
    attempt: int = 0,
    pid: int = 4242,
) -> FailureRecord:
    stacks = (
        (Stack(exc_type=exc, exc_value=value, frames=(Frame(filename=at[0], lineno=at[1],
                                                              name="<module>"),)),)
        if exc else ()
    )  # fmt: skip
    return FailureRecord(
        rank=0, local_rank=0, host="h", pid=pid, attempt=attempt, returncode=returncode,
        time=1.0, message=f"{exc}: {value}" if exc else "", traceback=stacks, stderr_tail=stderr,
    )  # fmt: skip


GPU_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.15 GiB of "
    "which 3.12 GiB is free. Including non-PyTorch memory, this process has 76.02 GiB memory in "
    "use. Of the allocated memory 74.1 GiB is allocated by PyTorch"
)


@pytest.mark.parametrize(
    ("record", "kernel_says", "found", "evidence"),
    [
        (failed("ModuleNotFoundError", "No module named 'tranformers'"), NOTHING, C.USER_ERROR,
         "ModuleNotFoundError at train.py:3"),
        (failed("SyntaxError", "invalid syntax"), NOTHING, C.USER_ERROR,
         "SyntaxError at train.py:3"),
        (failed(returncode=2, stderr=("usage: train.py [-h] [--lr LR]",
                                       "train.py: error: unrecognized arguments: --lrr 0.1")),
         NOTHING, C.USER_ERROR, "train.py: error: unrecognized arguments: --lrr 0.1"),
        (failed(returncode=2, stderr=("python3: can't open file '/job/trian.py': [Errno 2] No "
                                       "such file or directory",)),
         NOTHING, C.USER_ERROR, "python3: can't open file '/job/trian.py': [Errno 2] No such "
         "file or directory"),
        (failed("torch.OutOfMemoryError", GPU_OOM), NOTHING, C.OOM_GPU,
         "Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 3.12 GiB "
         "is free. Including non-PyTorch memory, this process has 76.02 GiB memory in use"),
        (failed(returncode=-9), KernelSays(readable=True, oom_kills=((4242, "Memory cgroup out of "
         "memory: Killed process 4242 (python3) anon-rss:2097152kB"),)), C.OOM_HOST,
         "the kernel's OOM killer: Memory cgroup out of memory: Killed process 4242 (python3) "
         "anon-rss:2097152kB"),
        (failed("RuntimeError", "DataLoader worker (pid 5151) is killed by signal: Killed."),
         KernelSays(readable=True, oom_kills=((5151, "Out of memory: Killed process 5151"),)),
         C.OOM_HOST, "the kernel's OOM killer: Out of memory: Killed process 5151"),
        (failed("MemoryError", ""), NOTHING, C.OOM_HOST, "MemoryError: Python could not allocate"),
        (failed("OSError", "[Errno 28] No space left on device: '/ckpt/step_100.pt'"), NOTHING,
         C.INFRA, "OSError: [Errno 28] No space left on device: '/ckpt/step_100.pt'"),
        (failed("torch.distributed.DistBackendError", "[../third_party/gloo/gloo/transport/tcp/"
                "pair.cc:534] Connection closed by peer [127.0.0.1]:41234"), NOTHING, C.COMM,
         "torch.distributed.DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
         " Connection closed by peer [127.0.0.1]:41234"),
        (failed("RuntimeError", "CUDA error: uncorrectable ECC error encountered"), NOTHING,
         C.HARDWARE, "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
        (failed("RuntimeError", "CUDA error: unspecified launch failure"),
         KernelSays(readable=True, xids=((79, "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has "
                                          "fallen off the bus."),)),
         C.HARDWARE, "the kernel log: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen "
         "off the bus."),
    ],
    ids=["import", "syntax", "argparse", "no-script", "gpu-oom", "host-oom", "dataloader-oom",
         "memoryerror", "disk-full", "lost-peer", "ecc", "xid-79"],
)  # fmt: skip
def test_each_class_with_the_evidence_that_decided_it(
    record: FailureRecord, kernel_says: KernelSays, found: FailureClass, evidence: str
) -> None:
    assert classify(record, kernel_says) == (found, evidence)


@pytest.mark.parametrize(
    ("record", "kernel_says", "evidence"),
    [
        (failed(returncode=-9), NOTHING,
         "killed by SIGKILL; the kernel log is not readable here: an OOM kill cannot be told"),
        (failed(returncode=-9), KernelSays(readable=True),
         "killed by SIGKILL, not by the kernel's OOM killer: by a person or a program"),
        (failed(returncode=-9), KernelSays(readable=True, oom_kills=((77, "Killed process 77"),)),
         "killed by SIGKILL; the kernel killed another process for memory then (pid 77): cannot "
         "tell it was this one"),
        (failed("RuntimeError", "CUDA error: an illegal memory access was encountered"),
         KernelSays(readable=True, xids=((13, "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM "
                                          "Warp Exception"),)),
         ""),
        (failed("ValueError", "loss is nan"), NOTHING, ""),  # its traceback tells all there is
        (failed(returncode=2), NOTHING, ""),  # exit 2 alone is no bad command line
        (failed("ConnectionResetError", "[Errno 104] Connection reset by peer"), NOTHING, ""),
    ],
    ids=["sigkill-unreadable", "sigkill-not-oom", "sigkill-other-pid", "xid-13-is-the-program",
         "value-error", "exit-2", "a-download's-reset"],
)  # fmt: skip
def test_what_nothing_explains_is_unknown_and_says_why(
    record: FailureRecord, kernel_says: KernelSays, evidence: str
) -> None:
    assert classify(record, kernel_says) == (C.UNKNOWN, evidence)


def test_the_same_exception_at_the_same_frame_in_a_later_attempt_is_a_user_error() -> None:
    classed = Classifier()
    first = classed(failed("KeyError", "'label'", attempt=0))
    assert (first.failure_class, first.repeat_of) == (C.UNKNOWN, None)
    other_rank = classed(replace(failed("KeyError", "'label'", attempt=0), rank=1))
    assert other_rank.repeat_of is None  # the same attempt: not a repeat
    again = classed(failed("KeyError", "'label'", attempt=1))
    assert (again.failure_class, again.repeat_of) == (C.USER_ERROR, 0)
    assert again.evidence == "the same KeyError at train.py:3 as attempt 0"
    moved = classed(failed("KeyError", "'label'", at=("/job/train.py", 9), attempt=2))
    assert (moved.failure_class, moved.repeat_of) == (C.UNKNOWN, None)  # another frame: new


def test_a_transient_error_that_repeats_is_not_called_deterministic() -> None:
    classed = Classifier()
    for attempt in range(3):
        record = classed(failed("ConnectionResetError", "[Errno 104]", attempt=attempt))
        assert (record.failure_class, record.repeat_of) == (C.UNKNOWN, None)
        timeout = classed(failed("requests.exceptions.ReadTimeout", "x", attempt=attempt))
        assert timeout.repeat_of is None


def test_a_native_crash_that_repeats_is_not_called_deterministic() -> None:
    classed = Classifier()
    for attempt in range(3):  # faulthandler's dump, at the same frame every time
        crash = failed("Fatal Python error", "Segmentation fault", attempt=attempt, returncode=-11)
        assert (classed(crash).failure_class, classed(crash).repeat_of) == (C.UNKNOWN, None)


def test_a_class_that_repeats_is_marked_and_keeps_its_class() -> None:
    classed = Classifier()
    oom = KernelSays(readable=True, oom_kills=((4242, "Killed process 4242 (python3)"),))
    assert classed(failed(returncode=-9), oom).repeat_of is None
    again = classed(failed(returncode=-9, attempt=1), oom)
    assert (again.failure_class, again.repeat_of) == (C.OOM_HOST, 0)
    assert again.evidence == (
        "the same oom_host as attempt 0: the kernel's OOM killer: Killed process 4242 (python3)"
    )


def kmsg(seq: int, usec: int, text: str) -> bytes:
    return f"6,{seq},{usec},-;{text}\n SUBSYSTEM=x\n".encode()


def test_the_kernel_log_is_read_from_the_attempts_time_on() -> None:
    records = [
        kmsg(1, 5_000_000, "Out of memory: Killed process 10 (python3) anon-rss:1024kB"),
        kmsg(2, 20_000_000, "Memory cgroup out of memory: Killed process 11 (python3)"),
        kmsg(3, 20_000_001, "oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid=12,uid=0"),
        kmsg(4, 21_000_000, "NVRM: Xid (PCI:0000:3b:00): 79, pid=12, GPU has fallen off the bus."),
        b"not a record", kmsg(5, 22_000_000, "eth0: link up"),
    ]  # fmt: skip
    said = kernel.parse(records, after=10.0)
    assert said.readable and [pid for pid, _ in said.oom_kills] == [11, 12]
    assert said.xids == (
        (79, "NVRM: Xid (PCI:0000:3b:00): 79, pid=12, GPU has fallen off the bus."),
    )


def test_the_real_kernel_log_is_read_back_and_an_unreadable_one_is_said() -> None:
    # A line of our own in the host's kernel log, named for what it is; its pid is above any
    # pid_max, so no worker can ever be matched with it.
    marker = f"elastic-hydra test {uuid.uuid4().hex[:8]} (not a real kill): oom-kill:pid=99999999"
    start = time.monotonic()
    fd = os.open(kernel.KMSG, os.O_WRONLY)
    try:
        os.write(fd, f"{marker}\n".encode())  # a line without its newline waits for the next
    finally:
        os.close(fd)
    said = kernel.since(start)
    assert said.readable and (99999999, marker) in said.oom_kills
    assert not kernel.since(time.monotonic() + 60).oom_kills  # nothing from the future
    assert kernel.since(start, path="/nonexistent/kmsg") == KernelSays(readable=False)


def test_the_exception_speaks_before_the_lines_printed_before_it() -> None:
    noisy = ("NCCL INFO Connection closed by peer", "No space left on device (an old warning)")
    typo = failed("ModuleNotFoundError", "No module named 'x'", stderr=noisy)
    assert classify(typo)[0] is C.USER_ERROR
    assert classify(failed("ValueError", "loss is nan", stderr=noisy)) == (C.UNKNOWN, "")
    crashed = failed(returncode=-6, stderr=("terminate called after ...", noisy[0]))
    assert classify(crashed) == (C.COMM, "NCCL INFO Connection closed by peer")  # no exception
    chained = replace(
        failed("RuntimeError", "step failed"),
        traceback=(
            Stack(exc_type="torch.distributed.DistBackendError", exc_value="ncclRemoteError",
                  link="cause"),
            *failed("RuntimeError", "step failed").traceback,
        ),
    )  # fmt: skip
    assert classify(chained) == (C.COMM, "torch.distributed.DistBackendError: ncclRemoteError")
