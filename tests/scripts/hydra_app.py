"""A Hydra app as the worker, shaped like lightning-hydra-template: `@hydra.main`, Hydra's own
default run dir (`outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}`), a checkpoint kept under
`${hydra:runtime.output_dir}` and resumed from there.

    hydra_app.py [HYDRA OVERRIDES ...]

Each rank records, in $OUT_DIR/attempt<restart count>_rank<rank>.json, the output dir Hydra gave
it, whether it found the checkpoint there, and ELASTIC_HYDRA_LAUNCH_TIME. Rank 1 reaches
`@hydra.main` in a later second than rank 0 (facebookresearch/hydra#2070): it waits for rank 0's
record, then for the clock's next second. On attempt 0, rank 0 writes the checkpoint and rank 1
then exits with code 3, so attempt 1 starts in a later second still.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

OUT = Path(os.environ["OUT_DIR"])
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def record(rank: int, data: dict[str, object]) -> None:
    path = OUT / f"attempt{ATTEMPT}_rank{rank}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig) -> None:
    output = Path(HydraConfig.get().runtime.output_dir)
    checkpoint = output / "last.ckpt"
    resumed = checkpoint.exists()
    if RANK == 0 and not resumed:
        checkpoint.write_text(f"written by attempt {ATTEMPT}\n")
    record(
        RANK,
        {
            "output_dir": str(output),
            "resumed": resumed,
            "launch_time": os.environ.get("ELASTIC_HYDRA_LAUNCH_TIME"),
        },
    )
    if RANK == 1 and ATTEMPT == 0:
        raise SystemExit(3)


if __name__ == "__main__":
    if RANK == 1:
        rank0 = OUT / f"attempt{ATTEMPT}_rank0.json"
        deadline = time.monotonic() + 60
        while not rank0.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.05 - time.time() % 1)  # into the next second of the clock
    main()
