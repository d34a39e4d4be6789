"""The template process of warm starts: imports the job's modules once, then forks workers.

    python -u /path/to/template.py AGENT_PID BOOTSTRAP PATH0 MODULE [MODULE ...]   (stdin: channel)

Run by path, like the bootstrap, with the job's interpreter, the workers' common environment
(`env.template_env`) and PATH0 (the script's directory) first on sys.path. The standard library
only, nothing of elastic-hydra: the agent's dependencies never reach a worker. Its stdin is one
end of a SOCK_SEQPACKET socketpair whose other end only the agent holds (end of file = the agent
is gone: the template exits; PR_SET_PDEATHSIG kills it too).

Protocol (one message each way per fork; marshal of plain tuples, data from the agent only):
  template -> agent, once:  (b"ready",) | (b"refuse", reason)
  agent -> template:        (argv, env, cwd, targets) + one descriptor per target (SCM_RIGHTS)
  template -> agent:        (b"pid", pid) | (b"error", text)

A fork: the template forks a middle process, which forks the worker and exits at once; the
template reaps the middle one and only then answers, so the worker is re-parented to the agent
(a child subreaper) before the agent hears its pid: the agent reads its exit status like any
child's. The worker makes its own session (its pid is its group, as a cold worker's), puts each
descriptor on its target (0 the gate, 1 and 2 the log files or pipes, rank 0's store socket),
closes every other one, and waits for the agent's go on the gate. Then it arms PR_SET_PDEATHSIG
(its parent is the agent by now; re-checked), reads stdin from /dev/null, takes the cwd, the
environment and argv, and returns to the module level, which runs the bootstrap's `main` exactly
as `python -u bootstrap.py SCRIPT ARGS` would.

The template refuses (and the agent starts every worker cold) when a listed module fails to
import, when more than one thread is alive after the imports (a fork copies one thread: the
others' locks stay held forever), or when CUDA is initialised (a forked CUDA context is unusable).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import signal
import socket
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9
_MAX_MESSAGE = 8 << 20  # bytes of one request: argv and environment (exec allows ~2 MiB)
_MAX_FDS = 16
_HIGH_FD = 1000  # received descriptors are moved above every target before they are placed


def _prctl_deathsig() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)


def _send(chan: socket.socket, *message: Any) -> None:
    chan.sendmsg([marshal.dumps(message)])


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _refusal(modules: list[str]) -> str | None:
    """Why forking is unsafe after the imports, or None."""
    for name in modules:
        try:
            __import__(name)
        except BaseException as exc:  # the user's module: any error refuses
            return f"cannot import {name}: {type(exc).__name__}: {exc}"
    if (count := _threads()) > 1:
        return f"{count} threads alive after the imports (a fork keeps only one)"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    initialised = getattr(cuda, "is_initialized", None)
    if callable(initialised) and initialised():
        return "CUDA is initialised in the template (a forked CUDA context is unusable)"
    return None


def _load_bootstrap(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("elastic_hydra_bootstrap", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the bootstrap {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve(chan: socket.socket, agent: int) -> tuple[Any, ...] | None:
    """Answer fork requests until the agent closes the channel (None: the template exits).

    Returns, in a forked worker only, its request (argv, env, cwd)."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(chan, _MAX_MESSAGE, _MAX_FDS)
        except OSError:
            return None
        if not data:
            return None
        try:
            argv, env, cwd, targets = marshal.loads(data)
            if len(targets) != len(fds):
                raise ValueError(f"{len(fds)} descriptors for {len(targets)} targets")
        except Exception as exc:  # a bad request is answered, never fatal
            for fd in fds:
                os.close(fd)
            _send(chan, b"error", f"bad request: {exc}")
            continue
        child = _fork(chan, fds, targets, agent)
        if child:
            return argv, env, cwd
        for fd in fds:
            os.close(fd)


