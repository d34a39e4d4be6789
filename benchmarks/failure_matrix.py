"""Injected failures: the class elastic-hydra tells, and the attempts each launcher spends.

    python benchmarks/failure_matrix.py [--only NAME[,NAME]] [--timeout 120] [--out DIR]
        [--name failure_matrix]

Each injection is a small real worker script, written to a temporary directory, that fails one
way. It runs under elastic-hydra (`restart.max_restarts=3`) and under torchrun (`--standalone
--max-restarts=3`), each with the same `nproc_per_node` (1, or 2 where a peer is needed) and a
timeout (--timeout; 30 s for torchrun on the hang, which it never notices). Recorded per
injection:

- elastic-hydra's class: summary.json's `failure_class` (for the flaky worker, which succeeds
  after one failure, the class of its restart event: a restart without one is `unknown`), and
  whether it is the expected one;
- the action: summary.json's `message`, its first clause;
- the time to the decision: from the injection (the worker appends a wall-clock stamp to
  `$OUT_DIR/injected` just before it fails; a script that cannot compile, the time it started;
  the preemption, the time SIGTERM was sent) to the agent's decision (events.jsonl: the first
  restart for a class retried on the normal budget, comm, hang or unknown; the finish event for
  the rest, from the last injection before it);
- the attempts: elastic-hydra's from summary.json, torchrun's from the times its workers started
  (a `sitecustomize` on PYTHONPATH appends a line to `$OUT_DIR/starts` as each worker's Python
  starts, before its script is even compiled, under both launchers).

A launch past its timeout is stopped (SIGSTOP, so it starts no new attempt), its workers are sent
SIGABRT (torchrun's run with PYTHONFAULTHANDLER=1: each prints where it is stuck), then its
process group and its workers are killed. Under the memory cgroup, the kernel log's OOM kills
in that cgroup are kept, with whether the launcher itself was the one killed.

The host OOM runs the launcher inside a cgroup v1 memory cgroup of 256 MiB (root and
/sys/fs/cgroup/memory needed); the GPU rows raise CUDA's and NCCL's own words on a CPU host.

Injections (--only takes these names): import, syntax, name, argument, file, oom_host, sigkill,
sigsegv, disk_full, lost_peer, hang, value_error, preempt, oom_gpu, nccl, ecc, memory_error,
connection, flaky, key_error.

Writes NAME.md and NAME.json into --out (default: results/ beside this file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_hydra.failures import kernel

RESULTS = Path(__file__).resolve().parent / "results"
MEMORY = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller
CGROUP_LIMIT = 256 << 20
Row = dict[str, Any]
RETRIED = frozenset({"comm", "hang", "unknown"})  # classes retried on the normal budget
# Run by every worker's Python as it starts (PYTHONPATH): one line per start, under both
# launchers. The launchers' own processes have no LOCAL_RANK.
SITECUSTOMIZE = """
import os, time
if "OUT_DIR" in os.environ and "LOCAL_RANK" in os.environ:
    with open(os.path.join(os.environ["OUT_DIR"], "starts"), "a") as f:
        f.write(f"{os.getpid()} {os.environ.get('RANK')} "
                f"{os.environ.get('TORCHELASTIC_RESTART_COUNT')} {time.time()}\\n")
"""
STAMP = """import os, sys, time


def stamp():
    with open(os.path.join(os.environ["OUT_DIR"], "injected"), "a") as f:
        f.write(f"{time.time()}\\n")


