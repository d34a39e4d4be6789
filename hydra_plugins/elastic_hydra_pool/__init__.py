"""elastic-hydra's pool launcher for Hydra sweeps: `elastic-hydra -m hydra/launcher=pool ...`."""
