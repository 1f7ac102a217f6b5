"""infra/aws/gpu_nodes.py against EC2's own data (moto's copy of DescribeInstanceTypes) and botocore's models."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import botocore.session
import pytest
from moto.utilities.utils import load_resource

from components import gpu_nodes
from infra.aws import launch_template
from infra.aws.tags import TAGGED_RESOURCE_TYPES
from infra.aws import gpu_nodes as efa
from infra.catalog import eks
from infra.catalog.capacity import CAPACITY_KINDS
from infra.catalog.instances import INSTANCE_TYPES, get_instance_type
from infra.k8s import scheduling

EC2_TYPES = load_resource("ec2/resources/instance_types.json")
SESSION = botocore.session.get_session()
EC2 = SESSION.get_service_model("ec2")
EKS = SESSION.get_service_model("eks")

GPU_TYPES = sorted(name for name, itype in INSTANCE_TYPES.items() if itype.gpu_count >= 1)
SGS = ["sg-efa", "sg-cluster"]


def network_info(name: str) -> dict:
    return EC2_TYPES[name]["NetworkInfo"]


def moto_efa_count(name: str) -> int:
    return network_info(name).get("EfaInfo", {}).get("MaximumEfaInterfaces", 0)


def test_the_catalog_has_gpu_types_with_and_without_efa() -> None:
    # Guards the parametrised tests below from silently testing nothing.
    assert {"p4d.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"} <= set(GPU_TYPES)
    assert any(moto_efa_count(n) == 0 for n in GPU_TYPES)


@pytest.mark.parametrize("name", GPU_TYPES)
def test_one_interface_per_efa_device_ec2_reports(name: str) -> None:
    interfaces = efa.efa_interfaces(get_instance_type(name), SGS)
    kinds = Counter(i["interface_type"] for i in interfaces)
    assert efa.efa_interface_count(interfaces) == moto_efa_count(name)
    assert kinds[efa.EFA_ONLY] == moto_efa_count(name)
    # The layout: one IP-bearing primary interface; every EFA device is efa-only.
    assert kinds[efa.INTERFACE] == 1 and kinds[efa.EFA] == 0
    assert len(interfaces) == moto_efa_count(name) + 1



@pytest.mark.parametrize("name", GPU_TYPES)
def test_interfaces_fit_the_cards_ec2_reports(name: str) -> None:
    info = network_info(name)
    cards = {c["NetworkCardIndex"]: c for c in info["NetworkCards"]}
    interfaces = efa.efa_interfaces(get_instance_type(name), SGS)

    slots = [(i["network_card_index"], i["device_index"]) for i in interfaces]
    assert len(set(slots)) == len(slots), f"two interfaces share a card/device slot: {slots}"
    assert len(interfaces) <= info["MaximumNetworkInterfaces"]
    per_card = Counter(card for card, _ in slots)
    for card, count in per_card.items():
        assert 0 <= card < info["MaximumNetworkCards"]
        assert count <= cards[card]["MaximumNetworkInterfaces"], (name, card, count)
    for i in interfaces:
        assert i["interface_type"] in cards[i["network_card_index"]]["InterfaceTypes"], (name, i)
    # Each EFA device sits on its own card (EC2 reports one EFA per card on every catalog type).
    efa_cards = [i["network_card_index"] for i in interfaces if i["interface_type"] == efa.EFA_ONLY]
    assert len(efa_cards) == len(set(efa_cards))


@pytest.mark.parametrize("name", GPU_TYPES)
def test_the_primary_interface_is_the_one_normal_interface_on_card_0_device_0(name: str) -> None:
    interfaces = efa.efa_interfaces(get_instance_type(name), SGS)
    primary = [i for i in interfaces if (i["network_card_index"], i["device_index"]) == (0, 0)]
    assert len(primary) == 1
    assert primary[0]["interface_type"] == efa.INTERFACE
    assert interfaces[0] is primary[0]


@pytest.mark.parametrize("name", GPU_TYPES)
def test_every_interface_carries_the_security_groups(name: str) -> None:
    for i in efa.efa_interfaces(get_instance_type(name), SGS):
        assert i["security_groups"] == SGS
        assert i["delete_on_termination"] is True


def test_p5_layout_in_full() -> None:
    interfaces = efa.efa_interfaces(get_instance_type("p5.48xlarge"), SGS)
    slots = {(i["network_card_index"], i["device_index"]): i["interface_type"] for i in interfaces}
    expected = {(0, 0): "interface", (0, 1): "efa-only", **{(c, 0): "efa-only" for c in range(1, 32)}}
    assert slots == expected
    assert efa.efa_interface_count(interfaces) == 32


def test_more_efa_interfaces_than_cards_still_get_their_own_slots() -> None:
    # No catalog type does this today; the layout must still hold if one ever does.
    p4d = get_instance_type("p4d.24xlarge")
    wide = dataclasses.replace(p4d, max_efa_interfaces=9)
    interfaces = efa.efa_interfaces(wide, SGS)
    slots = [(i["network_card_index"], i["device_index"]) for i in interfaces]
    assert len(set(slots)) == len(slots) == 10
    assert efa.efa_interface_count(interfaces) == 9
    assert max(c for c, _ in slots) == 3
    per_card = Counter(c for c, _ in slots)
    assert per_card == {0: 4, 1: 2, 2: 2, 3: 2}  # card 0 also holds the primary ENI


def test_no_security_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="security groups"):
        efa.efa_interfaces(get_instance_type("p5.48xlarge"), [])


# --- capacity ---------------------------------------------------------------------------------------


def test_on_demand_capacity() -> None:
    c = efa.capacity_settings("on-demand", None)
    assert c.node_group_capacity_type == "ON_DEMAND"
    assert c.instance_market_options is None
    assert c.capacity_reservation_specification is None


def test_capacity_reservation() -> None:
    c = efa.capacity_settings("capacity-reservation", "cr-0123456789abcdef0")
    assert c.node_group_capacity_type == "ON_DEMAND"
    assert c.instance_market_options is None
    assert c.capacity_reservation_specification == {
        "capacity_reservation_target": {"capacity_reservation_id": "cr-0123456789abcdef0"}
    }


def test_capacity_block() -> None:
    c = efa.capacity_settings("capacity-block", "cr-0123456789abcdef0")
    assert c.node_group_capacity_type == "CAPACITY_BLOCK"
    assert c.instance_market_options == {"market_type": "capacity-block"}
    assert c.capacity_reservation_specification == {
        "capacity_reservation_target": {"capacity_reservation_id": "cr-0123456789abcdef0"}
    }


@pytest.mark.parametrize("kind", ["capacity-reservation", "capacity-block"])
@pytest.mark.parametrize("missing", [None, ""])
def test_a_reservation_without_an_id_is_refused(kind: str, missing) -> None:
    with pytest.raises(ValueError, match=f"kind '{kind}' needs a reservation_id"):
        efa.capacity_settings(kind, missing)


def test_an_id_with_on_demand_is_refused() -> None:
    with pytest.raises(ValueError, match="reservation_id 'cr-0123456789abcdef0' given with kind 'on-demand'"):
        efa.capacity_settings("on-demand", "cr-0123456789abcdef0")


def test_an_unknown_capacity_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown kind 'spot'"):
        efa.capacity_settings("spot", None)


# --- update policy, taints, labels ------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2, 4, 16])
def test_never_more_than_one_gpu_node_away(nodes: int) -> None:
    assert efa.update_config(nodes)["max_unavailable"] == 1
    assert "max_unavailable_percentage" not in efa.update_config(nodes)


def test_update_strategy_follows_capacity() -> None:
    assert efa.update_config(4, "on-demand")["update_strategy"] == "DEFAULT"
    assert efa.update_config(4, "capacity-reservation")["update_strategy"] == "MINIMAL"
    assert efa.update_config(4, "capacity-block")["update_strategy"] == "MINIMAL"


def test_zero_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="node_count"):
        efa.update_config(0)


LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@pytest.mark.parametrize("name", GPU_TYPES)
def test_gpu_labels_are_valid_kubernetes_labels(name: str) -> None:
    labels = scheduling.gpu_labels(get_instance_type(name))
    assert labels[scheduling.ROLE_LABEL] == "gpu"
    assert labels[scheduling.INSTANCE_TYPE_LABEL] == name
    assert labels[scheduling.EFA_LABEL] == str(moto_efa_count(name))
    for key, value in labels.items():
        prefix, _, label = key.rpartition("/")
        assert DNS_SUBDOMAIN.match(prefix) and len(prefix) <= 253, key
        assert LABEL_NAME.match(label), key
        assert LABEL_NAME.match(value), value
        # kubernetes.io / k8s.io prefixes are reserved for Kubernetes itself.
        assert not prefix.endswith(("kubernetes.io", "k8s.io")), key


def test_root_device_per_ami_family() -> None:
    # Bottlerocket keeps container images on its data volume, AL2023 on the root volume.
    devices = {ami_type: efa.root_device_name(ami_type) for ami_type in eks.GPU_AMI_TYPES}
    assert devices == {
        "AL2023_x86_64_NVIDIA": "/dev/xvda",
        "AL2023_ARM_64_NVIDIA": "/dev/xvda",
        "BOTTLEROCKET_x86_64_NVIDIA": "/dev/xvdb",
        "BOTTLEROCKET_ARM_64_NVIDIA": "/dev/xvdb",
    }


# --- every enum value sent is one AWS knows ----------------------------------------------------------


def launch_template_member(*path: str):
    """The botocore shape at `path` under CreateLaunchTemplate's RequestLaunchTemplateData."""
    shape = EC2.shape_for("RequestLaunchTemplateData")
    for part in path:
        shape = shape.member if part == "[]" else shape.members[part]
    return shape


