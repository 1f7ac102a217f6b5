"""The real Pulumi program (`__main__.py`) under the recording engine, per stack file.

The program runs as the Python language host runs it (`runpy.run_path` of the
project directory) with the stack's config passed as the CLI passes it, and
`infra.preview.recording` keeps every registration (inputs and resource options) and
the stack outputs; assertions run on that plain data after the program ended.
"""

from __future__ import annotations

import hashlib
import json
import runpy
from functools import lru_cache
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime import rpc

from infra.catalog.instances import get_instance_type
from infra.config import engine_config, load_stack_file
from infra.preview.recording import STACK_TYPE, Recording, record

REPO = Path(__file__).resolve().parent.parent
KEY_FIGURES = {
    "model", "instanceType", "nodes", "tensorParallel", "pipelineParallel", "kvCacheTokens",
    "maxConcurrency", "vllmArgs", "hourlyCostUsd", "monthlyCostUsd",
    "clusterName", "endpoint", "kubeconfig", "gpuNodeGroup", "plan",
    "imageRepository", "servingEndpoint", "servedModelName", "weightsFileSystemId",
    "slaCapacityConcurrency", "slaCapacityRequestsPerSecond", "predictedOutputTokensPerSecond",
    "predictedCostPerMillionTokensUsd",
    "apiTunnelCommand",  # both stacks reach the API through the SSM bastion (private-ssm, the default)
    "apiKey",  # the inference API's key (a secret)
    # The in-cluster monitoring (gpu-serving:monitoring, on by default): where Grafana and Prometheus are, how to
    # reach them, Grafana's admin password (a secret).
    "grafanaService", "grafanaPortForward", "grafanaAdminPassword", "prometheusService", "prometheusPortForward",
}  # fmt: skip


def _run(config: dict[str, str], stack: str, into: Recording | None = None) -> Recording:
    return record(lambda: runpy.run_path(str(REPO), run_name="__main__"), stack=stack, config=config, into=into)


@lru_cache(maxsize=None)
def _stack(stack: str) -> Recording:
    return _run(engine_config(stack, REPO), stack)


def _with(config: dict[str, str], area: str, **changes: Any) -> dict[str, str]:
    out = dict(config)
    value = json.loads(out.get(f"gpu-serving:{area}", "{}"))
    value.update(changes)
    out[f"gpu-serving:{area}"] = json.dumps(value)
    return out


def _inputs(rec: Recording, typ: str, name: str) -> dict:
    (found,) = [r for r in rec.resources if r.type == typ and r.name == name]
    return found.inputs


# --- What each stack file creates ------------------------------------------------


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_exports_the_plan_and_the_cluster(stack):
    rec = _stack(stack)
    assert set(rec.outputs) == KEY_FIGURES
    plan = rec.outputs["plan"]
    assert plan["feasible"] is True and plan["errors"] == []
    assert rec.outputs["nodes"] == plan["layout"]["nodes"]
    assert rec.outputs["vllmArgs"] == plan["vllm_args"]
    # What the plan predicts at the SLA capacity, as plain outputs a dashboard or a PR reads.
    capacity = plan["performance"]["sla_capacity"]
    assert rec.outputs["slaCapacityConcurrency"] == capacity["concurrency"] > 0
    assert rec.outputs["slaCapacityRequestsPerSecond"] == pytest.approx(capacity["requests_per_s"])
    assert rec.outputs["predictedOutputTokensPerSecond"] == pytest.approx(capacity["output_tokens_per_s"])
    per_mtok = plan["cost"]["usd_per_million_tokens"]
    assert rec.outputs["predictedCostPerMillionTokensUsd"] == pytest.approx(per_mtok.get("tco") or per_mtok["cloud"])  # None drops out
    assert rec.outputs["clusterName"] == f"gpu-serving-{stack}"
    # The kubeconfig leaves the program only as a secret (Pulumi's wire format marks
    # a secret with the special signature key and the secret signature).
    kubeconfig = rec.outputs["kubeconfig"]
    assert kubeconfig[rpc._special_sig_key] == rpc._special_secret_sig
    assert rec.outputs["apiKey"][rpc._special_sig_key] == rpc._special_secret_sig  # the inference API's key: a secret too
    assert "get-token" in kubeconfig["value"]


