"""Failure classes: what kind of failure a worker's end was, and the evidence that says so.

- `classify`: the class (user_error, oom_host, oom_gpu, comm, hardware, infra, unknown) from the
  worker's record and what the kernel says, and the `Classifier` that marks a repeat (pure).
- `kernel`: the kernel log's OOM kills and GPU Xid lines, read from `/dev/kmsg`.

Imports: the root and `records/` only.
"""
