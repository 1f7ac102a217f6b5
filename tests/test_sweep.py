"""Leak sweeper (`infra/ops/sweep/`, `python -m infra sweep`) against a real moto server.

The server is seeded with what failed teardowns leave behind, for four kinds of owner:

- `pr-1`, an ephemeral stack that expired in 2020: a VPC with subnets, an internet
  gateway, a route table, a NAT gateway with its elastic IP, a VPC endpoint, two
  security groups that reference each other, a network interface, an instance with
  its volume, a loose volume, a launch template, a placement group, an EFS file
  system with a mount target, an NLB with a listener and a target group, an EKS
  cluster with a tagged node group and an untagged one, an ECR repository, a KMS key
  with an alias, a log group and an IAM role with policies and an instance profile;
  and what EKS and its add-ons leave without the stack's tags: a network interface
  the VPC CNI created (tagged only `cluster.k8s.amazonaws.com/name`), the
  control-plane log group EKS re-created for the stack's cluster
  (`/aws/eks/gpu-serving-pr-1/cluster`, untagged), and an Auto Scaling group of the
  cluster (tag `eks:cluster-name`) with its instance;
- `prod` (lifecycle=production) and `pr-2` (ephemeral, expires in 2099): the same kinds;
- untagged resources, and gpu-serving resources whose tags are incomplete or whose
  expires-at does not parse.

The sweep must delete exactly the first group (and the untagged parts AWS cannot
delete apart from them: the mount target, the untagged node group of the expired
cluster, the CNI interface, the re-created log group, the Auto Scaling group and,
with it, its instance) and leave everything else, the same untagged leftovers of
`prod` and `pr-2` included. moto 5.2.5 does not implement the placement-group
calls: `Gaps` (tests/moto_server.py) answers them from a small in-test store, in the form
botocore's model gives; everything else is moto's own behaviour.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.ops import aws as ops_aws
from infra.ops import sweep as sw
from infra.cli.app import app
from tests.moto_server import REGION, GapError, Gaps, aws, client, moto_server  # noqa: F401  (pytest fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)
EXPIRED = "2020-01-01T00:00:00Z"
LATER = "2099-01-01T00:00:00Z"
ROLE_DOC = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "eks.amazonaws.com"}, "Action": "sts:AssumeRole"}]})


def tags_for(owner: str) -> dict[str, str]:
    if owner == "expired":
        return {"project": "gpu-serving", "stack": "pr-1", "owner": "ci", "lifecycle": "ephemeral", "expires-at": EXPIRED}
    if owner == "later":
        return {"project": "gpu-serving", "stack": "pr-2", "owner": "ci", "lifecycle": "ephemeral", "expires-at": LATER}
    if owner == "prod":
        return {"project": "gpu-serving", "stack": "prod", "owner": "ml-platform", "lifecycle": "production"}
    if owner == "untagged":
        return {}
    raise ValueError(owner)


def kv(tags: dict[str, str]) -> list[dict]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def spec(kind: str, tags: dict[str, str]) -> list[dict]:
    return [{"ResourceType": kind, "Tags": kv(tags)}] if tags else []


class PlacementGroups:
    """EC2 placement groups as EC2 answers (moto 5.2.5 does not implement these calls)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict] = {}

    def create(self, name: str, tags: dict[str, str]) -> None:
        self.groups[name] = {"GroupName": name, "State": "available", "Strategy": "cluster",
                             "GroupId": f"pg-{len(self.groups):017x}", "Tags": kv(tags)}  # fmt: skip

    def describe(self, params: dict) -> dict:
        wanted = {f["Name"][4:]: set(f["Values"]) for f in params.get("Filters", []) if f["Name"].startswith("tag:")}

        def match(g: dict) -> bool:
            t = {x["Key"]: x["Value"] for x in g["Tags"]}
            return all(t.get(k) in v for k, v in wanted.items())

        return {"PlacementGroups": [g for g in self.groups.values() if match(g)]}

    def delete(self, params: dict) -> dict:
        if params["GroupName"] not in self.groups:
            raise GapError("InvalidPlacementGroup.Unknown", f"The Placement Group '{params['GroupName']}' is unknown.")
        del self.groups[params["GroupName"]]
        return {}

    def gaps(self) -> Gaps:
        return Gaps().on("ec2", "DescribePlacementGroups", self.describe).on("ec2", "DeletePlacementGroup", self.delete)


@dataclass
class Seeded:
    """What was created, by owner: {owner: {kind: [id, ...]}}."""

    ids: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    parts: dict[str, list[str]] = field(default_factory=dict)  # untagged parts of expired parents
    # Untagged leftovers EKS and the VPC CNI leave for a cluster: {owner: {(kind, id), ...}}
    leftovers: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    asg_instances: dict[str, set[str]] = field(default_factory=dict)  # instances of each owner's Auto Scaling group
    odd: dict[str, str] = field(default_factory=dict)  # volume id -> why it must be skipped
    placement: PlacementGroups = field(default_factory=PlacementGroups)

    def add(self, owner: str, kind: str, rid: str) -> str:
        self.ids.setdefault(owner, {}).setdefault(kind, []).append(rid)
        return rid

    def of(self, owner: str) -> set[tuple[str, str]]:
        return {(k, i) for k, ids in self.ids.get(owner, {}).items() for i in ids}