"""
TORCH_RAISE = STAMP + "import torch\n\nstamp()\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    """One injected failure: its worker script and how the launchers run it."""

    name: str
    title: str
    expected: str
    script: str
    how: str = "real"
    nproc: int = 1
    args: tuple[str, ...] = ()  # the script's arguments, under both launchers
    overrides: tuple[str, ...] = ()  # elastic-hydra's only
    torchrun_timeout: float | None = None  # None: --timeout
    cgroup: bool = False  # the launcher inside a memory cgroup of CGROUP_LIMIT
    sigterm: bool = False  # SIGTERM to the launcher 2 s after its workers started
    from_restart: bool = False  # the class is the first restart's (the job then succeeds)


NO_GPU = "raised: no GPU here"
INJECTIONS = (
    Injection(
        name="import", title="import error", expected="user_error",
        script=STAMP + "stamp()\nimport transformerz\n",
    ),
    Injection(
        name="syntax", title="syntax error", expected="user_error",
        script="def f(:\n    return 1\n",
    ),
    Injection(
        name="name", title="NameError at step 2", expected="user_error",
        script=STAMP + "for step in range(5):\n    if step == 2:\n        stamp()\n"
        "        print(stepp)\n    time.sleep(0.1)\n",
    ),
    Injection(
        name="argument", title="bad argument (--lrr 0.1)", expected="user_error",
        script=STAMP + "import argparse\n\nparser = argparse.ArgumentParser()\n"
        'parser.add_argument("--lr", type=float, default=0.1)\nstamp()\nparser.parse_args()\n',
        args=("--lrr", "0.1"),
    ),
    Injection(
        name="file", title="FileNotFoundError (data file)", expected="user_error",
        script=STAMP + 'stamp()\nopen("/data/missing/train-00000.bin", "rb")\n',
    ),
    Injection(
        name="oom_host", title="host OOM (256 MiB cgroup)", expected="oom_host",
        script=STAMP + "blocks = []\nstamp()\nwhile True:\n"
        '    blocks.append(b"x" * (16 << 20))\n',
        cgroup=True,
    ),
    Injection(
        name="sigkill", title="SIGKILL", expected="unknown",
        script=STAMP + "import signal\n\nstamp()\nos.kill(os.getpid(), signal.SIGKILL)\n",
    ),
    Injection(
        name="sigsegv", title="SIGSEGV (ctypes.string_at(0))", expected="unknown",
        script=STAMP + "import ctypes\n\nstamp()\nctypes.string_at(0)\n",
    ),
    Injection(
        name="disk_full", title="disk full (/dev/full)", expected="infra",
        script=STAMP + 'f = open("/dev/full", "w")\nf.write("x" * 4096)\nstamp()\nf.flush()\n',
    ),
    Injection(
        name="lost_peer", title="lost peer (gloo, rank 1 leaves)", expected="comm", nproc=2,
        script=STAMP + "import datetime\n\nimport torch\nimport torch.distributed as dist\n\n"
        'dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))\n'
        "t = torch.ones(4)\ndist.all_reduce(t)\nif dist.get_rank() == 1:\n"
        "    dist.destroy_process_group()\n    sys.exit(0)\nstamp()\ndist.all_reduce(t)\n"
        "dist.destroy_process_group()\n",
    ),
    Injection(
        name="hang", title="hang (sleeps forever)", expected="hang",
        script=STAMP + "stamp()\ntime.sleep(100_000)\n",
        overrides=("hang.timeout=5", "hang.action=restart"), torchrun_timeout=30.0,
    ),
    Injection(
        name="value_error", title="ValueError at step 3, every attempt", expected="user_error",
        script=STAMP + "for step in range(5):\n    if step == 3:\n        stamp()\n"
        '        raise ValueError(f"loss is nan at step {step}")\n    time.sleep(0.1)\n',
    ),
    Injection(
        name="preempt", title="preemption (SIGTERM to the launcher)", expected="preempted",
        script=STAMP + "for _ in range(1200):\n    time.sleep(0.1)\n", sigterm=True,
    ),
    Injection(
        name="oom_gpu", title="GPU OOM (torch.OutOfMemoryError)", expected="oom_gpu",
        how=NO_GPU,
        script=TORCH_RAISE + 'raise torch.OutOfMemoryError("CUDA out of memory. Tried to '
        "allocate 20.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 3.12 GiB is "
        'free. Including non-PyTorch memory, this process has 76.02 GiB memory in use.")\n',
    ),
    Injection(
        name="nccl", title="NCCL error (DistBackendError)", expected="comm", how=NO_GPU,
        script=TORCH_RAISE + 'raise torch.distributed.DistBackendError("NCCL error in: '
        "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
        'NCCL version 2.21.5 ncclRemoteError")\n',
    ),
    Injection(
        name="ecc", title="uncorrectable ECC error", expected="hardware", how=NO_GPU,
        script=TORCH_RAISE
        + 'raise RuntimeError("CUDA error: uncorrectable ECC error encountered")\n',
    ),
    Injection(
        name="memory_error", title="MemoryError", expected="oom_host",
        script=STAMP + "stamp()\nraise MemoryError()\n",
    ),
    Injection(
        name="connection", title="ConnectionResetError, every attempt", expected="unknown",
        script=STAMP + "import socket\nimport struct\n\n"
        'server = socket.create_server(("127.0.0.1", 0))\n'
        "client = socket.create_connection(server.getsockname())\n"
        "peer, _ = server.accept()\n"
        'peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))\n'
        "peer.close()  # a reset, not a clean close\nstamp()\nclient.recv(1)\n",
    ),
    Injection(
        name="flaky", title="flaky: fails on attempt 0 only", expected="unknown",
        script=STAMP + 'if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":\n    stamp()\n'
        '    raise RuntimeError("flaky: the first attempt fails")\nprint("done")\n',
        from_restart=True,
    ),
    Injection(
        name="key_error", title="KeyError at the same frame, every attempt", expected="user_error",
        script=STAMP + 'config = {"lr": 0.1}\nstamp()\nprint(config["batch_size"])\n',
    ),
)  # fmt: skip


@contextlib.contextmanager
def memory_cgroup(on: bool) -> Iterator[Path | None]:
    """A memory cgroup of CGROUP_LIMIT (None when `on` is False), removed once empty."""
    if not on:
        yield None
        return
    group = MEMORY / f"elastic-hydra-bench-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(CGROUP_LIMIT))
        yield group
    finally:
        deadline = time.monotonic() + 60
        while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            group.rmdir()


def starts_of(out: Path) -> list[tuple[int, str, float]]:
    """The workers' starts: (pid, TORCHELASTIC_RESTART_COUNT, wall clock), in order."""
    path = out / "starts"
    if not path.exists():
        return []
    rows: list[tuple[int, str, float]] = []
    for line in path.read_text().splitlines():
        pid, _rank, count, when = line.split()
        rows.append((int(pid), count, float(when)))
    return rows


