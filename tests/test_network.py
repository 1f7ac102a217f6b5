"""The network: subnet arithmetic (pure) and the Network component under the recording engine.

The recorder returns plain data once the program has finished; every test
asserts on that data, and first checks that what it iterates over is not empty.
AWS enum values are checked against botocore's EC2 service model.
"""

from __future__ import annotations

import ipaddress
import json

import botocore.session
import pulumi
import pulumi_aws as aws
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.network import Network, NetworkArgs, cluster_tag_key, nat_zones, s3_service_name
from infra.errors import UserError
from infra.aws.subnets import region_of_zones, subnet_layout
from infra.preview.recording import placeholder, record

AZS = ("us-east-1a", "us-east-1b", "us-east-1c")
GPU_AZ = "us-east-1b"
CLUSTER = "gs-test"
ACCOUNT = "123456789012"

SUBNET = "aws:ec2/subnet:Subnet"
NAT = "aws:ec2/natGateway:NatGateway"
EIP = "aws:ec2/eip:Eip"
VPC = "aws:ec2/vpc:Vpc"
ROUTE_TABLE = "aws:ec2/routeTable:RouteTable"
ROUTE = "aws:ec2/route:Route"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PLACEMENT = "aws:ec2/placementGroup:PlacementGroup"
IGW = "aws:ec2/internetGateway:InternetGateway"


@pytest.fixture(scope="module")
def ec2_model():
    return botocore.session.get_session().get_service_model("ec2")


def _args(**overrides) -> NetworkArgs:
    base = dict(
        cidr="10.0.0.0/16",
        availability_zones=AZS,
        gpu_availability_zone=GPU_AZ,
        create_placement_group=True,
        cluster_name=CLUSTER,
        account_id=ACCOUNT,
    )
    base.update(overrides)
    return NetworkArgs(**base)


def _record(args: NetworkArgs):
    def program() -> None:
        provider = aws.Provider("aws-test", region="us-east-1")
        Network("net", args, opts=pulumi.ResourceOptions(providers=[provider]))

    return record(program)


@pytest.fixture(scope="module")
def new_vpc():
    return _record(_args())


@pytest.fixture(scope="module")
def new_vpc_nat_per_az():
    return _record(_args(nat_gateway_per_az=True, create_placement_group=False))


@pytest.fixture(scope="module")
def existing_vpc():
    return _record(
        _args(
            existing_vpc_id="vpc-0123",
            existing_private_subnet_ids=("subnet-a", "subnet-b"),
            existing_public_subnet_ids=("subnet-pa",),
            existing_gpu_subnet_id="subnet-gpu",
            create_placement_group=False,
        )
    )


# ---- subnet arithmetic ------------------------------------------------------------------


def _check_layout(cidr: str, azs: tuple[str, ...], gpu_az: str) -> None:
    layout = subnet_layout(cidr, azs, gpu_az)
    vpc = ipaddress.ip_network(cidr)
    nets = [ipaddress.ip_network(c) for c in layout.all_cidrs()]
    assert len(nets) == 2 * len(azs) + 1
    assert list(layout.public) == list(azs) and list(layout.private) == list(azs)
    for net in nets:
        assert net.subnet_of(vpc), f"{net} outside {vpc}"
        assert 16 <= net.prefixlen <= 28, f"{net}: AWS subnets are /16 to /28"
    for i, a in enumerate(nets):
        for b in nets[i + 1 :]:
            assert not a.overlaps(b), f"{a} overlaps {b}"
    gpu = ipaddress.ip_network(layout.gpu)
    assert all(gpu.num_addresses > n.num_addresses for n in nets if n != gpu), "the GPU subnet must be the largest"
    assert layout.gpu_az == gpu_az


