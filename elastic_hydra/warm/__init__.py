"""Warm starts: Python workers forked from a process that imported the job's modules once.

`import torch` costs seconds of CPU in every worker, on every start and every restart. With
`warm.imports: [torch]` the agent starts one template process per node as the launch begins
(it imports while the rendezvous runs); each worker of each attempt is forked from it and then
becomes the user's script exactly as the bootstrap makes it (`__main__`, argv, cwd, environment,
its own session, containment, death signal, tracebacks, hang watch, log files).

- `template`: runs in the template process (the standard library only, by path, like the
  bootstrap): imports, refuses when a fork would not be safe, forks on request (double fork, so
  the worker is re-parented to the agent, a child subreaper).
- `pool`: the agent's side: starts the template, asks it for each worker over a socketpair
  (descriptors passed with SCM_RIGHTS) and hands `supervise` a Popen-like worker; any trouble
  turns warm starts off for the rest of the launch, with one event.
- `early`: starts the template, from the plan, or at the agent's first instant when the command
  line says what it needs (before Hydra's composition, so the imports overlap it); the launch
  adopts that one only when its plan asks for exactly the same template.
- `env`: the template's environment, the variables every worker shares (pure).

Imports: workers (the spawner seam it implements, containment), agent (the worker environment)
and the root. `launch` wires it; `cli.entry` calls `early` first of all.
"""