def seed_stack(s: Seeded, owner: str, n: int, *, full: bool) -> None:
    """One stack's leftovers. `full`: every kind the sweeper knows (else the network core and a few)."""
    t = tags_for(owner)
    ec2, efs, elb, eks = (client(x) for x in ("ec2", "efs", "elbv2", "eks"))
    ecr, kms, logs, iam = (client(x) for x in ("ecr", "kms", "logs", "iam"))
    vpc = s.add(owner, "ec2:vpc", ec2.create_vpc(CidrBlock=f"10.{n}.0.0/16", TagSpecifications=spec("vpc", t))["Vpc"]["VpcId"])
    sub_a = s.add(owner, "ec2:subnet", ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.{n}.1.0/24", AvailabilityZone="us-east-1a",
                                                         TagSpecifications=spec("subnet", t))["Subnet"]["SubnetId"])  # fmt: skip
    sub_b = s.add(owner, "ec2:subnet", ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.{n}.2.0/24", AvailabilityZone="us-east-1b",
                                                         TagSpecifications=spec("subnet", t))["Subnet"]["SubnetId"])  # fmt: skip
    sg_a = s.add(owner, "ec2:security-group", ec2.create_security_group(
        GroupName=f"efa-{n}", Description="efa", VpcId=vpc, TagSpecifications=spec("security-group", t))["GroupId"])  # fmt: skip
    inst = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="t3.micro", SubnetId=sub_a,
                             SecurityGroupIds=[sg_a], TagSpecifications=spec("instance", t))["Instances"][0]["InstanceId"]  # fmt: skip
    s.add(owner, "ec2:instance", inst)
    logs.create_log_group(logGroupName=f"/aws/eks/{owner}-{n}/cluster", **({"tags": t} if t else {}))
    s.add(owner, "logs:log-group", f"/aws/eks/{owner}-{n}/cluster")
    if not full:
        return
    igw = s.add(owner, "ec2:internet-gateway", ec2.create_internet_gateway(TagSpecifications=spec("internet-gateway", t))["InternetGateway"]["InternetGatewayId"])
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    rt = s.add(owner, "ec2:route-table", ec2.create_route_table(VpcId=vpc, TagSpecifications=spec("route-table", t))["RouteTable"]["RouteTableId"])
    ec2.create_route(RouteTableId=rt, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    ec2.associate_route_table(RouteTableId=rt, SubnetId=sub_b)
    eip = s.add(owner, "ec2:elastic-ip", ec2.allocate_address(Domain="vpc", TagSpecifications=spec("elastic-ip", t))["AllocationId"])
    s.add(owner, "ec2:nat-gateway", ec2.create_nat_gateway(SubnetId=sub_b, AllocationId=eip, TagSpecifications=spec("natgateway", t))["NatGateway"]["NatGatewayId"])
    s.add(owner, "ec2:vpc-endpoint", ec2.create_vpc_endpoint(VpcId=vpc, VpcEndpointType="Gateway", ServiceName=f"com.amazonaws.{REGION}.s3", RouteTableIds=[rt],
                                                             TagSpecifications=spec("vpc-endpoint", t))["VpcEndpoint"]["VpcEndpointId"])  # fmt: skip
    sg_b = s.add(owner, "ec2:security-group", ec2.create_security_group(
        GroupName=f"cluster-{n}", Description="cluster", VpcId=vpc, TagSpecifications=spec("security-group", t))["GroupId"])  # fmt: skip
    # The EFA group allows all traffic from itself and from the cluster group, and the other way round.
    ec2.authorize_security_group_ingress(GroupId=sg_a, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_a}, {"GroupId": sg_b}]}])
    ec2.authorize_security_group_egress(GroupId=sg_a, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_a}]}])
    ec2.authorize_security_group_ingress(GroupId=sg_b, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "UserIdGroupPairs": [{"GroupId": sg_a}]}])
    s.add(owner, "ec2:network-interface", ec2.create_network_interface(SubnetId=sub_a, Groups=[sg_a],
                                                                       TagSpecifications=spec("network-interface", t))["NetworkInterface"]["NetworkInterfaceId"])  # fmt: skip
    s.add(owner, "ec2:volume", ec2.create_volume(AvailabilityZone="us-east-1a", Size=100, TagSpecifications=spec("volume", t))["VolumeId"])
    s.add(owner, "ec2:launch-template", ec2.create_launch_template(
        LaunchTemplateName=f"gpu-{owner}-{n}", LaunchTemplateData={"InstanceType": "p5.48xlarge"},
        TagSpecifications=spec("launch-template", t))["LaunchTemplate"]["LaunchTemplateId"])  # fmt: skip
    s.placement.create(f"gpu-{owner}-{n}", t)
    s.add(owner, "ec2:placement-group", f"gpu-{owner}-{n}")
    fs = s.add(owner, "efs:file-system", efs.create_file_system(CreationToken=f"w-{owner}-{n}", Encrypted=True, Tags=kv(t))["FileSystemId"])
    mt = efs.create_mount_target(FileSystemId=fs, SubnetId=sub_a, SecurityGroups=[sg_a])["MountTargetId"]
    s.parts.setdefault(owner, []).append(mt)
    lb = elb.create_load_balancer(Name=f"serve-{owner}-{n}", Subnets=[sub_a, sub_b], Type="network", Scheme="internal",
                                  **({"Tags": kv(t)} if t else {}))["LoadBalancers"][0]["LoadBalancerArn"]  # fmt: skip
    tg = elb.create_target_group(Name=f"serve-{owner}-{n}", Protocol="TCP", Port=8000, VpcId=vpc, TargetType="ip",
                                 **({"Tags": kv(t)} if t else {}))["TargetGroups"][0]["TargetGroupArn"]  # fmt: skip
    elb.create_listener(LoadBalancerArn=lb, Protocol="TCP", Port=8000, DefaultActions=[{"Type": "forward", "TargetGroupArn": tg}])
    s.add(owner, "elbv2:load-balancer", lb)
    s.add(owner, "elbv2:target-group", tg)
    role = f"{owner}-{n}-cluster"
    arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument=ROLE_DOC, **({"Tags": kv(t)} if t else {}))["Role"]["Arn"]
    policy = iam.create_policy(PolicyName=f"{role}-policy", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "eks:Describe*", "Resource": "*"}]}))["Policy"]["Arn"]  # fmt: skip
    iam.attach_role_policy(RoleName=role, PolicyArn=policy)
    iam.put_role_policy(RoleName=role, PolicyName="inline", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"}]}))  # fmt: skip
    s.add(owner, "iam:role", role)
    profile = f"{owner}-{n}-bastion"
    iam.create_instance_profile(InstanceProfileName=profile, **({"Tags": kv(t)} if t else {}))
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=role)
    s.add(owner, "iam:instance-profile", profile)
    cluster = f"{owner}-{n}"
    eks.create_cluster(name=cluster, roleArn=arn, resourcesVpcConfig={"subnetIds": [sub_a, sub_b]}, **({"tags": t} if t else {}))
    s.add(owner, "eks:cluster", cluster)
    eks.create_nodegroup(clusterName=cluster, nodegroupName="gpu", nodeRole=arn, subnets=[sub_a], **({"tags": t} if t else {}))
    s.add(owner, "eks:nodegroup", f"{cluster}/gpu")
    eks.create_nodegroup(clusterName=cluster, nodegroupName="system", nodeRole=arn, subnets=[sub_a])  # no tags of its own
    s.parts.setdefault(owner, []).append(f"{cluster}/system")
    s.add(owner, "ecr:repository", ecr.create_repository(repositoryName=f"vllm-{owner}-{n}", **({"tags": kv(t)} if t else {}))["repository"]["repositoryName"])
    key = kms.create_key(Description=f"eks secrets {owner}", **({"Tags": [{"TagKey": k, "TagValue": v} for k, v in t.items()]} if t else {}))["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName=f"alias/eks-{owner}-{n}", TargetKeyId=key)
    s.add(owner, "kms:key", key)
    seed_eks_leftovers(s, owner, cluster, sub_a, t)


def seed_eks_leftovers(s: Seeded, owner: str, cluster: str, subnet: str, t: dict[str, str]) -> None:
    """What EKS and the VPC CNI create in a cluster's name without the stack's tags."""
    ec2, logs, asg = (client(x) for x in ("ec2", "logs", "autoscaling"))
    found: set[tuple[str, str]] = set()
    cni = ec2.create_network_interface(SubnetId=subnet, Description="aws-K8S-i-0123456789abcdef0",
                                       TagSpecifications=spec("network-interface", {"cluster.k8s.amazonaws.com/name": cluster}))
    found.add(("ec2:network-interface", cni["NetworkInterface"]["NetworkInterfaceId"]))
    if t.get("stack"):  # the group EKS re-creates, untagged, for the cluster the stack named gpu-serving-<stack>
        group = f"/aws/eks/gpu-serving-{t['stack']}/cluster"
        logs.create_log_group(logGroupName=group)
        found.add(("logs:log-group", group))
    lt = ec2.create_launch_template(LaunchTemplateName=f"eks-{cluster}", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"})
    name = f"eks-{cluster}-gpu-0123"
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=1, MaxSize=1, DesiredCapacity=1, VPCZoneIdentifier=subnet,
        LaunchTemplate={"LaunchTemplateId": lt["LaunchTemplate"]["LaunchTemplateId"], "Version": "$Latest"},
        Tags=[{"Key": "eks:cluster-name", "Value": cluster, "PropagateAtLaunch": True},
              {"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned", "PropagateAtLaunch": True}],
    )  # fmt: skip
    found.add(("autoscaling:group", name))
    instances = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]
    assert len(instances) == 1
    s.asg_instances[owner] = {i["InstanceId"] for i in instances}
    s.leftovers[owner] = found


