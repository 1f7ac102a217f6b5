"""Deleting, kind by kind, in `ORDER` (the order of `STEPS`): dependents before what they depend on.

    EKS Fargate profiles, node groups (wait) -> EKS clusters (wait)
    -> Auto Scaling groups, with their instances (wait)
    -> ELBv2 load balancers (wait) -> target groups
    -> EC2 instances (wait until terminated)
    -> EFS mount targets (wait) -> EFS file systems; FSx file systems (wait)
    -> NAT gateways (wait until deleted) -> elastic IPs
    -> VPC endpoints (wait) -> network interfaces -> EBS volumes
    -> launch templates -> placement groups
    -> security groups (rules that reference groups revoked first)
    -> subnets -> route tables -> internet gateways (detached) -> VPCs
    -> ECR repositories -> KMS keys (deletion scheduled, 7 days) -> log groups -> IAM roles
    -> IAM instance profiles

Each kind has a `Step`: `delete(clients, resource)` starts the deletion and
returns a detail for the report (or ""), and `exists(clients, resource)`, where
AWS deletes asynchronously, says whether it is still there (run.py waits on it).
A deleter raises `Retry` for a reason that may pass (still attached) and
`Refused` for one that will not (held by something not being swept).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from infra.ops import aws
from infra.ops.sweep.clients import Clients
from infra.ops.sweep.records import Resource

KMS_PENDING_DAYS = 7  # the shortest deletion window KMS allows


def mark_swept_holders(resources: Iterable[Resource]) -> None:
    """Tell the deleters of attachable things which holders are being swept too.

    An elastic IP may be disassociated from a swept instance, interface or NAT
    gateway's interface; a volume or interface may wait for a swept instance to
    let go. Anything held by something else is not the sweep's to touch.
    """
    resources = list(resources)
    ours = {r.id for r in resources if r.kind in ("ec2:instance", "ec2:network-interface")}
    ours |= {eni for r in resources if r.kind == "ec2:nat-gateway" for eni in r.data.get("enis", [])}
    instances = {r.id for r in resources if r.kind == "ec2:instance"}
    for r in resources:
        if r.kind == "ec2:elastic-ip":
            r.data["ours"] = ours
        elif r.kind in ("ec2:network-interface", "ec2:volume"):
            r.data["ours"] = instances


class Retry(Exception):
    """Not deletable yet, for a reason that may pass (e.g. still attached); retried until the deadline."""


class Refused(Exception):
    """Not deleted, on purpose or because AWS said no; the message is the report's detail as it is."""


def _exists(call: Callable[[], Any]) -> bool:
    try:
        return bool(call())
    except Exception as exc:  # noqa: BLE001
        if aws.is_gone(exc):
            return False
        raise


# Each kind: delete(c, r) -> detail or "", and exists(c, r) -> bool when AWS deletes asynchronously.


def _del_fargate(c: Clients, r: Resource) -> str:
    c.eks.delete_fargate_profile(clusterName=r.data["cluster"], fargateProfileName=r.data["profile"])
    return ""


def _has_fargate(c: Clients, r: Resource) -> bool:
    return _exists(lambda: c.eks.describe_fargate_profile(clusterName=r.data["cluster"], fargateProfileName=r.data["profile"]))


def _del_nodegroup(c: Clients, r: Resource) -> str:
    c.eks.delete_nodegroup(clusterName=r.data["cluster"], nodegroupName=r.data["nodegroup"])
    return ""


def _has_nodegroup(c: Clients, r: Resource) -> bool:
    return _exists(lambda: c.eks.describe_nodegroup(clusterName=r.data["cluster"], nodegroupName=r.data["nodegroup"]))


def _del_cluster(c: Clients, r: Resource) -> str:
    c.eks.delete_cluster(name=r.id)
    return ""


def _has_cluster(c: Clients, r: Resource) -> bool:
    return _exists(lambda: c.eks.describe_cluster(name=r.id))


def _del_asg(c: Clients, r: Resource) -> str:
    # ForceDelete terminates the group's instances with it (Auto Scaling API, DeleteAutoScalingGroup); deleting
    # them first would only have the group launch new ones.
    c.autoscaling.delete_auto_scaling_group(AutoScalingGroupName=r.id, ForceDelete=True)
    n = r.data.get("instances", 0)
    return f"with its {n} instance(s)" if n else ""


