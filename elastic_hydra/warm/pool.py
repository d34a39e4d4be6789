"""The agent's side of warm starts: one template process per node, and the workers forked from it.

`WarmPool` starts the template (`template.py`, run by path with the job's interpreter) as soon as
the launch begins, so its imports overlap the rendezvous; `spawn` asks it for one worker and
returns a `ForkedWorker` that `supervise` treats like a `subprocess.Popen`: the worker was
re-parented to the agent (a child subreaper) before its pid came back, so its exit status is
read with waitpid, its pidfd wakes the agent, and the stop (SIGTERM to its group, grace,
SIGKILL) is the same.

Any trouble falls back to cold starts for the rest of the launch, announced once through
`fallback`: a refusal (an import failed, threads, CUDA), a template that died or answers
nonsense, a request it cannot take. Nothing of the template outlives the agent: it dies with
it (PR_SET_PDEATHSIG), and exits when the agent closes the channel (`close`).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import selectors
import socket
import subprocess
import time
from collections.abc import Callable
from typing import IO

from elastic_hydra.plan import LaunchPlan, PythonModule, PythonScript
from elastic_hydra.warm import early
from elastic_hydra.warm.early import TemplateArgs
from elastic_hydra.warm.env import template_env
from elastic_hydra.workers.contain import is_subreaper
from elastic_hydra.workers.spawn import WorkerProcess, WorkerSpec

_REPLY_WAIT = 30.0  # seconds for one fork's answer (a fork takes milliseconds)
_MAX_REPLY = 64 << 10


class ForkedWorker:
    """A worker forked by the template and re-parented to the agent: Popen's surface."""

    def __init__(self, pid: int, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = stdout
        self.stderr = stderr

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 255
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(0.005)
        return code


class WarmPool:
    """One template per node; `spawn` forks a worker from it (None: start that one cold)."""

    def __init__(self, args: TemplateArgs, fallback: Callable[[str], None]) -> None:
        self.prefix = (args.python, "-u", args.bootstrap)  # the cold argv's head a fork replaces
        self._fallback = fallback
        self._state: str | None = None  # None: not ready yet; "ready"; else why it is off
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            template = early.claim(args) or early.spawn(args)
        except OSError as exc:
            self._chan = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # for _off to close
            self._off(f"cannot start the template: {exc.strerror}")
            return
        self._proc, self._chan = template.proc, template.chan

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def wait_ready(self, timeout: float, wake_fd: int | None = None) -> bool:
        """Block until the template has imported its modules (True) or refused (False), at most
        `timeout` s; False without a decision when `wake_fd` (the stop flag) becomes readable."""
        if self._state is not None:
            return self._state == "ready"
        with selectors.DefaultSelector() as sel:
            sel.register(self._chan, selectors.EVENT_READ)
            if wake_fd is not None:
                sel.register(wake_fd, selectors.EVENT_READ)
            ready = sel.select(timeout)
        if not ready:
            self._off(f"the template did not import its modules in {timeout:g} s")
        elif all(key.fd == wake_fd for key, _ in ready):
            return False  # a stop is pending: this attempt starts cold, nothing decided
        else:
            match self._reply():
                case (b"ready",):
                    self._state = "ready"
                case (b"refuse", str(reason)):
                    self._off(reason)
                case other:
                    self._off(f"the template answered {other!r:.200}")
        return self._state == "ready"

    def spawn(
        self, spec: WorkerSpec, *, gate: int, out: int, err: int, pipes: bool
    ) -> WorkerProcess | None:
        """Fork the worker of `spec` from the template (see `workers.spawn.Spawner`)."""
        if spec.argv[:3] != self.prefix or self._state != "ready":
            return None  # not ready (a stop came first: see wait_ready), off, or another Python
        ends: list[int] = []
        try:
            if pipes:
                ends = [*os.pipe(), *os.pipe()]  # stdout r, w; stderr r, w
                out, err = ends[1], ends[3]
            fds = {0: gate, 1: out, 2: err, **{fd: fd for fd in spec.pass_fds}}
            request = marshal.dumps((list(spec.argv), spec.env, spec.cwd, list(fds)))
            socket.send_fds(self._chan, [request], list(fds.values()))
            pid = self._answer()
        except OSError as exc:
            for fd in ends:
                os.close(fd)
            self._off(f"the template cannot fork: {exc}")
            return None
        if pid is None:
            for fd in ends:
                os.close(fd)
            return None
        if not pipes:
            return ForkedWorker(pid, None, None)
        os.close(ends[1])
        os.close(ends[3])
        return ForkedWorker(pid, open(ends[0], "rb", buffering=0), open(ends[2], "rb", 0))

    def _answer(self) -> int | None:
        if not self._chan_readable(_REPLY_WAIT):
            self._off(f"the template did not answer in {_REPLY_WAIT:g} s")
            return None
        match self._reply():
            case (b"pid", int(pid)) if pid > 0:
                return pid
            case (b"error", str(text)):
                self._off(f"the template cannot fork: {text}")
            case other:
                self._off(f"the template answered {other!r:.200}")
        return None

    def _chan_readable(self, timeout: float) -> bool:
        with selectors.DefaultSelector() as sel:
            sel.register(self._chan, selectors.EVENT_READ)
            return bool(sel.select(timeout))

    def _reply(self) -> object:
        try:
            data = self._chan.recv(_MAX_REPLY)
        except OSError as exc:
            return ("lost", exc.strerror)
        if not data:
            return self._exit_text()
        try:
            return marshal.loads(data)
        except (ValueError, EOFError, TypeError):
            return ("unreadable", data[:100])

    def _exit_text(self) -> tuple[str, str]:
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=1.0)
        return ("exited", f"with status {code}")

    def _off(self, reason: str) -> None:
        """Cold starts from now on; `fallback` hears why, once."""
        if self._state is not None and self._state != "ready":
            return
        self._state = reason
        self._fallback(reason)
        self._stop_template()

    def _stop_template(self) -> None:
        self._chan.close()  # end of file: the template exits
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def close(self) -> None:
        """End the template (the forked workers are the agent's, stopped by `supervise`)."""
        if self._state is None or self._state == "ready":
            self._state = "closed"
            self._stop_template()


def template_args(plan: LaunchPlan, base: dict[str, str], cwd: str) -> TemplateArgs | None:
    """The template the plan asks for (None: its workers start cold)."""
    entry = plan.entrypoint
    if not plan.warm.imports or not isinstance(entry, PythonScript | PythonModule):
        return None
    if entry.bootstrap is None:
        return None
    return TemplateArgs(
        python=entry.python,
        bootstrap=entry.bootstrap,
        imports=plan.warm.imports,
        env=template_env(plan, base),
        cwd=cwd,
        # The script's directory (`python script.py`), the cwd (`python -m`), as sys.path[0].
        path0=os.path.dirname(os.path.realpath(entry.path))
        if isinstance(entry, PythonScript)
        else cwd,
    )


def start_pool(
    plan: LaunchPlan, base: dict[str, str], cwd: str, fallback: Callable[[str], None]
) -> WarmPool | None:
    """The launch's template, started now or adopted (`early.claim`), where the plan asks for
    warm starts (None: cold)."""
    args = template_args(plan, base, cwd)
    if args is None:
        return None
    if not is_subreaper():  # a forked worker would be init's child: its exit status lost
        fallback("the agent is not a child subreaper")
        return None
    return WarmPool(args, fallback)
