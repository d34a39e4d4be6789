"""Typed config -> frozen `LaunchPlan`: the only validator of user values.

`resolver`'s `resolve_config` takes the composed job (typed by `config.composed`) and returns the
plan every later step reads, or raises `ConfigError` naming the key, the value and the fix. Its
parts:

- `entry`: `script=`, `module=` or `cmd=`, its arguments and the Python that runs it.
- `topology`: how many nodes and how they meet (rendezvous backend, endpoint, Slurm and the
  other schedulers' variables, read by `schedulers/`).
- `kubernetes`: the `k8s.*` keys of `--plan=jobset/trainjob`, and the plan their pods run.
- `runtime`: what runs around the workers: restart policy, console and log files, hang watch.
- `gpus`: `nproc_per_node` keywords, `gpus`, `devices`, `gpu_sharing`, CPU binding.
- `machine`: what this machine offers (GPUs from NVML or nvidia-smi, CPUs from sysfs), read
  without torch; resolution is handed these facts so that tests can pass their own.
- `preflight`: `preflight.*` as the battery's settings; refused where the nodes share no store.
- `quarantine`: `quarantine.ledger` made absolute, `quarantine.cooldown` in seconds.
- `checkpoint`: `checkpoint.*`: the job's checkpoint home (absolute, the same for every node and
  relaunch), the copies kept, the memory a snapshot may take.
- `timeouts`: the timeout layers the job runs with (heartbeat, last call, join, hang, the
  workers' collective timeout, exit barrier, stop grace), where each value comes from, and the
  pairs that would fire in the wrong order: refused when that breaks the job, else warned.

Imports: config (the schema and error explanations), schedulers (their readers) and the root.
"""
