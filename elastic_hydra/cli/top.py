"""`elastic-hydra top [RUN_DIR]` and `top --endpoint HOST:PORT --id RUN_ID`: every rank, live.

The records are the agents' status records (`observe.status`): a run dir's (this node's, or every
node's of a multi-node job whose directories are shared), or, with `--endpoint`, every node's
from the job's rendezvous store (c10d, or etcd with `--backend`), read-only. On a terminal the
table is redrawn about once a second until Ctrl-C or `q`; in a pipe, or with `--once`, one
snapshot is printed (`--json`: as JSON).
Records that do not read as one are left out with one warning.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from elastic_hydra.errors import EXIT_CONFIG, STORE_ERRORS, ConfigError
from elastic_hydra.observe.snapshot import Snapshot, run_dir_records, snapshot
from elastic_hydra.observe.status import JobPhase
from elastic_hydra.plan import DynamicBackend, Endpoint
from elastic_hydra.rundir import LOGS_ROOT, running_runs
from elastic_hydra.stopsignals import StopFlag, handle_signals

REFRESH = 1.0  # seconds between redraws
_ENDED = (None, JobPhase.DONE)  # no node publishes (stale, or no record yet), or every one ended


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-hydra top",
        description="Every rank of a running job, refreshed about once a second.",
    )
    parser.add_argument(
        "run_dir", nargs="?", help=f"default: the newest live run under ./{LOGS_ROOT}"
    )
    parser.add_argument("--endpoint", help="HOST:PORT of the job's c10d store (read-only)")
    parser.add_argument("--id", dest="run_id", help="the job's run id (rdzv.id), with --endpoint")
    parser.add_argument(
        "--backend", default="c10d", choices=[b.value for b in DynamicBackend],
        help="the job's rdzv.backend, with --endpoint (default c10d)",
    )  # fmt: skip
    parser.add_argument("--once", action="store_true", help="one snapshot, then exit")
    parser.add_argument("--json", action="store_true", help="one snapshot as JSON")
    return parser


def run(argv: Sequence[str]) -> int:
    return told(main, argv)


def told(main: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """A reader subcommand's `main` (`top`, `logs`), its bad words told in one line (exit 2),
    a closed pipe ending it quietly."""
    try:
        return main(argv)
    except ConfigError as exc:
        print(f"elastic-hydra: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # SIGPIPE, as `cat` ends


def main(argv: Sequence[str]) -> int:
    """Show the job; 0, 1 when there is nothing to show, 2 for bad words."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_CONFIG if exc.code else 0
    read = _reader(args)
    warned: list[bool] = []

    def checked() -> Snapshot:
        snap = read()
        if snap.ignored and not warned:
            warned.append(True)
            print(
                f"elastic-hydra: warning: {snap.ignored} status record(s) ignored ({snap.why})",
                file=sys.stderr,
            )
        return snap

    if args.once or args.json or not sys.stdout.isatty():
        snap = checked()
        if args.json:
            print(json.dumps(snap.to_json(), indent=2))
        else:
            from elastic_hydra.observe import view

            view.show(snap)
        return 0 if snap.nodes else 1
    from elastic_hydra.observe import view

    flag = StopFlag()
    try:
        with handle_signals(flag), _keys() as keys:
            view.live(checked, lambda seconds: _wait(flag, keys, seconds), REFRESH)
    finally:
        flag.close()
    return 0


def _reader(args: argparse.Namespace) -> Callable[[], Snapshot]:
    if args.endpoint is not None:
        if not args.run_id or args.run_dir:
            raise ConfigError(
                "--endpoint", "needs --id RUN_ID and no run dir", args.endpoint,
                "elastic-hydra top --endpoint HOST:PORT --id RUN_ID",
            )  # fmt: skip
        return _store_reader(_endpoint(args.endpoint), args.run_id, DynamicBackend(args.backend))
    root = Path(args.run_dir) if args.run_dir else _latest()
    if not root.is_dir():
        raise ConfigError("top", "no such run dir", str(root), "expected a run dir")
    return lambda: snapshot(run_dir_records(root), time.time())


def _store_reader(
    endpoint: Endpoint, run_id: str, backend: DynamicBackend
) -> Callable[[], Snapshot]:
    from elastic_hydra.rendezvous import status_keys

    try:
        store = status_keys.connect(endpoint, backend)
    except STORE_ERRORS as exc:
        raise ConfigError(
            "--endpoint", f"cannot reach the store ({str(exc).splitlines()[0][:80]})",
            str(endpoint), "the job's rdzv.endpoint, while the job runs",
        ) from None  # fmt: skip

    def read() -> Snapshot:
        try:
            raws = status_keys.read_records(store, run_id)
        except STORE_ERRORS:
            raws = []
        return snapshot(raws, time.time())

    return read


def _endpoint(text: str) -> Endpoint:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("--endpoint", "not HOST:PORT", text, "e.g. node0:29400")
    return Endpoint(host=host.strip("[]"), port=int(port))


def _latest() -> Path:
    """The newest run under ./eh_logs whose agents still publish, named on stderr."""
    now = time.time()
    runs = sorted(running_runs(Path(LOGS_ROOT)), key=lambda r: r.events.stat().st_mtime)
    live = [r for r in runs if snapshot(run_dir_records(r.root), now).phase not in _ENDED]
    if not live:
        dead = f" (the newest, {runs[-1].root}, stopped publishing)" if runs else ""
        raise ConfigError(
            "top", f"no live run{dead}", f"./{LOGS_ROOT}",
            "give a run dir: elastic-hydra top RUN_DIR (elastic-hydra report RUN_DIR for an "
            "ended one)",
        )  # fmt: skip
    print(f"elastic-hydra top: the newest live run, {live[-1].root}", file=sys.stderr)
    return live[-1].root


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """The terminal's keys one at a time (for `q`), restored after; None without a terminal."""
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    if fd is None:
        yield None
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait(flag: StopFlag, keys: int | None, seconds: float) -> bool:
    """Wait for the next redraw; True: stop (a signal, or `q`)."""
    fds = [flag.read_fd] + ([keys] if keys is not None else [])
    ready, _, _ = select.select(fds, [], [], seconds)
    if flag.signum is not None:
        return True
    if keys is not None and keys in ready:
        return os.read(keys, 32).lower().startswith(b"q")
    flag.drain()
    return False
