"""Schedulers: where a node learns its place from the scheduler that started it, and the
manifests that ask Kubernetes for such nodes.

One module per scheduler environment (TorchX's `schedulers/` is the model): each reads the
variables its scheduler gives a node into one `SchedulerNode` (node rank, node count, the
address of node 0, a run id every node agrees on, which variables said so), or raises
`SchedulerError` naming the variable that is missing or wrong and the fix:

- `kubeflow`: Kubeflow Trainer v2 (`PET_*`) and the older PyTorchJob (`MASTER_ADDR`, `RANK`...).
- `jobset`: a JobSet pod (`JOB_COMPLETION_INDEX` and the JobSet names the manifest exposes).
- `skypilot`, `dstack`: the `SKYPILOT_*` and `DSTACK_*` variables of their multi-node tasks.
- `detect`: `rdzv=auto`, the one scheduler whose environment is present (Slurm included).
- `slurm`: Slurm's hostlist syntax and the job facts it puts in the environment (`SlurmJob`):
  `rdzv=slurm` resolves from them straight to a c10d topology, and `config/` names a step's run
  directory after them, the same on every node.
- `base`: the shared words (`SchedulerNode`, `SchedulerError`, the integer readers).
- `manifests`: the other direction, the JobSet or TrainJob that starts such pods (plain data
  out), with the failure policies that keep Kubernetes and the agent from both restarting.

Pure: the environment is passed in as a mapping; no I/O. resolve/ turns a `SchedulerNode` into
a c10d topology and validates the `k8s.*` keys; cli/ shows the detection in `--plan` and prints
the manifests as YAML.

Imports: the root only.
"""