def _has_asg(c: Clients, r: Resource) -> bool:
    return _exists(lambda: c.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[r.id]).get("AutoScalingGroups"))


def _del_lb(c: Clients, r: Resource) -> str:
    c.elbv2.delete_load_balancer(LoadBalancerArn=r.id)
    return ""


def _has_lb(c: Clients, r: Resource) -> bool:
    return _exists(lambda: c.elbv2.describe_load_balancers(LoadBalancerArns=[r.id])["LoadBalancers"])


def _del_tg(c: Clients, r: Resource) -> str:
    c.elbv2.delete_target_group(TargetGroupArn=r.id)
    return ""


def _del_instance(c: Clients, r: Resource) -> str:
    c.ec2.terminate_instances(InstanceIds=[r.id])
    return "terminated"


def _has_instance(c: Clients, r: Resource) -> bool:
    def live() -> bool:
        for res in c.ec2.describe_instances(InstanceIds=[r.id]).get("Reservations", []):
            for i in res.get("Instances", []):
                if i.get("State", {}).get("Name") != "terminated":
                    return True
        return False

    return _exists(live)


def _del_mount_target(c: Clients, r: Resource) -> str:
    c.efs.delete_mount_target(MountTargetId=r.id)
    return ""


def _has_mount_target(c: Clients, r: Resource) -> bool:
    return _exists(
        lambda: [m for m in c.efs.describe_mount_targets(MountTargetId=r.id).get("MountTargets", []) if m.get("LifeCycleState") != "deleted"]
    )


def _del_efs(c: Clients, r: Resource) -> str:
    c.efs.delete_file_system(FileSystemId=r.id)
    return ""


def _has_efs(c: Clients, r: Resource) -> bool:
    return _exists(
        lambda: [f for f in c.efs.describe_file_systems(FileSystemId=r.id).get("FileSystems", []) if f.get("LifeCycleState") != "deleted"]
    )


def _del_fsx(c: Clients, r: Resource) -> str:
    c.fsx.delete_file_system(FileSystemId=r.id)
    return ""


def _has_fsx(c: Clients, r: Resource) -> bool:
    return _exists(lambda: c.fsx.describe_file_systems(FileSystemIds=[r.id]).get("FileSystems"))


def _del_nat(c: Clients, r: Resource) -> str:
    c.ec2.delete_nat_gateway(NatGatewayId=r.id)
    return ""


def _has_nat(c: Clients, r: Resource) -> bool:
    return _exists(
        lambda: [n for n in c.ec2.describe_nat_gateways(NatGatewayIds=[r.id]).get("NatGateways", []) if n.get("State") not in ("deleted", "failed")]
    )


def _del_eip(c: Clients, r: Resource) -> str:
    addrs = c.ec2.describe_addresses(AllocationIds=[r.id]).get("Addresses", [])
    a = addrs[0] if addrs else {}
    if a.get("AssociationId"):
        # AWS lets go of a deleted NAT gateway's address by itself. An address still held by an
        # instance or interface of the swept set (or by a swept NAT gateway's interface) is
        # disassociated; one held by anything else is not ours to touch.
        holder = a.get("InstanceId") or a.get("NetworkInterfaceId") or a["AssociationId"]
        if holder not in r.data.get("ours", ()):
            raise Retry(f"still associated with {holder}, which is not being swept")
        c.ec2.disassociate_address(AssociationId=a["AssociationId"])
        c.ec2.release_address(AllocationId=r.id)
        return f"released (disassociated from {holder}, swept too)"
    c.ec2.release_address(AllocationId=r.id)
    return "released"


def _del_vpce(c: Clients, r: Resource) -> str:
    out = c.ec2.delete_vpc_endpoints(VpcEndpointIds=[r.id])
    for u in out.get("Unsuccessful", []) or []:
        err = u.get("Error", {})
        raise Refused(f"{err.get('Code', '')}: {err.get('Message', '')}")
    return ""


def _has_vpce(c: Clients, r: Resource) -> bool:
    return _exists(
        lambda: [e for e in c.ec2.describe_vpc_endpoints(VpcEndpointIds=[r.id]).get("VpcEndpoints", []) if str(e.get("State", "")).lower() != "deleted"]
    )


