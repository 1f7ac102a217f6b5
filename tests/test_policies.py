"""The policy pack (policies/): each rule on small passing and failing resources,
the real stacks through the offline checker, mutated prod documents, the
`check` command, and the CrossGuard wiring with pulumi-policy's own argument
objects (the Pulumi CLI is not here to run the pack for real).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.metadata
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pulumi_policy import (
    EnforcementLevel,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    PolicyCustomTimeouts,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UNKNOWN_OBJECT_VALUE, unknown_checking_proxy

import policies.__main__ as pack
from infra.preview.policy_check import check_document, document_context, gpus_per_node
from infra.k8s.exposure import INTERNAL_NLB_ANNOTATIONS
from infra.preview.synth import synthesize
from policies import rules as R
from tests import cli_in_process
from tests import yaml_text
from tests.synthesized import repo_stack

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
CTX = dict(R.CONTEXT_DEFAULTS)
PROD = {**CTX, "production": True}
NO_OPTS: dict = {}


def one(messages: list, *fragments: str) -> str:
    """The single message, which contains every fragment."""
    assert len(messages) == 1, messages
    for f in fragments:
        assert f in messages[0], (f, messages[0])
    return messages[0]


# --- small builders (not the stack's code) ---------------------------------------------------


def container(name="main", *, gpus="8", shm=True, limits=None, security=None, command=None):
    c = {
        "name": name,
        "image": "vllm:test",
        "resources": {"limits": limits if limits is not None else {"cpu": "4", "memory": "16Gi", R.GPU: gpus}},
    }
    if shm:
        c["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    if security is not None:
        c["securityContext"] = security
    if command is not None:
        c["command"] = command
    return c


def pod(*containers, medium="Memory"):
    return {"securityContext": {"runAsUser": 65532, "runAsNonRoot": True}, "containers": list(containers),
            "volumes": [{"name": "shm", "emptyDir": {"medium": medium} if medium else {}}]}  # fmt: skip


def raycluster(head_command, head_gpus="8", worker_gpus="8", workers=True):
    spec = {"headGroupSpec": {"template": {"spec": pod(container("ray-head", gpus=head_gpus, command=head_command))}}}
    if workers:
        spec["workerGroupSpecs"] = [{"groupName": "gpu", "template": {"spec": pod(container("ray-worker", gpus=worker_gpus))}}]
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": spec}


RAY = "kubernetes:ray.io/v1:RayCluster"
JOB = "kubernetes:batch/v1:Job"


def res(type_, name, inputs, options=None, **extra):
    return {"type": type_, "name": name, "urn": f"urn:pulumi:s::p::{type_}::{name}", "inputs": inputs, "options": options or {}, **extra}


# --- 1. TP never spans nodes ------------------------------------------------------------------


def test_tp_within_the_pods_gpus_passes():
    rc = raycluster(["vllm", "serve", "/m", "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"])
    assert R.check_tp_within_node([res(RAY, "rc", rc)], CTX) == []


def test_tp_larger_than_the_pods_gpus_fails():
    rc = raycluster(["vllm", "serve", "/m", "--tensor-parallel-size", "16"])
    found = R.check_tp_within_node([res(RAY, "rc", rc)], CTX)
    assert [urn for urn, _ in found] == [res(RAY, "rc", rc)["urn"]] * 2  # head and worker group
    assert "--tensor-parallel-size 16 is more than the 8 GPUs the head template requests" in found[0][1]
    assert "would span nodes" in found[0][1]


def test_tp_read_from_a_shell_script_and_checked_against_gpus_per_node():
    script = "set -e\necho 'starting'\nexec vllm serve /m --served-model-name m --tensor-parallel-size=4 --max-model-len 8192\n"
    rc = raycluster(["/bin/bash", "-c", script], head_gpus="4", worker_gpus="4")
    assert R.check_tp_within_node([res(RAY, "rc", rc)], CTX) == []
    found = R.check_tp_within_node([res(RAY, "rc", rc)], {**CTX, "gpus_per_node": 2})
    assert [m for _, m in found] == [
        "vllm serve --tensor-parallel-size 4 is more than the 2 GPUs of one GPU node: tensor parallelism would span nodes"
    ]
    assert R.tensor_parallel_size(["vllm", "serve", "m"]) == 1
    assert R.tensor_parallel_size(["ray", "start"]) is None


# --- 2. EFA security group -------------------------------------------------------------------


def efa_stack(*, ingress=True, egress=True, unknown_ids=False):
    sg_ref = R.UNKNOWN if unknown_ids else "<id:efa>"
    deps = {"networkInterfaces": ["urn:pulumi:s::p::aws:ec2/securityGroup:SecurityGroup::efa"]} if unknown_ids else {}
    rule_deps = (
        {
            "securityGroupId": ["urn:pulumi:s::p::aws:ec2/securityGroup:SecurityGroup::efa"],
            "referencedSecurityGroupId": ["urn:pulumi:s::p::aws:ec2/securityGroup:SecurityGroup::efa"],
        }
        if unknown_ids
        else {}
    )
    lt = res(
        R.LAUNCH_TEMPLATE,
        "lt",
        {"networkInterfaces": [{"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "efa", "securityGroups": [sg_ref]}]},
        property_dependencies=deps,
    )
    out = [lt, res(R.SECURITY_GROUP, "efa", {"description": "EFA"})]
    rule = {"securityGroupId": sg_ref, "referencedSecurityGroupId": sg_ref, "ipProtocol": "-1"}
    if ingress:
        out.append(res(R.SG_INGRESS, "in", dict(rule), property_dependencies=rule_deps))
    if egress:
        out.append(res(R.SG_EGRESS, "out", dict(rule), property_dependencies=rule_deps))
    return out


def test_efa_group_referencing_itself_both_ways_passes():
    assert R.check_efa_security_group(efa_stack(), CTX) == []


def test_efa_group_matched_by_property_dependencies_while_ids_are_unknown():
    assert R.check_efa_security_group(efa_stack(unknown_ids=True), CTX) == []
    found = R.check_efa_security_group(efa_stack(unknown_ids=True, egress=False), CTX)
    one([m for _, m in found], "efa lacks an egress rule with protocol -1 referencing itself")


def test_efa_group_without_its_ingress_rule_fails():
    found = R.check_efa_security_group(efa_stack(ingress=False), CTX)
    assert found[0][0].endswith("::lt")
    one([m for _, m in found], "no security group on the EFA interfaces allows all traffic to and from itself", "efa lacks an ingress rule")


def test_efa_rule_with_a_port_range_does_not_count():
    stack = efa_stack()
    stack[2]["inputs"].update(ipProtocol="tcp", fromPort=0, toPort=65535)
    one([m for _, m in R.check_efa_security_group(stack, CTX)], "lacks an ingress rule")


def test_efa_inline_self_rules_pass():
    stack = efa_stack(ingress=False, egress=False)
    stack[1]["inputs"].update(ingress=[{"protocol": "-1", "fromPort": 0, "toPort": 0, "self": True}], egress=[{"protocol": "-1", "fromPort": 0, "toPort": 0, "self": True}])
    assert R.check_efa_security_group(stack, CTX) == []


# --- 3. IMDSv2 -------------------------------------------------------------------------------------


def test_imdsv2_required_passes():
    assert R.check_imdsv2(R.LAUNCH_TEMPLATE, {"metadataOptions": {"httpTokens": "required", "httpEndpoint": "enabled"}}, NO_OPTS, CTX) == []


def test_imdsv1_allowed_fails():
    one(R.check_imdsv2(R.LAUNCH_TEMPLATE, {"metadataOptions": {"httpTokens": "optional"}}, NO_OPTS, CTX), "httpTokens is 'optional'", '"required"')
    one(R.check_imdsv2(R.LAUNCH_TEMPLATE, {}, NO_OPTS, CTX), "httpTokens is not set")


# --- 4. Encryption at rest ------------------------------------------------------------------------


def test_encrypted_storage_passes():
    lt = {"blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true", "volumeSize": 100}}]}
    assert R.check_encryption(R.LAUNCH_TEMPLATE, lt, NO_OPTS, CTX) == []
    assert R.check_encryption(R.EBS_VOLUME, {"encrypted": True, "size": 10}, NO_OPTS, CTX) == []
    assert R.check_encryption(R.EFS, {"encrypted": True}, NO_OPTS, CTX) == []
    # FSx for Lustre is always encrypted at rest (FSx-managed key when no kmsKeyId).
    assert R.check_encryption(R.FSX_LUSTRE, {"deploymentType": "PERSISTENT_2"}, NO_OPTS, CTX) == []


def test_unencrypted_storage_fails():
    lt = {"blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "false"}}]}
    one(R.check_encryption(R.LAUNCH_TEMPLATE, lt, NO_OPTS, CTX), "block device /dev/xvda: EBS volume not encrypted")
    lt = {"blockDeviceMappings": [{"deviceName": "/dev/xvdb", "ebs": {"volumeSize": 10}}]}
    one(R.check_encryption(R.LAUNCH_TEMPLATE, lt, NO_OPTS, CTX), "/dev/xvdb")
    one(R.check_encryption(R.EBS_VOLUME, {"size": 10}, NO_OPTS, CTX), "EBS volume not encrypted")
    one(R.check_encryption(R.EFS, {"encrypted": False}, NO_OPTS, CTX), "EFS file system not encrypted at rest")


def test_customer_managed_keys_when_required():
    cmk = {**CTX, "require_customer_managed_keys": True}
    one(R.check_encryption(R.FSX_LUSTRE, {"deploymentType": "PERSISTENT_2"}, NO_OPTS, cmk), "no kmsKeyId")
    one(R.check_encryption(R.FSX_LUSTRE, {"deploymentType": "SCRATCH_2", "kmsKeyId": "k"}, NO_OPTS, cmk), "SCRATCH_2", "PERSISTENT")
    assert R.check_encryption(R.FSX_LUSTRE, {"deploymentType": "PERSISTENT_2", "kmsKeyId": "arn:aws:kms:k"}, NO_OPTS, cmk) == []
    one(R.check_encryption(R.EFS, {"encrypted": True}, NO_OPTS, cmk), "EFS file system has no kmsKeyId")


# --- 5. EKS -------------------------------------------------------------------------------------------


def eks(**vpc):
    return {
        "encryptionConfig": {"provider": {"keyArn": "arn:k"}, "resources": ["secrets"]},
        "enabledClusterLogTypes": ["api", "audit"],
        "vpcConfig": {"subnetIds": ["a", "b"], **vpc},
    }


def test_hardened_eks_cluster_passes():
    assert R.check_eks_cluster(R.EKS_CLUSTER, eks(endpointPrivateAccess=True, endpointPublicAccess=False), NO_OPTS, CTX) == []
    assert R.check_eks_cluster(R.EKS_CLUSTER, eks(endpointPublicAccess=True, publicAccessCidrs=["203.0.113.0/24"]), NO_OPTS, CTX) == []


def test_eks_without_secrets_encryption_or_audit_logs_fails():
    props = eks(endpointPublicAccess=False)
    props["encryptionConfig"]["resources"] = []
    props["enabledClusterLogTypes"] = ["api"]
    found = R.check_eks_cluster(R.EKS_CLUSTER, props, NO_OPTS, CTX)
    assert len(found) == 2
    assert "secrets are not envelope-encrypted" in found[0]
    assert 'add "audit" to enabledClusterLogTypes' in found[1]
    del props["encryptionConfig"]
    assert "secrets are not envelope-encrypted" in R.check_eks_cluster(R.EKS_CLUSTER, props, NO_OPTS, CTX)[0]


def test_eks_endpoint_open_to_the_internet_fails():
    one(R.check_eks_cluster(R.EKS_CLUSTER, eks(endpointPublicAccess=True), NO_OPTS, CTX), "no publicAccessCidrs, which EKS reads as 0.0.0.0/0")
    # EKS's default when endpointPublicAccess is not given is public.
    one(R.check_eks_cluster(R.EKS_CLUSTER, eks(), NO_OPTS, CTX), "public and open to the internet")
    one(R.check_eks_cluster(R.EKS_CLUSTER, eks(endpointPublicAccess=True, publicAccessCidrs=["10.0.0.0/8", "0.0.0.0/0"]), NO_OPTS, CTX), "publicAccessCidrs has 0.0.0.0/0")


# --- 6. Production weight storage ------------------------------------------------------------------------


def storage(protect, retain, reclaim="Retain"):
    opts = {"protect": protect, "retain_on_delete": retain}
    spec = {"csi": {"driver": "efs.csi.aws.com"}, "persistentVolumeReclaimPolicy": reclaim}
    return [
        res(R.EFS, "weights", {"encrypted": True}, dict(opts)),
        # The volume holds no data: never protected (components/storage.py, "Reclaim policy").
        res(R.PERSISTENT_VOLUME, "weights-pv", {"spec": spec}, {"protect": False, "retain_on_delete": False}),
    ]


def test_protected_production_storage_passes():
    assert R.check_production_storage_protected(storage(True, True), PROD) == []
    assert R.check_production_storage_protected(storage(False, False, "Delete"), CTX) == []  # not production


def test_unprotected_production_storage_fails():
    found = R.check_production_storage_protected(storage(False, True), PROD)
    assert [urn.rsplit("::", 1)[-1] for urn, _ in found] == ["weights"]
    assert "production stack: the model weights' file system weights lacks protect" in found[0][1]
    found = R.check_production_storage_protected(storage(True, False), PROD)
    assert "file system weights lacks retain_on_delete" in found[0][1]
    # retain_on_delete not visible (CrossGuard): protect alone decides.
    assert R.check_production_storage_protected(storage(True, None), PROD) == []


def test_a_production_volume_that_would_delete_its_data_fails():
    """What keeps the weights when a volume or its claim goes is the reclaim policy, not `protect`."""
    found = R.check_production_storage_protected(storage(True, True, "Delete"), PROD)
    assert [urn.rsplit("::", 1)[-1] for urn, _ in found] == ["weights-pv"]
    assert "PersistentVolume weights-pv has reclaim policy Delete, not Retain" in found[0][1]
    found = R.check_production_storage_protected(storage(True, True, None), PROD)
    assert "reclaim policy unset" in found[0][1]
    unknown = storage(True, True)
    unknown[1]["inputs"]["spec"]["persistentVolumeReclaimPolicy"] = R.UNKNOWN
    assert R.check_production_storage_protected(unknown, PROD) == []


def test_production_comes_from_the_aws_provider_default_tags():
    tags = json.dumps({"tags": {"project": "p", "lifecycle": "production"}})
    assert R.stack_context([res("pulumi:providers:aws", "aws", {"defaultTags": tags})])["production"] is True
    assert R.stack_context([res("pulumi:providers:aws", "aws", {"defaultTags": {"tags": {"lifecycle": "ephemeral"}}})])["production"] is False
    assert R.stack_context([], stack_tags={"lifecycle": "production"})["production"] is True


# --- 7. Serving pods --------------------------------------------------------------------------------------


def test_serving_pods_pass():
    assert R.check_serving_pods(RAY, raycluster(["vllm", "serve", "m"]), NO_OPTS, CTX) == []
    job = {"spec": {"template": {"spec": pod(container("bench"))}}}
    assert R.check_serving_pods(JOB, job, NO_OPTS, CTX) == []
    cpu_job = {"spec": {"template": {"spec": {"containers": [{"name": "stage", "image": "python"}]}}}}
    assert R.check_serving_pods(JOB, cpu_job, NO_OPTS, CTX) == []  # no GPU: not a serving pod


def test_serving_pod_without_memory_backed_shm_fails():
    rc = raycluster(["vllm", "serve", "m"], workers=False)
    rc["spec"]["headGroupSpec"]["template"]["spec"] = pod(container("ray-head"), medium=None)
    one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), "head template, container ray-head: /dev/shm is volume shm, not a memory-backed emptyDir")
    rc["spec"]["headGroupSpec"]["template"]["spec"] = pod(container("ray-head", shm=False))
    one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), "container ray-head: no /dev/shm mount")


def test_serving_pod_without_limits_fails():
    rc = raycluster(["vllm", "serve", "m"])
    rc["spec"]["workerGroupSpecs"][0]["template"]["spec"] = pod(container("ray-worker", limits={"cpu": "4"}))
    one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), "worker group gpu template, container ray-worker: no resource limit for memory, nvidia.com/gpu")


def test_privileged_serving_pods_fail():
    rc = raycluster(["vllm", "serve", "m"])
    rc["spec"]["headGroupSpec"]["template"]["spec"] = pod(container("ray-head", security={"privileged": True}))
    one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), "head template, container ray-head: runs privileged")
    job = {"spec": {"template": {"spec": pod(container("efa-check", security={"allowPrivilegeEscalation": True}))}}}
    one(R.check_serving_pods(JOB, job, NO_OPTS, CTX), "pod template, container efa-check: allows privilege escalation")


def test_serving_pods_add_no_capability_mount_no_host_path_and_never_run_as_root():
    rc = raycluster(["vllm", "serve", "m"])
    spec = pod(container("ray-head", security={"capabilities": {"drop": ["ALL"]}}))
    rc["spec"]["headGroupSpec"]["template"]["spec"] = spec
    assert R.check_serving_pods(RAY, rc, NO_OPTS, CTX) == []
    # IPC_LOCK included: EFA's locked-memory limit comes from the nodes, not from a capability.
    for cap, shown in (("IPC_LOCK", "IPC_LOCK"), ("CAP_SYS_ADMIN", "SYS_ADMIN")):
        spec["containers"][0]["securityContext"]["capabilities"]["add"] = [cap]
        one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), f"container ray-head: adds capabilities {shown}: serving pods add none")
    spec["containers"][0]["securityContext"]["capabilities"].pop("add")
    spec["volumes"].append({"name": "cc", "hostPath": {"path": "/var/lib/gpu-serving/compile-cache/ns/vllm", "type": "DirectoryOrCreate"}})
    one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), "head template: volume cc mounts host path '/var/lib/gpu-serving/compile-cache/ns/vllm'")
    spec["volumes"].pop()
    # Root: the container's own user over the pod's; no user and no runAsNonRoot may be root.
    spec["containers"][0]["securityContext"]["runAsUser"] = 0
    one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), "container ray-head: runs as root (runAsUser 0)")
    spec["containers"][0]["securityContext"].pop("runAsUser")
    spec["securityContext"] = {}
    one(R.check_serving_pods(RAY, rc, NO_OPTS, CTX), "container ray-head: may run as root")
    spec["securityContext"] = {"runAsNonRoot": True}  # the kubelet refuses an image whose user is root
    assert R.check_serving_pods(RAY, rc, NO_OPTS, CTX) == []


# --- 8. Load balancers -----------------------------------------------------------------------------------------


def service(type_, annotations=None):
    meta = {"name": "api"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"type": type_, "ports": [{"port": 8000}]}}


def test_internal_or_cluster_ip_services_pass():
    assert R.check_no_internet_facing_lb(R.SERVICE, service("ClusterIP"), NO_OPTS, CTX) == []
    assert R.check_no_internet_facing_lb(R.SERVICE, service("LoadBalancer", {R.LB_SCHEME: "internal"}), NO_OPTS, CTX) == []
    assert R.check_no_internet_facing_lb(R.SERVICE, service("LoadBalancer", {R.LB_INTERNAL: "true"}), NO_OPTS, CTX) == []


def test_internet_facing_load_balancers_fail():
    one(R.check_no_internet_facing_lb(R.SERVICE, service("LoadBalancer"), NO_OPTS, CTX), "without the internal annotations", "internet-facing")
    contradictory = {R.LB_INTERNAL: "true", R.LB_SCHEME: "internet-facing"}
    one(R.check_no_internet_facing_lb(R.SERVICE, service("LoadBalancer", contradictory), NO_OPTS, CTX), "internet-facing")
    one(R.check_no_internet_facing_lb("aws:lb/loadBalancer:LoadBalancer", {"loadBalancerType": "network"}, NO_OPTS, CTX), "internal is not true")


def test_internet_facing_allowed_when_the_context_says_so():
    allowed = {**CTX, "allow_internet_facing": True}
    assert R.check_no_internet_facing_lb(R.SERVICE, service("LoadBalancer"), NO_OPTS, allowed) == []


# --- pods and their network (policies/kubernetes_rules.py) -------------------------------------------------


def _k8s(type_, name, inputs):
    return {"type": type_, "name": name, "urn": f"urn:{name}", "inputs": inputs}


def _job(name="j", namespace="ns", **pod):
    base = {"automountServiceAccountToken": False, "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                              "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": 1000}}]}  # fmt: skip
    base.update(pod)
    return _k8s("kubernetes:batch/v1:Job", name, {"metadata": {"name": name, "namespace": namespace}, "spec": {"template": {"spec": base}}})


def _namespace_resource(name="ns", labels=None):
    return _k8s("kubernetes:core/v1:Namespace", name, {"metadata": {"name": name, "labels": labels or {}}})


def _deny(namespace="ns"):
    return _k8s(NETPOL, "deny", {"metadata": {"name": "deny", "namespace": namespace},
                                 "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})  # fmt: skip


def test_least_privilege_covers_every_workload_not_only_gpu_pods():
    assert R.check_pods_least_privilege("kubernetes:batch/v1:Job", _job()["inputs"], NO_OPTS, CTX) == []
    loose = _job(automountServiceAccountToken=True)["inputs"]
    one(R.check_pods_least_privilege("kubernetes:batch/v1:Job", loose, NO_OPTS, CTX), "mounts a service-account token")
    ipc = _job()["inputs"]
    ipc["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = ["IPC_LOCK"]
    one(R.check_pods_least_privilege("kubernetes:batch/v1:Job", ipc, NO_OPTS, CTX), "adds IPC_LOCK")
    # Not even with EFA: the nodes raise the locked-memory limit (infra/aws/gpu_nodes.py).
    ipc["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"vpc.amazonaws.com/efa": "32"}}
    one(R.check_pods_least_privilege("kubernetes:batch/v1:Job", ipc, NO_OPTS, CTX), "adds IPC_LOCK")
    unknown = _job()["inputs"]
    unknown["spec"]["template"]["spec"]["containers"][0]["securityContext"] = R.UNKNOWN
    assert R.check_pods_least_privilege("kubernetes:batch/v1:Job", unknown, NO_OPTS, CTX) == []


def test_the_namespace_rule_judges_the_namespaces_the_stack_creates():
    job = _job()  # passes restricted
    assert R.check_namespace_pod_security([job], CTX) == []  # the stack does not create namespace ns
    labelled = _namespace_resource(labels={"pod-security.kubernetes.io/enforce": "restricted"})
    assert R.check_namespace_pod_security([job, labelled], CTX) == []
    weak = _namespace_resource(labels={"pod-security.kubernetes.io/enforce": "baseline"})
    (found,) = R.check_namespace_pod_security([job, weak], CTX)
    assert found == ("urn:ns", "namespace ns enforces Pod Security baseline, but every pod the stack runs there passes restricted: enforce restricted")
    lax_warn = _namespace_resource(labels={"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "baseline"})
    one([m for _, m in R.check_namespace_pod_security([job, lax_warn], CTX)], "warn=baseline is weaker than enforce=restricted")
    unknown = _namespace_resource(labels=R.UNKNOWN)
    assert R.check_namespace_pod_security([job, unknown], CTX) == []
    # The pods are judged at the version the namespace pins: a probe sent to a host is outside baseline from 1.34.
    probing = _job(containers=[{**job["inputs"]["spec"]["template"]["spec"]["containers"][0],
                                "livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}])  # fmt: skip
    pinned = {"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "v1.33"}
    assert [m for _, m in R.check_namespace_pod_security([probing, _namespace_resource(labels=pinned)], CTX)] == [
        "namespace ns enforces Pod Security baseline, but every pod the stack runs there passes restricted: enforce restricted"
    ]
    pinned["pod-security.kubernetes.io/enforce-version"] = "v1.34"
    one([m for _, m in R.check_namespace_pod_security([probing, _namespace_resource(labels=pinned)], CTX)],
        "passes Pod Security privileged only", "host probes and lifecycle hooks")  # fmt: skip


def test_a_preview_with_the_pod_specs_unknown_reports_nothing(prod_doc):
    """In a CrossGuard preview the RayCluster's and Jobs' specs wait for the image (an Output): the stack rules
    must not judge them, nor take an unknown pod for one that passes restricted."""
    doc = copy.deepcopy(prod_doc)
    for r in doc["resources"]:
        if r["type"] in (RAY, "kubernetes:batch/v1:Job"):
            r["inputs"]["spec"] = R.UNKNOWN
    found = check_document(doc)
    assert found == [], [(v.rule, v.message) for v in found]


def test_the_network_rule_needs_a_default_deny_and_skips_what_it_cannot_see():
    job = _job()
    one([m for _, m in R.check_network_policies([job], CTX)], "has no default-deny NetworkPolicy")
    assert R.check_network_policies([job, _deny()], CTX) == []
    assert R.check_network_policies([job, _deny("elsewhere")], CTX) != []  # another namespace's deny does not count
    unseen = _k8s(NETPOL, "later", {"metadata": {"name": "later", "namespace": "ns"}, "spec": R.UNKNOWN})
    assert R.check_network_policies([job, unseen], CTX) == []


# --- the rule set ---------------------------------------------------------------------------------------------


def test_every_rule_has_a_name_description_and_is_mandatory():
    names = [r.name for r in R.RULES]
    assert len(names) == len(set(names)) == 20
    for r in R.RULES:
        assert r.description and "\n" not in r.description
        assert r.enforcement == R.MANDATORY
    assert {r.name for r in R.RULES if r.scope == "stack"} == {
        "tp-within-node", "efa-security-group-self-referencing", "production-weights-protected",
        "root-init-only-on-fsx", "namespace-pod-security", "network-policies-isolate-ray", "api-admits-only-its-clients", "iam-managed-policies-scoped",
        "vpcs-have-flow-logs", "default-security-groups-closed",
    }  # fmt: skip


PACK_MODULES = sorted(p for p in (REPO_ROOT / "policies").glob("*.py") if p.name not in ("__main__.py", "__init__.py"))


@pytest.mark.parametrize("path", PACK_MODULES, ids=lambda p: p.name)
def test_rules_import_only_the_standard_library(path):
    """The rules' modules need nothing but the standard library and each other (the pack's venv has pulumi-policy only)."""
    tree = ast.parse(path.read_text())
    siblings = {p.stem for p in PACK_MODULES}
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"} | siblings, imported
    assert len(PACK_MODULES) >= 6 and "rules" in siblings


# --- the real stacks -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prod_doc() -> dict:
    return repo_stack("prod")


@pytest.fixture(scope="module")
def test_doc() -> dict:
    return repo_stack("test")


def test_prod_and_test_stacks_pass_every_rule(prod_doc, test_doc):
    assert check_document(prod_doc) == []
    assert check_document(test_doc) == []


def _namespace_labels(doc) -> dict:
    return _find(doc, "kubernetes:core/v1:Namespace", "-serving")["inputs"]["metadata"]["labels"]


@pytest.fixture(scope="module")
def fsx_prod_doc(tmp_path_factory) -> dict:
    """prod with its weights on FSx for Lustre (the storage-type row of infra/preview/changes.py)."""
    from tests.project_copy import edited_project

    root = edited_project(tmp_path_factory.mktemp("fsx") / "project", "prod", [
        ("    fsxCsi: false\n", "    fsxCsi: true\n"),
        ("    owner: ml-platform\n", "    owner: ml-platform\n  gpu-serving:storage:\n    type: fsx\n"),
    ])  # fmt: skip
    return synthesize("prod", root)


def test_the_serving_namespace_enforces_restricted_on_efs_and_baseline_on_fsx(prod_doc, fsx_prod_doc):
    """The policy pack proves it on the synthesized stacks: on EFS every pod, the staging Job's included, passes
    restricted, and the namespace enforces it; on FSx the staging Job's root init container (CHOWN) is the one thing
    that needs baseline, and the namespace enforces that. Both pass every rule."""
    from policies import pod_security as pss

    jobs = {}
    for name, doc in (("efs", prod_doc), ("fsx", fsx_prod_doc)):
        assert check_document(doc) == [], [(v.rule, v.message) for v in check_document(doc)]
        job = _find(doc, "kubernetes:batch/v1:Job", "-weights-staging")["inputs"]["spec"]["template"]
        jobs[name] = job
        version = pss.policy_version(_namespace_labels(doc)["pod-security.kubernetes.io/enforce-version"])
        assert _namespace_labels(doc)["pod-security.kubernetes.io/enforce"] == pss.level(job["spec"], job["metadata"], version)
    assert _namespace_labels(prod_doc)["pod-security.kubernetes.io/enforce"] == "restricted"
    assert "initContainers" not in jobs["efs"]["spec"]
    assert _namespace_labels(fsx_prod_doc)["pod-security.kubernetes.io/enforce"] == "baseline"
    assert [c["name"] for c in jobs["fsx"]["spec"]["initContainers"]] == ["own-dest"]
    # Enforcing restricted on FSx would refuse the staging Job's pods, and only for its root step.
    doc = copy.deepcopy(fsx_prod_doc)
    _namespace_labels(doc)["pod-security.kubernetes.io/enforce"] = "restricted"
    found = check_document(doc)
    assert {v.rule for v in found} == {"namespace-pod-security"} and len(found) == 1
    assert "-weights-staging" in found[0].message and "own-dest" in found[0].message


def test_a_root_init_container_is_allowed_on_fsx_only(prod_doc, fsx_prod_doc):
    """The CHOWN exception of pods-least-privilege, narrowed: the FSx Job's root step passes; the same step in the EFS
    stack's Job (its claim bound to an EFS volume) is refused, and so is it in a pod without a claim."""
    fsx_job = _find(fsx_prod_doc, "kubernetes:batch/v1:Job", "-weights-staging")
    (owner,) = fsx_job["inputs"]["spec"]["template"]["spec"]["initContainers"]
    assert R.check_root_init_only_on_fsx(fsx_prod_doc["resources"], CTX) == []
    doc = copy.deepcopy(prod_doc)
    efs_job = _find(doc, "kubernetes:batch/v1:Job", "-weights-staging")
    efs_job["inputs"]["spec"]["template"]["spec"]["initContainers"] = [copy.deepcopy(owner)]
    (found,) = R.check_root_init_only_on_fsx(doc["resources"], CTX)
    assert found[0] == efs_job["urn"] and "init container own-dest runs as root or adds CHOWN" in found[1]
    assert "on efs.csi.aws.com" in found[1]
    # Root without CHOWN counts too; a pod without a claim has no FSx volume to hand over.
    pod = {"initContainers": [{"name": "r", "securityContext": {"runAsUser": 0}}], "containers": [{"name": "c"}]}
    bare = _k8s("kubernetes:core/v1:Pod", "p", {"metadata": {"name": "p", "namespace": "ns"}, "spec": pod})
    one([m for _, m in R.check_root_init_only_on_fsx([bare], CTX)], "it mounts no claim")
    # Unknown values (a preview): nothing judged.
    unknown = _k8s("kubernetes:core/v1:Pod", "p", {"metadata": {"name": "p", "namespace": "ns"}, "spec": {**pod, "initContainers": R.UNKNOWN}})
    assert R.check_root_init_only_on_fsx([unknown], CTX) == []
    # The whole pack says the same of the EFS document: this rule, and admission (restricted) too.
    assert {v.rule for v in check_document(doc)} == {"root-init-only-on-fsx", "namespace-pod-security"}


