"""`quarantine.*`: the ledger's path, made absolute, and the cooldown of the entries a job adds."""

from __future__ import annotations

import os

from elastic_hydra.config.schema import QuarantineConf
from elastic_hydra.durations import DURATION_FORM, parse_duration
from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import QuarantineSpec


def resolve_quarantine(conf: QuarantineConf, cwd: str) -> QuarantineSpec | None:
    """The ledger this job reads before every round, or None (no ledger).

    Raises:
        ConfigError: a cooldown that is no duration, a ledger path that is a directory or
            whose directory does not exist.
    """
    try:
        cooldown = parse_duration(conf.cooldown)
    except ValueError:
        raise ConfigError(
            "quarantine.cooldown", "not a duration", conf.cooldown, DURATION_FORM
        ) from None
    if conf.ledger is None or not str(conf.ledger).strip():
        return None
    path = os.path.abspath(os.path.join(cwd, os.path.expanduser(str(conf.ledger))))
    form = "expected the path of a file (it need not exist) in an existing directory"
    if os.path.isdir(path):
        raise ConfigError("quarantine.ledger", "is a directory", conf.ledger, form)
    if not os.path.isdir(os.path.dirname(path)):
        raise ConfigError(
            "quarantine.ledger", "its directory does not exist", conf.ledger, form,
            "Create it, or point at a shared file system every node sees.",
        )  # fmt: skip
    return QuarantineSpec(ledger=path, cooldown=cooldown)
