"""Leaves a daemon behind (setsid + double fork, as daemons do), then ends as told.

    daemonize.py MODE PIDFILE MARKER     MODE: ok (exit 0), fail (exit 1), wait (until stopped)

The daemon writes its /proc/self/cgroup to PIDFILE.cgroup, then its pid to PIDFILE, and sleeps
60 s; MARKER in its argv lets a test find it.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    mode, pidfile = sys.argv[1], sys.argv[2]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.chdir("/")
            with open("/proc/self/cgroup") as source, open(pidfile + ".cgroup", "w") as f:
                f.write(source.read())  # where it runs, there once PIDFILE is
            with open(pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            time.sleep(60)
        os._exit(0)
    os.wait()
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    if mode == "wait":
        time.sleep(60)
    return 1 if mode == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
