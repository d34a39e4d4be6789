"""`--plan=jobset` and `--plan=trainjob`: every manifest rendered here is validated against the
official schemas and models (tests/schedulers/validate.py), and the `k8s.*` keys are checked.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml  # type: ignore[import-untyped]

from elastic_hydra.cli.run import main
from elastic_hydra.errors import EXIT_CONFIG, EXIT_PREEMPTED_SAVED
from elastic_hydra.schedulers.manifests import quantity
from tests.conftest import REPO
from tests.schedulers import validate

IMAGE = "k8s.image=ghcr.io/example/train:1.0"
DDP = "examples/jobs/ddp.yaml"


@pytest.fixture(autouse=True)
def at_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifests are rendered where the pods start: the job's paths are relative to it."""
    monkeypatch.chdir(REPO)
    for name in ("PET_NNODES", "JOBSET_NAME", "SLURM_JOB_ID", "SKYPILOT_NODE_RANK"):
        monkeypatch.delenv(name, raising=False)


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d is not None]
    validate.validate(docs)
    return docs


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [d for d in docs if d["kind"] in ("JobSet", "TrainingRuntime")]
    spec = job["spec"] if job["kind"] == "JobSet" else job["spec"]["template"]["spec"]
    pod = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (found,) = pod["containers"]
    return found  # type: ignore[no-any-return]


def job_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [d for d in docs if d["kind"] in ("JobSet", "TrainingRuntime")]
    spec = job["spec"] if job["kind"] == "JobSet" else job["spec"]["template"]["spec"]
    return spec["replicatedJobs"][0]["template"]["spec"]  # type: ignore[no-any-return]


CASES = [
    pytest.param([DDP, "nproc_per_node=1"], 1, 1, 0, id="1-node"),
    pytest.param([DDP, "nnodes=2", "nproc_per_node=1"], 2, 2, 0, id="2-nodes"),
    pytest.param([DDP, "nnodes=2:4", "nproc_per_node=1"], 2, 4, 0, id="2:4"),
    pytest.param([DDP, "nnodes=2", "nproc_per_node=4", "k8s.gpus_per_node=4"], 2, 2, 4, id="gpus"),
    pytest.param(["script=examples/hello.py", "nnodes=2:3"], 2, 3, 0, id="no-job-file"),
]


