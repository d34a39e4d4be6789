"""Writes what the process is, as a worker sees itself, for the warm-vs-cold comparison.

process_facts.py DIR  ->  DIR/facts_<RANK>_<TORCHELASTIC_RESTART_COUNT>.json

Environment, argv, `__main__`, sys.path, `__file__`, signal dispositions and mask, its session
and group, its standard streams, its open descriptors, its threads, whether a module named by
FACTS_PROBE_MODULE is already imported (a forked worker has the template's imports).
With FACTS_FAIL_ATTEMPT=K, rank 1 exits 1 on attempt K once every rank wrote its facts.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def dispositions() -> dict[str, str]:
    found = {}
    for signum in range(1, signal.NSIG):
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        found[str(signum)] = getattr(handler, "__name__", repr(handler))
    return found


def watcher_started(deadline: float = 10.0) -> None:
    """Wait until the launcher's progress watcher (a thread of this process) wrote its first note:
    until then it may be importing `ctypes`, and a file it has open is not one of the worker's."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").endswith("/progress"):
                break
        except OSError:
            continue
    else:
        return  # no watcher in this worker
    end = time.monotonic() + deadline
    while os.fstat(int(name)).st_size == 0 and time.monotonic() < end:
        time.sleep(0.005)


def descriptors() -> dict[str, str]:
    watcher_started()
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        kind = target.split(":")[0] if ":[" in target else "file"
        fds[name] = kind if kind != "file" or int(name) > 2 else target.rsplit("/", 1)[-1]
    return fds


def facts() -> dict[str, object]:
    main = sys.modules["__main__"]
    probe = os.environ.get("FACTS_PROBE_MODULE", "")
    return {
        "env": dict(os.environ),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "path": sys.path,
        "file": __file__,
        "name": __name__,
        "main_is_this_module": main.__dict__ is globals(),
        "main_file": getattr(main, "__file__", None),
        "spec": repr(__spec__),
        "cwd": os.getcwd(),
        "dispositions": dispositions(),
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "own_session": os.getsid(0) == os.getpid(),
        "own_group": os.getpgid(0) == os.getpid(),
        "stdin": os.readlink("/proc/self/fd/0"),
        "fds": descriptors(),
        "unbuffered": getattr(sys.stdout, "write_through", None),
        "threads": len(os.listdir("/proc/self/task")),
        "flags": repr(sys.flags),
        "umask": os.umask(0o022),
        "ppid": os.getppid(),
        "probe_imported": probe in sys.modules,
    }


if __name__ == "__main__":
    out = sys.argv[1]
    name = f"facts_{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        json.dump(facts(), f)
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    if os.environ.get("FACTS_FAIL_ATTEMPT") == attempt and os.environ["RANK"] == "1":
        # Once every rank has written its facts (at most 30 s), rank 1 fails the attempt.
        names = [f"facts_{r}_{attempt}.json" for r in range(int(os.environ["WORLD_SIZE"]))]
        deadline = time.monotonic() + 30
        while not all(os.path.exists(os.path.join(out, n)) for n in names):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        raise SystemExit(f"failing attempt {attempt} on purpose")