def signal_workers(out: Path, signum: int) -> None:
    """`signum` to each worker of this launch still alive (by the pids it wrote at its start)."""
    for pid, _, _ in starts_of(out):
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            if f"OUT_DIR={out}".encode() in environ:
                os.kill(pid, signum)


def kill_leftovers(out: Path) -> None:
    """SIGKILL any worker of this launch still alive."""
    signal_workers(out, signal.SIGKILL)


def cgroup_kills(group: Path | None, mono: float) -> list[tuple[int, str]]:
    """The kernel's OOM kills in `group` since `mono`: its lines that name the cgroup, and the
    `Killed process` lines of the pids they name."""
    if group is None:
        return []
    kills = kernel.since(mono).oom_kills
    pids = {pid for pid, text in kills if f"oom_memcg=/{group.name}," in text}
    return [(pid, text) for pid, text in kills if pid in pids]


def stuck_in(output: str) -> list[str]:
    """From faulthandler's dumps in `output`: each dumped worker's innermost frame and the
    script's line it came from (`_new_process_group_helper <- w.py:4`)."""
    found: list[str] = []
    for block in re.findall(r"Current thread [^\n]*\n((?:  File [^\n]*\n)+)", output):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        if not frames:
            continue
        script = next((f for f in frames if f[0].endswith("/w.py")), frames[-1])
        found.append(f"{frames[0][2]} <- w.py:{script[1]}")
    return found


def launch(argv: list[str], env: dict[str, str], timeout: float, out: Path, inj: Injection) -> Row:
    """Run one launcher to its end (or `timeout`, then kill its group and its workers)."""
    with memory_cgroup(inj.cgroup) as group:
        if group is not None:
            enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
            argv = ["sh", "-c", enter, "sh", *argv]
        started, mono = time.time(), time.monotonic()
        with (out / "launcher.log").open("w") as log:
            proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        sigterm_at = None
        if inj.sigterm:
            while not starts_of(out) and proc.poll() is None and time.time() - started < timeout:
                time.sleep(0.05)
            time.sleep(2.0)
            sigterm_at = time.time()
            proc.send_signal(signal.SIGTERM)  # the launcher alone, not its group
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, timeout - (time.time() - started)))
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGSTOP)  # no new attempt while its workers tell
            signal_workers(out, signal.SIGABRT)  # faulthandler: where each one is stuck
            time.sleep(1.0)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall = time.time() - started
        kill_leftovers(out)  # workers live in sessions of their own
        if group is not None:
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)  # what this launch left in its cgroup
        kills = cgroup_kills(group, mono)
    return {
        "exit": proc.returncode, "timed_out": timed_out, "wall_s": round(wall, 1),
        "sigterm_at": sigterm_at, "output": (out / "launcher.log").read_text(errors="replace"),
        "launcher_pid": proc.pid, "oom_kills": [text for _, text in kills],
        "launcher_oom_killed": any(pid == proc.pid for pid, _ in kills),
    }  # fmt: skip


def first_clause(message: str) -> str:
    """`not retried: the same ...` -> `not retried`; parentheses (a class's evidence) dropped."""
    depth, kept = 0, []
    for char in message:
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif char == ":" and depth == 0:
            break
        elif depth == 0:
            kept.append(char)
    return " ".join("".join(kept).split())


