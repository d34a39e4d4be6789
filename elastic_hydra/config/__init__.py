"""The Hydra side of a job: composition, the schema, and Hydra's errors in our words.

A job is a YAML file that Hydra composes with our presets (`conf/`, shipped as
`elastic_hydra.conf`) and the user's overrides. This folder is the only importer of hydra and
omegaconf: the boundary hands each composed job on as a `Composed`, which the rest reads as plain
values; no module outside this folder touches a `DictConfig`.

- `boundary`: the one `compose()` for a launch, `--plan`, each sweep job and the tests, on one
  search path; the only user of Hydra's internals, checked against the supported releases.
- `composed`: a composed job as plain values: `Composed.job()` checks it against the schema
  and builds the `ComposedJob` (the typed `ElasticHydraConf`, the config unresolved and resolved
  once, the hash the nodes compare); `to_yaml` writes the saved files.
- `schema`: the typed `*Conf` dataclasses registered in Hydra's ConfigStore, with a help line per
  key (the keys table of the docs is generated from it).
- `invocation`: one parsed command line as the boundary reads it, and the quoting that keeps a
  value byte for byte through Hydra's override grammar.
- `resolvers`: our OmegaConf resolvers (run dir names, `logs.root`) and the pool plugin's
  discovery, registered before every composition.
- `explain`: Hydra's, OmegaConf's and YAML's exceptions as one line that names the key, the
  value and the fix.
- `jobfile`: checks of a job file before Hydra reads it (what it would take badly, or silently).

Imports: schedulers (a Slurm step's run directory name, for `resolvers`) and the root.
"""
