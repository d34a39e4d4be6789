"""torchrun's command line, read as elastic-hydra's keys. Pure: the standard library only.

`elastic-hydra --nproc-per-node=2 train.py --lr 0.1` works because these modules translate what
torchrun accepts into Hydra overrides of our schema, before Hydra sees the command:

- `flags`: every torchrun flag and its `PET_*` variable; what maps to a key, what is refused in
  one line, what is accepted and ignored (as torchrun ignores it) with a note.
- `rdzv`: the rendezvous flags (`--rdzv-backend`, `--rdzv-endpoint`, `--rdzv-conf`, ...) and the
  settings their translation builds.
- `logs`: `--log-dir`, `-r/--redirects`, `-t/--tee`, `--local-ranks-filter`.

Imports: the root only (errors). `cli.argv` is its one user.
"""
