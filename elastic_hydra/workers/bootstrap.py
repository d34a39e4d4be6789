"""Runs a Python worker's script or module as `__main__` and records an uncaught exception.

    python -u /path/to/bootstrap.py SCRIPT [ARGS ...]
    python -u /path/to/bootstrap.py -m MODULE [ARGS ...]

Run by path, not imported: it uses the standard library only, so it works with whichever Python
interpreter the job names, and the user's script imports nothing from elastic-hydra. The script
sees what `python SCRIPT` gives it: `__name__ == "__main__"`, `__file__`, `sys.argv`, its own
directory first on `sys.path`, a `__main__` module that pickle and multiprocessing's spawn can find.

On an uncaught exception it writes `TORCHELASTIC_ERROR_FILE` in torch's `@record` format (unless
`@record` already wrote it), plus the exception chain as frames and a sub-second time under the
key `elastic_hydra`, prints the traceback as Python would (without this file's or runpy's frames)
and exits with code 1. faulthandler writes the Python stack of a crash (SIGSEGV, SIGABRT, SIGFPE,
SIGBUS, SIGILL) to `ELASTIC_HYDRA_FAULT_FILE`. An uncaught KeyboardInterrupt (the SIGINT the
launcher forwards on Ctrl-C) ends it as it ends `python SCRIPT`, killed by SIGINT after the atexit
handlers, but without printing the traceback.

For the agent's hang detection and `elastic-hydra stacks`: faulthandler dumps every thread's
stack to `ELASTIC_HYDRA_STACKS_FILE` on the signal `ELASTIC_HYDRA_STACKS_SIGNAL` (from C: it
needs no GIL, so a rank stuck in a C call that holds it still answers), and a daemon thread
looks at the main thread every `ELASTIC_HYDRA_PROGRESS_EVERY` seconds and keeps
`ELASTIC_HYDRA_PROGRESS_FILE` (see `_note_progress`): when its stack last changed; whether it ran
Python code since the last look (it asks the main thread, through `Py_AddPendingCall`, to post a
semaphore when it next runs Python code: a main thread blocked in a C call, a GPU sync that spins
a core or a collective, does not), and whether it did so in the user's own frame; how many
collectives torch.distributed's groups have issued. These variables are taken out of the
script's environment, but for the progress file's, which `elastic_hydra.progress()` writes to.

A Hydra app run as the script gets `${now:...}` at the launch's time, `ELASTIC_HYDRA_LAUNCH_TIME`
(see `_pin_hydra_now`): every rank and every attempt of the launch share one output dir.
"""

from __future__ import annotations

import _thread
import atexit
import builtins
import faulthandler
import importlib.machinery
import os
import runpy
import signal
import sys
import time
import types

TYPE_CHECKING = False  # typing is not imported at run time: the bootstrap starts every worker
if TYPE_CHECKING:
    from typing import Any

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
FAULT_FILE_ENV = "ELASTIC_HYDRA_FAULT_FILE"
STORE_FD_ENV = "ELASTIC_HYDRA_STORE_FD"
STACKS_FILE_ENV = "ELASTIC_HYDRA_STACKS_FILE"
STACKS_SIGNAL_ENV = "ELASTIC_HYDRA_STACKS_SIGNAL"
PROGRESS_FILE_ENV = "ELASTIC_HYDRA_PROGRESS_FILE"
PROGRESS_EVERY_ENV = "ELASTIC_HYDRA_PROGRESS_EVERY"
COLLECTIVES_FILE_ENV = "ELASTIC_HYDRA_COLLECTIVES_FILE"
ARRIVALS_FILE_ENV = "ELASTIC_HYDRA_ARRIVALS_FILE"
LAUNCH_TIME_ENV = "ELASTIC_HYDRA_LAUNCH_TIME"
_stacks: object = None  # the stacks file: faulthandler writes to it for the worker's lifetime

# Frames of the bootstrap itself: runpy's code objects name the real file (`<frozen runpy>` on
# some versions), whatever the interpreter.
_OWN_FILES = frozenset([__file__, runpy.run_path.__code__.co_filename])


