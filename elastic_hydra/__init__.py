"""elastic-hydra: a declarative, config-driven elastic job launcher.

The folders, from the user down (each `__init__` says what it owns):

    cli/         what the user types: the command, its subcommands, argv
    torchrun/    torchrun's flags and PET_* as our keys (pure)
    config/      Hydra: composition, schema, errors explained (the only hydra/omegaconf user)
    resolve/     composed config -> frozen LaunchPlan (the only validator of user values)
    launch/      one launch wired: plan -> run dir -> agent -> result
    agent/       the loop and its contract: executor, seams, restart policy, worker env, events
    workers/     this node's processes: supervise, contain, console, bootstrap
    rendezvous/  how nodes meet and what they share (the only torch user)
    hangs/       progress watch, verdict, sharing across nodes
    report/      failure files, summary, rendering, notices
    sweeps/      the pool launcher's engine and its view
    quarantine/  bad hosts and GPUs kept out of later rounds and jobs: the ledger, the gate

The modules at the root are the shared words every folder may use: `errors`, `plan`,
`records`, `jsonrecord`, `tracebacks`, `rundir`, `redact`, `stopsignals`, `gpus`, `slurm`,
`durations`.
"""