def _fork(chan: socket.socket, fds: list[int], targets: list[int], agent: int) -> bool:
    """Fork a worker; True in the worker, False in the template (after its answer)."""
    read, write = os.pipe()
    try:
        middle = os.fork()
    except OSError as exc:
        os.close(read)
        os.close(write)
        _send(chan, b"error", f"fork: {exc}")
        return False
    if middle == 0:  # the middle process: fork the worker, tell its pid, exit
        os.close(read)
        try:
            worker = os.fork()
        except OSError:
            os._exit(1)
        if worker != 0:
            os.write(write, str(worker).encode())
            os._exit(0)
        try:
            os.close(write)
            _become_worker(chan, fds, targets, agent)
        except BaseException:  # never back into the template's loop
            os._exit(125)
        return True
    os.close(write)
    pid = os.read(read, 32)
    os.close(read)
    os.waitpid(middle, 0)  # the worker is the agent's child from here on
    if pid:
        _send(chan, b"pid", int(pid))
    else:
        _send(chan, b"error", "the worker was not forked")
    return False


def _become_worker(chan: socket.socket, fds: list[int], targets: list[int], agent: int) -> None:
    """In the new worker: own session, descriptors in place, wait for the agent's go."""
    import fcntl

    chan.detach()  # its descriptor is closed with every other one below
    os.setsid()
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD) for fd in fds]
    for fd, target in zip(high, targets, strict=True):
        os.dup2(fd, target)  # inheritable, as Popen leaves stdio and pass_fds
    start = 0
    for fd in sorted(set(targets)):
        if start < fd:  # closerange(n, n) would close every descriptor (close_range(n, n-1))
            os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX"))
    go = b""
    while len(go) < 3:
        chunk = os.read(0, 3 - len(go))
        if not chunk:  # the agent died, or decided this worker should not run
            os._exit(125)
        go += chunk
    _prctl_deathsig()
    if os.getppid() != agent:  # the agent died before the death signal was armed
        os._exit(125)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _become_script(argv: list[str], env: dict[str, str], cwd: str) -> None:
    """The process state `python -u bootstrap.py ARGS` has when its `main` starts."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # A cold worker starts behind /bin/sh (the agent's gate), which exports PWD: kept where it
    # names the working directory, else the physical path. The same here.
    pwd = env.get("PWD", "")
    try:
        same = os.path.isabs(pwd) and os.path.samestat(os.stat(pwd), os.stat("."))
    except OSError:
        same = False
    if not same:
        os.environ["PWD"] = os.getcwd()
    sys.argv = list(argv[2:])  # [bootstrap, SCRIPT or -m MODULE, ARGS...]
    sys.orig_argv = list(argv)
    sys.path[0] = os.path.dirname(argv[2])


def main() -> tuple[Any, Any] | None:
    """The template's life; in a forked worker, (bootstrap, request)."""
    agent, bootstrap_path, modules = int(sys.argv[1]), sys.argv[2], sys.argv[4:]
    # The imports see the sys.path the script will: its own directory first (the cwd for -m),
    # not this file's (whose neighbours would shadow top-level modules named env or pool).
    sys.path[0] = sys.argv[3]
    _prctl_deathsig()
    # The agent's save request: Slurm's --signal=USR1 reaches every process of the step, this
    # one too; the agent stops what it forked when it has saved (as the bootstrap does).
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if os.getppid() != agent:
        return None
    chan = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        bootstrap = _load_bootstrap(bootstrap_path)
    except Exception as exc:
        _send(chan, b"refuse", f"cannot load the bootstrap: {exc}")
        return None
    reason = _refusal(modules)
    if reason is not None:
        _send(chan, b"refuse", reason)
        chan.recv(1)  # until the agent closes the channel: it reads the reason first
        return None
    _send(chan, b"ready")
    request = serve(chan, agent)
    return None if request is None else (bootstrap, request)


if __name__ == "__main__":
    _forked = main()
    if _forked is not None:
        _bootstrap, (_argv, _env, _cwd) = _forked
        del _forked
        _become_script(_argv, _env, _cwd)
        del _argv, _env, _cwd
        _bootstrap.main()
