"""The `kubernetes:*` resources of a synth document as Kubernetes manifests.

pulumi-kubernetes takes a resource's manifest as its inputs (`apiVersion`,
`kind`, `metadata`, `spec` or `data`), so `manifests(doc)` writes them back out
as they are, with:

- `apiVersion` and `kind` from the type token where the inputs lack them
  (`kubernetes:batch/v1:Job` -> `batch/v1`, `Job`; the core group is `v1`);
- `metadata.name` the synth resource's name where the inputs have none (Pulumi
  would add a random suffix to it; a scanner only needs a stable name);
- secrets (`{"<secret>": true}` in the synth) as the string `<secret>`.

checkov (3.3.30) reads a manifest with `apiVersion` and `kind`
(checkov/kubernetes/parser/k8_yaml.py) and names it `<kind>.<namespace>.<name>`,
the namespace `default` when there is none (checkov/kubernetes/kubernetes_utils.py,
`get_resource_id`): the resource ids of `policies/accepted-risks.yaml`.

A custom resource that holds pod templates runs Pods that no manifest of the
stack shows; a scanner of workloads would never see them. For each template,
`manifests` adds the Pod its operator creates, in the custom resource's
namespace, named after it: for a `ray.io` RayCluster `<cluster>-head` (its
`headGroupSpec.template`) and `<cluster>-<group>-worker` (each
`workerGroupSpecs[].template`); for any other kind, every `template` with
`spec.containers` under its `spec`, named `<name>-<path to it>`. A Pod is its
template as written: what the operator adds when it creates the pod (KubeRay's
labels, environment, log volume, and the worker probes it injects) is not in
it. Jobs and other built-in workloads are scanned as they are: checkov reads
their pod templates (checkov/kubernetes/graph_builder/local_graph.py, for the
kinds of `SUPPORTED_POD_CONTAINERS_TYPES` in kubernetes_utils.py; its container
checks also read a CronJob's `jobTemplate`), not a custom resource's.

Gaps (`Manifests.gaps`): Helm releases and charts (`kubernetes:helm.sh/*`) and
other resources that only a cluster-side render would expand (`yaml`,
`kustomize` directories). Their manifests come from a chart's templates, which
the offline synthesis never renders: the operators' DaemonSets and
Deployments (GPU operator, EFA device plugin, KubeRay) are not scanned here.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Iterator

from infra.preview.convert import Gap
from infra.preview.markers import SECRET_KEY, is_secret

# pulumi-kubernetes resources that are rendered from something else: no manifest offline.
NOT_RENDERED = ("kubernetes:helm.sh/", "kubernetes:yaml", "kubernetes:kustomize")
NOT_RENDERED_REASONS = {
    "kubernetes:helm.sh/": "Helm release: its chart's templates are not rendered offline, so the workloads it installs are not scanned",
    "kubernetes:yaml": "YAML manifests expanded at deploy time: not rendered offline, not scanned",
    "kubernetes:kustomize": "kustomization expanded at deploy time: not rendered offline, not scanned",
}
RAY_CLUSTER = ("ray.io", "RayCluster")


@dataclass
class Manifest:
    """One manifest, and the synth resource it comes from."""

    source: str  # synth resource name
    source_type: str  # its Pulumi type token
    manifest: dict[str, Any]
    derived: str = ""  # for a Pod made from a custom resource's template: where the template is

    @property
    def kind(self) -> str:
        return str(self.manifest.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.manifest.get("metadata") or {}).get("name", ""))

    @property
    def namespace(self) -> str:
        return str((self.manifest.get("metadata") or {}).get("namespace", ""))


@dataclass
class Manifests:
    items: list[Manifest]
    gaps: list[Gap]


def api_version_and_kind(token: str) -> tuple[str, str]:
    """`kubernetes:batch/v1:Job` -> (`batch/v1`, `Job`); the core group is plain `v1`."""
    _, group_version, kind = token.split(":", 2)
    group, _, version = group_version.rpartition("/")
    return (version if group in ("core", "") else f"{group}/{version}"), kind


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        if is_secret(value):
            return SECRET_KEY
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _dns_name(name: str) -> str:
    """A name Kubernetes accepts for a Pod (lowercase letters, digits, `-`, `.`; at most 253)."""
    out = re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")
    return out[:253] or "pod"


def _is_pod_template(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("spec"), dict) and isinstance(value["spec"].get("containers"), list)


def pod_templates(manifest: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(pod name, template path, template) for every pod template of a custom resource."""
    name = str((manifest.get("metadata") or {}).get("name", ""))
    spec = manifest.get("spec") or {}
    group = str(manifest.get("apiVersion", "")).rpartition("/")[0]
    if (group, manifest.get("kind")) == RAY_CLUSTER:
        head = (spec.get("headGroupSpec") or {}).get("template")
        if _is_pod_template(head):
            yield f"{name}-head", "spec.headGroupSpec.template", head
        for i, worker in enumerate(spec.get("workerGroupSpecs") or []):
            template = (worker or {}).get("template")
            if _is_pod_template(template):
                group_name = worker.get("groupName") or f"group-{i}"
                yield f"{name}-{group_name}-worker", f"spec.workerGroupSpecs[{i}].template", template
        return

    def walk(value: Any, path: list[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
        if isinstance(value, dict):
            for key in sorted(value):
                child = value[key]
                if key == "template" and _is_pod_template(child):
                    yield "-".join([name, *path]) or name, ".".join(["spec", *path, key]), child
                else:
                    yield from walk(child, [*path, key])
        elif isinstance(value, list):
            for i, child in enumerate(value):
                yield from walk(child, [*path, str(i)])

    yield from walk(spec, [])


def pod_from_template(name: str, namespace: str, template: dict[str, Any]) -> dict[str, Any]:
    """The Pod an operator creates from a pod template, in `namespace`."""
    metadata = copy.deepcopy(template.get("metadata") or {})
    metadata["name"] = _dns_name(name)
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(template["spec"])}


BUILT_IN_GROUPS = {
    "core", "apps", "batch", "policy", "networking.k8s.io", "rbac.authorization.k8s.io", "storage.k8s.io",
    "autoscaling", "scheduling.k8s.io", "coordination.k8s.io", "node.k8s.io", "discovery.k8s.io",
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "certificates.k8s.io", "flowcontrol.apiserver.k8s.io",
}  # fmt: skip


def manifests(doc: dict[str, Any]) -> Manifests:
    """The `kubernetes:*` resources of a synth document as manifests (see the module docstring)."""
    items: list[Manifest] = []
    gaps: list[Gap] = []
    for r in doc.get("resources", []):
        typ = r.get("type", "")
        if not typ.startswith("kubernetes:") or not r.get("custom", True):
            continue
        prefix = next((p for p in NOT_RENDERED if typ.startswith(p)), None)
        if prefix is not None:
            gaps.append(Gap(r["name"], typ, NOT_RENDERED_REASONS[prefix]))
            continue
        if typ.count(":") != 2:
            gaps.append(Gap(r["name"], typ, "not a Kubernetes resource type token; not scanned", blocking=True))
            continue
        manifest = _plain(copy.deepcopy(r.get("inputs") or {}))
        api_version, kind = api_version_and_kind(typ)
        manifest.setdefault("apiVersion", api_version)
        manifest.setdefault("kind", kind)
        metadata = manifest.setdefault("metadata", {})
        metadata.setdefault("name", r["name"])
        items.append(Manifest(r["name"], typ, manifest))
        group = typ.split(":")[1].rpartition("/")[0]
        if group in BUILT_IN_GROUPS:
            continue
        for pod_name, path, template in pod_templates(manifest):
            pod = pod_from_template(pod_name, str(metadata.get("namespace", "")), template)
            items.append(Manifest(r["name"], typ, pod, derived=f"{kind} {metadata['name']}: {path}"))
    return Manifests(items, gaps)