def test_layout_for_the_prod_network():
    layout = subnet_layout("10.0.0.0/16", AZS, "us-east-1a")
    assert layout.gpu == "10.0.0.0/17"
    assert layout.private == {"us-east-1a": "10.0.128.0/20", "us-east-1b": "10.0.144.0/20", "us-east-1c": "10.0.160.0/20"}
    assert layout.public == {"us-east-1a": "10.0.192.0/21", "us-east-1b": "10.0.200.0/21", "us-east-1c": "10.0.208.0/21"}
    _check_layout("10.0.0.0/16", AZS, "us-east-1a")


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(min_value=0, max_value=2**32 - 1),
    zones=st.integers(min_value=2, max_value=6),
    extra_bits=st.integers(min_value=0, max_value=9),
    gpu_index=st.integers(min_value=0, max_value=5),
)
def test_layout_properties(base: int, zones: int, extra_bits: int, gpu_index: int):
    azs = tuple(f"eu-west-1{chr(ord('a') + i)}" for i in range(zones))
    slot_bits = (zones - 1).bit_length()
    prefix = min(16 + extra_bits, 28 - 3 - slot_bits)  # the smallest VPC the layout accepts
    cidr = str(ipaddress.ip_network((base, prefix), strict=False))
    _check_layout(cidr, azs, azs[gpu_index % zones])


def test_layout_rejects_a_cidr_too_small():
    with pytest.raises(UserError, match="too small"):
        subnet_layout("10.0.0.0/26", AZS, "us-east-1a")
    subnet_layout("10.0.0.0/23", AZS, "us-east-1a")  # the smallest for three zones (public /28)
    with pytest.raises(UserError, match="too small"):
        subnet_layout("10.0.0.0/24", AZS, "us-east-1a")


def test_layout_rejects_a_gpu_zone_outside_the_list():
    with pytest.raises(UserError, match="us-east-1d"):
        subnet_layout("10.0.0.0/16", AZS, "us-east-1d")


@pytest.mark.parametrize(
    "cidr, azs, match",
    [
        ("10.0.0.0/8", AZS, "/16 to /28"),
        ("10.0.0.1/16", AZS, "not a valid network"),
        ("not-a-cidr", AZS, "not a valid network"),
        ("fd00::/56", AZS, "IPv6"),
        ("10.0.0.0/16", ("us-east-1a",), "at least 2"),
        ("10.0.0.0/16", ("us-east-1a", "us-east-1a"), "more than once"),
    ],
)
def test_layout_rejects_bad_input(cidr, azs, match):
    with pytest.raises(UserError, match=match):
        subnet_layout(cidr, azs, azs[0])


def test_region_of_zones():
    assert region_of_zones(AZS) == "us-east-1"
    assert region_of_zones(("us-gov-west-1a", "us-gov-west-1b")) == "us-gov-west-1"
    with pytest.raises(UserError, match="several regions"):
        region_of_zones(("us-east-1a", "us-west-2a"))
    with pytest.raises(UserError, match="not an availability zone"):
        region_of_zones(("use1-az1", "use1-az2"))


def test_pure_helpers():
    assert nat_zones(AZS, per_az=False) == ("us-east-1a",)
    assert nat_zones(AZS, per_az=True) == AZS
    assert s3_service_name("us-east-1") == "com.amazonaws.us-east-1.s3"
    assert s3_service_name("cn-north-1") == "cn.com.amazonaws.cn-north-1.s3"


# ---- args validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"gpu_availability_zone": "us-east-1z"}, "us-east-1z"),
        ({"cidr": "10.0.0.0/27"}, "too small"),
        ({"cluster_name": ""}, "cluster_name"),
        ({"flow_log_traffic_type": "ACCEPT"}, "REJECT, ALL"),
        ({"log_retention_days": 31}, "CloudWatch Logs accepts"),
        ({"existing_gpu_subnet_id": "subnet-gpu"}, "without existing_vpc_id"),
        ({"existing_vpc_id": "vpc-1", "existing_private_subnet_ids": ("subnet-a",), "existing_gpu_subnet_id": "s"}, "two"),
        ({"existing_vpc_id": "vpc-1", "existing_private_subnet_ids": ("subnet-a", "subnet-b")}, "existing_gpu_subnet_id"),
        (
            {
                "existing_vpc_id": "vpc-1",
                "existing_private_subnet_ids": ("subnet-a", "subnet-b"),
                "existing_gpu_subnet_id": "subnet-g",
                "create_s3_endpoint": True,
            },
            "route_table_ids",
        ),
    ],
)
def test_bad_network_args_fail_before_any_resource(overrides, match):
    with pytest.raises(UserError, match=match):
        _args(**overrides)


# ---- the component, new VPC ------------------------------------------------------------


