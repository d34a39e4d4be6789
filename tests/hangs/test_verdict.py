"""The hang verdict tells waiters from suspects, for any number of ranks, and says when it
cannot tell.

Pure tests build each rank as the watch does from a dump (`watch._with_threads`): stacks shaped
like those of DDP, FSDP, an explicit collective, a data loader, a stopped and an exited rank.
One real launch: two gloo ranks under DDP, rank 1 asleep before `backward()` while rank 0 waits
inside autograd's engine (where DDP's allreduce runs), must name rank 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from elastic_hydra.hangs import verdict
from elastic_hydra.hangs.watch import _with_threads
from elastic_hydra.plan import HangAction
from elastic_hydra.records.hangs import HangRank, RankState
from elastic_hydra.tracebacks import Frame, ThreadStack
from tests.conftest import WORKERS
from tests.hangs.test_hangs import launch

Where = tuple[str, int, str]  # a frame: file, line, function
SITE = "/e/lib/python3.11/site-packages"
TORCH = f"{SITE}/torch"
BACKWARD = [  # loss.backward() down to autograd's engine (DDP's allreduce hooks run in there)
    (f"{TORCH}/_tensor.py", 648, "backward"),
    (f"{TORCH}/autograd/__init__.py", 353, "backward"),
    (f"{TORCH}/autograd/graph.py", 824, "_engine_run_backward"),
]
ALL_REDUCE = [
    (f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
    (f"{TORCH}/distributed/distributed_c10d.py", 2806, "all_reduce"),
]
FSDP_FORWARD = [  # FSDP's forward unshards its parameters: an all_gather
    (f"{TORCH}/nn/modules/module.py", 1773, "_wrapped_call_impl"),
    (f"{TORCH}/nn/modules/module.py", 1784, "_call_impl"),
    (f"{TORCH}/distributed/fsdp/fully_sharded_data_parallel.py", 850, "forward"),
    (f"{TORCH}/distributed/fsdp/_runtime_utils.py", 1175, "_pre_forward_unshard"),
    (f"{TORCH}/distributed/fsdp/_flat_param.py", 1420, "_all_gather_flat_param"),
    (f"{TORCH}/distributed/distributed_c10d.py", 3720, "all_gather_into_tensor"),
]
FSDP_BACKWARD = [  # FSDP's post-backward hook, run by the engine: a reduce_scatter
    *BACKWARD,
    (f"{TORCH}/distributed/fsdp/_runtime_utils.py", 715, "_post_backward_hook"),
    (f"{TORCH}/distributed/distributed_c10d.py", 4170, "reduce_scatter_tensor"),
]
LOADER_WORKERS = [  # a DataLoader with workers: the main thread waits for a batch
    (f"{TORCH}/utils/data/dataloader.py", 708, "__next__"),
    (f"{TORCH}/utils/data/dataloader.py", 1458, "_next_data"),
    (f"{TORCH}/utils/data/dataloader.py", 1420, "_get_data"),
    (f"{TORCH}/utils/data/dataloader.py", 1251, "_try_get_data"),
    ("/usr/lib/python3.11/queue.py", 180, "get"),
    ("/usr/lib/python3.11/threading.py", 331, "wait"),
]
CUDA_SYNC = [(f"{TORCH}/cuda/__init__.py", 985, "synchronize")]


def dumped(r: int, line: int, below: Sequence[Where] = (), code: str = "") -> HangRank:
    """Rank `r` dumped with its main thread at train.py:`line` (in `main`), then `below`."""
    frames = [("/u/train.py", 90, "<module>"), ("/u/train.py", line, "main"), *below]
    stack = ThreadStack(
        thread_id=1, frames=tuple(Frame(filename=f, lineno=n, name=m) for f, n, m in frames)
    )
    base = HangRank(rank=r, local_rank=r, pid=100 + r, state=RankState.EXITED)
    return replace(_with_threads(base, (stack,), 1), code=code)


def state(r: int, what: RankState) -> HangRank:
    return HangRank(rank=r, local_rank=r, pid=100 + r, state=what)


def sleeping(r: int, line: int = 34) -> HangRank:
    return dumped(r, line, code="time.sleep(10**6)")


# ------------------------------------------------------------------------ a suspect is named
def test_ddp_names_the_rank_asleep_before_backward_not_the_one_in_autograds_engine() -> None:
    # The case: the two groups of one tied, and the tie went to rank 0.
    text, odd = verdict.verdict([dumped(0, 38, BACKWARD), sleeping(1)], 12.2)
    assert odd == {1}
    assert text == (
        "hang after 12 s without progress: rank 1 at train.py:34 (time.sleep(10**6)) "
        "(stuck here); rank 0 in torch.autograd.graph._engine_run_backward called from "
        "train.py:38"
    )


@pytest.mark.parametrize("waiting", [FSDP_FORWARD, FSDP_BACKWARD], ids=["forward", "backward"])
def test_fsdp_names_the_rank_in_its_data_loader(waiting: list[Where]) -> None:
    ranks = [dumped(0, 40, waiting), dumped(1, 40, waiting), dumped(2, 22, LOADER_WORKERS),
             dumped(3, 40, waiting)]  # fmt: skip
    text, odd = verdict.verdict(ranks, 30)
    assert odd == {2}
    assert text.startswith(
        "hang after 30 s without progress: rank 2 in threading.wait called from train.py:22 "
        "(stuck here); ranks 0,1,3 in torch.distributed.distributed_c10d."
    )


@pytest.mark.parametrize(("n", "stuck"), [(n, s) for n in (2, 3, 4) for s in range(n)], ids=str)
def test_an_explicit_all_reduce_names_the_late_rank_whichever_it_is(n: int, stuck: int) -> None:
    ranks = [sleeping(r) if r == stuck else dumped(r, 42, ALL_REDUCE) for r in range(n)]
    text, odd = verdict.verdict(ranks, 5)
    assert odd == {stuck}
    assert text.startswith(f"hang after 5 s without progress: rank {stuck} at train.py:34")
    assert text.count("(stuck here)") == 1 and "cannot tell" not in text


def test_a_stopped_rank_beside_an_exited_one_is_the_suspect() -> None:
    # Before: "rank 0 exited (stuck here); rank 1 stopped".
    text, odd = verdict.verdict([state(0, RankState.EXITED), state(1, RankState.STOPPED)], 3)
    assert odd == {1}
    assert text == "hang after 3 s without progress: rank 1 stopped (stuck here); rank 0 exited"


@pytest.mark.parametrize(
    "waiter",
    [
        dumped(0, 50, CUDA_SYNC),
        dumped(0, 50, code="work.wait()"),  # a C call straight from the user's line
        dumped(0, 50, code="store.wait(['ready'])"),
        state(0, RankState.EXITED),
    ],
    ids=["cuda-synchronize", "work-wait", "store-wait", "exited"],
)
def test_waits_from_c_and_exits_are_waiters(waiter: HangRank) -> None:
    _, odd = verdict.verdict([waiter, sleeping(1), dumped(2, 42, ALL_REDUCE)], 5)
    assert odd == {1}


# ------------------------------------------------------------------------ or it cannot tell
@pytest.mark.parametrize(
    ("ranks", "why"),
    [
        (
            [dumped(0, 42, ALL_REDUCE), dumped(1, 38, BACKWARD), state(2, RankState.EXITED)],
            "every rank waits for the others or has exited",
        ),
        (
            [sleeping(0), dumped(1, 22, LOADER_WORKERS), dumped(2, 42, ALL_REDUCE)],
            "ranks in 2 places are not waiting for the others",
        ),
        (
            [state(0, RankState.STOPPED), sleeping(1), sleeping(2)],
            "ranks in 2 places are not waiting for the others",
        ),
        (
            [state(0, RankState.NO_DUMP), sleeping(1), dumped(2, 42, ALL_REDUCE)],
            "ranks in 2 places are not waiting for the others",
        ),
        ([sleeping(0), sleeping(1)], "every rank is in one place"),
    ],
    ids=["all-wait", "two-suspects", "stopped-and-asleep", "undumped-and-asleep", "one-place"],
)
def test_without_one_suspect_group_it_cannot_tell(ranks: list[HangRank], why: str) -> None:
    text, odd = verdict.verdict(ranks, 7)
    assert odd == frozenset()
    assert text.startswith(f"hang after 7 s without progress; cannot tell which rank ({why}): ")
    assert "(stuck here)" not in text


def test_the_report_shows_one_stack_per_place_when_it_cannot_tell() -> None:
    from elastic_hydra.records.hangs import HangRecord
    from elastic_hydra.report.render import hang_section

    ranks = [dumped(0, 42, ALL_REDUCE), dumped(1, 42, ALL_REDUCE), dumped(2, 38, BACKWARD)]
    text, odd = verdict.verdict(ranks, 7)
    assert odd == frozenset()
    record = HangRecord(verdict=text, idle_s=7, timeout_s=5, action=HangAction.FAIL, attempt=0,
                        time=0.0, ranks=tuple(ranks))  # fmt: skip
    shown = [str(part) for part in hang_section(record, plain=True)]
    assert [line for line in shown if line.startswith("rank ")] == [
        "rank 2 (local rank 2) on , pid 102: dumped",
        "rank 0 (local rank 0) on , pid 100: dumped",
    ]


def test_one_rank_alone_needs_no_telling() -> None:
    text, odd = verdict.verdict([sleeping(0)], 7)
    assert odd == frozenset()
    assert text == "hang after 7 s without progress: rank 0 at train.py:34 (time.sleep(10**6))"


# ------------------------------------------------------------------------------- real torch
def test_ddp_with_a_rank_asleep_before_backward_names_that_rank(tmp_path: Path) -> None:
    code, stderr, summary, _ = launch(
        tmp_path, f"script={WORKERS / 'hang_ddp.py'}", "nproc_per_node=2", "hang.timeout=3",
        "hang.action=fail", script_args=("1", "60"),
    )  # fmt: skip
    assert code == 1, stderr
    text = summary["hang"]["verdict"]
    assert "rank 1 at hang_ddp.py:" in text and "(time.sleep(seconds)) (stuck here)" in text, text
    assert "rank 0 in torch.autograd.graph._engine_run_backward called from hang_ddp.py:" in text
    assert [r["odd"] for r in summary["hang"]["ranks"]] == [False, True]
