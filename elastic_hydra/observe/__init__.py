"""Watching a running job: every agent's status record, `elastic-hydra top`, Prometheus metrics.

- `status`: the status record a node publishes (its phase, attempt, restarts and every local
  worker's state, progress age, CPU, memory and GPU), built from the typed events the agent
  already emits (`Tracker` is an Observer); versioned, size-capped, and validated on reading
  like the failure records, because a store is untrusted. Pure.
- `sample`: what the events cannot tell: each worker's CPU and memory from /proc, its GPU from
  NVML where pynvml is importable.
- `publish`: the agent's publisher, a thread that writes the record every few seconds to the run
  dir (atomic, private) and to the job's store where there is one; a slow or gone store costs a
  record, never the agent. It stops with the agent.
- `metrics`: the same state in Prometheus' text format (prometheus_client, its own registry),
  served on the job's address (`metrics.port`) and/or written for node_exporter's textfile
  collector (`metrics.textfile`).
- `snapshot`: records read back (a run dir's, or the store's) into one view of the job, a node
  whose record is old marked stale; `view`: that view as a rich table (the only rich importer).

Imports: agent (the events it folds), workers (the /proc reader) and the root. `launch` starts
the publisher, `cli.top` reads; the store's keys stay in `rendezvous` (the only importer of torch).
"""