def decision(inj: Injection, found: str | None, events: list[Row]) -> Row | None:
    """The event that holds the agent's decision on the injection."""
    restarts = [e for e in events if e["event"] == "restart"]
    finish = next((e for e in events if e["event"] == "finish"), None)
    if restarts and (inj.from_restart or found in RETRIED):
        return restarts[0]
    return finish


def elastic_hydra(case: Path, inj: Injection, env: dict[str, str], timeout: float) -> Row:
    """The injection under elastic-hydra: its class, action, time to decision and attempts."""
    out, logs = case / "eh-out", case / "eh-logs"
    out.mkdir()
    argv = [
        sys.executable, "-m", "elastic_hydra", f"script={case / 'w.py'}",
        f"nproc_per_node={inj.nproc}", "restart.max_restarts=3", "logs.quiet=true",
        f"logs.root={logs}", f"env.OUT_DIR={out}", *inj.overrides,
    ]  # fmt: skip
    if inj.args:
        argv += ["--", *inj.args]
    done = launch(argv, env, timeout, out, inj)
    summaries = list(logs.rglob("summary.json"))
    if not summaries:
        return {**done, "class": None, "message": "no summary.json", "attempts": None}
    summary = json.loads(summaries[0].read_text())
    events_path = next(logs.rglob("events.jsonl"))
    events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    restarts = [e for e in events if e["event"] == "restart"]
    found = summary.get("failure_class")
    if inj.from_restart:
        found = restarts[0].get("failure_class", "unknown") if restarts else found
    message = str(summary.get("message") or "")
    if inj.from_restart and restarts:
        then = "the job succeeded" if done["exit"] == 0 else f"exit {done['exit']}"
        message = f"{restarts[0].get('reason', '')}; then {then}"
    decided = decision(inj, found, events)
    injected = injected_times(out, done)
    to_decision = None
    if decided is not None and injected:
        at = float(decided["time"])
        before = [t for t in injected if t <= at + 0.5]
        if before:
            first = decided["event"] == "restart" and decided is restarts[0]
            to_decision = round(at - (before[0] if first else before[-1]), 3)
    cause = summary.get("root_cause") or {}
    return {
        **done, "class": found, "message": message, "attempts": summary.get("attempts"),
        "restarts": summary.get("restarts"), "to_decision_s": to_decision,
        "decision_event": decided["event"] if decided else None,
        "evidence": cause.get("evidence") if isinstance(cause, dict) else None,
        "restart_classes": [e.get("failure_class", "unknown") for e in restarts],
        "starts": len({count for _, count, _ in starts_of(out)}),
    }  # fmt: skip


def injected_times(out: Path, done: Row) -> list[float]:
    """When the failure was injected: the worker's stamps, else its starts (a script that does
    not compile fails as it starts), or the time SIGTERM was sent."""
    if done["sigterm_at"] is not None:
        return [float(done["sigterm_at"])]
    path = out / "injected"
    if path.exists():
        return sorted(float(line) for line in path.read_text().split())
    return sorted(when for _, _, when in starts_of(out))


def torchrun(case: Path, inj: Injection, env: dict[str, str], timeout: float) -> Row:
    """The injection under torchrun: its exit and the attempts its workers started."""
    out = case / "tr-out"
    out.mkdir()
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={inj.nproc}", "--max-restarts=3", str(case / "w.py"), *inj.args,
    ]  # fmt: skip
    limit = inj.torchrun_timeout or timeout
    env = {**env, "OUT_DIR": str(out), "PYTHONFAULTHANDLER": "1"}  # a stack if it is stopped
    done = launch(argv, env, limit, out, inj)
    attempts = len({count for _, count, _ in starts_of(out)})
    stuck = stuck_in(str(done["output"])) if done["timed_out"] else []
    note = ""
    if done["timed_out"] and inj.name == "hang":
        note = f"no verdict (killed after {limit:g} s)"
    elif done["timed_out"]:
        where = f"in {'; '.join(sorted(set(stuck)))}" if stuck else "(no stack dumped)"
        note = f"killed after {limit:g} s, attempt {attempts} stuck {where}"
    if done["launcher_oom_killed"]:
        note = "the OOM killer took torchrun itself"
    return {**done, "attempts": attempts, "note": note, "stuck": stuck}