def test_ec2_enums() -> None:
    assert gpu_nodes.ROOT_VOLUME_TYPE in launch_template_member("BlockDeviceMappings", "[]", "Ebs", "VolumeType").enum
    assert efa.MARKET_CAPACITY_BLOCK in launch_template_member("InstanceMarketOptions", "MarketType").enum
    assert launch_template.IMDS_TOKENS in launch_template_member("MetadataOptions", "HttpTokens").enum
    assert launch_template.IMDS_ENDPOINT in launch_template_member("MetadataOptions", "HttpEndpoint").enum
    resource_types = launch_template_member("TagSpecifications", "[]", "ResourceType").enum
    assert set(TAGGED_RESOURCE_TYPES) <= set(resource_types)
    # The template's InterfaceType is a free string in the API; the enum of what a card accepts
    # (DescribeInstanceTypes NetworkCards[].InterfaceTypes) is NetworkCardInterfaceType.
    assert launch_template_member("NetworkInterfaces", "[]", "InterfaceType").type_name == "string"
    card_types = EC2.shape_for("NetworkCardInterfaceType").enum
    sent = {i["interface_type"] for n in GPU_TYPES for i in efa.efa_interfaces(get_instance_type(n), SGS)}
    assert sent == {efa.INTERFACE, efa.EFA_ONLY}
    assert {efa.INTERFACE, efa.EFA, efa.EFA_ONLY} <= set(card_types)
    # The template's instance type (the catalog name) is one EC2 knows.
    assert set(GPU_TYPES) <= set(launch_template_member("InstanceType").enum)


def test_gpu_ami_types_are_the_nvidia_ones_eks_knows() -> None:
    ami_types = set(EKS.shape_for("AMITypes").enum)
    assert set(eks.GPU_AMI_TYPES) == {t for t in ami_types if t.endswith("_NVIDIA")}
    assert eks.DEFAULT_GPU_AMI_TYPE in eks.GPU_AMI_TYPES
    assert set(eks.GPU_AMI_TYPES.values()) <= set(EC2.shape_for("ArchitectureType").enum)
    assert {eks.ami_family(t) for t in ami_types} >= {eks.BOTTLEROCKET}


def test_eks_enums() -> None:
    capacity_types = EKS.shape_for("CapacityTypes").enum
    for kind, rid in [("on-demand", None), ("capacity-reservation", "cr-1"), ("capacity-block", "cr-1")]:
        assert efa.capacity_settings(kind, rid).node_group_capacity_type in capacity_types
    assert scheduling.gpu_taints()[0]["effect"] in EKS.shape_for("TaintEffect").enum
    strategies = EKS.shape_for("NodegroupUpdateStrategies").enum
    for kind in CAPACITY_KINDS:
        assert efa.update_config(4, kind)["update_strategy"] in strategies
