"""This node's worker processes: start, contain, tee, stop.

- `supervise`: starts one attempt's workers, each in its own process group behind a gate that
  opens once the agent knows its group (no window for an orphan); wakes on a child's exit; stops
  with SIGTERM + SIGCONT, a grace, SIGKILL and a bounded wait.
- `spawn`: what a worker is to start (`WorkerSpec`) and how it comes to be: a cold start
  (`setpriv` and a shell gate, then the program) or a `Spawner`'s fork (the warm template of
  `warm/`); `supervise` sees a Popen-like process.
- `guard`: a small process of its own that kills the workers' groups if the agent dies, even
  by SIGKILL.
- `contain`: every descendant of the workers, daemons included, found and stopped at the end
  (child subreaper, cgroup when there is one); those the agent inherits are reaped as they end.
- `console`: worker output to the console as whole lines with a rank prefix; a stalled terminal
  costs console lines (counted), never log-file bytes.
- `notes`: the bootstrap's files beside a worker's logs (crash dump, stacks, progress); only
  those that hold something stay once the worker is gone.
- `procfs`: the one reader of /proc/PID/stat (state, parent, group, session, CPU time), for the
  processes here, the hang watch and `observe`.
- `bootstrap`: runs inside the worker's interpreter (the standard library only): the user's
  script as `__main__`, its uncaught exception recorded, faulthandler, progress for the hang
  watch. Its frames are hidden from every traceback we show.
- `recorder`: loaded by the bootstrap by path (the standard library only): the worker's
  collectives from torch.distributed (issued counts, the state after a hang with torch's Flight
  Recorder dump, the arrival times the straggler score reads).

Imports: agent (the seams it implements) and the root.
"""