def _del_eni(c: Clients, r: Resource) -> str:
    enis = c.ec2.describe_network_interfaces(NetworkInterfaceIds=[r.id]).get("NetworkInterfaces", [])
    att = (enis[0].get("Attachment") or {}) if enis else {}
    if att.get("Status") in ("attached", "attaching", "detaching"):
        holder = att.get("InstanceId") or att.get("InstanceOwnerId") or att.get("AttachmentId")
        if att.get("InstanceId") and att["InstanceId"] not in r.data.get("ours", ()):
            raise Refused(f"attached to {holder}, which is not being swept; left alone")
        raise Retry(f"still attached to {holder}")
    c.ec2.delete_network_interface(NetworkInterfaceId=r.id)
    return ""


def _del_volume(c: Clients, r: Resource) -> str:
    vols = c.ec2.describe_volumes(VolumeIds=[r.id]).get("Volumes", [])
    attached = [a for a in (vols[0].get("Attachments") or []) if a.get("State") in ("attached", "attaching", "detaching")] if vols else []
    if attached:
        holder = attached[0].get("InstanceId")
        if holder not in r.data.get("ours", ()):
            raise Refused(f"attached to {holder}, which is not being swept; left alone")
        raise Retry(f"still attached to {holder}")
    c.ec2.delete_volume(VolumeId=r.id)
    return ""


def _del_lt(c: Clients, r: Resource) -> str:
    c.ec2.delete_launch_template(LaunchTemplateId=r.id)
    return ""


def _del_pg(c: Clients, r: Resource) -> str:
    c.ec2.delete_placement_group(GroupName=r.id)
    return ""


def revoke_group_rules(c: Clients, groups: list[Resource]) -> dict[str, int]:
    """Revoke every rule of `groups` that references a security group (theirs or others'), so that
    groups referring to one another can be deleted. Returns rules revoked per group."""
    revoked: dict[str, int] = {}
    for g in groups:
        try:
            rules = list(aws.pages(c.ec2, "describe_security_group_rules", "SecurityGroupRules",
                                Filters=[{"Name": "group-id", "Values": [g.id]}]))  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            if aws.is_gone(exc):
                continue
            raise
        ingress = [x["SecurityGroupRuleId"] for x in rules if x.get("ReferencedGroupInfo") and not x.get("IsEgress")]
        egress = [x["SecurityGroupRuleId"] for x in rules if x.get("ReferencedGroupInfo") and x.get("IsEgress")]
        if ingress:
            c.ec2.revoke_security_group_ingress(GroupId=g.id, SecurityGroupRuleIds=ingress)
        if egress:
            c.ec2.revoke_security_group_egress(GroupId=g.id, SecurityGroupRuleIds=egress)
        revoked[g.id] = len(ingress) + len(egress)
    return revoked


def _del_sg(c: Clients, r: Resource) -> str:
    c.ec2.delete_security_group(GroupId=r.id)
    n = r.data.get("revoked", 0)
    return f"after revoking {n} rule(s) that referenced security groups" if n else ""


def _del_subnet(c: Clients, r: Resource) -> str:
    c.ec2.delete_subnet(SubnetId=r.id)
    return ""


def _del_route_table(c: Clients, r: Resource) -> str:
    tables = c.ec2.describe_route_tables(RouteTableIds=[r.id]).get("RouteTables", [])
    n = 0
    for a in (tables[0].get("Associations") or []) if tables else []:
        if not a.get("Main") and a.get("RouteTableAssociationId"):
            c.ec2.disassociate_route_table(AssociationId=a["RouteTableAssociationId"])
            n += 1
    c.ec2.delete_route_table(RouteTableId=r.id)
    return f"after {n} association(s) removed" if n else ""


def _del_igw(c: Clients, r: Resource) -> str:
    igws = c.ec2.describe_internet_gateways(InternetGatewayIds=[r.id]).get("InternetGateways", [])
    detached = []
    for a in (igws[0].get("Attachments") or []) if igws else []:
        if a.get("VpcId"):
            c.ec2.detach_internet_gateway(InternetGatewayId=r.id, VpcId=a["VpcId"])
            detached.append(a["VpcId"])
    c.ec2.delete_internet_gateway(InternetGatewayId=r.id)
    return f"detached from {', '.join(detached)} first" if detached else ""


