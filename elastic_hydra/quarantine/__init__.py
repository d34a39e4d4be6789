"""Bad hosts and GPUs kept out of later rounds, restarts and jobs: the quarantine.

A host or a GPU found bad (by the preflight verdict, or by hand) goes into a ledger with its
evidence and a cooldown; every agent that points at the same ledger reads it before each
rendezvous round and leaves a quarantined host out before it joins.

- `ledger`: the file (JSON with a version) and its one public API, `Ledger.add/active/clear`
  and `QuarantineEntry`. Many nodes and processes write it at once: a lock on a sidecar file,
  write-to-temp, fsync, atomic rename. The file is untrusted input: bounded, checked entry by
  entry, a bad file or entry is one warning, never a crash.
- `gate`: the agent's admission check before each round (`refusal`, pure: the one line that
  names the entry, its evidence, when it expires, how to clear it, and under Slurm the
  `--exclude=` to resubmit with), and `LedgerGate`, which reads the ledger for it.
- `from_verdict`: a failed preflight verdict as this node's own entries (the bad node writes for
  itself only), and the line that says so.

Imports: the root and `records/` (a bad node's verdict) only. `launch` wires the gate into the
agent; `cli` owns `elastic-hydra quarantine`; nothing here imports either.
"""
