"""What a run leaves for people and programs: failure files, summary, console, notices.

- `failure_files`: what a failed worker left behind (torch's `@record` error file, our own
  traceback file, a crash dump, the tail of its stderr), read once into its failure record.
- `summary`: `summary.json`, how a launch ended on this node, every failure and the root cause;
  written whole, into the room kept for it when the disk is full.
- `render`: rich renderings of a failure report and a sweep table; `plan_view`: `--plan`'s
  table; `history`: `report`'s timeline, attempts and nodes. rich is imported by these three
  only, and only when something is shown.
- `notices`: one-line notices on stderr without rich (the success line, a multi-node job's
  progress).
- `events_file`: `events.jsonl`, written as the run goes on (`EventLog`) and read back as typed
  events, the one reader of a run's timeline (`report`, `stacks`); lines cut short or of
  unknown kinds are skipped and counted.
- `goodput`: the goodput ledger (pure): a node's wall time cut into phases (start-up,
  rendezvous, running, restart, hung, stopping ...) from its events, GPU-seconds, the work lost
  to each failure; a job's as the sum of its nodes'. Kept in summary.json.
- `logs`: a run's per-rank log files, every node's and attempt's, chosen by rank, node, attempt
  and stream, and merged: a line several ranks wrote alike once, with their ranks; tracebacks
  never merged (`elastic-hydra logs`).
- `timeline`: `report --html`: a run as one self-contained HTML page, inline SVG, every string
  from the run escaped (pure: the command writes it, 0600); `gantt`: a sweep's page, the
  pool's jobs on their slots, from pool.json read back as untrusted data (pure).

Imports: hangs, agent, resolve (the machine facts a plan shows) and the root.
"""
