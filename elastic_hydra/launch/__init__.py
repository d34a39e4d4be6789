"""One launch, wired: composed job -> plan -> run dir -> agent -> result.

- `job`: a composed job's plan, its private run dir, the saved config (secrets redacted), the
  agent run, and the `JobResult` a sweep collects; `--plan` is the same path minus the
  processes.
- `worker_factory`: each attempt's worker specs (argv, environment, files, console prefix,
  CPUs), started by `workers.supervise`.
- `wiring`: builds the agent of this node from real parts: `worker_factory` for processes,
  `rendezvous` for membership, `hangs.watch` for progress, `report` for the files and the
  console, the stop signals, and runs `agent.executor`'s loop with them.

This is the only folder that knows every other one: launch -> config, resolve, agent, workers,
rendezvous, hangs, report.
"""
