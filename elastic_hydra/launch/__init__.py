"""One launch, wired: composed job -> plan -> run dir -> agent -> result.

- `job`: a composed job's plan, its private run dir, the saved config (secrets redacted), the
  agent run, and the `JobResult` a sweep collects; `--plan` is the same path minus the
  processes.
- `worker_factory`: each attempt's worker specs (argv, environment, files, console prefix,
  CPUs), started by `workers.supervise`.
- `wiring`: builds the agent of this node from real parts: `worker_factory` for processes,
  `rendezvous` for membership, `hangs.watch` for progress, `stragglers.watch` for the rank
  that arrives last, `report` for the files and the
  console, the stop signals, and runs `agent.executor`'s loop with them.
- `preflight`: the preflight battery wired to this node (the probe group, the round's exchange,
  the console), and the ledger entries of a node that fails it.
- `observing`: the agent's watchers: the status publisher and, when asked for, the metrics;
  started and stopped with the agent.

Imports: config, resolve, agent, workers, rendezvous, hangs, report, observe, quarantine,
preflight, stragglers, failures, warm, checkpoint (the parts it wires) and the root. The one
folder that knows almost every other.
"""
