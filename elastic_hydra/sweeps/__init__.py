"""Sweeps on one machine: `hydra/launcher=pool` runs a sweep's jobs side by side.

- `slots`: what each job running at once owns: disjoint GPUs and, where there are enough,
  disjoint CPUs near them.
- `pool`: the dispatch that starts the next job the moment a slot frees, stop signals that reach
  every job, each job's result read back.
- `view`: the pool's progress for people: a live table on a terminal, one plain line per job
  start and end elsewhere.

The Hydra plugin itself stays in `hydra_plugins/elastic_hydra_pool`, where Hydra finds it.
Imports: report, resolve and the root.
"""
