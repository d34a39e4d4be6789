"""Every rendered manifest, checked against the official schemas and models (no hand-written
expectations):

- core kinds (ConfigMap, Service, batch/v1 Job) against Kubernetes' own OpenAPI schemas, as
  `kubernetes-validate` ships them, in strict mode (an unknown field fails), at `K8S_VERSION`;
- JobSet against the JobSet CRD's OpenAPI schema of the jobset repository (vendored beside this
  file: jobset_crd_v0.12.0.json names its source, tag and commit), made strict as the API server's
  field validation is (an unknown field fails), and against the `JobsetV1alpha2JobSet` model of
  `kubeflow-trainer-api`; the Job template inside each replicated job as a batch/v1 Job;
- TrainJob and TrainingRuntime against `kubeflow-trainer-api`'s models (trainer.kubeflow.org/
  v1alpha1); their JobSet template against the JobSet CRD, its Job template as a batch/v1 Job.

The pydantic models ignore fields they do not know, so a model check also requires that the
model gives back exactly the document it read.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubeflow_trainer_api.models.jobset_v1alpha2_job_set import JobsetV1alpha2JobSet
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob
from kubeflow_trainer_api.models.trainer_v1alpha1_training_runtime import (
    TrainerV1alpha1TrainingRuntime,
)

K8S_VERSION = "1.33.0"  # Job successPolicy is GA from 1.33, podFailurePolicy from 1.31
CRD_FILE = Path(__file__).with_name("jobset_crd_v0.12.0.json")
MODELS = {
    "JobSet": JobsetV1alpha2JobSet,
    "TrainJob": TrainerV1alpha1TrainJob,
    "TrainingRuntime": TrainerV1alpha1TrainingRuntime,
}


def versions() -> dict[str, str]:
    """What the manifests were validated against, for the record."""
    crd = json.loads(CRD_FILE.read_text())
    return {
        "kubernetes schemas": f"{K8S_VERSION} (kubernetes-validate "
        f"{importlib.metadata.version('kubernetes-validate')})",
        "jobset CRD": f"{crd['tag']} ({crd['commit'][:12]})",
        "kubeflow-trainer-api": importlib.metadata.version("kubeflow-trainer-api"),
    }


def validate(docs: list[dict[str, Any]]) -> list[str]:
    """Validate every manifest; the kinds seen, in order.

    Raises:
        AssertionError, jsonschema.ValidationError, kubernetes_validate.ValidationError,
        pydantic.ValidationError: a document that a cluster would refuse.
    """
    kinds = []
    for doc in docs:
        kind = doc["kind"]
        kinds.append(kind)
        if kind in ("ConfigMap", "Service", "Job", "Pod"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        elif kind == "JobSet":
            _model(doc)
            _jobset(doc)
        elif kind in ("TrainJob", "TrainingRuntime"):
            _model(doc)
            if kind == "TrainingRuntime":
                template = doc["spec"]["template"]
                _jobset({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                         "metadata": {"name": doc["metadata"]["name"]}, **template})  # fmt: skip
        else:
            raise AssertionError(f"no schema for kind {kind}")
    return kinds


def _model(doc: dict[str, Any]) -> None:
    model = MODELS[doc["kind"]].from_dict(copy.deepcopy(doc))
    assert model is not None
    back = model.to_dict()
    assert back == doc, f"{doc['kind']}: the model drops or changes fields: {back} != {doc}"


def _jobset(doc: dict[str, Any]) -> None:
    crd_validate(doc)
    for rjob in doc["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": f"{doc['metadata']['name']}-{rjob['name']}-0",
                            **rjob["template"].get("metadata", {})},
               "spec": rjob["template"]["spec"]}  # fmt: skip
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def crd_validate(doc: dict[str, Any]) -> None:
    """`jsonschema.validate(doc, strict CRD schema)`, with the schema's own check (against its
    metaschema, ~1 s here) done once, not once a document."""
    error = jsonschema.exceptions.best_match(_crd_validator().iter_errors(doc))
    if error is not None:
        raise error


@functools.cache
def _crd_validator() -> Any:  # a jsonschema Validator (its protocol's type is not exported)
    schema = _crd_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@functools.cache
def _crd_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(CRD_FILE.read_text())["openAPIV3Schema"]
    strict: dict[str, Any] = _strict(schema)
    return strict


def _strict(node: Any) -> Any:
    """The API server refuses unknown fields (kubectl's default field validation): an object
    schema with `properties` admits no others, unless it preserves unknown fields."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out
