"""components/gpu_nodes.py under the recording engine: what reaches the launch template and node group.

The mocks turn integers into floats, so numbers are compared numerically.
"""

from __future__ import annotations

from typing import Any

import botocore.session
import pulumi
import pytest
from moto.utilities.utils import load_resource

from components.gpu_nodes import TYPE, GpuNodeGroup, GpuNodeGroupArgs
from infra.preview import recording
from infra.catalog.instances import INSTANCE_TYPES, get_instance_type
from infra.preview.recording import Recording, record

LT = "aws:ec2/launchTemplate:LaunchTemplate"
NG = "aws:eks/nodeGroup:NodeGroup"
SGS = ["sg-efa", "sg-cluster"]
RESERVATION = "cr-0123456789abcdef0"

EC2_TYPES = load_resource("ec2/resources/instance_types.json")
SESSION = botocore.session.get_session()
EC2 = SESSION.get_service_model("ec2")
EKS = SESSION.get_service_model("eks")


@pytest.fixture(autouse=True)
def computed_outputs(monkeypatch):
    """What EC2 and EKS would compute and the component reads: the template's version, the group's name."""
    monkeypatch.setitem(recording.COMPUTED_OUTPUTS, LT, lambda name, inputs: {"latestVersion": 1})
    monkeypatch.setitem(recording.COMPUTED_OUTPUTS, NG, lambda name, inputs: {"nodeGroupName": f"{name}-name"})


def args(instance: str = "p5.48xlarge", **overrides: Any) -> GpuNodeGroupArgs:
    base = dict(
        cluster_name="gpu-serving-prod",
        node_role_arn="arn:aws:iam::123456789012:role/gpu-node",
        subnet_id="subnet-gpu",
        security_group_ids=SGS,
        instance_type=get_instance_type(instance),
        node_count=4,
        root_volume_gib=600,
    )
    base.update(overrides)
    return GpuNodeGroupArgs(**base)


def run(a: GpuNodeGroupArgs) -> tuple[Recording, dict]:
    """Record the component; also return its attributes and resolved outputs."""
    seen: dict = {}

    def program() -> None:
        group = GpuNodeGroup("gpu", a)
        seen["efa_interface_count"] = group.efa_interface_count
        pulumi.Output.all(group.node_group_name, group.launch_template_id).apply(
            lambda v: seen.update(node_group_name=v[0], launch_template_id=v[1])
        )

    return record(program), seen


def refused(a: GpuNodeGroupArgs) -> tuple[Recording, ValueError | None]:
    """Record a program that builds the component and keeps the ValueError it raises."""
    caught: dict = {}

    def program() -> None:
        try:
            GpuNodeGroup("gpu", a)
        except ValueError as e:
            caught["error"] = e

    return record(program), caught.get("error")


def lt_of(rec: Recording) -> dict:
    return rec.one(LT).inputs


def ng_of(rec: Recording) -> dict:
    return rec.one(NG).inputs


# --- structure ----------------------------------------------------------------------------------------


def test_one_launch_template_and_one_node_group_inside_the_component() -> None:
    rec, seen = run(args())
    component = rec.one(TYPE)
    assert component.name == "gpu"
    assert [r.type for r in rec.resources if r.type != recording.STACK_TYPE] == [TYPE, LT, NG]
    assert rec.one(LT).parent == component.urn
    assert rec.one(NG).parent == component.urn
    assert rec.one(LT).name == "gpu-lt" and rec.one(NG).name == "gpu-ng"


def test_node_group_uses_the_templates_id_and_latest_version() -> None:
    rec, seen = run(args())
    template = ng_of(rec)["launchTemplate"]
    assert template == {"id": recording.placeholder("id", "gpu-lt"), "version": "1"}
    assert rec.one(LT).urn in rec.one(NG).options["depends_on"]


def test_outputs() -> None:
    rec, seen = run(args())
    assert seen["efa_interface_count"] == 32
    assert seen["launch_template_id"] == recording.placeholder("id", "gpu-lt")
    assert seen["node_group_name"] == "gpu-ng-name"


def test_nothing_is_ignored_or_protected() -> None:
    rec, _ = run(args(capacity_kind="capacity-block", reservation_id=RESERVATION))
    for r in (rec.one(LT), rec.one(NG)):
        assert r.options["ignore_changes"] == [], r.name
        assert r.options["protect"] is False


# --- network interfaces -------------------------------------------------------------------------------


def efa_interfaces_of(lt: dict) -> list[dict]:
    return [i for i in lt["networkInterfaces"] if i["interfaceType"] in ("efa", "efa-only")]


def test_p5_template_has_32_efa_interfaces_and_one_primary() -> None:
    rec, _ = run(args("p5.48xlarge"))
    nics = lt_of(rec)["networkInterfaces"]
    assert len(efa_interfaces_of(lt_of(rec))) == 32
    assert len(nics) == 33
    primary = [i for i in nics if (i["networkCardIndex"], i["deviceIndex"]) == (0, 0)]
    assert len(primary) == 1 and primary[0]["interfaceType"] == "interface"
    assert sorted(i["networkCardIndex"] for i in efa_interfaces_of(lt_of(rec))) == list(range(32))


