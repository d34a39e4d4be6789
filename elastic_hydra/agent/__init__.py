"""The agent loop and its contract. Pure: no I/O of its own.

One node's agent runs the loop in `executor`: rendezvous -> start workers -> monitor -> restart
policy -> finish. Everything it touches is a seam, so the loop runs the same against real
processes (`launch.wiring`) and against fakes with a fake clock (the executor tests):

- `loop_state`: how one attempt ended, and what the loop has counted so far.
- `collateral`: failures that another node caused (its workers broke this node's collectives):
  a bounded wait for the rendezvous to say which node left or restarted.
- `seams`: the protocols the loop is composed of (process group, rendezvous, hang watch, clock,
  observer) and the plain data they exchange.
- `restart_policy`: after a failure, retry (after a delay) or stop, and the config key that
  would change the answer.
- `worker_env`: each worker's environment (torchrun's contract plus ours), a pure function of
  the plan, the rendezvous result and the attempt.
- `inherit`: the half of that environment a worker inherits from the agent's, and the names of
  the launcher's contract; it imports nothing, so the warm template's first instant can use it.
- `events`: the run's timeline, one typed record per event.
- `phases`: the phase the agent is in, folded from those events: the one state machine behind
  `top`'s phase (`observe.status`) and the goodput ledger (`report.goodput`).
- `outcome`: how the whole run ended: its workers' exits and failure records (`records/`; a
  failed worker's files are read once, through a seam, when its exit is seen).
- `round_gates`: what a node passes between the rendezvous and its workers: the quarantine
  admission before each round, the preflight verdict after it (a mixin of the executor).
- `preflight_rule`: what a node does with the round's preflight verdict: start, leave, re-join
  without the failed nodes, or stop (the same decision on every node, no word exchanged).

Imports: the root and `records/` only. Implementations live in workers, rendezvous and hangs,
which import this.
"""
