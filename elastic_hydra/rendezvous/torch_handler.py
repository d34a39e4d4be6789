"""torch's rendezvous handler, as elastic-hydra uses it: its creation (parameters, stores that
listen on their host's address alone, torch's logs kept quiet, a clear error when torch or
python-etcd is missing) and what it keeps of the job (the shared state, its nodes by name).

Everything here reads or patches torch's own objects; `rendezvous_torch` builds the protocol on it.

Calls into torch's handler catch every Exception on purpose: besides its RendezvousError family
it lets through its store's errors, python-etcd's (no builtin base) and legacy etcd's own retry
failures, and each of them means a lost rendezvous to the user (exit 3 with torch's words), never
a launcher bug (exit 70). Calls on a store catch `errors.STORE_ERRORS` alone: `guarded` makes an
etcd store raise within them.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from elastic_hydra.errors import TORCH_INSTALL, ConfigError, RendezvousError
from elastic_hydra.plan import Dynamic, DynamicBackend, LaunchPlan
from elastic_hydra.rendezvous.local import listen_socket

# torch's Store and RendezvousHandler, typed loosely: torch is optional and ships partial stubs.
Store = Any
RendezvousHandler = Any
CONNECT_TRY = 2.0  # seconds one connection attempt to the c10d store may take
CONNECT_RETRY = 0.25  # seconds between attempts while it refuses


def create_handler(
    plan: LaunchPlan,
    where: str,
    *,
    refused: Callable[[str | None], None] = lambda _why: None,
    stopped: Callable[[], bool] = lambda: False,
) -> RendezvousHandler:
    """torch's handler for the plan's backend (network I/O: it connects, or hosts the c10d
    store on the endpoint's address alone), or a RendezvousError that says where and what to do.
    While a c10d store refuses connections, `refused` hears why (None once it accepts)."""
    spec = plan.rdzv
    assert isinstance(spec, Dynamic)
    _check_resolves(spec.endpoint.host)
    parameters, get_handler = _import_torch_rendezvous(spec.backend)
    if spec.backend is DynamicBackend.C10D and not _hosts_store(spec):
        _wait_for_store(spec, refused, stopped)
    options: dict[str, Any] = {
        "join_timeout": int(spec.join_timeout),
        "last_call_timeout": int(spec.last_call_timeout),
        "close_timeout": int(spec.close_timeout),
        "heartbeat_timeout": int(spec.heartbeat_timeout),
        "keep_alive_interval": int(spec.keep_alive_interval),
        "keep_alive_max_attempt": spec.keep_alive_max_attempt,
        "read_timeout": int(spec.read_timeout),
        "timeout": int(spec.timeout),
    }
    if spec.is_host is not None:
        options["is_host"] = spec.is_host
    params = parameters(
        backend=spec.backend.value,
        endpoint=str(spec.endpoint),
        run_id=plan.torch_run_id,
        min_nodes=plan.nnodes.min,
        max_nodes=plan.nnodes.max,
        local_addr=plan.local_addr,
        **options,
    )
    if spec.backend is not DynamicBackend.ETCD:
        _mark_our_nodes()
    started = time.monotonic()
    try:
        with _stores_bound_to_their_host():
            handler = get_handler(params)
    except Exception as exc:  # torch's handler: any failure is an unreachable rendezvous
        raise RendezvousError(
            f"cannot reach the {where}: {reason(exc)} (gave up after "
            f"{time.monotonic() - started:.0f} s). Start the {_server(spec)} there, or fix "
            "rdzv.endpoint"
        ) from None
    if hasattr(handler, "_create_tcp_store_server"):  # the store round 0's workers use
        handler._create_tcp_store_server = lambda addr, port: bound_tcp_store(
            addr, port, multi_tenant=True
        )
    if (holder := getattr(handler, "_state_holder", None)) is not None:
        slack = spec.torchrun_departure_bound - spec.departure_bound
        judge_heartbeats(holder, datetime.timedelta(seconds=slack))
    return handler


# The local ids torch's dynamic handler gives the nodes of an elastic-hydra agent: from here up
# (torch counts handlers of one process from 0), so that every agent tells ours from torchrun's
# in the shared state itself, from the first round on.
OUR_NODES_FROM = 1 << 20


def _mark_our_nodes() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    generator = DynamicRendezvousHandler._node_desc_generator
    with generator._lock:
        generator._local_id = max(generator._local_id, OUR_NODES_FROM)


def is_ours(node: object) -> bool:
    """Whether a node of torch's shared state is an elastic-hydra agent's (else torchrun's)."""
    local_id = getattr(node, "local_id", 0)
    return isinstance(local_id, int) and local_id >= OUR_NODES_FROM


def judge_heartbeats(holder: Any, slack: datetime.timedelta) -> None:
    """torch drops every node whose last heartbeat is older than this agent's bound
    (keep_alive_interval x keep_alive_max_attempt). elastic-hydra agents beat every second; a
    torchrun agent of the same job beats at torch's default, every 5 s: it is judged at torch's
    default bound instead (`slack` longer), or it would be dropped alive between two beats.
    The state is read back unchanged: only the judgement is shifted."""
    if slack <= datetime.timedelta(0):
        return
    sanitize = holder._sanitize

    def judged() -> None:
        beats = holder._state.last_heartbeats
        theirs = [node for node in beats if not is_ours(node)]
        for node in theirs:
            beats[node] += slack
        try:
            sanitize()
        finally:
            for node in theirs:
                if node in beats:  # a node judged gone is out of the state
                    beats[node] -= slack

    holder._sanitize = judged


def _hosts_store(spec: Dynamic) -> bool:
    """Whether torch's c10d backend will host the store in this agent (rdzv.is_host, else
    torch's own guess: the endpoint names this machine)."""
    if spec.is_host is not None:
        return spec.is_host
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

    return bool(_matches_machine_hostname(spec.endpoint.host))


def _wait_for_store(
    spec: Dynamic, refused: Callable[[str | None], None], stopped: Callable[[], bool]
) -> None:
    """Wait until the c10d store's endpoint accepts a connection, for rdzv.connect_timeout.

    torch's client retries a refused connection for rdzv.read_timeout and then blames "the
    connection": a store that is not there (not started yet, or a wrong endpoint) is told while
    it waits and given up on after a bound of its own, by name.
    """
    deadline = time.monotonic() + spec.connect_timeout
    address = (spec.endpoint.host, spec.endpoint.port)
    while True:
        try:
            with socket.create_connection(address, timeout=CONNECT_TRY):
                refused(None)
                return
        except OSError as exc:
            why = (exc.strerror or reason(exc)).lower()  # "connection refused", "timed out"
        if time.monotonic() >= deadline or stopped():
            raise RendezvousError(
                f"cannot connect to the rendezvous store at {spec.endpoint} ({why}; retried "
                f"for rdzv.connect_timeout={spec.connect_timeout:g} s): start the "
                f"{_server(spec)} there first, or fix rdzv.endpoint"
            )
        refused(why)
        time.sleep(CONNECT_RETRY)


def _check_resolves(host: str) -> None:
    """A host name that does not resolve fails now, by name (torch would retry it for the whole
    read timeout and then blame the connection)."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise RendezvousError(
            f"the rendezvous host {host!r} does not resolve ({reason(exc)}): fix rdzv.endpoint, "
            "or make the name resolvable on this node (DNS or /etc/hosts)"
        ) from None


def _import_torch_rendezvous(backend: DynamicBackend) -> tuple[Any, Any]:
    """torch's RendezvousParameters and get_rendezvous_handler, or a ConfigError naming the
    package to install."""
    verbose = os.environ.get("ELASTIC_HYDRA_FULL_ERROR") == "1"
    try:
        with quiet_torch_cpp(not verbose):
            from torch.distributed.elastic.rendezvous import RendezvousParameters
            from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    except ImportError:
        raise ConfigError(
            "rdzv.backend",
            "needs PyTorch, which is not installed",
            backend.value,
            f"install it with `{TORCH_INSTALL}` (or pick rdzv=standalone or rdzv=static)",
        ) from None
    if backend is not DynamicBackend.C10D:
        try:
            import etcd  # noqa: F401  (python-etcd, the client torch's etcd handlers use)
        except ImportError:
            raise ConfigError(
                "rdzv.backend",
                "needs the python-etcd client, which is not installed",
                backend.value,
                "install it with `pip install python-etcd`",
            ) from None
    if backend is not DynamicBackend.ETCD:  # the dynamic handler's state is a pickle
        guard_state_codec()
    if not verbose:  # our one-line errors say what failed; torch's warnings repeat it
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
        if backend is DynamicBackend.ETCD:  # sets its own logger to INFO, on stderr, at import
            from torch.distributed.elastic.rendezvous import etcd_rendezvous

            etcd_rendezvous.logger.setLevel(logging.ERROR)
    return RendezvousParameters, get_rendezvous_handler


class ForeignStateError(pickle.UnpicklingError):
    """torch's rendezvous state in the store is not made of what that state is made of."""


_DYNAMIC = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
# What torch's `_RendezvousState` pickles to: dataclasses of its module, datetimes (in UTC:
# their timezone is a timedelta from UTC), sets.
_STATE_CLASSES = frozenset(
    [(_DYNAMIC, "_RendezvousState"), (_DYNAMIC, "_NodeDesc"), ("datetime", "datetime"),
     ("datetime", "timezone"), ("datetime", "timedelta"), ("builtins", "set"),
     ("builtins", "frozenset")]
)  # fmt: skip


class _StateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _STATE_CLASSES:
            raise ForeignStateError(f"it holds {module}.{name}"[:160])
        return super().find_class(module, name)


class _StateCodec:
    """Stands in for `pickle` in torch's dynamic rendezvous: the state it writes is pickled as
    torch pickles it; what it reads back admits the state's own classes alone, then is checked
    field by field. Anything else is refused (ForeignStateError, a PickleError: torch raises
    its RendezvousStateError from it) before any of it runs."""

    PickleError = pickle.PickleError
    dumps = staticmethod(pickle.dumps)

    @staticmethod
    def loads(data: bytes) -> Any:
        if len(data) > MAX_STATE:
            raise ForeignStateError(f"{len(data)} bytes, more than {MAX_STATE}")
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

        # A pickle may BUILD onto a class it names (setattr on it): torch's two classes are
        # compared after the load and restored if it changed them (the others are immutable).
        classes = (dr._RendezvousState, dr._NodeDesc)
        before = [dict(vars(cls)) for cls in classes]
        try:
            state = _StateUnpickler(io.BytesIO(data)).load()
        except ForeignStateError:
            raise
        except Exception as exc:  # truncated, not a pickle: corrupt, as torch would say
            raise ForeignStateError(f"it does not read ({exc!r:.80})") from None
        finally:
            changed = [_restore(cls, was) for cls, was in zip(classes, before, strict=True)]
        if any(changed):
            raise ForeignStateError("it changes torch's rendezvous classes")
        _check_state(state)
        return state


MAX_STATE = 16 << 20  # bytes of a rendezvous state read (thousands of nodes are far less)


def _restore(cls: type, was: dict[str, Any]) -> bool:
    """Put `cls`'s attributes back as `was` holds them; whether any had changed."""
    now = dict(vars(cls))
    changed = False
    for name in now.keys() - was.keys():
        delattr(cls, name)
        changed = True
    for name, value in was.items():
        if now.get(name, _restore) is not value:
            setattr(cls, name, value)
            changed = True
    return changed


def _check_state(state: Any) -> None:
    """torch's `_RendezvousState`, its fields of their types (nodes as `_NodeDesc`)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    def aware(t: Any) -> bool:  # torch compares them with datetime.now(timezone.utc)
        return type(t) is datetime.datetime and t.utcoffset() is not None

    def node(n: Any) -> bool:
        return (type(n) is _NodeDesc and type(getattr(n, "addr", None)) is str
                and type(getattr(n, "pid", None)) is int
                and type(getattr(n, "local_id", None)) is int)  # fmt: skip

    if type(state) is not _RendezvousState:
        raise ForeignStateError("not torch's rendezvous state (its type)")
    fields = vars(state)
    checks: dict[str, Callable[[Any], bool]] = {
        "round": lambda v: type(v) is int,
        "complete": lambda v: type(v) is bool,
        "deadline": lambda v: v is None or aware(v),
        "closed": lambda v: type(v) is bool,
        "participants": lambda v: type(v) is dict and all(node(k) and type(r) is int
                                                          for k, r in v.items()),
        "wait_list": lambda v: type(v) is set and all(map(node, v)),
        "redundancy_list": lambda v: type(v) is set and all(map(node, v)),
        "last_heartbeats": lambda v: type(v) is dict and all(
            node(k) and aware(t) for k, t in v.items()
        ),
    }  # fmt: skip
    bad = [name for name, ok in checks.items() if name not in fields or not ok(fields[name])]
    if bad:
        raise ForeignStateError(f"not torch's rendezvous state ({', '.join(bad)})")


def guard_state_codec() -> None:
    """torch's dynamic rendezvous (c10d, etcd-v2) reads its state from the store through
    `_StateCodec`: no code from the store runs in this agent."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.pickle = _StateCodec


def foreign_state(exc: BaseException) -> ForeignStateError | None:
    """The refused state behind a rendezvous error, if that is what it was."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ForeignStateError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


_QUIET = threading.RLock()  # the agent's threads load torch side by side (rendezvous, store)


@contextlib.contextmanager
def quiet_torch_cpp(quiet: bool) -> Iterator[None]:
    """Load torch with its C++ log level at FATAL (read once, at load) unless the user set it.

    The variable is set only while torch loads: workers never see it. One thread at a time: two
    that each set and removed it would remove it twice, and one could take the other's setting
    for the user's.
    """
    with _QUIET:
        if not quiet or "TORCH_CPP_LOG_LEVEL" in os.environ:
            yield
            return
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
        try:
            yield
        finally:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)


def bound_tcp_store(host: str, port: int, **options: Any) -> Store:
    """A TCPStore server that listens on `host` only, not on every interface."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined,unused-ignore]

    sock = listen_socket(host, port)
    try:
        store = TCPStore(
            host, sock.getsockname()[1], is_master=True, master_listen_fd=sock.fileno(), **options
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now
    return store


@contextlib.contextmanager
def _stores_bound_to_their_host() -> Iterator[None]:
    """While torch's c10d backend creates its store: the hosting agent's listens on the
    endpoint's address alone. A bind that fails (another agent on this machine hosts it) is the
    error torch expects, so it joins as a client, as it would have."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d

    original: Any = c10d.TCPStore  # type: ignore[attr-defined,unused-ignore]

    def tcp_store(host: str, port: int, *args: Any, is_master: bool = False, **kw: Any) -> Store:
        if not is_master or args:
            return original(host, port, *args, is_master=is_master, **kw)
        try:
            return bound_tcp_store(host, port, **kw)
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc

    c10d.TCPStore = tcp_store  # type: ignore[attr-defined,assignment,unused-ignore]
    try:
        yield
    finally:
        c10d.TCPStore = original  # type: ignore[attr-defined,unused-ignore]


def guarded(store: Store, backend: DynamicBackend) -> Store:
    """The store as our code uses it, every failure within `errors.STORE_ERRORS`.

    torch's c10d store already raises RuntimeError (DistStoreError, DistNetworkError) and OSError;
    its EtcdStore lets python-etcd's EtcdException through (a connection lost, an etcd that went
    away), raised here as a ConnectionError caused by it.
    """
    return store if backend is DynamicBackend.C10D else _EtcdStore(store)


class _EtcdStore:
    """torch's EtcdStore (or a PrefixStore over it), python-etcd's errors raised as
    ConnectionError: see `guarded`."""

    def __init__(self, store: Store) -> None:
        import etcd  # python-etcd: present, torch's etcd handlers made this store with it

        self._store = store
        self._errors: type[Exception] = etcd.EtcdException

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except self._errors as exc:
                raise ConnectionError(str(exc)) from exc

        return call


def dynamic_state(handler: object) -> Any:
    """The shared state of torch's dynamic handler (c10d, etcd-v2); None for legacy etcd."""
    holder = getattr(handler, "_state_holder", None)
    return None if holder is None else holder.state


def this_node(handler: object) -> object:
    return getattr(handler, "_this_node", None)


def agent_name(node: object) -> str:
    return f"{shown(getattr(node, 'addr', node))}, pid {shown(getattr(node, 'pid', '?'))}"


def node_name(node: object) -> str:
    addr, pid = getattr(node, "addr", None), getattr(node, "pid", None)
    return f"{shown(addr)} (agent pid {shown(pid)})" if addr is not None else shown(node)


def shown(value: object, limit: int = 80) -> str:
    """A value from torch's shared state (any agent wrote it) as one short printable word: it
    reaches the console, the events and summary.json."""
    text = "".join(c if c.isprintable() else "?" for c in str(value)[: limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reason(exc: BaseException) -> str:
    """The innermost message of torch's wrapped errors, on one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."


def _server(spec: Dynamic) -> str:
    if spec.backend is DynamicBackend.C10D:
        return "store (an agent with rdzv.is_host=true, or `elastic-hydra rdzv-server`)"
    return "etcd server (with --enable-v2 for etcd-v2)"
