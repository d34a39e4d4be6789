"""Preflight: check the nodes of a round before the user's workers start, and name the bad ones.

Between a completed rendezvous round and the workers, each agent runs a short battery on the
allocation that will train (`preflight=quick|full`; `off` by default):

- `probe`: the worker-side program (run as `python -m elastic_hydra.preflight.probe` in a worker
  group with the job's own environment; the only module here that imports torch, and no agent
  imports it): a fixed-size matrix multiply timed per worker, an allreduce inside each node and
  across nodes with its bus bandwidth.
- `node_checks`: the agent's own checks of its node: free space and a write probe in the run dir
  and `preflight.paths`, GPU health through NVML where it is importable, the rendezvous endpoint.
- `results`: one node's report as it travels through the rendezvous store (untrusted: bounded,
  validated).
- `verdict`: every node's reports rated against the round's medians (pure): the same verdict on
  every node, as `records.preflight.PreflightVerdict`.
- `battery`: the agent's side, wired by `launch` (implements `agent.seams.Preflight`).

Imports: agent (the seams) and the root. `launch` wires it.
"""
