"""What a run leaves for people and programs: failure files, summary, console, notices.

- `failure_files`: what a failed worker left behind (torch's `@record` error file, our own
  traceback file, a crash dump, the tail of its stderr), read once into its failure record.
- `summary`: `summary.json`, how a launch ended on this node, every failure and the root cause.
- `render`: rich renderings of a failure report and a sweep table; `plan_view`: `--plan`'s
  table; `history`: `report`'s timeline, attempts and nodes. rich is imported by these three
  only, and only when something is shown.
- `notices`: one-line notices on stderr without rich (the success line, a multi-node job's
  progress).
- `events_file`: `events.jsonl` read back as typed events, the one reader of a run's timeline
  (`report`, `stacks`); lines cut short or of unknown kinds are skipped and counted.

Imports: hangs, agent, resolve (the machine facts a plan shows) and the root.
"""
