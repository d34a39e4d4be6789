"""A stand-in for the Kubernetes controllers: it runs a rendered JobSet or TrainJob on this host.

It reads the manifests `--plan=jobset|trainjob` printed and does, for each pod, what the
controllers would, following their sources:

- the Job controller (kubernetes pkg/controller/job: `addCompletionIndexEnvVariables` in
  indexed_job_utils.go, the pod hostname `<job>-<index>` in job_controller.go) gives every pod of
  an Indexed Job `JOB_COMPLETION_INDEX` and its hostname; it applies the Job's
  `podFailurePolicy` (FailJob on the listed exit codes, Ignore on DisruptionTarget) and
  `backoffLimit` to pod failures, recreates a failed pod with the same index, and ends the Job
  on its `successPolicy` (`succeededIndexes`) or when every index succeeded;
- the JobSet controller (kubernetes-sigs/jobset pkg/controllers/jobset_controller.go
  `constructJob`, `labelAndAnnotateObject`; failure_policy.go) names the Job
  `<jobset>-<replicatedJob>-<jobIndex>`, sets the pod subdomain (network.subdomain, default the
  JobSet's name) and its headless service (here: /etc/hosts lines `<addr> <host>.<subdomain>`),
  annotates the pods (jobset-name, replicatedjob-name, job-index, restart-attempt: read through
  the downward API fieldRefs of the manifest), and applies `failurePolicy` to a failed Job
  (FailJobSet on a matching reason, else RestartJobSet up to maxRestarts: every pod recreated);
- Trainer's Torch plugin (kubeflow/trainer pkg/runtime/framework/plugins/torch/torch.go
  `EnforceMLPolicy`) adds PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the completion
  index), PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>` and PET_MASTER_PORT to the trainer
  container of a TrainJob, whose JobSet it builds from the runtime's template.

`machines` does the same for nodes outside Kubernetes (SkyPilot, dstack): host names and
addresses of their own, and the test gives each the scheduler's variables.

Each pod is a process in a UTS namespace of its own (its hostname) with a loopback address of
its own (`POD_IP`, in /etc/hosts for its DNS name), as tests/slurm_cluster.py runs Slurm nodes;
the image's `elastic-hydra` is this Python's `-m elastic_hydra`, a ConfigMap mount is a
directory, the image's working directory is the repository. What differs from a cluster: one
host, one kernel, one filesystem; ports are shared, so the rendezvous port is a free one, not
29400; a lost pod is one killed here, not a node that vanishes from the network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.conftest import REPO, free_port, rewrite, wait_for

HOSTS_FILE = Path("/etc/hosts")
_HOSTS_MARK = "# elastic-hydra k8s harness"
ADDRESS_BASE = "127.0.78."  # pod i: 127.0.78.(10 + i)
_EXPAND = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class Phase(enum.StrEnum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclasses.dataclass
class Pod:
    index: int
    hostname: str
    address: str
    proc: subprocess.Popen[bytes]
    log: Path
    disrupted: bool = False  # evicted/preempted: the DisruptionTarget condition

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclasses.dataclass
class Controller:
    """One JobSet (or a TrainJob's JobSet) with one replicated job of N indexed pods."""

    name: str  # the JobSet's (the TrainJob's)
    subdomain: str
    job: dict[str, Any]  # the batch/v1 Job spec
    failure_policy: dict[str, Any]
    env_of: Any  # (index, address, attempt) -> the container's environment
    args: list[str]
    workdir: Path
    tmp: Path
    pods: dict[int, Pod] = dataclasses.field(default_factory=dict)
    created: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (attempt, index)
    attempt: int = 0  # JobSet restarts so far
    failures: int = 0  # pod failures counted against backoffLimit
    phase: Phase = Phase.RUNNING
    reason: str = ""
    succeeded: set[int] = dataclasses.field(default_factory=set)
    ended: list[str] = dataclasses.field(default_factory=list)  # every end of the JobSet
    # Each pod failure, in order: (index, the podFailurePolicy rule that matched it, or None
    # when none did and it counted against backoffLimit).
    decided: list[tuple[int, dict[str, Any] | None]] = dataclasses.field(default_factory=list)

    # ------------------------------------------------------------------------------ pods
    def hostname(self, index: int) -> str:
        return f"{self.name}-node-0-{index}"  # Job `<jobset>-node-0`, pod `<job>-<index>`

    def address(self, index: int) -> str:
        return f"{ADDRESS_BASE}{10 + index}"

    def start(self, index: int) -> Pod:
        """Create pod `index` (again): its hostname, address, environment and command."""
        host, address = self.hostname(index), self.address(index)
        env = self.env_of(index, address, self.attempt)
        argv = [_expand(a, env) for a in self.args]
        script = f"hostname {shlex.quote(host)} && exec {shlex.join(argv)}"
        log = self.tmp / f"pod-{index}-{len(self.created)}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                ["unshare", "--uts", "sh", "-c", script], cwd=self.workdir, env=env,
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        pod = Pod(index=index, hostname=host, address=address, proc=proc, log=log)
        self.pods[index] = pod
        self.created.append((self.attempt, index))
        return pod

    def start_all(self) -> None:
        for index in range(int(self.job["parallelism"])):
            self.start(index)

    def kill(self, index: int, *, disruption: bool = False) -> None:
        """Kill pod `index` at once. With `disruption`, the pod fails as Kubernetes fails one
        whose node is lost or that is evicted: with the DisruptionTarget condition (the taint
        manager's eviction, the pod GC and the eviction API all add it). Without, as a container
        killed in place (an OOM kill): exit 137 and nothing more."""
        pod = self.pods[index]
        pod.disrupted = disruption
        _kill_tree(pod.proc.pid, signal.SIGKILL)

    def grace(self) -> float:
        """The pods' terminationGracePeriodSeconds (Kubernetes' default: 30)."""
        return float(self.job["template"]["spec"].get("terminationGracePeriodSeconds", 30))

    def delete(self, index: int) -> int:
        """Delete pod `index` as `kubectl delete pod` does: the kubelet sends SIGTERM to the
        container's first process (the agent) alone, waits the grace, then SIGKILLs what is
        left. The Job replaces the pod at the next `step` by its failure policy. The pod's
        container exit code."""
        pod = self.pods[index]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pod.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            pod.proc.wait(timeout=self.grace())
        if pod.proc.poll() is None:
            _kill_tree(pod.proc.pid, signal.SIGKILL)
        return _container_code(pod.proc.wait(timeout=30))

    def delete_all(self) -> None:
        """Terminate every running pod as the kubelet does: SIGTERM, the grace, SIGKILL."""
        grace = self.grace()
        running = [p for p in self.pods.values() if p.proc.poll() is None]
        for pod in running:
            _kill_tree(pod.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for pod in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if pod.proc.poll() is None:
                _kill_tree(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait(timeout=30)

    # ------------------------------------------------------------------------ the policy
    def step(self) -> None:
        """Apply the Job's and the JobSet's policies to the pods that ended since last time."""
        for index, pod in list(self.pods.items()):
            code = pod.proc.poll()
            if code is None or self.phase is not Phase.RUNNING or index in self.succeeded:
                continue
            code = _container_code(code)
            if code == 0:
                self.succeeded.add(index)
                if self._job_succeeded():
                    self._end(Phase.SUCCEEDED, "Completed")
                continue
            rule = self._pod_failure_rule(code, pod.disrupted)
            self.decided.append((index, rule))
            action = None if rule is None else rule["action"]
            if action == "FailJob":
                self._job_failed("PodFailurePolicy")
            elif action == "Ignore":
                self.start(index)
            else:
                self.failures += 1
                if self.failures > int(self.job.get("backoffLimit", 6)):
                    self._job_failed("BackoffLimitExceeded")
                else:
                    self.start(index)

    def _job_succeeded(self) -> bool:
        rules = self.job.get("successPolicy", {}).get("rules", [])
        for rule in rules:
            wanted = {int(i) for i in str(rule.get("succeededIndexes", "")).split(",") if i}
            if wanted and wanted <= self.succeeded:
                return True
        return len(self.succeeded) == int(self.job["completions"])

    def _pod_failure_rule(self, code: int, disrupted: bool) -> dict[str, Any] | None:
        """The Job's first podFailurePolicy rule that matches the failure, or None."""
        rules: list[dict[str, Any]] = self.job.get("podFailurePolicy", {}).get("rules", [])
        for rule in rules:
            on_codes = rule.get("onExitCodes")
            if on_codes and (code in on_codes["values"]) == (on_codes["operator"] == "In"):
                return rule
            conditions = rule.get("onPodConditions", [])
            if disrupted and any(c["type"] == "DisruptionTarget" for c in conditions):
                return rule
        return None  # counted against backoffLimit

    def _job_failed(self, reason: str) -> None:
        for rule in self.failure_policy.get("rules", []):
            reasons = rule.get("onJobFailureReasons", [])
            if not reasons or reason in reasons:
                if rule["action"] == "FailJobSet":
                    self._end(Phase.FAILED, reason)
                    return
                break
        if self.attempt < int(self.failure_policy.get("maxRestarts", 0)):
            self.delete_all()
            self.attempt += 1
            self.failures, self.succeeded = 0, set()
            self.start_all()
            return
        self._end(Phase.FAILED, reason)

    def _end(self, phase: Phase, reason: str) -> None:
        self.phase, self.reason = phase, reason
        self.ended.append(f"{phase}: {reason}")
        self.delete_all()  # a finished Job's remaining pods are terminated

    def wait(self, what: str, predicate: Any, timeout: float) -> Any:
        """Poll `predicate` while the controller keeps applying its policies."""

        def stepped() -> Any:
            self.step()
            return predicate()

        return wait_for(stepped, timeout, what, interval=0.2, detail=self.explain)

    def run(self, timeout: float) -> Phase:
        """Drive the policies until the JobSet ends (a failing test stops every pod)."""
        self.wait("the JobSet to end", lambda: self.phase is not Phase.RUNNING, timeout)
        return self.phase

    def explain(self) -> str:
        logs = [f"--- pod {i} ({p.hostname}, exit {p.proc.poll()})\n{p.text()[-3000:]}"
                for i, p in sorted(self.pods.items())]  # fmt: skip
        return f"{self.phase} {self.reason} created={self.created}\n" + "\n".join(logs)


# ------------------------------------------------------------------------------ from manifests
def _expand(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion of a container's args (an unknown name stays as is)."""
    return _EXPAND.sub(lambda m: env.get(m.group(1), m.group(0)), arg)


def _container_code(returncode: int) -> int:
    """A container's exit code as the kubelet reports it: 128 + N for a signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _field(path: str, index: int, address: str, annotations: Mapping[str, str]) -> str:
    """A downward API fieldRef's value."""
    if path == "status.podIP":
        return address
    found = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", path)
    assert found, f"the harness does not know the fieldRef {path}"
    return annotations[found.group(1)]


def _pod_env(
    container: dict[str, Any], index: int, address: str, annotations: Mapping[str, str],
    base: Mapping[str, str],
) -> dict[str, str]:  # fmt: skip
    env = dict(base)
    env["JOB_COMPLETION_INDEX"] = str(index)  # the Job controller's
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _expand(var["value"], env)
        else:
            env[var["name"]] = _field(var["valueFrom"]["fieldRef"]["fieldPath"], index, address,
                                      annotations)  # fmt: skip
    return env


def _mounts(docs: list[dict[str, Any]], pod: dict[str, Any], tmp: Path) -> dict[str, str]:
    """The pod's volumes as directories: mount path -> local directory. A ConfigMap's holds its
    data; an emptyDir is empty (the pods of this stand-in share the host's /dev/shm)."""
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    found = {}
    for mount in pod["containers"][0].get("volumeMounts", []):
        volume = volumes[mount["name"]]
        where = tmp / f"mount-{mount['name']}"
        where.mkdir(exist_ok=True)
        if "configMap" in volume:
            for name, text in maps[volume["configMap"]["name"]].items():
                (where / name).write_text(text)
        else:
            assert volume["emptyDir"]["medium"] == "Memory", volume
        found[mount["mountPath"]] = str(where)
    return found


def controller(docs: list[dict[str, Any]], tmp: Path, base_env: Mapping[str, str]) -> Controller:
    """The controller of the rendered manifests `docs` (a JobSet's, or a TrainJob's)."""
    kinds = {d["kind"]: d for d in docs}
    port = free_port()
    if "JobSet" in kinds:
        top = kinds["JobSet"]
        name = top["metadata"]["name"]
        spec = top["spec"]
        subdomain = spec.get("network", {}).get("subdomain", name)
        rjob = spec["replicatedJobs"][0]
        job = rjob["template"]["spec"]
        container = job["template"]["spec"]["containers"][0]
        args = [a.replace(":29400", f":{port}") if a.startswith("rdzv.endpoint=") else a
                for a in container["args"]]  # fmt: skip
        pet: dict[str, str] = {}
    else:
        train, runtime = kinds["TrainJob"], kinds["TrainingRuntime"]
        name = subdomain = train["metadata"]["name"]
        spec = runtime["spec"]["template"]["spec"]
        rjob = spec["replicatedJobs"][0]
        job = dict(rjob["template"]["spec"])
        trainer = train["spec"]["trainer"]
        count = int(trainer["numNodes"])
        job["parallelism"] = job["completions"] = count  # Trainer sizes the Job from numNodes
        container = job["template"]["spec"]["containers"][0]
        args = list(trainer["args"])
        pet = {"PET_NNODES": str(count), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
               "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
               "PET_MASTER_PORT": str(port)}  # fmt: skip
    mounts = _mounts(docs, job["template"]["spec"], tmp)
    for where, local in mounts.items():
        args = [local + a[len(where) :] if a.startswith(where + "/") else a for a in args]
    program = [sys.executable, "-m", "elastic_hydra"] if container["command"] == [
        "elastic-hydra"] else container["command"]  # fmt: skip

    def env_of(index: int, address: str, attempt: int) -> dict[str, str]:
        annotations = {
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
            "jobset.sigs.k8s.io/job-index": "0",
            "jobset.sigs.k8s.io/restart-attempt": str(attempt),
        }
        env = _pod_env(container, index, address, annotations, base_env)
        if pet:
            env |= pet | {"PET_NODE_RANK": str(index)}
        return env

    return Controller(
        name=name, subdomain=subdomain, job=job, failure_policy=spec.get("failurePolicy", {}),
        env_of=env_of, args=[*program, *args], workdir=Path(container.get("workingDir", REPO)),
        tmp=tmp,
    )  # fmt: skip


@contextlib.contextmanager
def running(docs: list[dict[str, Any]], tmp: Path, base_env: Mapping[str, str]) -> Iterator[
        Controller]:  # fmt: skip
    """The controller of `docs`, with its pods' DNS names in /etc/hosts; every pod is stopped
    and the names taken out again however the test ends."""
    assert shutil.which("unshare") and shutil.which("hostname"), "util-linux and hostname"
    ctl = controller(docs, tmp, base_env)
    count = int(ctl.job["parallelism"])
    names = {ctl.address(i): ctl.hostname(i) for i in range(count)}
    with _hosts(names, ctl.subdomain):
        try:
            yield ctl
        finally:
            ctl.delete_all()


@contextlib.contextmanager
def _hosts(names: Mapping[str, str], subdomain: str) -> Iterator[None]:
    """The headless service's records as /etc/hosts lines; exactly those are removed after."""
    mark = f"{_HOSTS_MARK} {os.getpid()}"
    lines = [f"{addr} {host}.{subdomain} {host}\n" for addr, host in names.items()]
    text = HOSTS_FILE.read_text()
    block = "".join(["" if not text or text.endswith("\n") else "\n", f"{mark} (begin)\n",
                     *lines, f"{mark} (end)\n"])  # fmt: skip
    rewrite(HOSTS_FILE, text + block)
    try:
        yield
    finally:
        rewrite(HOSTS_FILE, HOSTS_FILE.read_text().replace(block, "", 1))


def _kill_tree(pid: int, sig: int) -> None:
    """Signal a pod: its process group (the agent's session) and every process below it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for child in _descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@contextlib.contextmanager
def machines(names: list[str]) -> Iterator[list[tuple[str, str]]]:
    """Nodes of a scheduler outside Kubernetes (SkyPilot, dstack): (hostname, address) each, the
    names in /etc/hosts; `start_on` runs a command on one, `stop` stops it."""
    hosts = [(name, f"{ADDRESS_BASE}{40 + i}") for i, name in enumerate(names)]
    with _hosts({addr: name for name, addr in hosts}, "machines"):
        yield hosts


def start_on(
    host: tuple[str, str], argv: list[str], env: Mapping[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """`argv` on `host`: in a UTS namespace named after it, its own session."""
    script = f"hostname {shlex.quote(host[0])} && exec {shlex.join(argv)}"
    with log.open("wb") as sink:
        return subprocess.Popen(
            ["unshare", "--uts", "sh", "-c", script], cwd=REPO, env=dict(env),
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    """A node's launcher and what it started, gone (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        _kill_tree(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
