"""One launch, wired: composed job -> plan -> run dir -> agent -> result.

- `job`: a composed job's plan, its private run dir, the saved config (secrets redacted), the
  agent run, and the `JobResult` a sweep collects; `--plan` is the same path minus the
  processes.
- `wiring`: builds the agent of this node from real parts: `workers.supervise` for processes,
  `rendezvous` for membership, `hangs.watch` for progress, `report` for the files and the
  console, the stop signals, and runs `agent.executor`'s loop with them.

This is the only folder that knows every other one: launch -> config, resolve, agent, workers,
rendezvous, hangs, report.
"""
