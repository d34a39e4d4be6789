"""JobSet and TrainJob manifests run as Kubernetes would run them, by the harness that plays the
controllers (tests/schedulers/harness.py): real agents, real gloo workers, one UTS namespace and
one loopback address per pod, the manifest's failure policies applied to the pods' exits.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from elastic_hydra.errors import EXIT_PREEMPTED_SAVED
from tests.conftest import ELASTIC_HYDRA, REPO, WORKERS, free_port, wait_for
from tests.harness import launcher_env, run
from tests.multinode import FAST
from tests.schedulers import harness, validate

pytestmark = pytest.mark.timeout(400)
IMAGE = "k8s.image=ghcr.io/example/train:1.0"


def rendered(kind: str, *argv: str) -> list[dict[str, Any]]:
    proc = run(*argv, IMAGE, f"--plan={kind}", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    validate.validate(docs)
    return docs


def summaries(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("**/summary.json"))]


@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
def test_two_pods_train_the_ddp_example_to_the_end(tmp_path: Path, kind: str) -> None:
    out, logs = tmp_path / "weights", tmp_path / "logs"
    docs = rendered(kind, "examples/jobs/ddp.yaml", "nnodes=2", "nproc_per_node=1",
                    "hp.steps=5", f"hp.dir={out}", f"logs.root={logs}")  # fmt: skip
    with harness.running(docs, tmp_path, launcher_env()) as ctl:
        ctl.start_all()
        phase = ctl.run(300)
        assert phase is harness.Phase.SUCCEEDED, ctl.explain()
    assert ctl.created == [(0, 0), (0, 1)]  # nothing recreated, nothing restarted
    assert (out / "final.pt").exists(), ctl.explain()
    done = summaries(logs)
    assert [s["status"] for s in done] == ["succeeded", "succeeded"], ctl.explain()
    assert len({s["run_id"] for s in done}) == 1


def records(out: Path) -> list[dict[str, Any]]:
    path = out / "records.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def sized(out: Path, world: int) -> int:
    """How many records ranks of rounds of `world` ranks wrote."""
    return len([r for r in records(out) if r["world_size"] == world])


def test_an_elastic_jobset_survives_the_loss_of_a_pod(tmp_path: Path) -> None:
    """nnodes=2:4: pod 3 is lost with its node; the others go on without it, spending no restart
    (their broken ranks are the lost pod's collateral); its replacement re-joins. Kubernetes fails
    a lost node's pod with the DisruptionTarget condition, and the manifest's pod failure policy
    Ignores that: the pod is replaced without counting against the Job's backoffLimit."""
    out, logs, release = tmp_path / "out", tmp_path / "logs", tmp_path / "release"
    out.mkdir()
    docs = rendered("jobset", f"script={WORKERS / 'elastic.py'}", "nnodes=2:4",
                    "nproc_per_node=1", "restart.max_restarts=0", f"logs.root={logs}",
                    *FAST)  # fmt: skip
    env = launcher_env(OUT_DIR=str(out), EXIT_AT_WORLD="4", RELEASE=str(release), LOOP="1")
    with harness.running(docs, tmp_path, env) as ctl:
        ctl.start_all()
        ctl.wait("a round of 4", lambda: sized(out, 4) >= 4, 240)
        ctl.kill(3, disruption=True)  # its node is gone: its agent and workers with it
        # A lost node's pod is declared failed only later (the node controller's grace): until
        # then nothing replaces it, and the others go on as three.
        wait_for(lambda: sized(out, 3) >= 3, 120, "a round of 3", detail=ctl.explain)
        ctl.wait("the replacement's round of 4", lambda: sized(out, 4) >= 8, 180)
        release.touch()
        phase = ctl.run(180)
        assert phase is harness.Phase.SUCCEEDED, ctl.explain()
    assert ctl.created == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 3)]  # pod 3 recreated once
    # The manifest's rule for a disrupted pod decided the lost pod's fate, and it is Ignore.
    (jobset,) = [d for d in docs if d["kind"] == "JobSet"]
    rules = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    (lost,) = [r for r in rules if {"type": "DisruptionTarget", "status": "True"}
               in r.get("onPodConditions", [])]  # fmt: skip
    assert lost["action"] == "Ignore"
    assert ctl.decided == [(3, lost)], ctl.explain()  # the only pod failure
    assert (ctl.attempt, ctl.failures) == (0, 0)  # no JobSet restart, nothing against backoffLimit
    done = summaries(logs)
    assert len(done) == 4, ctl.explain()  # the lost pod wrote none
    for summary in done:
        assert (summary["status"], summary["restarts"]) == ("succeeded", 0), summary
    # A worker the launcher stopped for the re-join may still exit 1 (its collective broke as a
    # peer on another pod was stopped first): it is the launcher's doing, not a failure.
    broken = [e for s in done for e in s["exits"]
              if e["returncode"] != 0 and not e["terminated_by_launcher"]]  # fmt: skip
    assert broken and all(e["after_node_loss"] for e in broken), broken


