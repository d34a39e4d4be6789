"""torchrun's rendezvous flags as elastic-hydra keys, and the settings a translation builds. Pure.

The backend is chosen exactly as torch 2.13's `run()` chooses it: `--standalone` wins; the
default `static` with no `--rdzv-endpoint`, no `--master-port` and at most one node becomes
torchrun's standalone c10d (here: rdzv=standalone, the embedded one). Flags torchrun reads only for
another backend (`--node-rank` with c10d, `--master-addr` with one node...) become notes, as
torchrun's warnings; `--rdzv-conf` keys map one to one onto `rdzv.*`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from elastic_hydra.errors import ConfigError
from elastic_hydra.plan import TORCHRUN_RUN_ID

BACKENDS = ("static", "c10d", "etcd-v2", "etcd")
DYNAMIC = ("c10d", "etcd-v2", "etcd")
# Flags that choose the rendezvous: when one is given, the rendezvous is torchrun's choice.
_RDZV_FLAGS = ("standalone", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "master_addr",
               "master_port", "node_rank", "nnodes")  # fmt: skip
# --rdzv-conf keys read with get_as_int by torch's handlers, each an rdzv.<key> here.
_INT_KEYS = (
    "join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout",
    "keep_alive_interval", "keep_alive_max_attempt", "read_timeout", "timeout",
)  # fmt: skip
_NOT_PASSED = {
    "store_type": "The c10d store is always a TCPStore here (store_type=tcp).",
    "rank": "Give --node-rank instead.",
    **dict.fromkeys(
        ("protocol", "ssl_cert", "ssl_cert_key", "ca_cert", "etcd_prefix", "cacert", "cert", "key"),
        "elastic-hydra passes no TLS or key-prefix settings to etcd.",
    ),
}
_TRUE, _FALSE = ("1", "true", "t", "yes", "y"), ("0", "false", "f", "no", "n")  # get_as_bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Given:
    """A torchrun flag's value and where it came from (for the messages)."""

    name: str  # the flag as written (`--nproc_per_node`), or the variable (`PET_NNODES`)
    value: str | bool  # switches: True
    shown: str  # as it appeared: `--nnodes=2`, `PET_NNODES=2`, `train.py`
    explicit: bool  # on the command line; False: from the environment


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One elastic-hydra key a torchrun-style command sets."""

    key: str  # dotted, or a config group (`rdzv`)
    value: object  # None, bool, int, float, str or a list of int
    source: Given | None  # None: inferred as torchrun infers it (the backend, the run id)
    group: bool = False  # a config group's option, e.g. rdzv=c10d


@dataclass(slots=True)
class Builder:
    """The settings and notes of one translation, in the order they were made."""

    settings: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def set(self, key: str, value: object, source: Given | None, group: bool = False) -> None:
        self.settings = [s for s in self.settings if s.key != key]
        self.settings.append(Setting(key=key, value=value, source=source, group=group))

    def note(self, text: str) -> None:
        self.notes.append(text)


def number(g: Given, kind: type[int] | type[float], example: str) -> int | float:
    """A flag's value as torchrun's argparse `type=int`/`type=float` reads it."""
    try:
        return kind(str(g.value).strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(
            g.name, f"not {what}", g.shown, f"expected e.g. {g.name}={example}"
        ) from None


def rendezvous(b: Builder, v: Mapping[str, Given]) -> None:
    """The rdzv group and its keys, master_addr/master_port/node_rank, local_addr.

    Raises:
        ConfigError: a plugin backend, a static endpoint without a port, a bad --rdzv-conf.
    """
    backend, source = _backend(b, v)
    if any(dest in v for dest in _RDZV_FLAGS):
        b.set("rdzv", backend, source, group=True)
    if backend == "static":
        _static(b, v)
    else:
        _static_flags_ignored(b, v, backend)
    if backend in DYNAMIC:
        _dynamic(b, v)
    if (g := v.get("rdzv_conf")) is not None:
        _rdzv_conf(b, g, backend)
    if (g := v.get("local_addr")) is not None:
        b.set("local_addr", str(g.value).strip(), g)


def max_nodes(v: Mapping[str, Given]) -> int:
    """The MAX of --nnodes (1 where it is not a node count: the resolver says why)."""
    g = v.get("nnodes")
    text = str(g.value).strip().rpartition(":")[2] if g is not None else "1"
    return int(text) if text.isdigit() else 1


def _backend(b: Builder, v: Mapping[str, Given]) -> tuple[str, Given | None]:
    standalone, chosen = v.get("standalone"), v.get("rdzv_backend")
    if standalone is not None:
        for dest in ("rdzv_backend", "rdzv_endpoint", "rdzv_id"):
            if (g := v.get(dest)) is not None:
                b.note(f"{g.shown} is ignored with {standalone.shown}, as torchrun ignores it")
        return "standalone", standalone
    name = str(chosen.value).strip() if chosen is not None else "static"
    if chosen is not None and name not in BACKENDS:
        raise ConfigError(
            chosen.name, "not a rendezvous backend here", chosen.shown,
            "expected c10d, etcd-v2, etcd or static",
            "torchrun's plugin backends (torchrun.handlers) are not supported.",
        )  # fmt: skip
    endpoint = v.get("rdzv_endpoint")
    no_endpoint = endpoint is None or not str(endpoint.value).strip()
    if name == "static" and no_endpoint and "master_port" not in v and max_nodes(v) == 1:
        return "standalone", None  # torchrun's own switch to a one-node c10d on a free port
    return name, chosen


def _static(b: Builder, v: Mapping[str, Given]) -> None:
    endpoint = v.get("rdzv_endpoint")
    if endpoint is not None and str(endpoint.value).strip():
        host, port = _host_port(endpoint)
        for dest in ("master_addr", "master_port"):
            if (g := v.get(dest)) is not None:
                b.note(f"{g.shown} is ignored: {endpoint.shown} names the master of a static "
                       "rendezvous, as under torchrun")  # fmt: skip
        b.set("master_addr", host, endpoint)
        b.set("master_port", port, endpoint)
    else:
        if (g := v.get("master_addr")) is not None:
            b.set("master_addr", str(g.value).strip().strip("[]"), g)
        if (g := v.get("master_port")) is not None:
            b.set("master_port", number(g, int, "29500"), g)
    if (g := v.get("node_rank")) is not None:
        b.set("node_rank", number(g, int, "0"), g)
    if (g := v.get("rdzv_id")) is not None:
        b.set("rdzv.id", str(g.value), g)


def _static_flags_ignored(b: Builder, v: Mapping[str, Given], backend: str) -> None:
    for dest in ("master_addr", "master_port", "node_rank"):
        g = v.get(dest)
        if g is None or (dest == "node_rank" and str(g.value).strip() == "0"):
            continue
        b.note(f"{g.shown} is used by a static rendezvous only; ignored with rdzv={backend}, "
               "as torchrun ignores it")  # fmt: skip


def _dynamic(b: Builder, v: Mapping[str, Given]) -> None:
    g = v.get("rdzv_endpoint")
    if g is not None and str(g.value).strip():
        b.set("rdzv.endpoint", str(g.value).strip(), g)
    if (g := v.get("rdzv_id")) is not None:
        b.set("rdzv.id", str(g.value), g)
    elif max_nodes(v) > 1:
        b.set("rdzv.id", TORCHRUN_RUN_ID, None)
        b.note(f"no --rdzv-id: the run id is torchrun's default, {TORCHRUN_RUN_ID}; give each "
               "job its own --rdzv-id so that jobs sharing a store stay apart")  # fmt: skip


def _host_port(g: Given) -> tuple[str, int]:
    """A static rendezvous's endpoint: `host:port` or `[v6]:port` (torch requires the port)."""
    text = str(g.value).strip()
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            g.name, "a static rendezvous needs host:port", g.shown, "expected e.g. node0:29500"
        )
    return host, int(port)


