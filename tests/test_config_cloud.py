"""Config of the cloud layer: mistakes are refused with the key and what is allowed."""

from __future__ import annotations

import copy
import datetime as dt
import typing

import pytest
from moto.utilities.utils import load_resource

from infra.catalog.eks import GPU_AMI_TYPES
from infra.catalog.instances import INSTANCE_TYPES
from infra.config import from_mapping, read_stack_file
from infra.config.areas import GpuConfig
from infra.errors import UserError

EC2_TYPES = load_resource("ec2/resources/instance_types.json")


def _prod_areas(repo_root) -> dict:
    raw = read_stack_file("prod", repo_root)
    return {k.split(":", 1)[1]: v for k, v in raw.items() if k.startswith("gpu-serving:")}


def _refused(areas: dict, *fragments: str) -> str:
    with pytest.raises(UserError) as info:
        from_mapping("prod", areas, region="us-east-1")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "Traceback" not in message
    return message


@pytest.fixture
def prod(repo_root) -> dict:
    return copy.deepcopy(_prod_areas(repo_root))


def test_prod_and_test_stacks_load(repo_root):
    for stack in ("prod", "test"):
        raw = read_stack_file(stack, repo_root)
        areas = {k.split(":", 1)[1]: v for k, v in raw.items() if k.startswith("gpu-serving:")}
        cfg = from_mapping(stack, areas, region=raw.get("aws:region"))
        assert cfg.gpu.nodes >= 1


def test_unknown_instance_type_lists_the_known_ones(prod):
    prod["gpu"]["instanceType"] = "p9.48xlarge"
    _refused(prod, "gpu-serving:gpu.instanceType", "p9.48xlarge", "p5.48xlarge", "p5en.48xlarge", "g6e.xlarge")


def test_gpu_nodes_in_two_zones_is_refused(prod):
    prod["network"]["gpuAvailabilityZone"] = ["us-east-1a", "us-east-1b"]
    _refused(prod, "gpu-serving:network.gpuAvailabilityZone", "one availability zone", "us-east-1a, us-east-1b")


def test_gpu_zone_must_be_one_of_the_zones(prod):
    prod["network"]["gpuAvailabilityZone"] = "us-east-1f"
    _refused(prod, "gpu-serving:network", "us-east-1f", "us-east-1a, us-east-1b, us-east-1c")


def test_a_zone_listed_twice_is_refused(prod):
    prod["network"]["availabilityZones"] = ["us-east-1a", "us-east-1b", "us-east-1a"]
    _refused(prod, "gpu-serving:network.availabilityZones", "us-east-1a more than once")


@pytest.mark.parametrize("key, value", [("availabilityZones", ["us-west-2a", "us-west-2b"]), ("gpuAvailabilityZone", "eu-west-1a")])
def test_zones_of_another_region_are_refused(prod, key, value):
    prod["network"].pop("gpuAvailabilityZone", None)
    prod["network"].pop("availabilityZones", None)
    prod["network"][key] = value
    _refused(prod, f"gpu-serving:network.{key}", "is not a zone of aws:region us-east-1")


