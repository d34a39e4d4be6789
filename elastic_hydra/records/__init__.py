"""The records of a run: the typed facts every folder passes on, and their JSON. Pure data and
pure functions, one record per fact (a worker failure is one `FailureRecord` from its exit to the
report, in memory, in summary.json and in the rendezvous store).

- `failures`: one worker's exit (`WorkerExit`) and failure (`FailureRecord`, its files read once
  when its exit is seen), return codes described by one function, the root cause chosen by one
  rule, and what the store tells of a torchrun peer (`PeerFailure`).
- `hangs`: where each rank of a hung job was (`HangRank`, `GroupState`) and the verdict
  (`HangRecord`).
- `stragglers`: a rank's arrival at a collective (`Arrival`), a collective as some ranks
  arrived at it (`Seen`), a rank's straggler score (`Score`) and its naming (`Change`).
- `goodput`: the goodput ledger (`Ledger`): where wall time and GPU-seconds went, the work each
  failure lost.
- `preflight`: the preflight battery's verdict (`PreflightVerdict`): its findings, the nodes and
  GPUs it names.
- `summary`: how a launch ended on a node (`RunSummary`, summary.json) and one job's result
  (`JobResult`, result.json).

Records read back (summary.json, the store's records from other nodes) go through `from_json`,
which checks every field it reads (ValueError naming the field).

Imports: the root only (`jsonrecord`, `plan`, `tracebacks`). Every folder may import this one,
as it may the root; the root imports no folder, this one included.
"""
