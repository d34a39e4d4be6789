"""What the user types: the `elastic-hydra` command and its subcommands.

A command line becomes a launch here and nowhere else:

- `entry` is the console script. It owns the stop signals before it imports anything heavy,
  then hands the words to the subcommand they name.
- `argv` splits our command line into what Hydra reads (the job file, overrides) and what we
  keep (`--plan`, the script's own arguments after `--`); torchrun's flags are turned into our
  keys by `elastic_hydra.torchrun`.
- `main` runs a launch or `--plan`, maps every outcome to an exit code (0, 1, 2, 128+N, 70 for a
  bug of ours) and prints a user's mistake as one line; `report` shows a finished run again.
- `jobyaml` writes the job file of a torchrun-style command (`--plan=yaml`).
- `stacks` shows where a running job's ranks are, on this node, right now.

Imports go down only: cli -> torchrun, config, launch, hangs, report (and rendezvous, for the
`rdzv-server` subcommand). Nothing below imports cli.
"""