def test_prod_resource_types_and_names():
    rec = _stack("prod")
    names = {(r.type, r.name) for r in rec.resources}
    expected = {
        (STACK_TYPE, "gpu-serving-prod"),
        ("pulumi:providers:aws", "aws"),
        ("gpu-serving:network:Network", "gpu-serving-prod"),
        ("gpu-serving:cluster:EksCluster", "gpu-serving-prod"),
        ("gpu-serving:gpu:GpuNodeGroup", "gpu-serving-prod-gpu"),
        ("aws:ec2/vpc:Vpc", "gpu-serving-prod-vpc"),
        ("aws:ec2/placementGroup:PlacementGroup", "gpu-serving-prod-gpu"),
        ("aws:eks/cluster:Cluster", "gpu-serving-prod-eks"),
        ("aws:ec2/launchTemplate:LaunchTemplate", "gpu-serving-prod-gpu-lt"),
        ("aws:eks/nodeGroup:NodeGroup", "gpu-serving-prod-gpu-ng"),
        ("aws:eks/nodeGroup:NodeGroup", "gpu-serving-prod-system"),
        ("pulumi:providers:kubernetes", "gpu-serving-prod-k8s"),
    }
    assert expected <= names, expected - names
    # Three zones, each with a public and a private subnet, plus the GPU subnet;
    # one NAT gateway per zone in production.
    assert len(rec.of_type("aws:ec2/subnet:Subnet")) == 3 + 3 + 1
    assert len(rec.of_type("aws:ec2/natGateway:NatGateway")) == 3
    addons = {r.inputs["addonName"] for r in rec.of_type("aws:eks/addon:Addon")}
    assert addons == {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "aws-efs-csi-driver", "aws-ebs-csi-driver", "eks-node-monitoring-agent"}


def test_prod_gpu_nodes_follow_the_plan_and_the_catalog():
    rec = _stack("prod")
    plan = rec.outputs["plan"]
    itype = get_instance_type("p5.48xlarge")
    lt = _inputs(rec, "aws:ec2/launchTemplate:LaunchTemplate", "gpu-serving-prod-gpu-lt")
    ng = _inputs(rec, "aws:eks/nodeGroup:NodeGroup", "gpu-serving-prod-gpu-ng")

    assert lt["instanceType"] == plan["instance"]["type"] == "p5.48xlarge"
    scaling = ng["scalingConfig"]
    assert scaling["minSize"] == scaling["maxSize"] == scaling["desiredSize"] == plan["layout"]["nodes"] == 4
    assert ng["updateConfig"]["maxUnavailable"] == 1
    assert ng["amiType"] == "AL2023_x86_64_NVIDIA"
    assert ng["capacityType"] == "ON_DEMAND"
    assert ng["subnetIds"] == ["<id:gpu-serving-prod-gpu-us-east-1a>"]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"} in ng["taints"]
    assert ng["labels"]["gpu-serving/instance-type"] == "p5.48xlarge"
    assert ng["launchTemplate"]["id"] == "<id:gpu-serving-prod-gpu-lt>" and ng["launchTemplate"]["version"]

    # Every EFA interface the instance has (32 on p5), plus the primary interface.
    nics = lt["networkInterfaces"]
    efa = [n for n in nics if n["interfaceType"] in ("efa", "efa-only")]
    assert len(efa) == itype.max_efa_interfaces == 32
    assert {(n["networkCardIndex"], n["deviceIndex"]) for n in nics} == {(0, 0), (0, 1), *((c, 0) for c in range(1, 32))}
    assert all(set(n["securityGroups"]) == {"<id:gpu-serving-prod-efa>", "<cluster-sg:gpu-serving-prod-eks>"} for n in nics)
    assert "securityGroupIds" not in lt and "vpcSecurityGroupIds" not in lt  # per interface only

    assert lt["metadataOptions"]["httpTokens"] == "required"  # IMDSv2
    (root,) = lt["blockDeviceMappings"]
    assert root["ebs"]["volumeType"] == "gp3" and root["ebs"]["encrypted"] == "true"
    assert root["ebs"]["volumeSize"] == plan["node"]["root_volume_gib"]
    assert lt["placement"]["groupName"] == "gpu-serving-prod-gpu"


def test_prod_cluster_is_encrypted_private_and_protected():
    rec = _stack("prod")
    (cluster,) = rec.of_type("aws:eks/cluster:Cluster")
    inputs = cluster.inputs
    assert inputs["vpcConfig"]["endpointPrivateAccess"] is True
    assert inputs["vpcConfig"]["endpointPublicAccess"] is False  # no public CIDRs in prod
    assert inputs["encryptionConfig"]["resources"] == ["secrets"]
    assert inputs["accessConfig"]["authenticationMode"] == "API"
    assert sorted(inputs["enabledClusterLogTypes"]) == ["api", "audit", "authenticator", "controllerManager", "scheduler"]
    assert cluster.options["protect"] is True
    assert "bootstrapSelfManagedAddons" in cluster.options["ignore_changes"]
    key = rec.named("gpu-serving-prod-secrets")
    assert key.inputs["enableKeyRotation"] is True
    assert inputs["encryptionConfig"]["provider"]["keyArn"] == "<arn:gpu-serving-prod-secrets>"


