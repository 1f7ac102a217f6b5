"""Where every pod of the synthesized stack can run, judged against the node groups the stack registers.

The taint and labels are read from the EKS node groups in the synthesis (what
AWS is asked to put on the nodes), translated from the EKS API's spelling to
Kubernetes' as the kubelet reports them, and every pod template the stack
creates is matched against them with Kubernetes' own rules. A toleration with a
typo, a selector on a label no node group sets, or an operator that could land
on a GPU node fails here.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from tests.synthesized import repo_stack

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
# EKS node group taint effects -> the node's taint as Kubernetes shows it (EKS User
# Guide, "Recipe: Prevent pods from being scheduled on specific nodes": NO_SCHEDULE
# becomes NoSchedule on the node).
EKS_TO_K8S_EFFECT = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@lru_cache(maxsize=None)
def _doc(stack: str) -> dict:
    return repo_stack(stack)


def _node_groups(doc: dict) -> dict[str, dict]:
    """Node group name -> {labels, taints (Kubernetes spelling)}."""
    out = {}
    for r in doc["resources"]:
        if r["type"] == NODE_GROUP:
            taints = [{**t, "effect": EKS_TO_K8S_EFFECT[t["effect"]]} for t in r["inputs"].get("taints") or []]
            out[r["name"]] = {"labels": r["inputs"].get("labels") or {}, "taints": taints}
    return out


def _tolerates(toleration: dict, taint: dict) -> bool:
    """k8s.io/api/core/v1 Toleration.ToleratesTaint."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


def _fits(pod: dict, group: dict) -> bool:
    """The pod may schedule onto the group's nodes: its nodeSelector matches and it tolerates every NoSchedule taint."""
    selector = pod.get("nodeSelector") or {}
    if any(group["labels"].get(k) != v for k, v in selector.items() if not k.startswith("kubernetes.io/")):
        return False
    tolerations = pod.get("tolerations") or []
    return all(any(_tolerates(t, taint) for t in tolerations) for taint in group["taints"] if taint["effect"] != "PreferNoSchedule")


def _pods(doc: dict) -> list[tuple[str, dict]]:
    """(what, pod spec) for every pod template the stack creates, Helm-installed pods included."""
    pods = []
    for r in doc["resources"]:
        inputs = r["inputs"]
        if r["type"] == "kubernetes:batch/v1:Job":
            pods.append((f"Job {r['name']}", inputs["spec"]["template"]["spec"]))
        elif r["type"] == "kubernetes:ray.io/v1:RayCluster":
            spec = inputs["spec"]
            pods.append(("Ray head", spec["headGroupSpec"]["template"]["spec"]))
            for g in spec.get("workerGroupSpecs", []):
                pods.append((f"Ray workers {g['groupName']}", g["template"]["spec"]))
        elif r["type"] == "kubernetes:helm.sh/v3:Release":
            values = inputs.get("values") or {}
            chart = inputs["chart"]
            if chart == "gpu-operator":
                pods.append(("gpu-operator controller", values["operator"]))
                pods.append(("gpu-operator operands", {"tolerations": values["daemonsets"]["tolerations"]}))
                pods.append(("node-feature-discovery worker", values["node-feature-discovery"]["worker"]))
            elif chart == "kuberay-operator":
                pods.append(("kuberay-operator", values))
            elif chart == "aws-efa-k8s-device-plugin":
                pods.append(("efa-device-plugin", {"tolerations": values["tolerations"]}))
    return pods


GPU_PODS = ("Ray head", "Ray workers", "Job gpu-serving-prod-serving-efa-check", "Job gpu-serving-prod-serving-benchmark",
            "gpu-operator operands", "node-feature-discovery worker", "efa-device-plugin")  # fmt: skip
SYSTEM_PODS = ("gpu-operator controller", "kuberay-operator", "Job gpu-serving-prod-weights-staging", "Job gpu-serving-test-weights-staging")


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_gpu_pods_reach_the_gpu_nodes_and_system_pods_stay_off_them(stack):
    doc = _doc(stack)
    groups = _node_groups(doc)
    gpu = groups[f"gpu-serving-{stack}-gpu-ng"]
    system = groups[f"gpu-serving-{stack}-system"]
    assert gpu["taints"], "the GPU node group must carry a taint"
    pods = _pods(doc)
    seen = set()
    for what, pod in pods:
        if what.startswith(GPU_PODS):
            assert _fits(pod, gpu), f"{what} cannot run on the GPU nodes"
            seen.add("gpu")
        if what.startswith(SYSTEM_PODS):
            assert _fits(pod, system), f"{what} cannot run on the system nodes"
            assert not _fits(pod, gpu), f"{what} could take a GPU node"
            seen.add("system")
    assert seen == {"gpu", "system"}
    # The serving pods and GPU Jobs select the GPU group; nothing else could host them.
    for what, pod in pods:
        if what.startswith(("Ray", "Job gpu-serving-prod-serving")):
            assert pod["nodeSelector"], what
            assert not _fits(pod, system), f"{what} could land on a system node"


def test_a_wrong_toleration_is_caught():
    """The rule above is strict enough to fail: a toleration with another value does not match."""
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert _tolerates({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}, taint)
    assert not _tolerates({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, taint)
    assert not _tolerates({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoExecute"}, taint)
    assert _tolerates({"operator": "Exists"}, taint)