def seed() -> Seeded:
    s = Seeded()
    seed_stack(s, "expired", 1, full=True)
    seed_stack(s, "prod", 2, full=True)
    seed_stack(s, "later", 3, full=True)
    seed_stack(s, "untagged", 4, full=True)
    ec2 = client("ec2")
    odd = {
        "tomorrow": {"project": "gpu-serving", "lifecycle": "ephemeral", "expires-at": "tomorrow"},
        "naive": {"project": "gpu-serving", "lifecycle": "ephemeral", "expires-at": "2020-01-01T00:00:00"},
        "no-lifecycle": {"project": "gpu-serving", "expires-at": EXPIRED},
        "no-expiry": {"project": "gpu-serving", "lifecycle": "ephemeral"},
        "other-project": {"project": "someone-else", "lifecycle": "ephemeral", "expires-at": EXPIRED},
        # Production wins even with an old expiry on it.
        "prod-with-expiry": {"project": "gpu-serving", "lifecycle": "production", "expires-at": EXPIRED},
    }
    for why, t in odd.items():
        vol = ec2.create_volume(AvailabilityZone="us-east-1a", Size=1, TagSpecifications=spec("volume", {**t, "Name": why}))["VolumeId"]
        s.odd[vol] = why
    return s


def swept(session, yes: bool, wait: float = 5.0) -> sw.Report:
    return sw.sweep([REGION], yes=yes, now=NOW, session=session, wait=wait, poll=0.01)