@pytest.mark.parametrize("storage", ["efs", "fsx"])
def test_weights_audit_logs_and_flow_logs_use_the_stacks_keys(storage):
    """The weights' file system takes the stack's key; the config's retention and traffic type reach the logs."""
    config = engine_config("prod", REPO)
    if storage == "fsx":
        config = _with(_with(config, "storage", type="fsx"), "cluster", fsxCsi=True)
    config = _with(_with(config, "lifecycle", logRetentionDays=731), "network", flowLogTrafficType="ALL")
    rec = _run(config, "prod")
    fs = {"efs": "aws:efs/fileSystem:FileSystem", "fsx": "aws:fsx/lustreFileSystem:LustreFileSystem"}[storage]
    (weights,) = rec.of_type(fs)
    assert weights.inputs["kmsKeyId"] == "<arn:gpu-serving-prod-secrets>"
    groups = {r.name: r for r in rec.of_type("aws:cloudwatch/logGroup:LogGroup")}
    assert {n: g.inputs["retentionInDays"] for n, g in groups.items()} == {
        "gpu-serving-prod-control-plane-logs": 731, "gpu-serving-prod-flow-logs": 731}  # fmt: skip
    assert {n: g.inputs["kmsKeyId"] for n, g in groups.items()} == {
        "gpu-serving-prod-control-plane-logs": "<arn:gpu-serving-prod-secrets>",
        "gpu-serving-prod-flow-logs": "<arn:gpu-serving-prod-flow-logs-key>"}  # fmt: skip
    assert all(g.options["protect"] and g.options["retain_on_delete"] for g in groups.values())  # production
    assert rec.one("aws:ec2/flowLog:FlowLog").inputs["trafficType"] == "ALL"
    # The account comes from the provider's credentials (STS GetCallerIdentity), once.
    assert [t for t, _ in rec.calls].count("aws:index/getCallerIdentity:getCallerIdentity") == 1


def test_test_stack_keeps_nothing_after_destroy():
    rec = _stack("test")
    assert not [r.name for r in rec.resources if r.options["retain_on_delete"] and r.type.startswith("aws:")]
    assert {r.inputs["retentionInDays"] for r in rec.of_type("aws:cloudwatch/logGroup:LogGroup")} == {365}


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_the_serving_namespace_pins_pod_security_to_the_clusters_version(stack):
    """The Pod Security labels name the version the cluster runs, also when the config leaves it to the default
    (a version label is `latest` or a version such as `v1.35`: Kubernetes documentation, "Enforce Pod Security
    Standards by Configuring the Built-in Admission Controller")."""
    rec = _stack(stack)
    version = rec.one("aws:eks/cluster:Cluster").inputs["version"]
    (namespace,) = [r for r in rec.of_type("kubernetes:core/v1:Namespace") if r.name.endswith("-serving")]
    labels = namespace.inputs["metadata"]["labels"]
    assert {labels[f"pod-security.kubernetes.io/{m}-version"] for m in ("enforce", "warn", "audit")} == {f"v{version}"}


def test_every_aws_resource_uses_the_tagging_provider():
    rec = _stack("prod")
    provider = rec.one("pulumi:providers:aws")
    tags = json.loads(provider.inputs["defaultTags"])["tags"]
    assert tags == {"project": "gpu-serving", "stack": "prod", "owner": "ml-platform", "lifecycle": "production"}
    aws_resources = [r for r in rec.resources if r.custom and r.type.startswith("aws:")]
    assert aws_resources and all(r.options["provider"] == "aws" for r in aws_resources)


def test_test_stack_is_small_and_expires():
    rec = _stack("test")
    cfg = load_stack_file("test", REPO)
    tags = json.loads(rec.one("pulumi:providers:aws").inputs["defaultTags"])["tags"]
    assert tags["expires-at"] == cfg.lifecycle.expires_at
    ng = _inputs(rec, "aws:eks/nodeGroup:NodeGroup", "gpu-serving-test-gpu-ng")
    assert ng["scalingConfig"]["desiredSize"] == 1
    lt = _inputs(rec, "aws:ec2/launchTemplate:LaunchTemplate", "gpu-serving-test-gpu-lt")
    assert lt["instanceType"] == "g6e.xlarge"
    assert [n["interfaceType"] for n in lt["networkInterfaces"]] == ["interface"]  # no EFA on g6e.xlarge
    # Nothing in an ephemeral stack is protected.
    assert not any(r.options["protect"] for r in rec.resources)


