"""JobSet and TrainJob manifests run as Kubernetes would run them, by the harness that plays the
controllers (tests/schedulers/harness.py): real agents, real gloo workers, one UTS namespace and
one loopback address per pod, the manifest's failure policies applied to the pods' exits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.conftest import REPO, WORKERS
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