def keys(entries: list[sw.Entry]) -> set[tuple[str, str]]:
    return {(e.resource.kind, e.resource.id) for e in entries}


def still_there(s: Seeded) -> set[tuple[str, str]]:
    """Every seeded (kind, id) that the AWS APIs still show."""
    ec2, efs, elb, eks = (client(x) for x in ("ec2", "efs", "elbv2", "eks"))
    ecr, kms, logs, iam = (client(x) for x in ("ecr", "kms", "logs", "iam"))
    live: set[tuple[str, str]] = set()
    for res in ec2.describe_instances()["Reservations"]:
        live |= {("ec2:instance", i["InstanceId"]) for i in res["Instances"] if i["State"]["Name"] != "terminated"}
    live |= {("ec2:vpc", v["VpcId"]) for v in ec2.describe_vpcs()["Vpcs"]}
    live |= {("ec2:subnet", v["SubnetId"]) for v in ec2.describe_subnets()["Subnets"]}
    live |= {("ec2:security-group", v["GroupId"]) for v in ec2.describe_security_groups()["SecurityGroups"]}
    live |= {("ec2:internet-gateway", v["InternetGatewayId"]) for v in ec2.describe_internet_gateways()["InternetGateways"]}
    live |= {("ec2:route-table", v["RouteTableId"]) for v in ec2.describe_route_tables()["RouteTables"]}
    live |= {("ec2:elastic-ip", v["AllocationId"]) for v in ec2.describe_addresses()["Addresses"]}
    live |= {("ec2:nat-gateway", v["NatGatewayId"]) for v in ec2.describe_nat_gateways()["NatGateways"] if v["State"] != "deleted"}
    live |= {("ec2:vpc-endpoint", v["VpcEndpointId"]) for v in ec2.describe_vpc_endpoints()["VpcEndpoints"] if v["State"].lower() != "deleted"}
    live |= {("ec2:network-interface", v["NetworkInterfaceId"]) for v in ec2.describe_network_interfaces()["NetworkInterfaces"]}
    live |= {("ec2:volume", v["VolumeId"]) for v in ec2.describe_volumes()["Volumes"]}
    live |= {("ec2:launch-template", v["LaunchTemplateId"]) for v in ec2.describe_launch_templates()["LaunchTemplates"]}
    live |= {("ec2:placement-group", name) for name in s.placement.groups}
    for fs in efs.describe_file_systems()["FileSystems"]:
        live.add(("efs:file-system", fs["FileSystemId"]))
        live |= {("efs:mount-target", m["MountTargetId"]) for m in efs.describe_mount_targets(FileSystemId=fs["FileSystemId"])["MountTargets"]}
    live |= {("elbv2:load-balancer", v["LoadBalancerArn"]) for v in elb.describe_load_balancers()["LoadBalancers"]}
    live |= {("elbv2:target-group", v["TargetGroupArn"]) for v in elb.describe_target_groups()["TargetGroups"]}
    for c in eks.list_clusters()["clusters"]:
        live.add(("eks:cluster", c))
        live |= {("eks:nodegroup", f"{c}/{ng}") for ng in eks.list_nodegroups(clusterName=c)["nodegroups"]}
    live |= {("ecr:repository", r["repositoryName"]) for r in ecr.describe_repositories()["repositories"]}
    live |= {("kms:key", k["KeyId"]) for k in kms.list_keys()["Keys"] if kms.describe_key(KeyId=k["KeyId"])["KeyMetadata"]["KeyState"] != "PendingDeletion"}
    live |= {("logs:log-group", g["logGroupName"]) for g in logs.describe_log_groups()["logGroups"]}
    live |= {("iam:role", r["RoleName"]) for r in iam.list_roles()["Roles"]}
    live |= {("iam:instance-profile", p["InstanceProfileName"]) for p in iam.list_instance_profiles()["InstanceProfiles"]}
    asg = client("autoscaling")
    live |= {("autoscaling:group", g["AutoScalingGroupName"]) for g in asg.describe_auto_scaling_groups()["AutoScalingGroups"]}
    return live


