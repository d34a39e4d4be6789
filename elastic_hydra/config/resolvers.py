"""What a composition needs registered first: the schema, our OmegaConf resolvers, the plugin.

`eh.host` and `eh.launch` name a run's directory (`DATE/TIME_HOST`, or `slurm/JOBID.STEPID` in a
Slurm step, the same on every node), `eh.root` refuses an empty `logs.root` before Hydra makes a
directory under `/`, `eh.keys` lists the keys for `--help`. Registering is idempotent; the
boundary does it before every composition.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from elastic_hydra.config import schema
from elastic_hydra.errors import ConfigError
from elastic_hydra.rundir import LOGS_ROOT


def register(launched: float) -> None:
    """The schema and our resolvers; called before every composition, with the instant a plain
    run's directory is named after (`eh.launch`: the launch's time, which the plan carries)."""
    schema.register()
    OmegaConf.register_new_resolver("eh.host", socket.gethostname, use_cache=True, replace=True)
    name = functools.partial(_launch_name, launched)
    OmegaConf.register_new_resolver("eh.launch", name, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("eh.root", _logs_root, replace=True)
    OmegaConf.register_new_resolver("eh.keys", schema.keys_text, replace=True)  # for --help
    _plugins_listable()


def _plugins_listable() -> None:
    """Let Hydra's plugin scan find our pool launcher under an editable install too.

    Hydra lists the directories of the `hydra_plugins` namespace (pkgutil); a PEP 660 editable
    install maps `hydra_plugins.elastic_hydra_pool` through an import hook that cannot be
    listed, so the plugin's own directory joins the namespace's path (hydra#3252).
    """
    import importlib.util

    spec = importlib.util.find_spec("hydra_plugins.elastic_hydra_pool")
    if spec is None or not spec.submodule_search_locations:
        return
    import hydra_plugins

    home = str(Path(next(iter(spec.submodule_search_locations))).parent)
    if home not in list(hydra_plugins.__path__):
        hydra_plugins.__path__.append(home)


def _logs_root(root: object) -> str:
    """logs.root as the start of a run or sweep dir: an empty one would put them into /."""
    if not str(root).strip():
        raise ConfigError(
            "logs.root", "is empty", str(root), f"expected a directory, e.g. logs.root={LOGS_ROOT}"
        )
    return str(root)


def _launch_name(launched: float) -> str:
    """A plain run's directory under logs.root: `DATE/TIME_HOST` of the launch's instant, unique
    per launch; inside a Slurm step `slurm/JOBID.STEPID`, the same on every node (each writes in
    its own subdir)."""
    step = _slurm_step(os.environ)
    if step is not None:
        return f"slurm/{step}"
    when = datetime.fromtimestamp(launched).strftime("%Y-%m-%d/%H-%M-%S-%f")
    return f"{when}_{socket.gethostname()}"


def _slurm_step(environ: Mapping[str, str]) -> str | None:
    """`slurm.step_dir_name`, with Slurm's reader loaded inside a Slurm job only: outside one
    (no job id, so `slurm_job` is None) there is no step to name."""
    if "SLURM_JOB_ID" not in environ and "SLURM_JOBID" not in environ:
        return None
    from elastic_hydra.schedulers import slurm

    return slurm.step_dir_name(environ)