def main() -> None:
    if len(sys.argv) < 2 or (sys.argv[1:2] == ["-m"] and len(sys.argv) < 3):
        sys.stderr.write("usage: bootstrap.py SCRIPT [ARGS ...] | -m MODULE [ARGS ...]\n")
        sys.exit(2)
    # SIGUSR1 is the agent's save request (Slurm's --signal=USR1@T, `elastic-hydra save`), and
    # Slurm sends it to every process of the step: a worker goes on until the agent, having
    # saved, stops it. A script that sets a handler of its own (Lightning's requeue) still has it.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    fault_path = os.environ.get(FAULT_FILE_ENV)
    if fault_path:
        # Private, like every file of the run dir; it lives as long as the worker.
        fault = os.fdopen(os.open(fault_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")
        faulthandler.enable(fault, all_threads=True)
    _watch_self()
    store_fd = os.environ.pop(STORE_FD_ENV, None)
    if store_fd is not None:
        _listen_on_agents_socket(int(store_fd))
    launched = os.environ.get(LAUNCH_TIME_ENV)
    if launched:
        try:  # noqa: SIM105 (contextlib is one more import in every worker's start)
            _pin_hydra_now(float(launched))
        except ValueError:  # not a time: Hydra keeps its own
            pass
    # The user's code gets a fresh `__main__` module that stays in sys.modules to the end (atexit
    # handlers and pickling find it), as with plain python. (This file's functions keep their
    # own globals.)
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        if sys.argv[1] == "-m":
            name = sys.argv[2]
            sys.argv = [name, *sys.argv[3:]]  # runpy puts the module's file in argv[0]
            sys.path[0] = os.getcwd()
            # What `python -m` itself calls (it runs the module in sys.modules["__main__"]).
            runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]
        else:
            script = sys.argv[1]
            sys.argv = sys.argv[1:]
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            _run_script(script)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        # Ctrl-C reaches the workers as the SIGINT the launcher forwards (as torchrun does).
        # Raised on, it ends the worker as Python ends on one (atexit handlers, then killed by
        # SIGINT: 130 in a shell), minus the traceback every rank would print.
        sys.excepthook = _quiet_interrupt(sys.excepthook)
        raise
    except BaseException as exc:
        _strip_own_frames(exc)
        _record(exc, time.time())
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


def _quiet_interrupt(hook: Any) -> Any:
    """`hook`, silent for KeyboardInterrupt."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            hook(kind, value, tb)

    return excepthook


def _watch_self() -> None:
    """Stacks on the agent's signal, and progress notes, where the agent asks for them."""
    global _stacks
    main = _thread.get_ident()
    stacks, signum = os.environ.pop(STACKS_FILE_ENV, None), os.environ.pop(STACKS_SIGNAL_ENV, None)
    progress = os.environ.get(PROGRESS_FILE_ENV)  # kept: `elastic_hydra.progress()` writes to it
    every = os.environ.pop(PROGRESS_EVERY_ENV, None)
    collectives = os.environ.pop(COLLECTIVES_FILE_ENV, None)
    arrivals = os.environ.pop(ARRIVALS_FILE_ENV, None)
    if stacks and signum:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        _stacks = os.fdopen(os.open(stacks, flags, 0o600), "w")
        _stacks.write(f"main thread 0x{main:016x}\n")  # which of the dumped threads is main
        _stacks.flush()
        faulthandler.register(int(signum), file=_stacks, all_threads=True, chain=False)
    if progress and every:
        fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # Both held while the watch runs: `stop` is released to end it, `done` by it as it ends.
        stop, done = _thread.allocate_lock(), _thread.allocate_lock()
        stop.acquire()
        done.acquire()
        args = (fd, float(every), main, (stop, done), (collectives, arrivals))
        _thread.start_new_thread(_note_progress, args)

        def end_watch() -> None:
            # Before the interpreter finalizes: a thread still running then is ended by
            # pthread_exit when it next takes the GIL, which can abort a process whose C++
            # libraries (torch) are being torn down.
            stop.release()
            done.acquire(timeout=1.0)

        atexit.register(end_watch)


_LINE = 21  # bytes of one line of the progress file: "%-20.3f\n"
# The progress file's lines, each _LINE bytes, rewritten in place: the last look at which the
# main thread's stack had changed; the last look that found it had run Python code; the last look
# that found it had run Python code in the user's own frame (it came back from a call made there:
# a loop passed its line again); the number of collectives its process groups had issued (torch's
# own sequence numbers; blank before torch.distributed has a group); the last time the script
# called `elastic_hydra.progress()`.
STACK_MOVED, RAN, USER_RAN, COLLECTIVES, SCRIPT_SAID = range(5)
_STDLIB = os.path.dirname(os.__file__) + os.sep


def _note_progress(
    fd: int,
    every: float,
    main: int,
    locks: tuple[Any, Any],
    files: tuple[str | None, str | None],
) -> None:
    """At each look: the time the main thread's stack last changed, the last look that found
    the main thread had run Python code (anywhere, and in the user's own frame), and the count of
    collectives issued (see the lines above).

    A stack is the code and the bytecode offset of each frame: a rank blocked in a call
    (a collective, a lock, `sleep`, a read) keeps the same one; a loop moves it, unless each
    look finds it in the same call, which a loop's `sleep` or a GPU loop's `.item()` makes likely.
    Such a loop still comes back to its own frame between two calls: the probe asked while the
    main thread was in a call made from the user's frame, and answered, tells that it did.
    When the agent asks (`files[0]` + ".request" exists), it writes the collectives' state;
    with `files[1]`, it keeps the rank's arrival times at its collectives there.
    """
    stop, done = locks
    collectives, arrivals = files
    try:
        last, probe, asked_in_user, count = None, _Probe.make(), False, None
        recorder = _recorder()
        arrived = recorder.Arrivals(arrivals) if arrivals else None
        if probe is not None:
            os.pwrite(fd, b"%-20.3f\n%-20.3f\n%-20.3f\n" % (time.time(), 0.0, 0.0), 0)
        while True:
            frame = sys._current_frames().get(main)
            if frame is None:  # the main thread has ended
                return
            in_user = _is_user(frame.f_code.co_filename)
            here = []
            while frame is not None:
                here.append((id(frame.f_code), frame.f_lasti))
                frame = frame.f_back
            now = time.time()
            if (stack := hash(tuple(here))) != last:
                last = stack
                os.pwrite(fd, b"%-20.3f\n" % now, STACK_MOVED * _LINE)
            if probe is not None:
                was_asked = probe.asked
                if probe.ran():
                    os.pwrite(fd, b"%-20.3f\n" % now, RAN * _LINE)
                    if asked_in_user:
                        os.pwrite(fd, b"%-20.3f\n" % now, USER_RAN * _LINE)
                    asked_in_user = in_user  # asked again at this look
                elif not was_asked:
                    asked_in_user = in_user
            if (issued := recorder.collectives()) is not None and issued != count:
                count = issued
                os.pwrite(fd, b"%-20d\n" % issued, COLLECTIVES * _LINE)
                if arrived is not None:
                    try:
                        arrived.look(now)
                    except Exception:  # a full disk, a removed run dir: no more arrivals
                        arrived = None
            if collectives and os.path.exists(collectives + ".request"):
                recorder.write_collectives(collectives)
            if stop.acquire(timeout=every):  # released: the worker is exiting
                return
    except BaseException:  # never the worker's problem
        return
    finally:
        done.release()


_RECORDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recorder.py")


def _recorder() -> types.ModuleType:
    """`recorder.py` beside this file, loaded by path as this file is run (the worker's
    `sys.path` is the script's), once."""
    module = sys.modules.get("_elastic_hydra_recorder")
    if module is None:
        loader = importlib.machinery.SourceFileLoader("_elastic_hydra_recorder", _RECORDER)
        module = types.ModuleType(loader.name)
        module.__file__ = _RECORDER
        loader.exec_module(module)
        sys.modules[loader.name] = module
    return module


def _is_user(filename: str) -> bool:
    """Whether a code object's file is the user's: not the standard library, an installed
    package, frozen or generated code, or this file."""
    return not (
        filename.startswith(("<", _STDLIB))
        or "/site-packages/" in filename
        or "/dist-packages/" in filename
        or filename in _OWN_FILES
    )


class _Probe:
    """Whether the main thread ran Python code since it was last asked.

    CPython's `Py_AddPendingCall` queues a C function that only the main thread's eval loop
    calls, between two bytecodes: never while it is inside a C call (a GPU sync, a collective)
    or `sleep`, unless Python code (a signal handler) runs there. The function queued is libc's
    `sem_post` on a semaphore of our own: no Python runs in the main thread for it, and nothing
    it does can fail there.
    """

    def __init__(self, ctypes: Any, add: Any, libc: Any) -> None:
        self.add, self.libc = add, libc
        self.sem = libc.malloc(64)  # a sem_t (32 bytes on Linux), never freed: a call queued
        if not self.sem or libc.sem_init(self.sem, 0, 0) != 0:  # at exit may still post to it
            raise OSError("no semaphore")
        self.post = ctypes.cast(libc.sem_post, ctypes.c_void_p).value
        self.asked = False

    @classmethod
    def make(cls) -> _Probe | None:
        """None where there is no such call (not CPython, no ctypes, 3.8's noisy shutdown)."""
        if sys.version_info < (3, 9):  # noqa: UP036 (the job's interpreter runs this file)
            return None
        try:
            import ctypes

            add = ctypes.pythonapi.Py_AddPendingCall
            add.argtypes, add.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
            libc = ctypes.CDLL(None)
            libc.malloc.restype = ctypes.c_void_p
            libc.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
            libc.sem_post.argtypes = libc.sem_trywait.argtypes = [ctypes.c_void_p]
            return cls(ctypes, add, libc)
        except Exception:  # no ctypes, no libc, no symbol: no probe
            return None

    def ran(self) -> bool:
        """Whether the main thread ran the call asked at an earlier look; asks again."""
        done = self.asked and self.libc.sem_trywait(self.sem) == 0
        if done or not self.asked:
            self.asked = self.add(self.post, self.sem) == 0  # -1: its queue is full
        return done


def _listen_on_agents_socket(fd: int) -> None:
    """Rank 0 of a one-node job: the env:// store that torch starts listens on the socket the
    agent bound to 127.0.0.1 (torch's own would listen on every interface).

    torch is not imported here: when the script imports `torch.distributed.rendezvous`, its store
    factory is wrapped to hand TCPStore that socket (`master_listen_fd`) for this job's
    MASTER_PORT. Every other store is torch's as before.
    """
    port = int(os.environ.get("MASTER_PORT", "-1"))

    def wrap(module: Any) -> None:
        create = module._create_c10d_store

        def _create_c10d_store(*args: Any) -> Any:  # (hostname, port, rank, world_size, ...)
            hostname, port_, rank, world_size, timeout, *rest = args
            if rank != 0 or port_ != port or module._torchelastic_use_agent_store():
                return create(*args)
            return module.TCPStore(
                host_name=hostname, port=port_, world_size=world_size, is_master=True,
                timeout=timeout, multi_tenant=True, use_libuv=rest[0] if rest else True,
                master_listen_fd=os.dup(fd),  # the store closes its copy; a restart gets another
            )  # fmt: skip

        module._create_c10d_store = _create_c10d_store

    _after_import("torch.distributed.rendezvous", wrap)


def _pin_hydra_now(launched: float) -> None:
    """A Hydra app in the worker: `${now:...}` is the launch's time, the same for every rank and
    every attempt, so they all get one output dir (Hydra's default `hydra.run.dir` is
    `outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}`: each process would take the second it reached
    `@hydra.main`, hydra#2070).

    Hydra (re)registers its `now` resolver in `hydra.core.utils.setup_globals`, which `@hydra.main`
    and the compose API call before they compose: when the script imports that module, its
    `setup_globals` is wrapped to register `now` again, on the launch's time, in the OmegaConf that
    module uses. Nothing of Hydra or OmegaConf is imported here; a Hydra without them is left as
    it is.
    """

    def pin(utils: Any) -> None:
        setup = getattr(utils, "setup_globals", None)
        omegaconf = getattr(utils, "OmegaConf", None)  # the one Hydra registers its resolvers in
        if not callable(setup) or omegaconf is None:
            return

        def setup_globals() -> None:
            setup()
            from datetime import datetime

            when = datetime.fromtimestamp(launched)
            omegaconf.register_new_resolver("now", when.strftime, use_cache=True, replace=True)

        utils.setup_globals = setup_globals
        # Modules that imported it by name before (Hydra's own compose and basic launcher:
        # only in a warm worker, whose template imported Hydra) get the pinned one too.
        for module in list(sys.modules.values()):
            try:
                if getattr(module, "setup_globals", None) is setup:
                    vars(module)["setup_globals"] = setup_globals
            except Exception:  # a lazy module that will not be looked at: not Hydra's
                pass

    _after_import("hydra.core.utils", pin)


def _after_import(name: str, patch: Any) -> None:
    """Call `patch(module)` once the module `name` is imported (executed), before the importer
    gets it; the script's own import machinery (other finders, editable installs) finds it.
    A patch that fails leaves the module as it was: it is never the worker's problem.
    A module imported already (a warm worker forked from a template that imported torch) is
    patched at once."""
    if (module := sys.modules.get(name)) is not None:
        try:  # noqa: SIM105 (no contextlib: see main)
            patch(module)
        except Exception:  # the module stays as it came
            pass
        return

    class Finder:  # a meta path finder (importlib.abc is not imported: it costs every start)
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if find is not None and (spec := find(fullname, path, target)) is not None:
                    break
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module: Any) -> None:
                    run(module)
                    if getattr(module, "__name__", None) == name:  # a loader may serve many
                        try:  # noqa: SIM105 (no contextlib: see main)
                            patch(module)
                        except Exception:  # the module stays as it came
                            pass

                try:  # noqa: SIM105
                    spec.loader.exec_module = exec_module
                except (AttributeError, TypeError):  # a loader that takes no attribute
                    pass
            return spec

    sys.meta_path.insert(0, Finder())