@pytest.fixture
def seeded(aws) -> Seeded:
    return seed()


@pytest.fixture
def session(seeded):
    gaps = seeded.placement.gaps()
    sess = gaps.session()
    sess.gaps = gaps  # the test reads the calls made (in order) from here
    return sess


def expected_deletions(s: Seeded) -> set[tuple[str, str]]:
    parts = {("efs:mount-target", i) for i in s.parts["expired"] if i.startswith("fsmt-")}
    parts |= {("eks:nodegroup", i) for i in s.parts["expired"] if "/" in i}
    parts |= s.leftovers["expired"]
    return s.of("expired") | parts


# --- selection ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tags", "delete", "why"),
    [
        (tags_for("expired"), True, "expired at 2020-01-01T00:00:00Z"),
        (tags_for("later"), False, "not expired"),
        (tags_for("prod"), False, "lifecycle=production"),
        ({**tags_for("prod"), "expires-at": EXPIRED}, False, "lifecycle=production"),
        ({}, False, "not tagged project=gpu-serving"),
        ({"project": "gpu-serving", "lifecycle": "ephemeral", "expires-at": "soon"}, False, "is not an ISO 8601 time"),
        ({"project": "gpu-serving", "lifecycle": "ephemeral", "expires-at": "2020-01-01T00:00:00"}, False, "is not an ISO 8601 time with a time zone"),
        ({"project": "gpu-serving", "lifecycle": "ephemeral", "expires-at": "2026-12-02T13:00:00+02:00"}, True, "expired"),
        ({"project": "gpu-serving", "lifecycle": "ephemeral"}, False, "no expires-at tag"),
        ({"project": "gpu-serving", "expires-at": EXPIRED}, False, "no lifecycle=ephemeral tag"),
    ],
)
def test_verdict(tags, delete, why):
    got, reason = sw.verdict(tags, NOW)
    assert got is delete and why in reason


def test_order_covers_every_kind_once():
    assert len(set(sw.ORDER)) == len(sw.ORDER) == len(sw.STEPS)
    before = lambda a, b: sw.ORDER.index(a) < sw.ORDER.index(b)  # noqa: E731
    assert before("eks:nodegroup", "eks:cluster")
    assert before("elbv2:load-balancer", "elbv2:target-group")
    assert before("ec2:instance", "ec2:network-interface") and before("ec2:instance", "ec2:volume")
    assert before("efs:mount-target", "efs:file-system")
    assert before("ec2:nat-gateway", "ec2:elastic-ip")
    assert before("ec2:security-group", "ec2:subnet") and sw.ORDER.index("ec2:vpc") == max(sw.ORDER.index(k) for k in sw.ORDER if k.startswith("ec2:"))


# --- the AWS helpers (infra/ops/aws.py) ---------------------------------------------------------


def test_the_shared_aws_helpers_read_real_errors(aws):
    """infra/ops/aws.py, on the errors the moto server and botocore actually raise."""
    ec2 = client("ec2")
    with pytest.raises(Exception) as missing:
        ec2.describe_vpcs(VpcIds=["vpc-00000000"])
    assert ops_aws.error_code(missing.value) == "InvalidVpcID.NotFound"
    assert ops_aws.is_gone(missing.value) and not ops_aws.is_denied(missing.value)
    assert ops_aws.error_text(missing.value) == "InvalidVpcID.NotFound: VpcID {'vpc-00000000'} does not exist."
    assert ops_aws.error_text(missing.value, limit=10) == "InvalidVpcID.NotFound: VpcID {'vp..."
    with pytest.raises(Exception) as page:  # moto answers this call with an HTML error page
        ec2.describe_placement_groups()
    assert ops_aws.error_text(page.value) == "HTTP error page: 500 Internal Server Error"
    assert not ops_aws.is_gone(page.value)
    assert ops_aws.error_text(KeyError("InstanceId")) == "KeyError: 'InstanceId'"
    assert ops_aws.tag_dict([{"Key": "a", "Value": "1"}, {"Key": "b"}, {"Value": "no key"}]) == {"a": "1", "b": ""}
    assert ops_aws.tag_dict([{"TagKey": "k", "TagValue": "v"}], "TagKey", "TagValue") == {"k": "v"}
    assert ops_aws.tag_dict(None) == {}