def test_context_of_the_real_stacks(prod_doc, test_doc):
    assert document_context(prod_doc)["production"] is True
    assert document_context(test_doc)["production"] is False
    assert gpus_per_node(prod_doc) == 8 and gpus_per_node(test_doc) == 1
    assert document_context(prod_doc)["allow_internet_facing"] is False


def _find(doc, type_, name_suffix=""):
    found = [r for r in doc["resources"] if r["type"] == type_ and r["name"].endswith(name_suffix)]
    assert len(found) == 1, [r["name"] for r in found]
    return found[0]


def _imds_optional(doc):
    _find(doc, R.LAUNCH_TEMPLATE, "-gpu-lt")["inputs"]["metadataOptions"]["httpTokens"] = "optional"


def _public_endpoint(doc):
    _find(doc, R.EKS_CLUSTER)["inputs"]["vpcConfig"]["endpointPublicAccess"] = True


def _public_lb(doc):
    _find(doc, R.SERVICE, "-api")["inputs"]["spec"]["type"] = "LoadBalancer"


def _privileged_head(doc):
    head = _find(doc, RAY)["inputs"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["securityContext"]["privileged"] = True


NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def _no_default_deny(doc):
    doc["resources"].remove(_find(doc, NETPOL, "-serving-default-deny"))


def _ray_open_to_every_namespace(doc):
    _find(doc, NETPOL, "-np-vllm-ray")["inputs"]["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})


def _ray_open_to_the_vpc(doc):
    _find(doc, NETPOL, "-np-vllm-ray")["inputs"]["spec"]["ingress"].append({"from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]})


def _ray_pods_cut_off(doc):
    _find(doc, NETPOL, "-np-vllm-ray")["inputs"]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["ray.io/cluster"] = "other"


def _staging_escalates(doc):
    job = _find(doc, "kubernetes:batch/v1:Job")["inputs"]["spec"]["template"]["spec"]
    job["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True


def _staging_adds_chown_outside_init(doc):
    job = _find(doc, "kubernetes:batch/v1:Job")["inputs"]["spec"]["template"]["spec"]
    job["containers"][0]["securityContext"]["capabilities"]["add"] = ["CHOWN"]


def _head_mounts_a_token(doc):
    del _find(doc, RAY)["inputs"]["spec"]["headGroupSpec"]["template"]["spec"]["automountServiceAccountToken"]


def _writable_worker_root(doc):
    worker = _find(doc, RAY)["inputs"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["securityContext"]["readOnlyRootFilesystem"] = False


def _enforce_baseline(doc):
    """What an EFS stack's namespace enforced while its staging Job had a root init container."""
    _find(doc, "kubernetes:core/v1:Namespace", "prod-serving")["inputs"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "baseline"


def _no_pod_security_labels(doc):
    del _find(doc, "kubernetes:core/v1:Namespace", "prod-serving")["inputs"]["metadata"]["labels"]


def _enforce_privileged(doc):
    """privileged admits anything: never the stack's level, and weaker than what its pods pass."""
    _find(doc, "kubernetes:core/v1:Namespace", "prod-serving")["inputs"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"


def _head_with_ipc_lock_and_a_host_path(doc):
    """What the serving pods carried before the nodes raised the locked-memory limit."""
    head = _find(doc, RAY)["inputs"]["spec"]["headGroupSpec"]["template"]["spec"]
    head["containers"][0]["securityContext"]["capabilities"]["add"] = ["IPC_LOCK"]
    head["volumes"].append({"name": "cc", "hostPath": {"path": "/var/lib/gpu-serving/compile-cache/ns/vllm", "type": "DirectoryOrCreate"}})


def _efs_unprotected(doc):
    _find(doc, R.EFS)["options"]["protect"] = False


def _pv_deleted_on_release(doc):
    _find(doc, R.PERSISTENT_VOLUME, "-weights-pv")["inputs"]["spec"]["persistentVolumeReclaimPolicy"] = "Delete"


def _tp_16(doc):
    head = _find(doc, RAY)["inputs"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    args = head["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    args[args.index("--tensor-parallel-size") + 1] = "16"


def _attach(doc, name: str, role: str, policy: str) -> None:
    doc["resources"].append({"type": "aws:iam/rolePolicyAttachment:RolePolicyAttachment", "name": name, "urn": f"urn:{name}",
                             "options": {}, "inputs": {"role": role, "policyArn": f"arn:aws:iam::aws:policy/{policy}"}})  # fmt: skip


def _cni_policy_on_the_node_role(doc):
    """What the stack did before the VPC CNI got its own role (EKS User Guide: the CNI's own role, not the node's)."""
    node_role = _find(doc, "aws:iam/role:Role", "-node-role")["name"]
    _attach(doc, "node-cni", node_role, "AmazonEKS_CNI_Policy")


def _fsx_full_access(doc):
    """What the FSx CSI driver had before its static volumes were found to need no AWS call."""
    _attach(doc, "fsx-csi", _find(doc, "aws:iam/role:Role", "-aws-efs-csi-driver-role")["name"], "AmazonFSxFullAccess")


def _no_efa_ingress(doc):
    doc["resources"].remove(_find(doc, R.SG_INGRESS, "-efa-in-self"))


def _unencrypted_root(doc):
    _find(doc, R.LAUNCH_TEMPLATE, "-gpu-lt")["inputs"]["blockDeviceMappings"][0]["ebs"]["encrypted"] = "false"


def _no_shm(doc):
    worker = _find(doc, RAY)["inputs"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["volumeMounts"] = [m for m in worker["volumeMounts"] if m["mountPath"] != "/dev/shm"]


@pytest.mark.parametrize(
    "mutate, rule, fragment",
    [
        (_imds_optional, "imdsv2-required", "httpTokens is 'optional'"),
        (_public_endpoint, "eks-secrets-audit-private-endpoint", "which EKS reads as 0.0.0.0/0"),
        # A public load balancer is also one that keeps no client addresses and names no source ranges.
        (_public_lb, ("no-internet-facing-load-balancer", "api-admits-only-its-clients"), "without the internal annotations"),
        (_privileged_head, ("serving-pods-shm-limits-unprivileged", "namespace-pod-security"), "container ray-head: runs privileged"),
        (_efs_unprotected, "production-weights-protected", "lacks protect"),
        (_pv_deleted_on_release, "production-weights-protected", "PersistentVolume gpu-serving-prod-weights-pv has reclaim policy Delete"),
        (_tp_16, "tp-within-node", "--tensor-parallel-size 16"),
        (_no_efa_ingress, "efa-security-group-self-referencing", "lacks an ingress rule"),
        (_cni_policy_on_the_node_role, "iam-managed-policies-scoped", "attaches AmazonEKS_CNI_Policy to role gpu-serving-prod-node-role, which ec2.amazonaws.com can assume"),
        (_fsx_full_access, "iam-managed-policies-scoped", "attaches AmazonFSxFullAccess"),
        (_unencrypted_root, "storage-encrypted", "EBS volume not encrypted"),
        (_no_shm, "serving-pods-shm-limits-unprivileged", "worker group gpu template, container ray-worker: no /dev/shm"),
        (_no_default_deny, "network-policies-isolate-ray", "namespace gpu-serving runs the stack's pods"),
        # Every port of the head opened to every namespace: Ray's and the API's.
        (_ray_open_to_every_namespace, ("network-policies-isolate-ray", "api-admits-only-its-clients"), "a pod of another namespace can reach the head's Ray GCS port 6379"),
        (_ray_open_to_the_vpc, "network-policies-isolate-ray", "address 10.0.0.1 can reach the head's Ray client server port 10001"),
        (_ray_pods_cut_off, "network-policies-isolate-ray", "its head and workers cannot reach each other"),
        # The staging Job passes restricted on EFS, which the namespace enforces: admission would refuse these too.
        (_staging_escalates, ("pods-least-privilege", "namespace-pod-security"), "container stage: set securityContext.allowPrivilegeEscalation: false"),
        (_staging_adds_chown_outside_init, ("pods-least-privilege", "namespace-pod-security"), "container stage: adds CHOWN"),
        (_head_mounts_a_token, "pods-least-privilege", "head template: mounts a service-account token"),
        (_writable_worker_root, "pods-least-privilege", "container ray-worker: set securityContext.readOnlyRootFilesystem: true"),
        (_enforce_baseline, "namespace-pod-security", "namespace gpu-serving enforces Pod Security baseline, but every pod the stack runs there passes restricted: enforce restricted"),
        (_no_pod_security_labels, "namespace-pod-security", "without Pod Security admission"),
        (_enforce_privileged, "namespace-pod-security", "enforces Pod Security privileged: the stack's namespaces enforce baseline or stricter"),
    ],
    ids=lambda v: getattr(v, "__name__", None) if callable(v) else None,
)
def test_a_mutated_prod_document_fails_the_right_rule(prod_doc, mutate, rule, fragment):
    doc = copy.deepcopy(prod_doc)
    mutate(doc)
    found = check_document(doc)
    # Some mutations break two rules (a privileged serving pod: the serving pods' own, and baseline admission).
    assert {v.rule for v in found} == ({rule} if isinstance(rule, str) else set(rule)), [(v.rule, v.message) for v in found]
    assert any(fragment in v.message for v in found), [v.message for v in found]
    assert all(v.mandatory for v in found)


def _as_internal_lb(doc, cidrs=("10.8.0.0/16",)):
    """prod as `serviceType: internal-lb` with `apiClients.cidrs` would synthesise it: the API Service and the
    API NetworkPolicy from the stack's own builders."""
    from infra.k8s import exposure, network_policies
    from infra.k8s.serving_spec import Clients
    from tests.test_rayspec import make_spec, stack_plan

    spec = make_spec(stack_plan("prod"), service_type="internal-lb", api_clients=Clients(cidrs=cidrs))
    built = exposure.service(spec)
    svc = _find(doc, R.SERVICE, "-api")["inputs"]
    svc["spec"] = {**built["spec"], "selector": svc["spec"]["selector"]}
    svc["metadata"]["annotations"] = built["metadata"]["annotations"]
    (api,) = [p for p in network_policies.serving_policies(spec) if p["metadata"]["name"].endswith("-api")]
    ns = svc["metadata"]["namespace"]
    doc["resources"] = [r for r in doc["resources"] if not (r["type"] == NETPOL and r["inputs"]["metadata"]["name"].endswith("-api"))]
    doc["resources"].append({"type": NETPOL, "name": "api", "urn": "urn:api", "options": {}, "inputs": {
        "metadata": {"name": api["metadata"]["name"], "namespace": ns}, "spec": api["spec"]}})  # fmt: skip
    return svc


def test_the_stacks_internal_load_balancer_passes(prod_doc):
    doc = copy.deepcopy(prod_doc)
    svc = _as_internal_lb(doc)
    assert svc["spec"]["type"] == "LoadBalancer" and svc["metadata"]["annotations"] == dict(INTERNAL_NLB_ANNOTATIONS)
    assert check_document(doc) == []


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda svc, doc: svc["spec"].update(externalTrafficPolicy="Cluster"), "without externalTrafficPolicy: Local"),
        (lambda svc, doc: svc["spec"].pop("loadBalancerSourceRanges"), "without loadBalancerSourceRanges admits every address"),
        (lambda svc, doc: svc["spec"].update(loadBalancerSourceRanges=["0.0.0.0/0"]), "loadBalancerSourceRanges includes every address"),
        # The NetworkPolicy admits the whole VPC while the load balancer names one client network.
        (lambda svc, doc: svc["spec"].update(loadBalancerSourceRanges=["10.8.1.0/24"]), "address 10.8.0.1, outside its loadBalancerSourceRanges"),
    ],
)
def test_an_api_load_balancer_that_admits_more_than_its_clients_fails(prod_doc, mutate, fragment):
    doc = copy.deepcopy(prod_doc)
    mutate(_as_internal_lb(doc), doc)
    found = check_document(doc)
    assert {v.rule for v in found} == {"api-admits-only-its-clients"}, [(v.rule, v.message) for v in found]
    assert any(fragment in v.message for v in found), [v.message for v in found]


def test_the_api_refuses_pods_of_other_namespaces(prod_doc):
    doc = copy.deepcopy(prod_doc)
    _as_internal_lb(doc)
    api = [r for r in doc["resources"] if r["type"] == NETPOL and r["inputs"]["metadata"]["name"].endswith("-api")][0]
    api["inputs"]["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})  # every namespace
    found = check_document(doc)
    assert {v.rule for v in found} == {"api-admits-only-its-clients"}
    assert any("a pod of another namespace can reach the API port 8000" in v.message for v in found)


def test_every_namespace_the_stack_creates_denies_by_default(prod_doc):
    doc = copy.deepcopy(prod_doc)
    operator_ns = [r["inputs"]["metadata"]["name"] for r in doc["resources"] if r["type"] == "kubernetes:core/v1:Namespace"
                   and r["inputs"]["metadata"]["name"] != "gpu-serving"]  # fmt: skip
    assert operator_ns  # the GPU operator's and KubeRay's
    ns = operator_ns[0]
    doc["resources"] = [r for r in doc["resources"] if not (r["type"] == NETPOL and r["inputs"]["metadata"].get("namespace") == ns
                                                            and not r["inputs"]["spec"].get("ingress") and not r["inputs"]["spec"].get("egress"))]  # fmt: skip
    found = check_document(doc)
    assert {v.rule for v in found} == {"network-policies-isolate-ray"}
    assert any(f"namespace {ns} is the stack's but has no default-deny NetworkPolicy" in v.message for v in found)


def test_the_test_stack_may_leave_its_storage_unprotected(test_doc):
    doc = copy.deepcopy(test_doc)
    assert all(not r["options"].get("protect") for r in doc["resources"] if r["type"] == R.EFS)
    assert check_document(doc) == []


# --- the command -----------------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "infra", *args], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=180
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def test_cli_check_prod_passes(prod_doc, monkeypatch):
    # In-process (tests/cli_in_process.py): the command checks the module's prod synthesis.
    cli_in_process.serve_synthesis(monkeypatch, {("prod", None): lambda: prod_doc})
    proc = cli_in_process.invoke("check", "--stack", "prod", expect=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "All 20 policy rules passed: stack prod" in proc.stdout


def test_cli_check_json_and_a_failing_stack(tmp_path: Path, monkeypatch):
    root = tmp_path / "project"
    root.mkdir()
    for name in ("Pulumi.yaml", "__main__.py"):
        (root / name).write_text((REPO_ROOT / name).read_text())
    stack = yaml_text.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())
    # The config refuses 0.0.0.0/0 in production; a non-production copy passes the config, not the policy.
    stack["config"]["gpu-serving:lifecycle"] = {"production": False, "owner": "ci", "expiresAt": "2026-12-31T23:00:00Z"}
    stack["config"]["gpu-serving:cluster"].update(endpointAccess="public-restricted", deployerCidrs=["0.0.0.0/0"])
    (root / "Pulumi.prod.yaml").write_text(yaml.safe_dump(stack))

    # In-process (tests/cli_in_process.py): the copy is synthesised for real once; the --json run, over the
    # same unedited copy, checks that same document.
    cli_in_process.serve_synthesis(monkeypatch, {("prod", root): functools.cache(lambda: synthesize("prod", root))})
    proc = cli_in_process.invoke("check", "--stack", "prod", "--root", str(root), expect=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "eks-secrets-audit-private-endpoint" in proc.stdout
    assert "1 violation(s) of 1 of 20 rules" in proc.stdout

    proc = cli_in_process.invoke("check", "--stack", "prod", "--root", str(root), "--json", expect=None)
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["passed"] is False and len(result["rules"]) == 20
    (v,) = result["violations"]
    assert v["rule"] == "eks-secrets-audit-private-endpoint" and v["name"] == "gpu-serving-prod-eks"
    assert "publicAccessCidrs has 0.0.0.0/0" in v["message"]


def test_cli_check_unknown_stack_is_a_user_error():
    # The fresh `python -m infra check` process: the real entry point's exit status and error.
    proc = run_cli("check", "--stack", "no-such-stack")
    assert proc.returncode == 2
    assert "Pulumi.no-such-stack.yaml" in proc.stderr


# --- the CrossGuard pack -----------------------------------------------------------------------------------------


def test_pack_files():
    meta = yaml_text.safe_load((REPO_ROOT / "policies" / "PulumiPolicy.yaml").read_text())
    assert meta["runtime"]["name"] == "python" and meta["version"]
    reqs = [l.split("#")[0].strip() for l in (REPO_ROOT / "policies" / "requirements.txt").read_text().splitlines()]
    pins = dict(l.split("==") for l in reqs if l)
    assert pins["pulumi-policy"] == "1.21.0" == importlib.metadata.version("pulumi-policy")
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, name


def test_pack_registers_one_policy_per_rule():
    policies = pack.policies()
    assert [p.name for p in policies] == [r.name for r in R.RULES]
    for p, r in zip(policies, R.RULES):
        assert p.description == r.description
        assert p.enforcement_level == EnforcementLevel.MANDATORY
        assert isinstance(p, ResourceValidationPolicy if r.scope == "resource" else StackValidationPolicy)
        assert (p.config_schema is not None) == bool(r.config)


def test_pack_main_builds_the_gpu_serving_pack(monkeypatch):
    seen = {}
    monkeypatch.setattr(pack, "PolicyPack", lambda **kw: seen.update(kw))
    pack.main()
    assert seen["name"] == "gpu-serving"
    assert [p.name for p in seen["policies"]] == [r.name for r in R.RULES]


def test_pack_runs_as_the_analyzer_runs_it():
    """`python -m pulumi.policy` runs the directory (`runpy.run_path`): `rules` comes from next to it."""
    top_level = ["rules", *(p.stem for p in PACK_MODULES)]
    saved = {name: sys.modules.pop(name) for name in top_level if name in sys.modules}
    try:
        ns = runpy.run_path(str(REPO_ROOT / "policies"), run_name="analyzer_probe")  # not __main__: no server
        assert ns["rules"].__file__ == str(REPO_ROOT / "policies" / "rules.py")
        assert [p.name for p in ns["policies"]()] == [r.name for r in R.RULES]
        # The rules' own modules came from next to it too (top-level imports, not the policies package).
        assert sys.modules["kubernetes_rules"].__file__ == str(REPO_ROOT / "policies" / "kubernetes_rules.py")
    finally:
        for name in top_level:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def _opts(protect=False):
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], None)


def _policy(name):
    return next(p for p in pack.policies() if p.name == name)


def _resource_args(type_, props, config=None, provider=None):
    return ResourceValidationArgs(type_, unknown_checking_proxy(props), f"urn:pulumi:s::p::{type_}::r", "r", _opts(), provider, config or {})


def test_plain_copies_proxies_and_marks_unknowns():
    proxy = unknown_checking_proxy({"a": {"b": [1, UNKNOWN_STRING_VALUE]}, "c": UNKNOWN_OBJECT_VALUE, "d": "x"})
    assert pack.plain(proxy) == {"a": {"b": [1, R.UNKNOWN]}, "c": R.UNKNOWN, "d": "x"}


def test_resource_adapter_reports_the_rules_messages():
    reported = []
    args = _resource_args(R.LAUNCH_TEMPLATE, {"metadataOptions": {"httpTokens": "optional"}})
    _policy("imdsv2-required").validate(args, lambda msg, urn=None: reported.append(msg))
    one(reported, "httpTokens is 'optional'")

    reported.clear()  # unknown during a preview: no verdict, no exception
    args = _resource_args(R.LAUNCH_TEMPLATE, {"metadataOptions": {"httpTokens": UNKNOWN_STRING_VALUE}})
    _policy("imdsv2-required").validate(args, lambda msg, urn=None: reported.append(msg))
    assert reported == []


def test_resource_adapter_reads_the_policy_config():
    lb = service("LoadBalancer")
    reported = []
    _policy("no-internet-facing-load-balancer").validate(_resource_args(R.SERVICE, lb), lambda m, urn=None: reported.append(m))
    one(reported, "internet-facing")
    reported.clear()
    args = _resource_args(R.SERVICE, lb, config={"allowInternetFacing": True})
    _policy("no-internet-facing-load-balancer").validate(args, lambda m, urn=None: reported.append(m))
    assert reported == []


def _policy_resource(type_, name, props, protect=False, deps=None, provider=None):
    return PolicyResource(
        type_, unknown_checking_proxy(props), f"urn:pulumi:s::p::{type_}::{name}", name, _opts(protect), provider, None, [], deps or {}
    )


def test_stack_adapter_matches_security_group_rules_by_property_dependencies():
    sg = _policy_resource(R.SECURITY_GROUP, "efa", {"description": "EFA"})
    unknown = {"securityGroupId": UNKNOWN_STRING_VALUE, "referencedSecurityGroupId": UNKNOWN_STRING_VALUE, "ipProtocol": "-1"}
    deps = {"securityGroupId": [sg], "referencedSecurityGroupId": [sg]}
    lt = _policy_resource(
        R.LAUNCH_TEMPLATE,
        "lt",
        {"networkInterfaces": [{"deviceIndex": 0, "interfaceType": "efa-only", "securityGroups": [UNKNOWN_STRING_VALUE]}]},
        deps={"networkInterfaces": [sg]},
    )
    ingress = _policy_resource(R.SG_INGRESS, "in", dict(unknown), deps=deps)
    egress = _policy_resource(R.SG_EGRESS, "out", dict(unknown), deps=deps)
    policy = _policy("efa-security-group-self-referencing")

    reported = []
    policy.validate(StackValidationArgs([lt, sg, ingress, egress]), lambda m, urn=None: reported.append((urn, m)))
    assert reported == []
    policy.validate(StackValidationArgs([lt, sg, ingress]), lambda m, urn=None: reported.append((urn, m)))
    assert [urn for urn, _ in reported] == [lt.urn]
    one([m for _, m in reported], "lacks an egress rule")


def test_stack_adapter_reads_production_and_protect():
    tags = json.dumps({"tags": {"lifecycle": "production", "project": "gpu-serving"}})
    provider = _policy_resource("pulumi:providers:aws", "aws", {"defaultTags": tags, "region": "us-east-1"})
    efs = _policy_resource(R.EFS, "weights", {"encrypted": True}, protect=False)
    policy = _policy("production-weights-protected")
    reported = []
    policy.validate(StackValidationArgs([provider, efs]), lambda m, urn=None: reported.append((urn, m)))
    assert [urn for urn, _ in reported] == [efs.urn]
    one([m for _, m in reported], "lacks protect")  # retain_on_delete is not visible to CrossGuard

    reported.clear()  # the provider only known through the resource's `provider`
    efs = _policy_resource(R.EFS, "weights", {"encrypted": True}, protect=True)
    kept = _policy_resource(R.PERSISTENT_VOLUME, "pv", {"spec": {"persistentVolumeReclaimPolicy": "Retain"}}, protect=False)
    deleted = _policy_resource(R.PERSISTENT_VOLUME, "pv-delete", {"spec": {"persistentVolumeReclaimPolicy": "Delete"}}, protect=False)
    efs.provider = PolicyProviderResource("pulumi:providers:aws", unknown_checking_proxy({"defaultTags": tags}), provider.urn, "aws")
    policy.validate(StackValidationArgs([efs, kept, deleted]), lambda m, urn=None: reported.append((urn, m)))
    assert [urn for urn, _ in reported] == [deleted.urn]


def test_stack_adapter_tp_rule_on_a_raycluster():
    rc = _policy_resource(RAY, "rc", raycluster(["vllm", "serve", "/m", "--tensor-parallel-size", "16"], workers=False))
    reported = []
    _policy("tp-within-node").validate(StackValidationArgs([rc]), lambda m, urn=None: reported.append((urn, m)))
    one([m for _, m in reported], "--tensor-parallel-size 16 is more than the 8 GPUs the head template requests")
    reported.clear()
    _policy("tp-within-node").validate(StackValidationArgs([rc], config={"gpusPerNode": 8}), lambda m, urn=None: reported.append((urn, m)))
    assert len(reported) == 2 and "of one GPU node" in reported[1][1]