def test_new_vpc_resource_counts(new_vpc, new_vpc_nat_per_az):
    for rec, nats, placement in ((new_vpc, 1, 1), (new_vpc_nat_per_az, len(AZS), 0)):
        assert len(rec.of_type(VPC)) == 1
        assert len(rec.of_type(IGW)) == 1
        assert len(rec.of_type(SUBNET)) == 2 * len(AZS) + 1
        assert len(rec.of_type(NAT)) == nats
        assert len(rec.of_type(EIP)) == nats
        assert len(rec.of_type(ROUTE_TABLE)) == 1 + len(AZS)  # one public, one private per zone
        assert len(rec.of_type(ENDPOINT)) == 1
        assert len(rec.of_type(SG)) == 1
        assert len(rec.of_type(INGRESS)) == 1
        assert len(rec.of_type(EGRESS)) == 2
        assert len(rec.of_type(PLACEMENT)) == placement
        assert len(rec.of_type("gpu-serving:network:Network")) == 1


def test_vpc_has_dns(new_vpc):
    vpc = new_vpc.one(VPC)
    assert vpc.inputs["cidrBlock"] == "10.0.0.0/16"
    assert vpc.inputs["enableDnsSupport"] is True
    assert vpc.inputs["enableDnsHostnames"] is True


def test_subnets_match_the_layout_and_carry_the_cluster_tag(new_vpc):
    layout = subnet_layout("10.0.0.0/16", AZS, GPU_AZ)
    subnets = {r.name: r for r in new_vpc.of_type(SUBNET)}
    assert len(subnets) == 7
    for az in AZS:
        pub, priv = subnets[f"net-public-{az}"], subnets[f"net-private-{az}"]
        assert (pub.inputs["cidrBlock"], pub.inputs["availabilityZone"]) == (layout.public[az], az)
        assert (priv.inputs["cidrBlock"], priv.inputs["availabilityZone"]) == (layout.private[az], az)
        assert pub.inputs["tags"]["kubernetes.io/role/elb"] == "1"
        assert priv.inputs["tags"]["kubernetes.io/role/internal-elb"] == "1"
    gpu = subnets[f"net-gpu-{GPU_AZ}"]
    assert gpu.inputs["availabilityZone"] == GPU_AZ
    assert gpu.inputs["cidrBlock"] == layout.gpu
    assert "kubernetes.io/role/internal-elb" not in gpu.inputs["tags"]
    for subnet in subnets.values():
        assert subnet.inputs["tags"][cluster_tag_key(CLUSTER)] == "shared", subnet.name
        assert subnet.inputs["vpcId"] == placeholder("id", "net-vpc")


def test_nat_per_az_routes_each_zone_to_its_own_nat(new_vpc, new_vpc_nat_per_az):
    routes = {r.name: r.inputs for r in new_vpc_nat_per_az.of_type(ROUTE)}
    assert len(routes) == 1 + len(AZS)
    for az in AZS:
        assert routes[f"net-private-rt-{az}-default"]["natGatewayId"] == placeholder("id", f"net-nat-{az}")
        nat = new_vpc_nat_per_az.named(f"net-nat-{az}")
        assert nat.inputs["subnetId"] == placeholder("id", f"net-public-{az}")
        # A public NAT gateway waits for the internet gateway.
        assert any(u.endswith("::net-igw") for u in nat.options["depends_on"])
    single = {r.name: r.inputs for r in new_vpc.of_type(ROUTE)}
    assert {single[f"net-private-rt-{az}-default"]["natGatewayId"] for az in AZS} == {placeholder("id", f"net-nat-{AZS[0]}")}
    assert single["net-public-rt-default"]["gatewayId"] == placeholder("id", "net-igw")
    assert all(e.inputs["domain"] == "vpc" for e in new_vpc_nat_per_az.of_type(EIP))


def test_gpu_subnet_uses_its_zones_private_route_table(new_vpc):
    assoc = new_vpc.named(f"net-gpu-{GPU_AZ}-rta")
    assert assoc.inputs["routeTableId"] == placeholder("id", f"net-private-rt-{GPU_AZ}")
    assert assoc.inputs["subnetId"] == placeholder("id", f"net-gpu-{GPU_AZ}")