# --- dry run ------------------------------------------------------------------------------------


def test_dry_run_lists_exactly_the_expired_and_deletes_nothing(seeded, session):
    before = still_there(seeded)
    report = swept(session, yes=False)
    assert report.dry_run and report.ok, report.errors
    assert keys(report.planned) == expected_deletions(seeded)
    assert not report.deleted and not report.failed
    assert still_there(seeded) == before  # nothing touched
    deletes = [op for svc, op in session.gaps.operations if op.startswith(("Delete", "Terminate", "Release", "Revoke", "Detach", "Schedule"))]
    assert deletes == []

    # Parts without tags of their own are listed with their parent.
    parts = {e.resource.id: e.detail for e in report.planned if e.resource.parent}
    left = {kind: rid for kind, rid in seeded.leftovers["expired"]}
    assert parts == {seeded.parts["expired"][0]: f"part of efs:file-system {seeded.ids['expired']['efs:file-system'][0]}",
                     "expired-1/system": "part of eks:cluster expired-1",
                     # What EKS and the VPC CNI left without the stack's tags:
                     left["ec2:network-interface"]: f"part of ec2:vpc {seeded.ids['expired']['ec2:vpc'][0]}",
                     left["logs:log-group"]: "part of the expired stack pr-1",
                     left["autoscaling:group"]: "part of eks:cluster expired-1"}  # fmt: skip
    # The same leftovers of the production and the unexpired stack are not even listed.
    listed = keys(report.planned) | keys(report.skipped)
    assert not listed & (seeded.leftovers["prod"] | seeded.leftovers["later"] | seeded.leftovers["untagged"])

    # Skipped: every gpu-serving resource that stays, with the reason.
    skipped = {(e.resource.kind, e.resource.id): e.detail for e in report.skipped}
    for kind, rid in seeded.of("prod"):
        assert "lifecycle=production" in skipped[(kind, rid)]
    for kind, rid in seeded.of("later"):
        assert skipped[(kind, rid)].startswith("not expired: expires-at=2099")
    reasons = {seeded.odd[rid]: why for (kind, rid), why in skipped.items() if rid in seeded.odd}
    assert "is not an ISO 8601 time" in reasons["tomorrow"] and "time zone" in reasons["naive"]
    assert "no lifecycle=ephemeral tag" in reasons["no-lifecycle"] and "no expires-at tag" in reasons["no-expiry"]
    assert "lifecycle=production" in reasons["prod-with-expiry"]
    assert "other-project" not in reasons  # not ours: not even reported
    assert not any(rid in {i for _, i in seeded.of("untagged")} for _, rid in skipped)


# --- deleting -----------------------------------------------------------------------------------