def test_capacity_block_reaches_template_and_node_group():
    config = engine_config("prod", REPO)
    config = _with(config, "gpu", capacity={"type": "capacity-block", "reservationId": "cr-0123456789abcdef0"})
    rec = _run(config, "prod")
    key = hashlib.sha256(b"cr-0123456789abcdef0").hexdigest()[:8]  # the block's own node group and template
    lt = _inputs(rec, "aws:ec2/launchTemplate:LaunchTemplate", f"gpu-serving-prod-gpu-lt-{key}")
    ng = _inputs(rec, "aws:eks/nodeGroup:NodeGroup", f"gpu-serving-prod-gpu-ng-{key}")
    assert lt["instanceMarketOptions"]["marketType"] == "capacity-block"
    target = lt["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"
    assert ng["capacityType"] == "CAPACITY_BLOCK"
    # The block fixes placement: no placement group.
    assert not rec.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert "placement" not in lt or not lt["placement"].get("groupName")
    # A block made in a cluster placement group launches into that one (the stack creates none).
    rec = _run(_with(config, "network", placementGroupName="p5-blocks"), "prod")
    assert not rec.of_type("aws:ec2/placementGroup:PlacementGroup")
    lt = _inputs(rec, "aws:ec2/launchTemplate:LaunchTemplate", f"gpu-serving-prod-gpu-lt-{key}")
    assert lt["placement"] == {"groupName": "p5-blocks"}


# --- Mistakes stop the program before anything is created ----------------------------


def _refused(config: dict[str, str], *fragments: str) -> None:
    partial = Recording()
    with pytest.raises(pulumi.RunError) as info:
        _run(config, "prod", into=partial)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "Traceback" not in message and "pydantic" not in message.lower()
    assert info.value.__cause__ is None
    # Only the root stack reached the engine; nothing exported.
    assert [r.type for r in partial.resources] == [STACK_TYPE]
    assert partial.exports == {}


def test_infeasible_plan_stops_with_the_numbers():
    config = _with(engine_config("prod", REPO), "model", name="kimi-k3", weightFormat="fp8")
    _refused(config, "kimi-k3", "4 x p5.48xlarge", "no feasible plan", "TB")


def test_an_sla_no_layout_meets_stops_the_program_with_the_best_reachable():
    config = _with(engine_config("prod", REPO), "serving", sla={"ttftP99Ms": 250, "tpotP99Ms": 2})
    _refused(config, "no layout of 4 x p5.48xlarge meets the SLA", "TPOT p99 at concurrency 1 is", "> 2.0 ms",
             "the best it reaches: TTFT p99")  # fmt: skip


@pytest.mark.parametrize(
    "area, changes, expected",
    [
        ("serving", {"gpuMemoryUtilization": 1.2}, "gpu-serving:serving.gpuMemoryUtilization = 1.2 is out of range"),
        ("serving", {"maxModelLenn": 4096}, "unknown key gpu-serving:serving.maxModelLenn"),
        ("model", {"name": "no-such-model"}, "stack prod: unknown model 'no-such-model'"),
        ("gpu", {"instanceType": "p9.48xlarge"}, "gpu-serving:gpu.instanceType: unknown instance type"),
        ("gpu", {"capacity": {"type": "capacity-block"}}, "gpu-serving:gpu.capacity.reservationId"),
        ("network", {"gpuAvailabilityZone": ["us-east-1a", "us-east-1b"]}, "one availability zone"),
        ("serving", {"pipelineParallel": 8}, "gpu-serving:gpu.nodes"),
    ],
)
def test_config_mistake_stops_with_one_message(area, changes, expected):
    _refused(_with(engine_config("prod", REPO), area, **changes), expected)


# --- The Kubernetes layer follows the plan and the node group ------------------------


def _raycluster(rec: Recording) -> dict:
    (rc,) = rec.of_type("kubernetes:ray.io/v1:RayCluster")
    return rc.inputs


def _pods(rc: dict) -> list[tuple[dict, int]]:
    """(container of the pod template, number of such pods) for the head and each worker group."""
    spec = rc["spec"]
    groups = [(spec["headGroupSpec"]["template"], 1)]
    groups += [(g["template"], g["replicas"]) for g in spec.get("workerGroupSpecs", [])]
    return [(t["spec"]["containers"][0], n) for t, n in groups]


def _cross_layer(rec: Recording) -> dict:
    """The figures every layer must agree on, as each layer states them."""
    plan = rec.outputs["plan"]
    lt = next(r.inputs for r in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate") if "-gpu-lt" in r.name)
    ng = next(r.inputs for r in rec.of_type("aws:eks/nodeGroup:NodeGroup") if "-gpu-ng" in r.name)
    pods = _pods(_raycluster(rec))
    limits = [c["resources"]["limits"] for c, _ in pods]
    head = pods[0][0]
    command = " ".join(head.get("command", []) + head.get("args", []))
    return {
        "plan": plan,
        "launch_template_efa": sum(n["interfaceType"] in ("efa", "efa-only") for n in lt["networkInterfaces"]),
        "nodes": ng["scalingConfig"]["desiredSize"],
        "instance_type": lt["instanceType"],
        "pod_count": sum(n for _, n in pods),
        "gpus": {int(l["nvidia.com/gpu"]) for l in limits},
        "efa": {int(l.get("vpc.amazonaws.com/efa", 0)) for l in limits},
        "command": command,
    }


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_layers_agree(stack):
    x = _cross_layer(_stack(stack))
    plan, layout = x["plan"], x["plan"]["layout"]
    assert x["pod_count"] == x["nodes"] == layout["nodes"]  # one serving pod per GPU node
    assert x["gpus"] == {layout["gpus_per_node"]}
    assert x["pod_count"] * layout["gpus_per_node"] == layout["tp"] * layout["pp"] * layout["dp"]
    assert x["efa"] == {x["launch_template_efa"]} == {plan["pod"]["efa_interfaces"]}
    assert " ".join(plan["vllm_args"]) in x["command"]


def test_changing_model_and_instance_type_changes_every_figure():
    config = _with(engine_config("prod", REPO), "model", name="kimi-k3")
    config = _with(config, "gpu", instanceType="p5en.48xlarge")
    x = _cross_layer(_run(config, "prod"))
    base = _cross_layer(_stack("prod"))
    assert x["instance_type"] == "p5en.48xlarge" != base["instance_type"]
    assert x["launch_template_efa"] == 16 != base["launch_template_efa"]  # p5en: 16 EFA cards
    assert x["efa"] == {16}
    assert x["plan"]["model"]["name"] == "kimi-k3"
    assert x["plan"]["vllm_args"] != base["plan"]["vllm_args"] or x["plan"]["kv_cache"] != base["plan"]["kv_cache"]
    assert " ".join(x["plan"]["vllm_args"]) in x["command"]
    assert "moonshotai/Kimi-K3" in x["command"]


# --- Pinned inputs (issue 19 item 6) ---------------------------------------------------


def test_prod_runs_the_pushed_serving_image_by_digest_and_stages_the_pinned_commit():
    from infra.catalog.models import CATALOG
    from infra.k8s.serving_image import serving_image_tag

    rec = _stack("prod")
    tag = serving_image_tag("0.34.0", "2.60.0")
    # The digest is the one ECR reports for the tag bin/build-image pushed, asked for by that tag.
    asked = [args for token, args in rec.calls if token == "aws:ecr/getImage:getImage"]
    assert asked == [{"imageTag": tag, "repositoryName": "gpu-serving-prod/vllm"}]
    images = {c["image"] for c, _ in _pods(_raycluster(rec))}
    assert images == {f"123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving-prod/vllm:{tag}@sha256:{'0' * 64}"}
    # The staging Job downloads every file from the catalog's pinned commit of DeepSeek-V4-Pro.
    (job,) = [r for r in rec.of_type("kubernetes:batch/v1:Job") if "staging" in r.name]
    assert f"hf://deepseek-ai/DeepSeek-V4-Pro@{CATALOG['deepseek-v4-pro'].revision}" in json.dumps(job.inputs)


def test_prod_refuses_a_serving_image_by_tag_alone():
    config = _with(engine_config("prod", REPO), "serving", image="123456789012.dkr.ecr.us-east-1.amazonaws.com/vllm:0.34.0")
    _refused(config, "gpu-serving:serving.image", "by tag alone", "@sha256:<digest>")


def test_a_serving_image_given_by_digest_runs_as_given():
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/vllm:0.34.0@sha256:" + "ab" * 32
    rec = _run(_with(engine_config("prod", REPO), "serving", image=image), "prod")
    assert {c["image"] for c, _ in _pods(_raycluster(rec))} == {image}
    assert not [token for token, _ in rec.calls if token == "aws:ecr/getImage:getImage"]