def test_s3_gateway_endpoint_on_every_private_route_table(new_vpc, ec2_model):
    endpoint = new_vpc.one(ENDPOINT).inputs
    assert endpoint["vpcEndpointType"] == "Gateway"
    assert endpoint["vpcEndpointType"] in ec2_model.shape_for("VpcEndpointType").enum
    assert endpoint["serviceName"] == "com.amazonaws.us-east-1.s3"
    private_tables = [r for r in new_vpc.of_type(ROUTE_TABLE) if "-private-" in r.name]
    assert len(private_tables) == len(AZS)
    assert sorted(endpoint["routeTableIds"]) == sorted(placeholder("id", r.name) for r in private_tables)


def test_efa_security_group_allows_all_traffic_within_itself(new_vpc):
    sg_id = placeholder("id", new_vpc.one(SG).name)
    ingress = new_vpc.one(INGRESS).inputs
    assert (ingress["securityGroupId"], ingress["referencedSecurityGroupId"], ingress["ipProtocol"]) == (sg_id, sg_id, "-1")
    egress = [r.inputs for r in new_vpc.of_type(EGRESS)]
    assert len(egress) == 2
    self_out = [e for e in egress if e.get("referencedSecurityGroupId") == sg_id]
    anywhere = [e for e in egress if e.get("cidrIpv4") == "0.0.0.0/0"]
    assert len(self_out) == 1 and len(anywhere) == 1
    assert all(e["ipProtocol"] == "-1" and e["securityGroupId"] == sg_id for e in egress)


def test_placement_group_only_when_asked(new_vpc, new_vpc_nat_per_az, ec2_model):
    group = new_vpc.one(PLACEMENT).inputs
    assert group["strategy"] == "cluster"
    assert group["strategy"] in ec2_model.shape_for("PlacementStrategy").enum
    assert new_vpc_nat_per_az.of_type(PLACEMENT) == []


def test_every_aws_resource_uses_the_callers_provider(new_vpc):
    children = [r for r in new_vpc.resources if r.custom and not r.type.startswith("pulumi:providers:")]
    assert len(children) > 20
    assert {r.options["provider"] for r in children} == {"aws-test"}
    network_urn = new_vpc.one("gpu-serving:network:Network").urn
    assert {r.parent for r in children} == {network_urn}


def test_outputs():
    seen: dict = {}

    def program() -> None:
        net = Network("net", _args())
        assert net.placement_group_name is not None
        pulumi.Output.all(
            net.vpc_id, net.private_subnet_ids, net.public_subnet_ids, net.gpu_subnet_id, net.efa_security_group_id, net.placement_group_name
        ).apply(lambda v: seen.update(zip(("vpc", "private", "public", "gpu", "sg", "pg"), v)))

        bare = Network("bare", _args(create_placement_group=False))
        assert bare.placement_group_name is None

    record(program)
    assert seen == {
        "vpc": placeholder("id", "net-vpc"),
        "private": [placeholder("id", f"net-private-{az}") for az in AZS],
        "public": [placeholder("id", f"net-public-{az}") for az in AZS],
        "gpu": placeholder("id", f"net-gpu-{GPU_AZ}"),
        "sg": placeholder("id", "net-efa"),
        "pg": "net-gpu",
    }


# ---- the default security group and the flow logs ---------------------------------------

DEFAULT_SG = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
FLOW_LOG = "aws:ec2/flowLog:FlowLog"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
KEY = "aws:kms/key:Key"


def _depends_on(rec, name: str) -> set[str]:
    return {u.rsplit("::", 1)[-1] for u in rec.named(name).options["depends_on"]}


def test_the_default_security_group_is_adopted_with_no_rules(new_vpc):
    group = new_vpc.one(DEFAULT_SG)
    assert group.inputs["vpcId"] == placeholder("id", "net-vpc")
    assert "ingress" not in group.inputs and "egress" not in group.inputs  # adopting it removes AWS's rules
    # Nothing of the stack uses it: every group it attaches is one of its own.
    assert not [r for r in new_vpc.resources if placeholder("id", "net-default-sg") in str(r.inputs)]


