"""Hangs: a job that stops making progress is a failure too, with evidence.

- `watch`: this node's watch on its workers (`hang.timeout`): progress from the bootstrap's
  beats, stack changes and CPU time; on a hang, every rank's stack is dumped (faulthandler from
  C, no GIL needed) before any signal.
- `verdict`: hangs as data: where each rank is, and the one line that names the odd rank out,
  or says it cannot tell.
- `share`: hangs across nodes through the rendezvous store: each node's progress, and every
  node's ranks for one job-wide verdict.

Imports: agent (worker environment, seams), workers (the /proc reader) and the root.
"""
