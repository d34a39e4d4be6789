"""Status records in the rendezvous store (c10d's TCPStore, or the etcd server of both etcd
backends): each agent's, under its own slot of the run.

An agent takes a slot once (`elastic_hydra/<run_id>/status/count`, added to) and replaces its
record there every few seconds; `elastic-hydra top --endpoint` reads the count and every slot.
The store lists no keys, hence the count; it is capped when read (`MAX_NODES`), as a forged one
must not make the reader ask forever. Each side opens its own client connection with a short
timeout, never the rendezvous's: a store that is slow or gone costs a record (or a refresh of the
view), never the agent's loop, which shares nothing with it. torch is imported at the first
connection, never at import.
"""

from __future__ import annotations

import contextlib
import warnings
from datetime import timedelta
from typing import Any

from elastic_hydra.errors import STORE_ERRORS
from elastic_hydra.plan import DynamicBackend, Endpoint
from elastic_hydra.rendezvous import torch_handler

STATUS = "elastic_hydra/{run_id}/status/"
ETCD_PREFIX = "/elastic_hydra"  # the etcd directory of our store (torch's rendezvous is elsewhere)
MAX_NODES = 4096
TIMEOUT = 2.0  # seconds for one connection or one request
RETRY = 10.0  # seconds an agent waits before connecting again to a store that failed

Store = Any


def connect(
    endpoint: Endpoint, backend: DynamicBackend = DynamicBackend.C10D, timeout: float = TIMEOUT
) -> Store:
    """A client of the job's store at `endpoint`: the c10d TCPStore, or the etcd server (both
    etcd backends) through torch's EtcdStore under a prefix of ours. Raises within STORE_ERRORS.
    torch loads quietly (its C++ log, NumPy's absence): a refusal is told by the caller."""
    with warnings.catch_warnings(), torch_handler.quiet_torch_cpp(True):
        warnings.simplefilter("ignore")
        from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]

        if backend is not DynamicBackend.C10D:
            from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore
    if backend is DynamicBackend.C10D:
        return TCPStore(
            endpoint.host, endpoint.port, is_master=False, timeout=timedelta(seconds=timeout)
        )
    import etcd  # python-etcd, as torch's etcd handlers use it

    try:
        client = etcd.Client(host=endpoint.host, port=endpoint.port, read_timeout=timeout)
        client.machines  # noqa: B018  (one request: is anyone there)
    except etcd.EtcdException as exc:
        raise ConnectionError(str(exc)) from exc
    store = EtcdStore(client, ETCD_PREFIX, timedelta(seconds=timeout))
    return torch_handler.guarded(store, backend)


class StoreSink:
    """An agent's side: publishes its record to its slot (a `publish.Sink`)."""

    def __init__(
        self,
        endpoint: Endpoint,
        run_id: str,
        backend: DynamicBackend = DynamicBackend.C10D,
        clock: Any = None,
    ) -> None:
        import time

        self.endpoint, self.prefix = endpoint, STATUS.format(run_id=run_id)
        self.backend = backend
        self.store: Store | None = None
        self.slot: int | None = None
        self.clock = clock or time.monotonic
        self.failed_at: float | None = None

    def __call__(self, raw: bytes) -> None:
        if self.failed_at is not None and self.clock() - self.failed_at < RETRY:
            return  # the store failed a moment ago: do not wait on it at every record
        try:
            if self.store is None:
                self.store = connect(self.endpoint, self.backend)
            if self.slot is None:
                self.slot = int(self.store.add(f"{self.prefix}count", 1))
            self.store.set(f"{self.prefix}{self.slot}", raw)
            self.failed_at = None
        except STORE_ERRORS:
            self.store, self.failed_at = None, self.clock()


def read_records(store: Store, run_id: str) -> list[bytes]:
    """Every slot's record (a slot that is empty or cannot be read is left out).

    Raises:
        within STORE_ERRORS: the store did not answer the count.
    """
    prefix = STATUS.format(run_id=run_id)
    if not store.check([f"{prefix}count"]):  # no agent published yet (read-only: no add(0))
        return []
    count = min(max(int(bytes(store.get(f"{prefix}count")).decode()), 0), MAX_NODES)
    keys = [f"{prefix}{slot}" for slot in range(1, count + 1)]
    raws = []
    for key in keys:
        with contextlib.suppress(*STORE_ERRORS):
            if store.check([key]):
                raws.append(bytes(store.get(key)))
    return raws
