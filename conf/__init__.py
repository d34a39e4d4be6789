"""elastic-hydra's Hydra presets (installed as the package `elastic_hydra.conf`)."""