def test_p4d_template_has_4_efa_interfaces() -> None:
    rec, _ = run(args("p4d.24xlarge"))
    assert len(efa_interfaces_of(lt_of(rec))) == 4
    assert len(lt_of(rec)["networkInterfaces"]) == 5


@pytest.mark.parametrize(
    "name", sorted(n for n, t in INSTANCE_TYPES.items() if t.max_efa_interfaces > 0)
)
def test_efa_count_and_card_limits_match_ec2(name: str) -> None:
    rec, seen = run(args(name, node_count=2))
    info = EC2_TYPES[name]["NetworkInfo"]
    nics = lt_of(rec)["networkInterfaces"]
    assert len(efa_interfaces_of(lt_of(rec))) == info["EfaInfo"]["MaximumEfaInterfaces"] == seen["efa_interface_count"]
    limits = {c["NetworkCardIndex"]: c["MaximumNetworkInterfaces"] for c in info["NetworkCards"]}
    for card in {int(i["networkCardIndex"]) for i in nics}:
        assert sum(1 for i in nics if int(i["networkCardIndex"]) == card) <= limits[card]


def test_every_interface_carries_the_security_groups_and_no_subnet() -> None:
    rec, _ = run(args())
    for nic in lt_of(rec)["networkInterfaces"]:
        assert nic["securityGroups"] == SGS
        assert nic["deleteOnTermination"] == "true"
        assert "subnetId" not in nic
        assert "associatePublicIpAddress" not in nic


def test_template_top_level_has_no_subnet_security_groups_image_or_profile() -> None:
    rec, _ = run(args())
    lt = lt_of(rec)
    for key in ("vpcSecurityGroupIds", "securityGroupNames", "imageId", "iamInstanceProfile",
                "instanceInitiatedShutdownBehavior", "subnetId"):
        assert key not in lt, key
    # Bottlerocket takes no nodeadm user data (AL2023 gets the RAID0 NodeConfig: test_node_disks.py).
    assert "userData" not in lt_of(run(args(ami_type="BOTTLEROCKET_x86_64_NVIDIA"))[0])


def test_instance_type_is_set_on_the_template_only() -> None:
    rec, _ = run(args("p5en.48xlarge"))
    assert lt_of(rec)["instanceType"] == "p5en.48xlarge"
    assert "instanceTypes" not in ng_of(rec)


# --- IMDS and disk ------------------------------------------------------------------------------------


def test_imdsv2_required() -> None:
    rec, _ = run(args())
    metadata = lt_of(rec)["metadataOptions"]
    assert metadata["httpTokens"] == "required"
    assert metadata["httpEndpoint"] == "enabled"
    assert metadata["httpPutResponseHopLimit"] == 1


def test_hop_limit_2_when_asked() -> None:
    rec, _ = run(args(imds_hop_limit=2))
    assert lt_of(rec)["metadataOptions"]["httpPutResponseHopLimit"] == 2


@pytest.mark.parametrize("size", [200, 1200])
def test_encrypted_gp3_root_volume_of_the_given_size(size: int) -> None:
    rec, _ = run(args(root_volume_gib=size))
    [mapping] = lt_of(rec)["blockDeviceMappings"]
    assert mapping["deviceName"] == "/dev/xvda"
    ebs = mapping["ebs"]
    assert ebs["volumeType"] == "gp3"
    assert ebs["encrypted"] == "true"
    assert ebs["deleteOnTermination"] == "true"
    assert ebs["volumeSize"] == size


def test_bottlerocket_sizes_its_data_volume() -> None:
    rec, _ = run(args(ami_type="BOTTLEROCKET_x86_64_NVIDIA"))
    [mapping] = lt_of(rec)["blockDeviceMappings"]
    assert mapping["deviceName"] == "/dev/xvdb"
    assert ng_of(rec)["amiType"] == "BOTTLEROCKET_x86_64_NVIDIA"


def test_instances_volumes_and_interfaces_are_named() -> None:
    rec, _ = run(args(tags={"team": "ml"}))
    specs = {s["resourceType"]: s["tags"] for s in lt_of(rec)["tagSpecifications"]}
    assert set(specs) == {"instance", "volume", "network-interface"}
    for tags in specs.values():
        assert tags == {"Name": "gpu", "team": "ml"}  # the component's name


# --- capacity -----------------------------------------------------------------------------------------


def test_capacity_block_in_template_and_node_group() -> None:
    rec, _ = run(args(capacity_kind="capacity-block", reservation_id=RESERVATION))
    lt, ng = lt_of(rec), ng_of(rec)
    assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt["capacityReservationSpecification"] == {"capacityReservationTarget": {"capacityReservationId": RESERVATION}}
    assert ng["capacityType"] == "CAPACITY_BLOCK"
    assert ng["updateConfig"]["updateStrategy"] == "MINIMAL"


def test_capacity_reservation_targets_the_reservation_on_demand() -> None:
    rec, _ = run(args(capacity_kind="capacity-reservation", reservation_id=RESERVATION))
    lt, ng = lt_of(rec), ng_of(rec)
    assert "instanceMarketOptions" not in lt
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] == RESERVATION
    assert ng["capacityType"] == "ON_DEMAND"


