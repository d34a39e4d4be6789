"""One job of a pool sweep, in a process of its own: `python -m ...elastic_hydra_pool.pool_job`.

It reads its `JobSpec` (pickled by the pool launcher) on stdin and runs it with Hydra's
`run_job`, as Hydra's basic launcher runs a job. Its exit code is the job's.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import traceback

_PR_SET_PDEATHSIG = 1
EXIT_BUG = 70


def _die_with_the_pool() -> None:
    """SIGTERM (a clean stop: logs and summary written) when the pool dies, with no window."""
    parent = os.environ.get("ELASTIC_HYDRA_POOL_PARENT")
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and str(os.getppid()) != parent:
        sys.exit(128 + signal.SIGTERM)


def main() -> int:
    _die_with_the_pool()
    from elastic_hydra import stopsignals

    stopsignals.record_early()  # a stop before the job's agent runs is its stop too
    spec = pickle.load(sys.stdin.buffer)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    from hydra.core.utils import JobRuntime, JobStatus, run_job, setup_globals

    from elastic_hydra import hydra_boundary
    from elastic_hydra.job import SweepStopped
    from elastic_hydra.records import JobResult

    setup_globals()
    hydra_boundary.register()
    JobRuntime.instance().set("name", str(spec.config.hydra.job.name))
    try:
        ret = run_job(
            hydra_context=spec.context,
            task_function=spec.task,
            config=spec.config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    except SweepStopped as exc:
        return exc.exit_code
    if ret.status == JobStatus.FAILED:
        error = ret._return_value
        traceback.print_exception(error)
        return EXIT_BUG
    value = ret.return_value
    return value.exit_code if isinstance(value, JobResult) else 0


if __name__ == "__main__":
    sys.exit(main())
