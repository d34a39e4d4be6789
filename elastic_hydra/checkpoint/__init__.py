"""Recovery without lost work: snapshots of each rank's state, kept by the agent.

The worker's side is three calls (`api`), importable without torch:

    from elastic_hydra import checkpoint as ckpt

    state = ckpt.restore()           # None on a fresh start; else this rank's snapshot
    ckpt.snapshot(state, step=step)  # into memory the agent owns: complete or absent
    if ckpt.save_requested():        # a stop signal: every rank stops at the same step
        break

The agent's side (`keeper`) owns the node's snapshot area in memory, agrees with the other
nodes on what each attempt resumes from, and copies the snapshots into the job's checkpoint
home when it ends, where a relaunch of the job finds them.

- `api`: `restore`, `snapshot`, `save_requested` (the worker's side).
- `codec`: a state's bytes, written and read back without running anything (torch's
  `weights_only` loader, or an unpickler that resolves no name).
- `layout`: the area's and the home's file names.
- `keeper`: the area, the offer before each attempt, the copies and their manifests.
- `buddy`: the ring of a multi-node job: each node's snapshots pushed to the next node's agent
  over TCP, and a rank's snapshot fetched from the node that holds it.

Imports: agent (the worker environment's names, the node exchange seam), workers (the /proc
reader: is an area's agent gone) and the root.
"""

from elastic_hydra.checkpoint.api import CheckpointError, restore, save_requested, snapshot

__all__ = ["CheckpointError", "restore", "save_requested", "snapshot"]