def test_on_demand_has_no_market_options_or_reservation() -> None:
    rec, _ = run(args())
    lt, ng = lt_of(rec), ng_of(rec)
    assert "instanceMarketOptions" not in lt
    assert "capacityReservationSpecification" not in lt
    assert ng["capacityType"] == "ON_DEMAND"
    assert ng["updateConfig"]["updateStrategy"] == "DEFAULT"


@pytest.mark.parametrize("kind", ["capacity-block", "capacity-reservation"])
def test_a_reservation_without_id_fails_before_anything_is_registered(kind: str) -> None:
    rec, error = refused(args(capacity_kind=kind, reservation_id=None))
    assert error is not None and "reservation_id" in str(error)
    assert [r.type for r in rec.resources] == [recording.STACK_TYPE]


def test_a_capacity_block_made_in_a_placement_group_launches_into_it() -> None:
    # EC2 User Guide, "Use Capacity Reservations with cluster placement groups": the instances name the
    # reservation and the placement group it was made in.
    rec, _ = run(args(capacity_kind="capacity-block", reservation_id=RESERVATION, placement_group_name="blocks-pg"))
    lt = lt_of(rec)
    assert lt["placement"] == {"groupName": "blocks-pg"}
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] == RESERVATION


def test_a_non_gpu_ami_type_is_refused() -> None:
    rec, error = refused(args(ami_type="AL2023_x86_64_STANDARD"))
    assert error is not None and "ami_type 'AL2023_x86_64_STANDARD'" in str(error)
    assert [r.type for r in rec.resources] == [recording.STACK_TYPE]


def test_placement_group_only_when_given() -> None:
    rec, _ = run(args(placement_group_name="gpu-serving-prod-efa"))
    assert lt_of(rec)["placement"] == {"groupName": "gpu-serving-prod-efa"}
    rec, _ = run(args())
    assert "placement" not in lt_of(rec)


# --- node group ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 4])
def test_scaling_sizes_are_the_node_count(nodes: int) -> None:
    rec, _ = run(args(node_count=nodes))
    assert ng_of(rec)["scalingConfig"] == {"minSize": nodes, "maxSize": nodes, "desiredSize": nodes}


def test_at_most_one_node_unavailable() -> None:
    rec, _ = run(args())
    update = ng_of(rec)["updateConfig"]
    assert update["maxUnavailable"] == 1
    assert "maxUnavailablePercentage" not in update


def test_node_group_wiring() -> None:
    rec, _ = run(args(kubernetes_version="1.33"))
    ng = ng_of(rec)
    assert ng["clusterName"] == "gpu-serving-prod"
    assert ng["nodeRoleArn"] == "arn:aws:iam::123456789012:role/gpu-node"
    assert ng["subnetIds"] == ["subnet-gpu"]
    assert ng["amiType"] == "AL2023_x86_64_NVIDIA"
    assert ng["version"] == "1.33"
    assert "diskSize" not in ng and "remoteAccess" not in ng


def test_gpu_taint_and_labels() -> None:
    rec, _ = run(args("p5.48xlarge"))
    ng = ng_of(rec)
    assert ng["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert ng["labels"]["gpu-serving/role"] == "gpu"
    assert ng["labels"]["gpu-serving/instance-type"] == "p5.48xlarge"
    assert ng["labels"]["gpu-serving/efa-interfaces"] == "32"


# --- what was sent is what AWS accepts -----------------------------------------------------------------


@pytest.mark.parametrize("kind,rid", [("on-demand", None), ("capacity-reservation", RESERVATION), ("capacity-block", RESERVATION)])
def test_recorded_enum_values_are_in_botocore(kind: str, rid: str | None) -> None:
    rec, _ = run(args(capacity_kind=kind, reservation_id=rid))
    lt, ng = lt_of(rec), ng_of(rec)
    enum = lambda model, shape: set(model.shape_for(shape).enum)  # noqa: E731
    assert ng["amiType"] in enum(EKS, "AMITypes")
    assert ng["capacityType"] in enum(EKS, "CapacityTypes")
    assert ng["updateConfig"]["updateStrategy"] in enum(EKS, "NodegroupUpdateStrategies")
    assert {t["effect"] for t in ng["taints"]} <= enum(EKS, "TaintEffect")
    assert lt["instanceType"] in enum(EC2, "InstanceType")
    assert lt["blockDeviceMappings"][0]["ebs"]["volumeType"] in enum(EC2, "VolumeType")
    assert lt["metadataOptions"]["httpTokens"] in enum(EC2, "LaunchTemplateHttpTokensState")
    assert {i["interfaceType"] for i in lt["networkInterfaces"]} <= enum(EC2, "NetworkCardInterfaceType")
    assert {s["resourceType"] for s in lt["tagSpecifications"]} <= enum(EC2, "ResourceType")
    if "instanceMarketOptions" in lt:
        assert lt["instanceMarketOptions"]["marketType"] in enum(EC2, "MarketType")
