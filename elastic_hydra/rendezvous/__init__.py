"""How the nodes of a job meet, and what they share. The only importer of torch.

Two kinds of rendezvous implement `agent.seams.Rendezvous`:

- `local`: standalone (one node, no service, no torch) and static (fixed node ranks, like
  `torch.distributed.launch`).
- `torch_backend`: c10d, etcd-v2 and etcd through PyTorch's own handlers, so torchrun agents can
  join the same job; joins and the exit barrier. `membership` tells the round's changes, the
  same on every node (the node that left, not the first survivor to re-join). `torchrun_agents`
  finds the torchrun agents among the nodes and names them in changes and advice; `join_wait`
  runs a blocking join so that a signal still stops it, with notices of what it waits for.
  `torch_handler` creates and reads torch's handler (a c10d store that refuses connections is
  waited for `rdzv.connect_timeout`, then named).

What the nodes share besides the rendezvous itself lives in the store under our keys:

- `store_keys`: rank assignment (torchrun's keys), node facts (config digests), failure records,
  the exit barrier.
- `sealed_records`: failure records as untrusted input: size caps, then read as any
  `FailureRecord` is (`from_json`), membership, and an HMAC when `ELASTIC_HYDRA_RDZV_SECRET`
  is set.
- `status_keys`: each agent's status record under its own slot of the run, and every slot read
  back for `elastic-hydra top --endpoint`.
- `server`: `elastic-hydra rdzv-server`, the c10d store as a process of its own.
- `hang_share`: hangs across nodes: each node's latest progress, and every node's ranks of a
  hang (the hang watch gives the job-wide verdict from them).
- `arrivals`: the straggler score across nodes: each node's clock offset to node 0's, measured
  at the start of a round, and every node's collectives on that clock.

Imports: agent and the root.
"""