def _del_vpc(c: Clients, r: Resource) -> str:
    c.ec2.delete_vpc(VpcId=r.id)
    return ""


def _del_ecr(c: Clients, r: Resource) -> str:
    c.ecr.delete_repository(repositoryName=r.id, force=True)
    return "with its images"


def _del_kms(c: Clients, r: Resource) -> str:
    for alias in list(aws.pages(c.kms, "list_aliases", "Aliases", KeyId=r.id)):
        name = alias.get("AliasName", "")
        if name and not name.startswith("alias/aws/"):
            c.kms.delete_alias(AliasName=name)
    out = c.kms.schedule_key_deletion(KeyId=r.id, PendingWindowInDays=KMS_PENDING_DAYS)
    when = out.get("DeletionDate")
    when_text = when.strftime("%Y-%m-%d") if isinstance(when, dt.datetime) else f"in {KMS_PENDING_DAYS} days"
    return f"deletion scheduled for {when_text} (KMS's shortest window); aliases removed"


def _del_log_group(c: Clients, r: Resource) -> str:
    c.logs.delete_log_group(logGroupName=r.id)
    return ""


def _del_role(c: Clients, r: Resource) -> str:
    iam = c.iam
    for p in list(aws.pages(iam, "list_attached_role_policies", "AttachedPolicies", RoleName=r.id)):
        iam.detach_role_policy(RoleName=r.id, PolicyArn=p["PolicyArn"])
    for name in list(aws.pages(iam, "list_role_policies", "PolicyNames", RoleName=r.id)):
        iam.delete_role_policy(RoleName=r.id, PolicyName=name)
    for prof in list(aws.pages(iam, "list_instance_profiles_for_role", "InstanceProfiles", RoleName=r.id)):
        iam.remove_role_from_instance_profile(InstanceProfileName=prof["InstanceProfileName"], RoleName=r.id)
    iam.delete_role(RoleName=r.id)
    return "policies detached first"


@dataclass(frozen=True)
class Step:
    kind: str
    delete: Callable[[Clients, Resource], str]
    exists: Optional[Callable[[Clients, Resource], bool]] = None  # set where AWS deletes asynchronously


def _del_instance_profile(c: Clients, r: Resource) -> str:
    iam = c.iam
    for role in iam.get_instance_profile(InstanceProfileName=r.id)["InstanceProfile"].get("Roles", []):
        iam.remove_role_from_instance_profile(InstanceProfileName=r.id, RoleName=role["RoleName"])
    iam.delete_instance_profile(InstanceProfileName=r.id)
    return ""


STEPS: dict[str, Step] = {
    s.kind: s
    for s in (
        Step("eks:fargate-profile", _del_fargate, _has_fargate),
        Step("eks:nodegroup", _del_nodegroup, _has_nodegroup),
        Step("eks:cluster", _del_cluster, _has_cluster),
        Step("autoscaling:group", _del_asg, _has_asg),
        Step("elbv2:load-balancer", _del_lb, _has_lb),
        Step("elbv2:target-group", _del_tg),
        Step("ec2:instance", _del_instance, _has_instance),
        Step("efs:mount-target", _del_mount_target, _has_mount_target),
        Step("efs:file-system", _del_efs, _has_efs),
        Step("fsx:file-system", _del_fsx, _has_fsx),
        Step("ec2:nat-gateway", _del_nat, _has_nat),
        Step("ec2:elastic-ip", _del_eip),
        Step("ec2:vpc-endpoint", _del_vpce, _has_vpce),
        Step("ec2:network-interface", _del_eni),
        Step("ec2:volume", _del_volume),
        Step("ec2:launch-template", _del_lt),
        Step("ec2:placement-group", _del_pg),
        Step("ec2:security-group", _del_sg),
        Step("ec2:subnet", _del_subnet),
        Step("ec2:route-table", _del_route_table),
        Step("ec2:internet-gateway", _del_igw),
        Step("ec2:vpc", _del_vpc),
        Step("ecr:repository", _del_ecr),
        Step("kms:key", _del_kms),
        Step("logs:log-group", _del_log_group),
        Step("iam:role", _del_role),
        Step("iam:instance-profile", _del_instance_profile),
    )
}
ORDER: tuple[str, ...] = tuple(STEPS)  # the kinds, in the order they are deleted
