"""Every AWS enum value the stack sends is one the AWS API accepts.

The whole program is synthesised for each stack file (and for a Capacity Block
variant of prod), and each field below is checked, wherever it occurs, against
the enum in botocore's service model for EC2 or EKS: the same data the AWS CLI
and SDKs validate against.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import botocore.session
import pytest

from infra.preview.synth import synthesize
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent

# resource type -> [(dotted input path, "[]" walks a list), service, enum shape]
ENUM_FIELDS: dict[str, list[tuple[str, str, str]]] = {
    "aws:eks/nodeGroup:NodeGroup": [
        ("amiType", "eks", "AMITypes"),
        ("capacityType", "eks", "CapacityTypes"),
        ("instanceTypes[]", "ec2", "InstanceType"),
        ("taints[].effect", "eks", "TaintEffect"),
        ("updateConfig.updateStrategy", "eks", "NodegroupUpdateStrategies"),
    ],
    "aws:eks/cluster:Cluster": [
        ("accessConfig.authenticationMode", "eks", "AuthenticationMode"),
        ("enabledClusterLogTypes[]", "eks", "LogType"),
    ],
    "aws:ec2/launchTemplate:LaunchTemplate": [
        ("instanceType", "ec2", "InstanceType"),
        ("blockDeviceMappings[].ebs.volumeType", "ec2", "VolumeType"),
        ("instanceMarketOptions.marketType", "ec2", "MarketType"),
        ("metadataOptions.httpTokens", "ec2", "LaunchTemplateHttpTokensState"),
        ("metadataOptions.httpEndpoint", "ec2", "LaunchTemplateInstanceMetadataEndpointState"),
        ("networkInterfaces[].interfaceType", "ec2", "NetworkCardInterfaceType"),
        ("tagSpecifications[].resourceType", "ec2", "ResourceType"),
    ],
    "aws:ec2/placementGroup:PlacementGroup": [("strategy", "ec2", "PlacementStrategy")],
    "aws:ec2/vpcEndpoint:VpcEndpoint": [("vpcEndpointType", "ec2", "VpcEndpointType")],
    "aws:ec2/eip:Eip": [("domain", "ec2", "DomainType")],
    "aws:ec2/flowLog:FlowLog": [("trafficType", "ec2", "TrafficType"), ("logDestinationType", "ec2", "LogDestinationType")],
}

# Fields every stack must send (a value missing here would pass the check vacuously).
REQUIRED = {
    ("aws:eks/nodeGroup:NodeGroup", "amiType"),
    ("aws:eks/nodeGroup:NodeGroup", "capacityType"),
    ("aws:eks/cluster:Cluster", "accessConfig.authenticationMode"),
    ("aws:ec2/launchTemplate:LaunchTemplate", "instanceType"),
    ("aws:ec2/launchTemplate:LaunchTemplate", "blockDeviceMappings[].ebs.volumeType"),
    ("aws:ec2/launchTemplate:LaunchTemplate", "metadataOptions.httpTokens"),
    ("aws:ec2/launchTemplate:LaunchTemplate", "networkInterfaces[].interfaceType"),
    ("aws:eks/cluster:Cluster", "enabledClusterLogTypes[]"),
    ("aws:ec2/flowLog:FlowLog", "trafficType"),
    ("aws:ec2/flowLog:FlowLog", "logDestinationType"),
}


@lru_cache(maxsize=None)
def _enum(service: str, shape: str) -> frozenset[str]:
    return frozenset(botocore.session.get_session().get_service_model(service).shape_for(shape).enum)


def _values(obj, path: str) -> list:
    """Every value at a dotted path; `name[]` walks the list under `name`."""
    items = [obj]
    for part in path.split("."):
        nxt = []
        for item in items:
            if not isinstance(item, dict):
                continue
            key, walk = (part[:-2], True) if part.endswith("[]") else (part, False)
            value = item.get(key)
            if value is None:
                continue
            nxt.extend(value if walk and isinstance(value, list) else [value])
        items = nxt
    return items


def _capacity_block_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cb")
    for f in REPO.iterdir():
        if f.name in ("venv", ".git") or f.name.startswith("Pulumi."):
            continue
        (root / f.name).symlink_to(f)
    (root / "Pulumi.yaml").symlink_to(REPO / "Pulumi.yaml")
    text = (REPO / "Pulumi.prod.yaml").read_text()
    text = text.replace("      type: on-demand", "      type: capacity-block\n      reservationId: cr-0123456789abcdef0")
    (root / "Pulumi.prod.yaml").write_text(text)
    return root


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, dict]:
    docs = {stack: repo_stack(stack) for stack in ("prod", "test")}
    docs["prod-capacity-block"] = synthesize("prod", _capacity_block_repo(tmp_path_factory))
    return docs


def test_capacity_block_variant_really_is_one(documents):
    doc = documents["prod-capacity-block"]
    groups = [r for r in doc["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup" and "-gpu-ng-" in r["name"]]
    assert [g["inputs"]["capacityType"] for g in groups] == ["CAPACITY_BLOCK"]


@pytest.mark.parametrize("variant", ["prod", "test", "prod-capacity-block"])
def test_enum_values_are_in_botocore(documents, variant):
    seen = set()
    bad = []
    for res in documents[variant]["resources"]:
        for path, service, shape in ENUM_FIELDS.get(res["type"], []):
            for value in _values(res["inputs"], path):
                seen.add((res["type"], path))
                if value not in _enum(service, shape):
                    bad.append(f"{res['name']}: {path} = {json.dumps(value)} is not in {service} {shape}")
    assert not bad, "\n".join(bad)
    assert REQUIRED <= seen, REQUIRED - seen


def test_the_config_offers_only_what_cloudwatch_and_ec2_accept():
    """The config's retention days and flow-log traffic types (infra/catalog/cloudwatch.py) against botocore."""
    from infra.catalog.cloudwatch import FLOW_LOG_TRAFFIC_TYPES, LOG_RETENTION_DAYS, NEVER_EXPIRE

    assert set(FLOW_LOG_TRAFFIC_TYPES) <= _enum("ec2", "TrafficType")
    # The logs model has no enum for Days; its documentation lists the values ("Possible values are: 1, 3, ...").
    doc = botocore.session.get_session().get_service_model("logs").shape_for("Days").documentation
    listed = {int(n) for n in re.findall(r"\d+", doc.split("Possible values are:")[1].split(".")[0])}
    assert set(LOG_RETENTION_DAYS) - {NEVER_EXPIRE} == listed