def test_a_pod_deleted_with_its_grace_saves_every_node_and_the_set_resumes_there(
    tmp_path: Path,
) -> None:
    """`kubectl delete pod` of one pod of two: its agent alone gets SIGTERM. It asks every node,
    through the round's store, to save one step; both pods stop after it and exit 75 (preempted,
    saved), which the manifest Ignores; their replacements resume after that step from the
    job's checkpoint home, and the steps are run once each."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    docs = rendered("jobset", f"script={WORKERS / 'snapshots_plain.py'}", "nnodes=2",
                    "nproc_per_node=1", f"logs.root={logs}", *FAST)  # fmt: skip
    env = launcher_env(OUT_DIR=str(out), STEPS="200", STEP_TIME="0.05")
    steps = out / "steps-0.txt"
    with harness.running(docs, tmp_path, env) as ctl:
        ctl.start_all()
        before = dict(ctl.pods)
        ctl.wait("ten steps", lambda: steps.exists() and len(steps.read_text().split()) >= 10, 120)
        assert ctl.delete(1) == EXIT_PREEMPTED_SAVED, ctl.explain()
        phase = ctl.run(240)
        assert phase is harness.Phase.SUCCEEDED, ctl.explain()
    first = [before[i].text() for i in (0, 1)]
    kept = {re.search(r"checkpoint: step (\d+) of rank \d kept", text) for text in first}
    assert None not in kept, first
    (step,) = {m.group(1) for m in kept if m is not None}  # the same step on both pods
    for text in first:
        assert f"stopping after step {step}" in text, text
    (jobset,) = [d for d in docs if d["kind"] == "JobSet"]
    rules = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    (saved,) = [r for r in rules if EXIT_PREEMPTED_SAVED in r.get("onExitCodes", {}).get(
        "values", [])]  # fmt: skip
    assert saved["action"] == "Ignore"
    assert sorted(i for i, _ in ctl.decided) == [0, 1], ctl.explain()  # each pod once, exit 75
    assert all(rule == saved for _, rule in ctl.decided), ctl.decided
    assert sorted(ctl.created) == [(0, 0), (0, 0), (0, 1), (0, 1)]  # each replaced once
    assert (ctl.attempt, ctl.failures) == (0, 0)  # no restart, nothing against backoffLimit
    for i in (0, 1):
        assert f"resumed after step {step}" in ctl.pods[i].text(), ctl.explain()
    for rank in (0, 1):  # every step ran once: none lost, none run again
        ran = [int(s) for s in (out / f"steps-{rank}.txt").read_text().split()]
        assert ran == list(range(200)), ran


def test_a_pod_that_fails_ends_the_set_once(tmp_path: Path) -> None:
    """The agent gave up (exit 1): the Job fails by its pod failure policy and the JobSet ends,
    although it may restart twice for pod losses: nothing is recreated or restarted."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    docs = rendered("jobset", f"script={WORKERS / 'elastic.py'}", "nnodes=2", "nproc_per_node=1",
                    "restart.max_restarts=0", "k8s.jobset_restarts=2", f"logs.root={logs}",
                    *FAST)  # fmt: skip
    env = launcher_env(OUT_DIR=str(out), FAIL_RANK="1")
    with harness.running(docs, tmp_path, env) as ctl:
        ctl.start_all()
        phase = ctl.run(240)
        assert phase is harness.Phase.FAILED, ctl.explain()
    assert ctl.ended == ["Failed: PodFailurePolicy"], ctl.explain()
    assert ctl.created == [(0, 0), (0, 1)] and ctl.attempt == 0
    assert any("boom from rank 1" in p.text() for p in ctl.pods.values()), ctl.explain()


@pytest.mark.parametrize("preset", ["skypilot", "dstack"])
def test_skypilot_and_dstack_nodes_train_from_their_variables(tmp_path: Path, preset: str) -> None:
    """Two machines (own host name, own address) given only the scheduler's variables."""
    out, logs = tmp_path / "weights", tmp_path / "logs"
    port = free_port()
    with harness.machines(["gpu-a", "gpu-b"]) as hosts:
        ips = "\n".join(addr for _, addr in hosts)
        procs = []
        try:
            for rank, host in enumerate(hosts):
                said = (
                    {"SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": "2",
                     "SKYPILOT_NODE_IPS": ips, "SKYPILOT_TASK_ID": f"sky-{tmp_path.name}"}
                    if preset == "skypilot" else
                    {"DSTACK_NODE_RANK": str(rank), "DSTACK_NODES_NUM": "2",
                     "DSTACK_MASTER_NODE_IP": hosts[0][1], "DSTACK_NODES_IPS": ips,
                     "DSTACK_RUN_NAME": f"run-{tmp_path.name}"}
                )  # fmt: skip
                argv = [*ELASTIC_HYDRA, "examples/jobs/ddp.yaml", f"rdzv={preset}",
                        f"rdzv.endpoint=:{port}", "nproc_per_node=1", "hp.steps=5",
                        f"hp.dir={out}", f"local_addr={host[1]}", f"logs.root={logs}"]  # fmt: skip
                log = tmp_path / f"{host[0]}.log"
                procs.append(harness.start_on(host, argv, launcher_env(**said), log))
            wait_for(lambda: all(p.poll() is not None for p in procs), 240, "the nodes to end",
                     detail=lambda: "\n".join(p.read_text()[-2000:]
                                              for p in tmp_path.glob("gpu-*.log")))  # fmt: skip
        finally:
            for proc in procs:
                harness.stop(proc)
    assert [p.returncode for p in procs] == [0, 0]
    assert (out / "final.pt").exists()
    done = summaries(logs)
    assert [s["status"] for s in done] == ["succeeded", "succeeded"]
