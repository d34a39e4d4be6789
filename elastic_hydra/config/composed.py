"""A composed job as plain values: where Hydra's `DictConfig` becomes data the rest reads.

The boundary hands every composed job on as a `Composed`; outside config/ nobody reads its
`DictConfig`. `Composed.job()` checks it and builds the `ComposedJob`, once per job:

    conf         the typed `ElasticHydraConf` that `resolve` turns into a plan
    unresolved   the config as written (interpolations kept), as `.hydra/config.yaml` holds it
    resolved     the config resolved once: the values the saved `config.yaml` and the hash read
    config_hash  what every node of a multi-node job must agree on

`to_yaml` writes plain data as YAML the way Hydra writes its own saved files.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import yaml  # type: ignore[import-untyped]
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_omega_conf_dumper
from omegaconf.errors import OmegaConfBaseException

from elastic_hydra.config import schema
from elastic_hydra.config.schema import ElasticHydraConf
from elastic_hydra.errors import ConfigError

# What every node's workers must agree on. Node-local keys (logs, devices, nproc_per_node,
# local_addr...) may differ between nodes, as they may under torchrun.
JOB_KEYS = ("script", "module", "cmd", "args", "hp")
FREE_FORM = ("env", "hp")  # their keys are the user's: no schema to check them against


@dataclass(frozen=True, slots=True, kw_only=True)
class ComposedJob:
    """One composed job, checked against the schema, as plain values (see the module).

    The containers are read, never changed: several files and the hash are made from them.
    """

    conf: ElasticHydraConf
    unresolved: dict[str, Any]
    resolved: dict[str, Any]
    config_hash: str


@dataclass(frozen=True, slots=True)
class Composed:
    """A job's config as the boundary composed it (the words after `--` already in `args`).

    `dictconfig` is Hydra's object, for config/ and the tests; everything else reads the plain
    `unresolved()` data, or the checked `job()`.
    """

    dictconfig: DictConfig = field(repr=False)

    def unresolved(self) -> dict[str, Any]:
        """The config as written, interpolations kept (reading it resolves nothing)."""
        return _container(self.dictconfig, resolve=False)

    def job(self) -> ComposedJob:
        """The job checked and typed (see `composed_job`).

        Raises:
            ConfigError: the first problem found, as one line.
        """
        return composed_job(self.dictconfig)


def composed_job(cfg: DictConfig) -> ComposedJob:
    """Check a composed job config against the schema and turn it into plain values.

    Raises:
        ConfigError: a job without the schema, a key the schema does not know, or a value
            OmegaConf refuses (wrong type, missing, a broken interpolation).
    """
    if OmegaConf.get_type(cfg) is not ElasticHydraConf:
        raise ConfigError(
            "defaults", "the job does not include elastic_hydra_base", "<untyped job>",
            "expected a defaults list that starts with elastic_hydra_base",
            "See examples/jobs/hello.yaml.",
        )  # fmt: skip
    _check_known_keys(cfg)
    try:
        conf = OmegaConf.to_object(cfg)
        # After the typed object: everything it resolved resolves again, from the same caches.
        resolved = _container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        from elastic_hydra.config.explain import from_omegaconf  # a mistake's words, on demand

        raise from_omegaconf(exc) from None
    assert isinstance(conf, ElasticHydraConf)
    return ComposedJob(
        conf=conf,
        unresolved=_container(cfg, resolve=False),
        resolved=resolved,
        config_hash=config_hash(resolved),
    )


def config_hash(resolved: dict[str, Any]) -> str:
    """A digest of the job's program and arguments, resolved: a `${now:}` in them, evaluated
    once per node, makes the nodes disagree.

    Arguments that are not UTF-8 reach us as lone surrogates (`os.fsdecode`): "surrogatepass"
    encodes them too (any string hashes; arguments that differ in a byte differ here), and
    leaves the digest of every UTF-8 job as it was.
    """
    data = {k: resolved.get(k) for k in JOB_KEYS}
    text = json.dumps(data, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def to_yaml(data: Any) -> str:
    """Plain data (mappings, lists, scalars) as YAML, as OmegaConf writes a config: the same
    bytes as `OmegaConf.to_yaml(OmegaConf.create(data))`.

    Without building the config first: that costs twice the dump itself (about 20 ms of every
    launch for its four saved files), and it would parse every `${` in the data as an
    interpolation, refusing a script argument such as `${oops` that the workers receive as is.
    The dump is OmegaConf's own (its dumper quotes strings that would read back as a bool or a
    number); data of another kind than plain values take OmegaConf's whole way.
    """
    try:
        plain = _yaml_ready(data)
    except _NotPlainError:
        return OmegaConf.to_yaml(OmegaConf.create(data))
    text: str = yaml.dump(
        plain,
        default_flow_style=False,
        allow_unicode=True,
        sort_keys=False,
        Dumper=get_omega_conf_dumper(),
    )  # as OmegaConf.to_yaml calls it
    return text


class _NotPlainError(Exception):
    """A value that OmegaConf would convert, or refuse, in a way `_yaml_ready` does not."""


_SCALARS = (str, int, float, bool, type(None))
_KEYS = (str, int, float, bool)


def _yaml_ready(value: Any) -> Any:
    """`value` as `OmegaConf.to_container(OmegaConf.create(value), enum_to_str=True)` gives it
    back for plain data: tuples become lists and enum members their names."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (*_KEYS, enum.Enum)):
                raise _NotPlainError(key)
            out[key.name if isinstance(key, enum.Enum) else key] = _yaml_ready(item)
        return out
    if isinstance(value, list | tuple):
        return [_yaml_ready(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, _SCALARS):
        return value
    raise _NotPlainError(value)


def _container(cfg: DictConfig, *, resolve: bool) -> dict[str, Any]:
    data = OmegaConf.to_container(cfg, resolve=resolve)
    assert isinstance(data, dict)
    return {str(key): value for key, value in data.items()}


def _check_known_keys(cfg: DictConfig) -> None:
    """Keys forced in with `+key=value` compose, but the schema would drop them silently."""
    known = set(schema.schema_keys())
    prefixes = {k.rsplit(".", 1)[0] for k in known if "." in k}

    def walk(node: DictConfig, prefix: str) -> None:
        for key in node:
            path = f"{prefix}{key!s}"
            if path in FREE_FORM:
                continue
            if path not in known and path not in prefixes:
                from elastic_hydra.config.explain import unknown_key

                raise unknown_key(path)
            child = node._get_node(key)
            if path in prefixes and isinstance(child, DictConfig):
                walk(child, f"{path}.")

    walk(cfg, "")
