"""Stragglers: the rank that arrives last at the job's collectives, named while the job runs.

- `score`: the score and its hysteresis, from the ranks' arrivals (pure).
- `watch`: this node's watch (`seams.StragglerWatch`): its ranks' arrivals, as the bootstrap
  keeps them, summed per collective and, on several nodes, shared through the job's store.

Imports: agent (seams) and the root.
"""