def test_yes_deletes_exactly_the_expired_in_dependency_order(seeded, session):
    before = still_there(seeded)
    report = swept(session, yes=True)
    assert report.failed == [] and report.errors == [], (report.failed, report.errors)
    assert keys(report.deleted) == expected_deletions(seeded)

    after = still_there(seeded)
    assert not (after & expected_deletions(seeded))  # all gone
    for owner in ("prod", "later", "untagged"):  # and nothing else of what was seeded
        assert seeded.of(owner) <= after, owner
    assert {("ec2:volume", v) for v in seeded.odd} <= after
    assert {("efs:mount-target", i) for i in seeded.parts["prod"] if i.startswith("fsmt-")} <= after
    assert {("eks:nodegroup", i) for i in seeded.parts["prod"] + seeded.parts["untagged"] if "/" in i} <= after
    # What went besides: only what AWS deletes with its parent (the VPC's default group and main route
    # table, the root volume and interface of a terminated instance, the NAT's and mount target's interfaces).
    # The expired cluster's Auto Scaling group went with its instance; the others' kept theirs.
    asg_instances = {("ec2:instance", i) for i in seeded.asg_instances["expired"]}
    assert asg_instances and not asg_instances & after
    for owner in ("prod", "later", "untagged"):
        assert seeded.leftovers[owner] <= after, owner
        assert {("ec2:instance", i) for i in seeded.asg_instances[owner]} <= after, owner
    asg_entry = next(e for e in report.deleted if e.resource.kind == "autoscaling:group")
    assert asg_entry.detail == "with its 1 instance(s)"
    extra = (before - after) - expected_deletions(seeded) - asg_instances
    assert {k for k, _ in extra} <= {"ec2:security-group", "ec2:route-table", "ec2:volume", "ec2:network-interface"}, extra
    assert not extra & (seeded.of("prod") | seeded.of("later") | seeded.of("untagged"))
    # The KMS key is scheduled for deletion (7 days), its alias gone; the role's policies were detached first.
    kms_entry = next(e for e in report.deleted if e.resource.kind == "kms:key")
    assert "deletion scheduled for" in kms_entry.detail
    assert "alias/eks-expired-1" not in {a["AliasName"] for a in client("kms").list_aliases()["Aliases"]}
    sg_entries = [e for e in report.deleted if e.resource.kind == "ec2:security-group"]
    assert any("after revoking" in e.detail for e in sg_entries)

    ops = [op for svc, op in session.gaps.operations]

    def first(op: str) -> int:
        return ops.index(op)

    def last(op: str) -> int:
        return len(ops) - 1 - ops[::-1].index(op)

    assert last("DeleteNodegroup") < first("DeleteCluster")
    assert last("DeleteCluster") < first("DeleteAutoScalingGroup") < first("TerminateInstances")
    assert first("DeleteNetworkInterface") < first("DeleteSubnet")  # the CNI's interface no longer blocks it
    assert first("RemoveRoleFromInstanceProfile") < first("DeleteInstanceProfile")
    assert last("DeleteCluster") < first("DeleteLoadBalancer") < first("DeleteTargetGroup")
    assert first("TerminateInstances") < first("DeleteNetworkInterface") and first("TerminateInstances") < first("DeleteVolume")
    assert first("DeleteMountTarget") < first("DeleteFileSystem")
    assert first("DeleteNatGateway") < first("ReleaseAddress")
    assert first("RevokeSecurityGroupIngress") < first("DeleteSecurityGroup")
    assert last("DeleteSecurityGroup") < first("DeleteSubnet")
    assert first("DisassociateRouteTable") < first("DeleteRouteTable")
    assert first("DetachInternetGateway") < first("DeleteInternetGateway") < first("DeleteVpc")
    assert last("DeleteSubnet") < first("DeleteVpc")
    assert first("DetachRolePolicy") < first("DeleteRole") and first("DeleteRolePolicy") < first("DeleteRole")

    # A second sweep finds nothing more to do.
    again = swept(session, yes=True)
    assert again.planned == [] and again.ok


def test_failures_are_reported_and_production_is_left_alone(aws):
    # An expired VPC that holds a production subnet: the VPC cannot go, and the subnet must not.
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.50.0.0/16", TagSpecifications=spec("vpc", tags_for("expired")))["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.50.1.0/24", TagSpecifications=spec("subnet", tags_for("prod")))["Subnet"]["SubnetId"]
    report = sw.sweep([REGION], yes=True, now=NOW, wait=0, poll=0.01)
    assert keys(report.planned) == {("ec2:vpc", vpc)}
    assert [(e.resource.id, e.detail.split(":")[0]) for e in report.failed] == [(vpc, "DependencyViolation")]
    assert not report.ok
    assert {s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]} >= {sub}
    assert vpc in {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]}


def test_expired_parts_of_a_production_instance_are_left_attached(aws):
    # An expired volume and interface attached to a production instance: never detached, reported at once.
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.70.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.70.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    inst = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="t3.micro", SubnetId=sub,
                             TagSpecifications=spec("instance", tags_for("prod")))["Instances"][0]["InstanceId"]  # fmt: skip
    vol = ec2.create_volume(AvailabilityZone="us-east-1a", Size=1, TagSpecifications=spec("volume", tags_for("expired")))["VolumeId"]
    ec2.attach_volume(VolumeId=vol, InstanceId=inst, Device="/dev/sdf")
    eni = ec2.create_network_interface(SubnetId=sub, TagSpecifications=spec("network-interface", tags_for("expired")))["NetworkInterface"]["NetworkInterfaceId"]
    ec2.attach_network_interface(NetworkInterfaceId=eni, InstanceId=inst, DeviceIndex=1)
    report = sw.sweep([REGION], yes=True, now=NOW, wait=60, poll=5)  # must not sit out the wait
    failed = {e.resource.id: e.detail for e in report.failed}
    assert failed == {vol: f"attached to {inst}, which is not being swept; left alone",
                      eni: f"attached to {inst}, which is not being swept; left alone"}  # fmt: skip
    assert ec2.describe_volumes(VolumeIds=[vol])["Volumes"][0]["Attachments"][0]["InstanceId"] == inst
    assert ec2.describe_network_interfaces(NetworkInterfaceIds=[eni])["NetworkInterfaces"][0]["Attachment"]["InstanceId"] == inst


