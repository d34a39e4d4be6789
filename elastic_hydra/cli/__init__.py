"""What the user types: the `elastic-hydra` command and its subcommands.

A command line becomes a launch here and nowhere else:

- `entry` is the console script. It owns the stop signals before it imports anything heavy,
  then hands the words to the subcommand they name.
- `argv` splits our command line into what Hydra reads (the job file, overrides) and what we
  keep (`--plan`, the script's own arguments after `--`); torchrun's flags are turned into our
  keys by `elastic_hydra.torchrun`.
- `completion` rewrites a shell-completion line so that Hydra loads the job file it names.
- `run` is the command: it runs a launch or a subcommand, maps every outcome to an exit code
  (0, 1, 2, 128+N, 70 for a bug of ours) and prints a user's mistake as one line.

One module per subcommand:

- `plan`: `--plan`, the launch minus the processes; `jobyaml` writes the job file of a
  torchrun-style command (`--plan=yaml`).
- `report`: a finished run (or sweep) shown again.
- `stacks`: where a running job's ranks are, on this node, right now.
- `save`: a running job's agent asked to save its ranks' snapshots and stop (SIGUSR1).
- `rdzv_server`: `rdzv-server`, the c10d store of `elastic_hydra.rendezvous.server` as a process.
- `quarantine`: `quarantine list|add|clear`, the ledger of `elastic_hydra.quarantine` by hand.
- `top`: `top`, every rank of a running job live, from the agents' status records.
- `logs`: `logs`, a run's per-rank logs as one stream, filtered, equal lines of several ranks
  once; `-f` follows a running job.
- `manifest`: `--plan=jobset|trainjob`, the job's Kubernetes manifests as YAML.

Imports: torchrun, config, launch, hangs, report, rendezvous (the `rdzv-server` subcommand),
observe (`top`), quarantine (`quarantine`), schedulers (`--plan` names the detected scheduler,
prints manifests), warm (the entry point starts the template first of all), checkpoint
(`--plan` says what a launch would resume from) and the root.
Nothing below imports cli.
"""
