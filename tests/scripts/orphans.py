"""Leaves processes behind for the agent, their subreaper, to reap.

orphans.py exit N MARKER         start N children (`sh -c 'sleep 60' MARKER`, each with a
                                 `sleep` child) in this process's group, then exit 1 at once:
                                 they outlive it until the agent stops the group
orphans.py brief N MARKER DONE   N double-forked grandchildren that end at once (a checkpoint
                                 uploader, say), then write DONE and wait for the launcher
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def main() -> int:
    mode, count, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "exit":
        for _ in range(count):
            subprocess.Popen(["sh", "-c", "sleep 60", marker])
        return 1
    for _ in range(count):
        if os.fork() == 0:
            if os.fork() == 0:
                os._exit(0)  # ends now; re-parented to the agent once its parent is gone
            os._exit(0)  # its child, never waited for, goes to the subreaper
        os.wait()
    done = sys.argv[4]
    with open(done + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(done + ".tmp", done)
    time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
