"""Hangs: a job that stops making progress is a failure too, with evidence.

- `watch`: this node's watch on its workers (`hang.timeout`): progress from the bootstrap's
  beats, stack changes and CPU time; on a hang, every rank's stack is dumped (faulthandler from
  C, no GIL needed) before any signal; on several nodes, the job's progress and every node's
  ranks come through `seams.JobShare` (the store: `rendezvous.hang_share`), and the verdict is
  computed once, from every node's ranks.
- `verdict`: hangs as data: where each rank is, and the one line that names the odd rank out,
  or says it cannot tell.

Imports: agent (worker environment, seams), workers (the /proc reader) and the root.
"""