def test_existing_gpu_subnets_in_two_zones_is_refused(prod):
    prod["network"].update(
        existingVpcId="vpc-0123456789abcdef0",
        existingPrivateSubnetIds=["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
        existingGpuSubnetId=["subnet-0123456789abcdef2", "subnet-0123456789abcdef3"],
    )
    _refused(prod, "gpu-serving:network.existingGpuSubnetId", "one subnet")


def test_existing_vpc_needs_its_subnets(prod):
    prod["network"]["existingVpcId"] = "vpc-0123456789abcdef0"
    _refused(prod, "gpu-serving:network", "existingPrivateSubnetIds", "existingGpuSubnetId")


@pytest.mark.parametrize("kind", ["capacity-block", "capacity-reservation"])
def test_reserved_capacity_needs_a_reservation_id(prod, kind):
    prod["gpu"]["capacity"] = {"type": kind}
    _refused(prod, "gpu-serving:gpu.capacity.reservationId", kind)


def test_reservation_id_must_look_like_one(prod):
    prod["gpu"]["capacity"] = {"type": "capacity-block", "reservationId": "block-1"}
    _refused(prod, "gpu-serving:gpu.capacity.reservationId", "cr-0123456789abcdef0")


def test_reservation_id_on_demand_is_refused(prod):
    prod["gpu"]["capacity"] = {"type": "on-demand", "reservationId": "cr-0123456789abcdef0"}
    _refused(prod, "gpu-serving:gpu.capacity.reservationId", "'on-demand'", "'capacity-block'")


def test_unknown_capacity_type_lists_the_known_ones(prod):
    prod["gpu"]["capacity"] = {"type": "spot"}
    _refused(prod, "gpu-serving:gpu.capacity.type", "'spot'", "'on-demand'", "'capacity-reservation'", "'capacity-block'")


@pytest.mark.parametrize("kind", ["capacity-block", "capacity-reservation"])
def test_reserved_capacity_in_a_placement_group_is_refused(prod, kind):
    prod["gpu"]["capacity"] = {"type": kind, "reservationId": "cr-0123456789abcdef0"}
    prod["network"]["placementGroup"] = True
    message = _refused(prod, "gpu-serving:network.placementGroup", kind, "placementGroupName")
    assert "config errors" not in message  # one message, about the one key


@pytest.mark.parametrize("ami_type", ["AL2023_x86_64_STANDARD", "AL2023_ARM_64_NVIDIA"])
def test_ami_type_must_be_a_gpu_one_for_the_instances(prod, ami_type):
    prod["gpu"]["amiType"] = ami_type
    _refused(prod, "gpu-serving:gpu.amiType", ami_type, "'AL2023_x86_64_NVIDIA'", "'BOTTLEROCKET_x86_64_NVIDIA'")


def test_allowed_ami_types_are_the_gpu_ones_of_the_catalogs_cpu_architectures():
    # EC2's data (moto's copy of DescribeInstanceTypes): the CPUs of the catalog's instance types.
    architectures = {a for name in INSTANCE_TYPES for a in EC2_TYPES[name]["ProcessorInfo"]["SupportedArchitectures"]}
    allowed = set(typing.get_args(GpuConfig.model_fields["ami_type"].annotation))
    assert allowed == {t for t, arch in GPU_AMI_TYPES.items() if arch in architectures}


def test_capacity_block_drops_the_placement_group_by_default(prod):
    prod["gpu"]["capacity"] = {"type": "capacity-block", "reservationId": "cr-0123456789abcdef0"}
    cfg = from_mapping("prod", prod, region="us-east-1")
    assert cfg.placement_group is False
    prod["gpu"]["capacity"] = {"type": "on-demand"}
    assert from_mapping("prod", prod, region="us-east-1").placement_group is True


def test_fewer_nodes_than_pipeline_stages_is_refused(prod):
    prod["serving"]["pipelineParallel"] = 4
    prod["gpu"]["nodes"] = 2
    _refused(prod, "gpu-serving:gpu.nodes", "2", "pipelineParallel = 4")


def test_non_production_stack_needs_an_expiry(prod):
    prod["lifecycle"] = {"production": False, "owner": "someone"}
    _refused(prod, "gpu-serving:lifecycle.expiresAt", "non-production")
    prod["lifecycle"]["expiresAt"] = "next tuesday"
    _refused(prod, "gpu-serving:lifecycle.expiresAt", "2026-12-31T18:00:00Z")


def test_missing_lifecycle_asks_for_the_expiry(prod):
    del prod["lifecycle"]
    _refused(prod, "gpu-serving:lifecycle.expiresAt")


def test_deployer_cidrs_must_be_cidrs(prod):
    prod["cluster"].update(endpointAccess="public-restricted", deployerCidrs=["everyone"])
    _refused(prod, "gpu-serving:cluster.deployerCidrs.0", "'everyone'")


def test_the_old_public_access_key_says_what_replaced_it(prod):
    prod["cluster"]["publicAccessCidrs"] = ["203.0.113.0/24"]
    _refused(prod, "gpu-serving:cluster.publicAccessCidrs", "replaced by endpointAccess and deployerCidrs")


@pytest.mark.parametrize("kind", ["capacity-block", "capacity-reservation"])
def test_a_reservation_names_the_placement_group_it_was_made_in(prod, kind):
    prod["gpu"]["capacity"] = {"type": kind, "reservationId": "cr-0123456789abcdef0"}
    prod["network"]["placementGroupName"] = "p5-blocks"
    cfg = from_mapping("prod", prod, region="us-east-1")
    assert cfg.placement_group is False  # the stack makes none: the nodes go into the named one
    assert cfg.network.placement_group_name == "p5-blocks"
    prod["network"]["placementGroup"] = True
    _refused(prod, "gpu-serving:network.placementGroup")


def test_bottlerocket_names_its_ami_release(prod):
    prod["gpu"]["amiType"] = "BOTTLEROCKET_x86_64_NVIDIA"
    _refused(prod, "gpu-serving:gpu.amiReleaseVersion", "BOTTLEROCKET_x86_64_NVIDIA", "aws ssm get-parameter")
    prod["gpu"]["amiReleaseVersion"] = "1.50.0-a1b2c3d4"
    cfg = from_mapping("prod", prod, region="us-east-1")
    assert cfg.ami_release_version(dt.date(2026, 12, 3)) == "1.50.0-a1b2c3d4"
    assert cfg.system_ami_release_version(dt.date(2026, 12, 3)) == "1.35.6-20260714"  # the system nodes stay AL2023


def test_fsx_storage_needs_the_fsx_driver(prod):
    prod["storage"] = {"type": "fsx"}
    _refused(prod, "gpu-serving:storage.type", "fsxCsi")
    prod["cluster"]["fsxCsi"] = True
    assert from_mapping("prod", prod, region="us-east-1").storage.type == "fsx"


def test_s3_source_needs_a_uri(prod):
    prod["storage"] = {"source": "s3"}
    _refused(prod, "gpu-serving:storage.s3Uri")


def test_min_cost_stack_picks_the_fewest_nodes_up_to_the_given_count(prod):
    from infra.planning import make_plan

    prod["model"] = {"name": "qwen3-30b-a3b"}
    prod["serving"] = {"objective": "min-cost", "targetConcurrency": 4, "maxModelLen": 32768}
    cfg = from_mapping("prod", prod, region="us-east-1")
    plan = make_plan(cfg.plan_request())
    assert plan.feasible and plan.instance.name == "p5.48xlarge"
    assert plan.nodes == 1 < cfg.gpu.nodes  # one p5 holds it; the stack would run one node
    assert plan.evaluation.max_concurrency >= 4