def _run_script(script: str) -> None:
    if not os.path.isfile(script):  # a directory or zip file with a __main__.py
        runpy.run_path(script, run_name="__main__")
        return
    script = os.path.abspath(script)  # as Python (3.9+) gives a script's __main__
    module = sys.modules["__main__"]
    module.__file__ = script
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    module.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    exec(code, module.__dict__)


def _strip_own_frames(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    exc.__traceback__ = tb


def _record(exc: BaseException, when: float) -> None:
    # Imported only on failure: each import here would delay every worker's start.
    import json
    import traceback

    path = os.environ.get(ERROR_FILE_ENV)
    if not path or os.path.exists(path):  # torch's @record wrote it first: keep the user's
        return
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        ours: dict[str, Any] = {"time": when, "stacks": _chain(exc)}
        if "torch.distributed.distributed_c10d" in sys.modules:  # its last collectives
            ours["collectives"] = _recorder().collective_state()[0]
        data = {
            "message": {
                "message": f"{type(exc).__name__}: {_text(exc)}",
                "extraInfo": {"py_callstack": text, "timestamp": str(int(when))},
            },
            "elastic_hydra": ours,
        }
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(data, f, default=repr)
    except Exception as err:  # recording must never hide the user's own error
        sys.stderr.write(f"elastic-hydra bootstrap: cannot record the error in {path}: {err}\n")


def _chain(exc: BaseException) -> list[dict[str, object]]:
    """The exception and its causes, oldest first (the order Python prints them)."""
    import traceback

    stacks: list[dict[str, object]] = []
    seen: set[int] = set()
    link: str | None = None  # how the exception appended next led to the one before it
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        stacks.append(
            {
                "exc_type": _type_name(current),
                "exc_value": _text(current),
                "link": link,
                "frames": [
                    {"filename": f.filename, "lineno": f.lineno, "name": f.name, "line": f.line}
                    for f in traceback.extract_tb(current.__traceback__)
                    if f.filename not in _OWN_FILES
                ],
            }
        )
        if current.__cause__ is not None:
            current, link = current.__cause__, "cause"
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, "context"
        else:
            current = None
    stacks.reverse()
    return stacks


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<exception str() failed>"  # what Python itself prints


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


if __name__ == "__main__":
    main()
