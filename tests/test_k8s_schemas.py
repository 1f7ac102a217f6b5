"""Every Kubernetes object the stack creates is valid for the cluster's version.

Each stack file is synthesised; every `kubernetes:*` resource is turned back
into its manifest (apiVersion, kind and the fields it sends) and validated with
kubernetes-validate in strict mode (unknown fields are errors) against the
Kubernetes OpenAPI schema of the stack's `kubernetesVersion`; custom resources
of KubeRay are validated against the KubeRay 1.7.0 CRD (tests/fixtures/upstream).
Helm releases and provider resources are not Kubernetes objects.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from infra.catalog.eks_versions import today
from infra.config import load_stack_file
from tests import yaml_text
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent
KUBERAY_CRD = ("upstream", "kuberay-operator-1.7.0", "ray.io_rayclusters.yaml")
NOT_OBJECTS = ("kubernetes:helm.sh/", "pulumi:providers:")
SECRET = {"<secret>": True}


def _plain(value):
    """Secrets and values only the cloud knows, as strings a schema accepts."""
    if value == SECRET:
        return "redacted"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _manifest(resource: dict) -> dict:
    inputs = dict(resource["inputs"])
    for field in ("data", "stringData"):  # a Secret's maps are secret as a whole
        if inputs.get(field) == SECRET:
            inputs[field] = {"redacted": "redacted"}
    doc = _plain(inputs)
    api_group_kind = resource["type"].split(":", 1)[1]  # e.g. core/v1:Service
    group_version, kind = api_group_kind.rsplit(":", 1)
    group, version = group_version.rsplit("/", 1)
    doc.setdefault("apiVersion", version if group == "core" else f"{group}/{version}")
    doc.setdefault("kind", kind)
    return doc


@lru_cache(maxsize=None)
def _objects(stack: str) -> list[dict]:
    doc = repo_stack(stack)
    return [r for r in doc["resources"] if r["type"].startswith("kubernetes:") and not r["type"].startswith(NOT_OBJECTS)]


def _k8s_version(stack: str) -> str:
    # The stack's version: its pin, or the default on the day (infra/catalog/eks_versions.py).
    return load_stack_file(stack, REPO).kubernetes_version(today()) + ".0"


@lru_cache(maxsize=None)
def _raycluster_schema(path: Path) -> dict:
    crd = yaml_text.safe_load(path.read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return served["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_stack_creates_kubernetes_objects(stack):
    kinds = {_manifest(r)["kind"] for r in _objects(stack)}
    # The serving layer: the RayCluster, its Service and disruption budget, the
    # weights' volume and claim, and the staging Job.
    assert {"RayCluster", "Service", "PodDisruptionBudget", "PersistentVolume", "PersistentVolumeClaim", "Job"} <= kinds, kinds


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_every_object_validates_strictly(stack, fixture_file):
    version = _k8s_version(stack)
    crd_path = fixture_file(*KUBERAY_CRD)
    errors = []
    for resource in _objects(stack):
        manifest = _manifest(resource)
        if manifest["apiVersion"].startswith("ray.io/"):
            schema_errors = sorted(jsonschema.Draft7Validator(_raycluster_schema(crd_path)).iter_errors(manifest), key=str)
            errors += [f"{resource['name']}: {e.message} at {list(e.path)}" for e in schema_errors]
            continue
        if manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # no CRD schema of the Prometheus operator is vendored; see the serving tests
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{resource['name']} ({manifest['kind']}): {exc.message} at {list(exc.path)}")
    assert not errors, "\n".join(errors)