def test_listing_failures_are_reported_not_fatal(aws):
    # Without Gaps, moto answers the placement-group listing with HTTP 500: the sweep says so and goes on.
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.60.0.0/16", TagSpecifications=spec("vpc", tags_for("expired")))["Vpc"]["VpcId"]
    report = sw.sweep([REGION], yes=True, now=NOW, wait=0, poll=0.01)
    assert keys(report.deleted) == {("ec2:vpc", vpc)}
    assert len(report.errors) == 1 and "placement groups" in report.errors[0]
    assert not report.ok


# --- the command --------------------------------------------------------------------------------


def cli_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    return {**env, "COLUMNS": "250"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "infra", "sweep", *args], cwd=REPO_ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def test_cli_subprocess_dry_run_then_yes(seeded):
    # The real command against the moto server (AWS_ENDPOINT_URL from the environment). moto cannot list
    # placement groups, so the command reports that listing as failed and exits 1; all else is swept.
    before = still_there(seeded)
    proc = run_cli("--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["dry_run"] is True and data["deleted"] == []
    expected = expected_deletions(seeded) - {("ec2:placement-group", n) for n in seeded.placement.groups}
    assert {(e["kind"], e["id"]) for e in data["would_delete"]} == expected
    assert any("placement groups" in err for err in data["errors"])
    assert still_there(seeded) == before

    text = run_cli()  # the tables a person reads
    assert "Would delete" in text.stdout and "rerun with --yes to delete" in text.stdout
    assert "vpc" in text.stdout and seeded.ids["expired"]["ec2:vpc"][0] in text.stdout

    proc = run_cli("--yes", "--wait", "5")
    assert proc.returncode == 1  # the placement-group listing, again
    assert "Deleted (" in proc.stdout and "could not look" in proc.stdout
    after = still_there(seeded)
    assert not (after & expected)
    assert {("ec2:placement-group", n) for n in seeded.placement.groups} <= after  # never seen, so never touched
    for owner in ("prod", "later", "untagged"):
        assert seeded.of(owner) <= after, owner


def test_cli_in_process_with_gaps_exits_0(seeded, session, monkeypatch):
    monkeypatch.setattr(ops_aws, "new_session", lambda region=None: session)
    result = CliRunner().invoke(app, ["sweep", "--yes", "--region", REGION, "--wait", "5"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "Deleted (" in result.output and "0 failed" in result.output
    assert "Skipped (" in result.output and "lifecycle=production" in result.output
    after = still_there(seeded)
    assert not (after & seeded.of("expired"))


def test_cli_without_region_exits_2(aws):
    env = {k: v for k, v in cli_env().items() if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    proc = subprocess.run([sys.executable, "-m", "infra", "sweep"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no AWS region" in proc.stderr


def test_a_log_group_eks_recreated_for_a_gone_ephemeral_cluster_goes_once_no_stack_can_be_alive(aws):
    # A teardown that succeeded leaves nothing tagged to link it to: EKS re-created the log group, untagged, after
    # the stack deleted it. Its ephemeral cluster's name, the cluster's absence and its age are what the sweep reads.
    logs = client("logs")
    eks = client("eks")
    iam = client("iam")
    role = iam.create_role(RoleName="r", AssumeRolePolicyDocument=ROLE_DOC)["Role"]["Arn"]
    for name in ("gpu-serving-eph-1a2b3c4d", "gpu-serving-eph-live", "gpu-serving-prod", "someone-elses"):
        logs.create_log_group(logGroupName=f"/aws/eks/{name}/cluster")
    eks.create_cluster(name="gpu-serving-eph-live", roleArn=role, resourcesVpcConfig={"subnetIds": []})
    created = dt.datetime.fromtimestamp(logs.describe_log_groups()["logGroups"][0]["creationTime"] / 1000, dt.timezone.utc)

    def listed(now: dt.datetime) -> dict[str, str]:
        report = sw.sweep([REGION], yes=False, now=now, wait=0, poll=0.01)
        return {e.resource.id: e.detail for e in report.planned if e.resource.kind == "logs:log-group"}

    assert listed(created + dt.timedelta(days=1)) == {}  # an ephemeral stack may still be alive under that name
    later = listed(created + dt.timedelta(days=8))
    assert list(later) == ["/aws/eks/gpu-serving-eph-1a2b3c4d/cluster"]  # not the live cluster's, not prod's, not others'
    assert "re-created by EKS for the ephemeral cluster gpu-serving-eph-1a2b3c4d, which no longer exists" in later[
        "/aws/eks/gpu-serving-eph-1a2b3c4d/cluster"]
    report = sw.sweep([REGION], yes=True, now=created + dt.timedelta(days=8), wait=5, poll=0.01)
    assert [e.resource.id for e in report.deleted if e.resource.kind == "logs:log-group"] == ["/aws/eks/gpu-serving-eph-1a2b3c4d/cluster"]
    assert {g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]} == {
        "/aws/eks/gpu-serving-eph-live/cluster", "/aws/eks/gpu-serving-prod/cluster", "/aws/eks/someone-elses/cluster"}