def run_one(work: Path, inj: Injection, timeout: float) -> Row:
    """One injection under both launchers: a row of the table, with what explains it."""
    case = Path(tempfile.mkdtemp(dir=work, prefix=f"{inj.name}-"))
    (case / "w.py").write_text(inj.script)
    site = case / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PYTHON"))}
    env.update({"PYTHONPATH": str(site), "COLUMNS": "500"})
    env.pop("RANK", None)
    eh = elastic_hydra(case, inj, env, timeout)
    tr = torchrun(case, inj, env, timeout)
    return {
        "name": inj.name, "injection": inj.title, "how": inj.how, "expected": inj.expected,
        "nproc_per_node": inj.nproc, "eh_class": eh["class"],
        "right": eh["class"] == inj.expected, "action": first_clause(str(eh["message"])),
        "to_decision_s": eh.get("to_decision_s"), "attempts_eh": eh["attempts"],
        "attempts_torchrun": tr["attempts"], "torchrun_note": tr["note"],
        "eh_exit": eh["exit"], "eh_timed_out": eh["timed_out"], "eh_wall_s": eh["wall_s"],
        "eh_message": eh["message"], "eh_evidence": eh.get("evidence"),
        "eh_restart_classes": eh.get("restart_classes"), "eh_starts": eh.get("starts"),
        "eh_decision_event": eh.get("decision_event"), "torchrun_exit": tr["exit"],
        "torchrun_wall_s": tr["wall_s"], "torchrun_stuck": tr["stuck"],
        "torchrun_output_tail": tail(str(tr["output"])), "eh_output_tail": tail(str(eh["output"])),
        "eh_oom_kills": eh.get("oom_kills"), "torchrun_oom_kills": tr["oom_kills"],
        "eh_launcher_oom_killed": eh.get("launcher_oom_killed"),
    }  # fmt: skip


def seconds(value: float | None) -> str:
    """`6.1 s`, `0.43 s`, `11 ms`, or `-`."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 0.1 else f"{value:.2f} s"


def tail(text: str, lines: int = 8) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.strip().splitlines()[-lines:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="injections to run, comma separated")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per launch")
    parser.add_argument("--name", default="failure_matrix", help="the results' file name")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {inj.name for inj in INJECTIONS})
    if unknown:
        parser.error(f"unknown injection: {', '.join(unknown)}")
    chosen = [inj for inj in INJECTIONS if not names or inj.name in names]
    load, began = os.getloadavg(), time.time()
    results: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="failure-matrix-") as tmp:
        for inj in chosen:
            result = run_one(Path(tmp), inj, args.timeout)
            print(json.dumps(result), flush=True)
            results.append(result)
    user = [r for r in results if r["expected"] == "user_error"]
    summary = {
        "right": sum(bool(r["right"]) for r in results),
        "rows": len(results),
        "user_error_attempts_eh": sum(int(r["attempts_eh"] or 0) for r in user),
        "user_error_attempts_torchrun": sum(int(r["attempts_torchrun"] or 0) for r in user),
        "user_error_rows": len(user),
    }
    meta = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_before": load,
        "loadavg_after": os.getloadavg(),
        "time": began,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began)),
        "wall_s": round(time.time() - began, 1),
        "max_restarts": 3,
        "timeout_s": args.timeout,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "results": results}, indent=1) + "\n"
    )
    (args.out / f"{args.name}.md").write_text(markdown(meta, summary, results))
    print(markdown(meta, summary, results))


def markdown(meta: Row, summary: Row, results: list[Row]) -> str:
    """The table, with the load, the date and the summary line above it."""
    before, after = meta["loadavg_before"], meta["loadavg_after"]
    lines = [
        "# Injected failures: elastic-hydra's class and attempts against torchrun's", "",
        f"{meta['date']}; load average before {before[0]:.2f}, after {after[0]:.2f};"
        f" {meta['cpus']} CPUs; restart budget 3 under both launchers; the whole matrix took"
        f" {meta['wall_s']:.0f} s.", "",
        f"right: {summary['right']} of {summary['rows']}; attempts spent on deterministic user"
        f" errors: elastic-hydra {summary['user_error_attempts_eh']}, torchrun"
        f" {summary['user_error_attempts_torchrun']} ({summary['user_error_rows']} injections).",
        "",
        "to decision: seconds from the injection to elastic-hydra's decision (its first restart"
        " for a class retried on the budget: comm, hang, unknown; its final decision otherwise)."
        " attempts torchrun: the times its workers started.",
        "",
        "| injection | how | expected | elastic-hydra class | right | action | to decision |"
        " attempts elastic-hydra | attempts torchrun |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in results:
        took = seconds(r["to_decision_s"])
        torch_attempts = str(r["attempts_torchrun"])
        if r["torchrun_note"]:
            torch_attempts += f": {r['torchrun_note']}"
        cells = [
            r["injection"], r["how"], r["expected"], r["eh_class"] or "none",
            "yes" if r["right"] else "NO", r["action"], took, str(r["attempts_eh"]),
            torch_attempts,
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