@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
@pytest.mark.parametrize(("argv", "least", "most", "gpus"), CASES)
def test_every_rendered_manifest_validates(  # noqa: PLR0917 (pytest's parameters)
    capsys: pytest.CaptureFixture[str], kind: str, argv: list[str], least: int, most: int,
    gpus: int,
) -> None:  # fmt: skip
    docs = render(capsys, *argv, IMAGE, f"--plan={kind}")
    kinds = [d["kind"] for d in docs]
    shipped = argv[0] == DDP
    expected = ["JobSet"] if kind == "jobset" else ["TrainingRuntime", "TrainJob"]
    assert kinds == (["ConfigMap"] if shipped else []) + expected
    job = job_spec(docs)
    shape = (job["parallelism"], job["completions"], job["completionMode"])
    assert shape == (most, most, "Indexed")
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    assert ("successPolicy" in job) == (least != most)  # elastic: done when pod 0 is
    c = container(docs)
    preset = "rdzv=jobset" if kind == "jobset" else "rdzv=kubeflow"
    nnodes = str(most) if least == most else f"{least}:{most}"
    assert preset in c["args"] and f"nnodes={nnodes}" in c["args"]
    assert "local_addr=$(POD_IP)" in c["args"]
    assert c["args"][0] == ("/etc/elastic-hydra/job.yaml" if shipped else argv[0])
    assert c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == (
        str(gpus) if gpus else None
    )
    if shipped:
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        assert cm["data"]["job.yaml"] == (REPO / DDP).read_text()
    if kind == "trainjob":
        (train,) = [d for d in docs if d["kind"] == "TrainJob"]
        trainer = train["spec"]["trainer"]
        assert (trainer["numNodes"], trainer["args"]) == (most, c["args"])
        assert train["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"


def test_failure_ownership(capsys: pytest.CaptureFixture[str]) -> None:
    """The agent's give-up codes end the Job and the set once; evictions, and an agent stopped
    with its workers' snapshots kept (75), are replaced free."""
    docs = render(capsys, DDP, "nnodes=2:4", "nproc_per_node=1", IMAGE, "k8s.pod_replacements=5",
                  "k8s.jobset_restarts=2", "--plan=jobset")  # fmt: skip
    job = job_spec(docs)
    fail, ignore, saved = job["podFailurePolicy"]["rules"]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == [1, 2, 70]
    assert ignore["action"] == "Ignore"
    assert ignore["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    codes = {"containerName": "node", "operator": "In", "values": [EXIT_PREEMPTED_SAVED]}
    assert saved == {"action": "Ignore", "onExitCodes": codes}
    assert job["backoffLimit"] == 5
    jobset = docs[-1]["spec"]
    assert jobset["failurePolicy"] == {
        "maxRestarts": 2,
        "rules": [{"name": "agent-gave-up", "action": "FailJobSet",
                   "onJobFailureReasons": ["PodFailurePolicy"]}],
    }  # fmt: skip
    assert jobset["network"]["enableDNSHostnames"] is True  # JobSet makes the headless service


def test_k8s_keys_in_the_job_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "Big_Train.yaml"
    job.write_text(
        "defaults: [elastic_hydra_base, _self_]\n"
        f"script: {REPO / 'examples/hello.py'}\n"
        "nnodes: '2'\n"
        "k8s:\n  image: reg.example/x:2\n  namespace: ml\n  service_account: trainer\n"
        "  workdir: /app\n"
    )
    docs = render(capsys, str(job), "--plan=jobset", "--", "--lr", "0.1")
    jobset = docs[-1]
    assert (jobset["metadata"]["name"], jobset["metadata"]["namespace"]) == (
        "elastic-hydra-big-train", "ml"
    )  # fmt: skip
    pod = job_spec(docs)["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    c = container(docs)
    assert (c["image"], c["workingDir"]) == ("reg.example/x:2", "/app")
    assert c["args"][-3:] == ["--", "--lr", "0.1"]
    in_image = render(capsys, str(job), "k8s.job_file=/app/job.yaml", "--plan=jobset")
    assert [d["kind"] for d in in_image] == ["JobSet"]
    assert container(in_image)["args"][0] == "/app/job.yaml"
    assert [v["name"] for v in job_spec(in_image)["template"]["spec"]["volumes"]] == ["dshm"]


def volumes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod's volumes by name, each with the container's mount of it."""
    pod = job_spec(docs)["template"]["spec"]
    mounts = {m["name"]: m for m in container(docs).get("volumeMounts", [])}
    return {v["name"]: v | {"mount": mounts[v["name"]]} for v in pod.get("volumes", [])}


@pytest.mark.parametrize(
    ("text", "value"),
    [("8", 8), ("7500m", 7.5), ("64Gi", 64 * 2**30), ("1.5G", 1.5e9), ("1e9", 1e9),
     ("1E3", 1e3), ("1E", 1e18), ("2Ei", 2 * 2**60), (".5", 0.5), ("5.", 5), ("100u", 1e-4)],
)  # fmt: skip
def test_kubernetes_quantities(text: str, value: float) -> None:
    assert quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "lots", "-1Gi", "1GiB", "1 Gi", "0x10", "1e", "Gi"])
def test_what_is_not_a_quantity(text: str) -> None:
    with pytest.raises(ValueError):
        quantity(text)


@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
def test_resources_and_shared_memory(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    base = (DDP, "nnodes=2:3", "nproc_per_node=4", IMAGE, f"--plan={kind}")
    docs = render(capsys, *base, "k8s.cpu=15500m", "k8s.memory=64Gi", "k8s.gpus_per_node=4")
    # CPU and memory: requested as much as the limit (the pod gets what it asks for, and is
    # evicted last); the GPUs a limit, which Kubernetes copies into the request.
    assert container(docs)["resources"] == {
        "limits": {"cpu": "15500m", "memory": "64Gi", "nvidia.com/gpu": "4"},
        "requests": {"cpu": "15500m", "memory": "64Gi"},
    }
    if kind == "trainjob":
        assert docs[-1]["spec"]["trainer"]["resourcesPerNode"] == container(docs)["resources"]
    # /dev/shm in memory, half the pod's memory: it counts against the pod's limit.
    shm = volumes(docs)["dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32768Mi"}
    assert shm["mount"] == {"name": "dshm", "mountPath": "/dev/shm"}
    assert volumes(docs)["job"]["configMap"] == {"name": "elastic-hydra-ddp-job"}
    # Without k8s.memory: 1Gi per worker; a size of one's own; none at all.
    plain = render(capsys, *base)
    assert "resources" not in container(plain)
    assert volumes(plain)["dshm"]["emptyDir"]["sizeLimit"] == "4Gi"
    sized = render(capsys, *base, "k8s.shm=12Gi", "k8s.memory=16Gi")
    assert volumes(sized)["dshm"]["emptyDir"]["sizeLimit"] == "12Gi"
    assert "dshm" not in volumes(render(capsys, *base, "k8s.shm=null"))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([DDP, "--plan=jobset"], "k8s.image: is needed for a manifest"),
        ([DDP, IMAGE, "k8s.name=Bad_Name", "--plan=jobset"], "k8s.name: not a DNS label"),
        ([DDP, IMAGE, "k8s.namespace=a.b", "--plan=trainjob"], "k8s.namespace: not a namespace"),
        ([DDP, IMAGE, "k8s.gpus_per_node=-1", "--plan=jobset"], "k8s.gpus_per_node: is negative"),
        ([DDP, IMAGE, "k8s.job_file=job.yaml", "--plan=jobset"], "k8s.job_file: is not an abs"),
        ([DDP, "k8s.image=a b", "--plan=jobset"], "k8s.image: not an image reference"),
        ([DDP, IMAGE, "k8s.cpu=lots", "--plan=jobset"], "k8s.cpu: not a Kubernetes quantity"),
        ([DDP, IMAGE, "k8s.memory=-1Gi", "--plan=jobset"], "k8s.memory: not a Kubernetes qua"),
        ([DDP, IMAGE, "k8s.memory=64", "--plan=jobset"], "k8s.memory: is too small for a pod"),
        ([DDP, IMAGE, "k8s.shm=0", "--plan=trainjob"], "k8s.shm: is too small for a pod"),
        ([DDP, IMAGE, "k8s.shm=8Gi", "k8s.memory=4Gi", "--plan=jobset"], "k8s.shm: is more than"),
        (["script=nope.py", IMAGE, "--plan=jobset"], "script: no such file"),
        ([DDP, IMAGE, "nnodes=0", "--plan=jobset"], "nnodes: needs at least 1 node"),
        ([DDP, IMAGE, "-m", "--plan=jobset"], "--plan: =jobset writes the manifest"),
        ([DDP, IMAGE, "--plan=helm"], "--plan: unknown format"),
    ],
)
def test_a_bad_manifest_request_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_CONFIG
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith("elastic-hydra: error: ") and fragment in line, line
    assert out == ""


def test_the_validators_refuse_what_a_cluster_would(capsys: pytest.CaptureFixture[str]) -> None:
    """Not vacuous: an unknown field or a wrong type anywhere fails, and each validator refuses
    what only it checks: a JobSet failure policy action that is a Job's (FailJob) passes the
    trainer models (a plain string there) and is refused by the JobSet CRD's schema alone."""
    jobset_docs = render(capsys, DDP, IMAGE, "--plan=jobset")
    train_docs = render(capsys, DDP, IMAGE, "--plan=trainjob")

    def broken(docs: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
        docs = copy.deepcopy(docs)
        doc = docs[-1] if where != "configmap" else docs[0]
        if where == "jobset-spec":
            doc["spec"]["restartPolicy"] = "Always"  # no such JobSet field
        elif where == "job":
            doc["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = "four"
        elif where == "pod":
            pod = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            pod["containers"][0]["gpus"] = 1
        elif where == "trainjob":
            doc["spec"]["trainer"]["nodes"] = 2
        elif where == "configmap":
            doc["data"]["job.yaml"] = 7
        elif where == "jobset-action":
            doc["spec"]["failurePolicy"]["rules"][0]["action"] = "FailJob"
        elif where == "runtime-action":  # the TrainingRuntime's JobSet template
            (doc,) = [d for d in docs if d["kind"] == "TrainingRuntime"]
            doc["spec"]["template"]["spec"]["failurePolicy"]["rules"][0]["action"] = "FailJob"
        return docs

    for docs, where, error in [
        (jobset_docs, "jobset-spec", (jsonschema.ValidationError, AssertionError)),
        (jobset_docs, "job", (jsonschema.ValidationError, pydantic.ValidationError)),
        (jobset_docs, "pod", (kubernetes_validate.ValidationError, AssertionError)),
        (train_docs, "trainjob", (AssertionError,)),
        (jobset_docs, "configmap", (kubernetes_validate.ValidationError,)),
        (jobset_docs, "jobset-action", (jsonschema.ValidationError,)),
        (train_docs, "runtime-action", (jsonschema.ValidationError,)),
    ]:
        with pytest.raises(error):
            validate.validate(broken(docs, where))
    # The CRD's schema is the strict one: an unknown field fails there too, not only in a model.
    doc = broken(jobset_docs, "jobset-spec")[-1]
    with pytest.raises(jsonschema.ValidationError, match="restartPolicy"):
        validate.crd_validate(doc)


def test_validated_versions_are_named() -> None:
    found = validate.versions()
    assert found["jobset CRD"].startswith("v0.12.0")
    assert found["kubeflow-trainer-api"].startswith("2.")
    assert found["kubernetes schemas"].startswith(validate.K8S_VERSION)


def test_the_docs_manifest_is_the_commands_output(capsys: pytest.CaptureFixture[str]) -> None:
    page = (REPO / "docs" / "kubernetes.md").read_text()
    start = "<!-- manifest: generated by the command above -->\n```yaml\n"
    shown = page[page.index(start) + len(start) : page.index("```\n<!-- manifest: end -->")]
    command = DDP, "nnodes=2:4", "nproc_per_node=1", "k8s.image=ghcr.io/example/train:1.0"
    assert f"$ elastic-hydra {' '.join(command)} --plan=jobset\n" in page
    with pytest.raises(SystemExit):
        main([*command, "--plan=jobset"])
    assert shown == capsys.readouterr().out
    validate.validate(list(yaml.safe_load_all(shown)))