def test_flow_logs_record_rejected_traffic_to_an_encrypted_retained_log_group(new_vpc, ec2_model):
    flow = new_vpc.one(FLOW_LOG).inputs
    assert flow["vpcId"] == placeholder("id", "net-vpc")
    assert flow["trafficType"] == "REJECT" and flow["trafficType"] in ec2_model.shape_for("TrafficType").enum
    assert flow["logDestinationType"] == "cloud-watch-logs" and flow["logDestinationType"] in ec2_model.shape_for("LogDestinationType").enum
    assert flow["logDestination"] == placeholder("arn", "net-flow-logs")
    assert flow["iamRoleArn"] == placeholder("arn", "net-flow-logs-role")
    assert "net-flow-logs-publish" in _depends_on(new_vpc, "net-vpc-flow-log")
    group = new_vpc.one(LOG_GROUP).inputs
    assert group == {**group, "name": "/aws/vpc/net/flow-logs", "retentionInDays": 365, "kmsKeyId": placeholder("arn", "net-flow-logs-key")}


def test_the_flow_logs_key_and_role_policies(new_vpc):
    key = new_vpc.one(KEY).inputs
    assert key["enableKeyRotation"] is True
    statements = {st["Sid"]: st for st in json.loads(key["policy"])["Statement"]}
    assert set(statements) == {"AccountAdministersTheKey", "CloudWatchLogsEncryptsTheStacksLogGroups"}
    assert statements["CloudWatchLogsEncryptsTheStacksLogGroups"]["Condition"]["ArnEquals"] == {
        "kms:EncryptionContext:aws:logs:arn": [f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/vpc/net/flow-logs"]}  # fmt: skip
    trust = json.loads(new_vpc.named("net-flow-logs-role").inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": ACCOUNT}
    publish = new_vpc.named("net-flow-logs-publish").inputs
    assert publish["role"] == placeholder("id", "net-flow-logs-role")
    assert json.loads(publish["policy"])["Statement"][0]["Resource"][0] == f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/vpc/net/flow-logs"


def test_flow_logs_follow_the_config_and_are_kept_in_production(new_vpc):
    assert not [r.name for r in new_vpc.resources if r.options["protect"] or r.options["retain_on_delete"]]
    rec = _record(_args(flow_log_traffic_type="ALL", log_retention_days=731, protect=True))
    assert rec.one(FLOW_LOG).inputs["trafficType"] == "ALL"
    assert rec.one(LOG_GROUP).inputs["retentionInDays"] == 731
    kept = {r.name for r in rec.resources if r.options["protect"] and r.options["retain_on_delete"]}
    assert kept == {"net-flow-logs", "net-flow-logs-key"}
    assert rec.one(KEY).inputs["deletionWindowInDays"] == 30


# ---- the component, existing VPC ---------------------------------------------------------


def test_existing_vpc_creates_no_vpc_subnets_or_nat(existing_vpc):
    for typ in (VPC, SUBNET, NAT, EIP, IGW, ROUTE_TABLE, ROUTE, "aws:ec2/routeTableAssociation:RouteTableAssociation",
                DEFAULT_SG, FLOW_LOG, LOG_GROUP, KEY):  # fmt: skip
        assert existing_vpc.of_type(typ) == [], typ
    assert existing_vpc.of_type(ENDPOINT) == []  # not asked for: the VPC's owner has its own
    sg = existing_vpc.one(SG)
    assert sg.inputs["vpcId"] == "vpc-0123"
    assert len(existing_vpc.of_type(INGRESS)) == 1 and len(existing_vpc.of_type(EGRESS)) == 2


def test_existing_vpc_passes_ids_through_and_can_add_s3_endpoint():
    seen: dict = {}

    def program() -> None:
        net = Network(
            "net",
            _args(
                existing_vpc_id="vpc-0123",
                existing_private_subnet_ids=("subnet-a", "subnet-b"),
                existing_gpu_subnet_id="subnet-gpu",
                existing_private_route_table_ids=("rtb-a", "rtb-b"),
                create_s3_endpoint=True,
            ),
        )
        pulumi.Output.all(net.vpc_id, net.private_subnet_ids, net.public_subnet_ids, net.gpu_subnet_id).apply(
            lambda v: seen.update(zip(("vpc", "private", "public", "gpu"), v))
        )

    rec = record(program)
    assert seen == {"vpc": "vpc-0123", "private": ["subnet-a", "subnet-b"], "public": [], "gpu": "subnet-gpu"}
    endpoint = rec.one(ENDPOINT).inputs
    assert endpoint["routeTableIds"] == ["rtb-a", "rtb-b"] and endpoint["vpcId"] == "vpc-0123"
    assert rec.one(PLACEMENT).inputs["strategy"] == "cluster"
    assert rec.of_type(SUBNET) == []