def parse_rdzv_conf(g: Given) -> dict[str, str]:
    """`k=v,k=v` as torch's `_parse_rendezvous_config` reads it (no commas inside values)."""
    conf: dict[str, str] = {}
    text = str(g.value).strip()
    for item in text.split(",") if text else ():
        key, _, value = item.partition("=")
        if not key.strip() or not value.strip():
            raise ConfigError(
                g.name, "not key=value,...", g.shown,
                "expected e.g. join_timeout=600,read_timeout=60",
            )  # fmt: skip
        conf[key.strip()] = value.strip()
    return conf


def _rdzv_conf(b: Builder, g: Given, backend: str) -> None:
    conf = parse_rdzv_conf(g)
    values: dict[str, object] = {}
    for key, value in conf.items():
        if key in _INT_KEYS:
            if not value.isdigit():
                raise ConfigError(
                    g.name, f"{key} is not whole seconds", g.shown, f"expected e.g. {key}=30"
                )
            values[key] = int(value)
        elif key == "is_host" and value.lower() in (*_TRUE, *_FALSE):
            values[key] = value.lower() in _TRUE
        elif key == "is_host":
            raise ConfigError(
                g.name, "is_host is not a boolean", g.shown, "expected is_host=1 or 0"
            )
        elif key == "store_type" and value == "tcp":
            continue  # torch's default, and ours
        elif key in _NOT_PASSED:
            raise ConfigError(
                g.name, f"key {key} is not supported here", g.shown, "drop it", _NOT_PASSED[key]
            )
        else:
            known = ", ".join((*_INT_KEYS, "is_host", "store_type"))
            raise ConfigError(g.name, f"unknown key {key}", g.shown, f"expected one of {known}")
    if values and backend not in DYNAMIC:
        b.note(f"{g.shown}: not used by rdzv={backend} (only c10d, etcd-v2 and etcd read it)")
        return
    for name, setting in values.items():
        b.set(f"rdzv.{name}", setting, g)
