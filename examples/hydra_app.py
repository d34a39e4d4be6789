"""A Hydra app as the worker (`@hydra.main`), shaped like lightning-hydra-template: it keeps its
checkpoint in its output dir, Hydra's default `outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}`, and
resumes from it.

Under elastic-hydra every rank and every restart of a launch gets the same output dir: the
launch's time stands for `${now:...}` (from the repository root):

    elastic-hydra script=examples/hydra_app.py nproc_per_node=2
    elastic-hydra script=examples/hydra_app.py nproc_per_node=2 -- \\
        'hydra.run.dir=${oc.env:ELASTIC_HYDRA_RUN_DIR}/hydra'    # inside the run dir
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig) -> None:
    output = Path(HydraConfig.get().runtime.output_dir)
    checkpoint = output / "last.ckpt"
    rank = int(os.environ.get("RANK", "0"))
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0
    print(f"rank {rank}: output dir {output}, starting at step {step}")
    if rank == 0:  # one writer; the others read a whole file or none (rename is atomic)
        partial = checkpoint.with_name(checkpoint.name + ".tmp")
        partial.write_text(f"{step + 1}\n")
        partial.replace(checkpoint)


if __name__ == "__main__":
    main()
