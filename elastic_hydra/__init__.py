"""elastic-hydra: a declarative, config-driven elastic job launcher."""
