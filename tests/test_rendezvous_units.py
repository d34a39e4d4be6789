"""Pure pieces of the multi-node path: torchrun's rank assignment and the job-wide root cause."""

from __future__ import annotations

from typing import Any

from elastic_hydra.rendezvous_torch import assign_ranks
from elastic_hydra.summary import job_root_cause


def test_ranks_are_contiguous_per_node_in_node_rank_order() -> None:
    infos = [{"role": "default", "rank": i, "local_world_size": n} for i, n in enumerate([2, 4, 1])]
    assert assign_ranks(infos) == [[0, 7, 0, 7], [2, 7, 2, 7], [6, 7, 6, 7]]


def test_role_ranks_count_within_each_role_as_torchrun_does() -> None:
    infos = [
        {"role": "trainer", "rank": 0, "local_world_size": 2},
        {"role": "reader", "rank": 1, "local_world_size": 3},
        {"role": "trainer", "rank": 2, "local_world_size": 2},
    ]
    # [base global rank, world size, base role rank, role world size]
    assert assign_ranks(infos) == [[0, 7, 0, 4], [2, 7, 0, 3], [5, 7, 2, 4]]


def record(rank: int, time: float, rdzv_round: int = 0, **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "time": time, "rdzv_round": rdzv_round, "host": "h", **extra}


def test_the_job_root_cause_is_the_earliest_real_failure_of_the_last_failing_round() -> None:
    records = [
        record(5, 10.0, terminated_by_launcher=True),  # stopped by its launcher: never blamed
        record(3, 11.0),
        record(1, 12.5),  # a collective error on another node, after rank 3 died
        record(0, 30.0, rdzv_round=1, terminated_by_launcher=True),
        record(6, 31.0, rdzv_round=1),
        record(2, 32.0, rdzv_round=1),
    ]
    cause = job_root_cause(records[:3])
    assert cause is not None and cause["rank"] == 3
    latest = job_root_cause(records)
    assert latest is not None and latest["rank"] == 6  # the round that ended the job


def test_no_real_failure_means_no_job_root_cause() -> None:
    assert job_root_cause([]) is None
    assert job_root_cause([record(1, 1.0, terminated_by_launcher=True)]) is None
