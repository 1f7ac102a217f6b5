"""Discovery: what each service holds, tagged or part of something tagged, per region.

One lister per service (EC2: one per kind, each making its own call, so one
failing call hides nothing else). A listing that fails is reported and the rest
goes on. Every resource found is judged by its own tags (selection.py).

The only things deleted without tags of their own are parts that AWS cannot
delete apart from their tagged parent and that have no tags to read: EFS mount
targets of a swept file system, EKS node groups and Fargate profiles without
tags of a swept cluster (listed here, with their parent), and, at deletion
(deleting.py), the aliases of a swept KMS key, the route-table associations,
internet gateway attachments and security-group rules of swept tables, gateways
and groups, and the policy attachments of a swept IAM role.

And what EKS and its add-ons create in a swept cluster's name without the
stack's tags, found in a second pass once the tagged resources of a region are
known (`PART_LISTERS`; a cluster is swept when it is, or when its stack's
tagged resources are: EKS clusters are named `gpu-serving-<stack>`):

- network interfaces the VPC CNI created (tagged only
  `cluster.k8s.amazonaws.com/name`) in a swept VPC: left behind, they block
  the deletion of their subnet and VPC;
- the control-plane log group `/aws/eks/<cluster>/cluster` of a swept
  cluster, which EKS creates again, untagged, when it delivers logs after the
  stack deleted ours; and such a log group of an ephemeral stack's cluster
  (`gpu-serving-eph-...`) when no cluster of that name exists any more and the
  group is older than the longest an ephemeral stack may live, so nothing of
  the stack can still be running;
- Auto Scaling groups of a swept cluster (tags `eks:cluster-name` or
  `kubernetes.io/cluster/<name>`), deleted with their instances.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Optional

from infra.aws.tags import PROJECT_TAG, cluster_name
from infra.config import PROJECT
from infra.ops import aws
from infra.ops.sweep.clients import Clients
from infra.ops.sweep.deleting import ORDER
from infra.ops.sweep.records import GLOBAL, Entry, Resource
from infra.ops.ephemeral.naming import MAX_TTL_HOURS, NAME_PREFIX
from infra.ops.sweep.selection import verdict

CNI_CLUSTER_TAG = "cluster.k8s.amazonaws.com/name"  # what the VPC CNI tags its network interfaces with
EKS_ASG_CLUSTER_TAG = "eks:cluster-name"  # EKS managed node groups tag their Auto Scaling groups so
K8S_CLUSTER_TAG = "kubernetes.io/cluster/"  # ... and with kubernetes.io/cluster/<name>
EKS_LOG_GROUP = re.compile(r"^/aws/eks/(?P<cluster>[^/]+)/cluster$")  # EKS control-plane logs
EPHEMERAL_CLUSTER_PREFIX = f"{PROJECT}-{NAME_PREFIX}"  # clusters of stacks made by `python -m infra ephemeral`


def _project_filter() -> list[dict]:
    return [{"Name": f"tag:{PROJECT_TAG}", "Values": [PROJECT]}]


def _list_eks(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    """Clusters, and the node groups and Fargate profiles of every cluster (selected by their own
    tags, or as parts of a swept cluster when they have no tags of their own)."""
    for cname in aws.pages(c.eks, "list_clusters", "clusters"):
        try:
            cluster = c.eks.describe_cluster(name=cname)["cluster"]
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"EKS cluster {cname}", exc)
            continue
        ctags = dict(cluster.get("tags") or {})
        cr = Resource("eks:cluster", cname, c.region, ctags, cname, data={"arn": cluster.get("arn")})
        yield cr
        cluster_swept = verdict(ctags, now)[0]
        for ng in aws.pages(c.eks, "list_nodegroups", "nodegroups", clusterName=cname):
            try:
                info = c.eks.describe_nodegroup(clusterName=cname, nodegroupName=ng)["nodegroup"]
            except Exception as exc:  # noqa: BLE001
                if not aws.is_gone(exc):
                    c.unreadable(f"EKS node group {cname}/{ng}", exc)
                continue
            tags = dict(info.get("tags") or {})
            parent = f"eks:cluster {cname}" if cluster_swept and PROJECT_TAG not in tags else ""
            yield Resource("eks:nodegroup", f"{cname}/{ng}", c.region, (tags or ctags) if parent else tags, ng, parent,
                           data={"cluster": cname, "nodegroup": ng})  # fmt: skip
        try:
            profiles = list(aws.pages(c.eks, "list_fargate_profiles", "fargateProfileNames", clusterName=cname))
        except Exception as exc:  # noqa: BLE001 - not every endpoint has Fargate; a cluster without them is fine
            if aws.error_code(exc) in ("", "404") or aws.is_gone(exc):
                profiles = []
            else:
                raise
        for fp in profiles:
            info = c.eks.describe_fargate_profile(clusterName=cname, fargateProfileName=fp)["fargateProfile"]
            tags = dict(info.get("tags") or {})
            parent = f"eks:cluster {cname}" if cluster_swept and PROJECT_TAG not in tags else ""
            yield Resource("eks:fargate-profile", f"{cname}/{fp}", c.region, (tags or ctags) if parent else tags, fp, parent,
                           data={"cluster": cname, "profile": fp})  # fmt: skip


def _elbv2_tags(c: Clients, arns: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for i in range(0, len(arns), 20):
        for d in c.elbv2.describe_tags(ResourceArns=arns[i : i + 20]).get("TagDescriptions", []):
            out[d["ResourceArn"]] = aws.tag_dict(d.get("Tags"))
    return out


def _list_elbv2(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    lbs = list(aws.pages(c.elbv2, "describe_load_balancers", "LoadBalancers"))
    tags = _elbv2_tags(c, [lb["LoadBalancerArn"] for lb in lbs])
    for lb in lbs:
        arn = lb["LoadBalancerArn"]
        yield Resource("elbv2:load-balancer", arn, c.region, tags.get(arn, {}), lb.get("LoadBalancerName", ""))
    tgs = list(aws.pages(c.elbv2, "describe_target_groups", "TargetGroups"))
    tags = _elbv2_tags(c, [tg["TargetGroupArn"] for tg in tgs])
    for tg in tgs:
        arn = tg["TargetGroupArn"]
        yield Resource("elbv2:target-group", arn, c.region, tags.get(arn, {}), tg.get("TargetGroupName", ""))


def _name(tags: Mapping[str, str], default: str = "") -> str:
    return tags.get("Name", default)


# EC2, one lister per kind.


def _ec2_by_name_tag(kind: str, op: str, key: str, id_field: str) -> Callable[[Clients], Iterator[Resource]]:
    """The lister of an EC2 kind that needs nothing but its id and tags (named by its Name tag)."""

    def lister(c: Clients) -> Iterator[Resource]:
        for item in aws.pages(c.ec2, op, key, Filters=_project_filter()):
            t = aws.tag_dict(item.get("Tags"))
            yield Resource(kind, item[id_field], c.region, t, _name(t))

    return lister


def _ec2_instances(c: Clients) -> Iterator[Resource]:
    for res in aws.pages(c.ec2, "describe_instances", "Reservations", Filters=_project_filter()):
        for i in res.get("Instances", []):
            if i.get("State", {}).get("Name") == "terminated":
                continue
            t = aws.tag_dict(i.get("Tags"))
            yield Resource("ec2:instance", i["InstanceId"], c.region, t, _name(t))


def _ec2_network_interfaces(c: Clients) -> Iterator[Resource]:
    for n in aws.pages(c.ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=_project_filter()):
        t = aws.tag_dict(n.get("TagSet") or n.get("Tags"))
        yield Resource("ec2:network-interface", n["NetworkInterfaceId"], c.region, t, _name(t, n.get("Description", "")))


def _ec2_launch_templates(c: Clients) -> Iterator[Resource]:
    for lt in aws.pages(c.ec2, "describe_launch_templates", "LaunchTemplates", Filters=_project_filter()):
        t = aws.tag_dict(lt.get("Tags"))
        yield Resource("ec2:launch-template", lt["LaunchTemplateId"], c.region, t, lt.get("LaunchTemplateName", ""))


def _ec2_placement_groups(c: Clients) -> Iterator[Resource]:
    for pg in aws.pages(c.ec2, "describe_placement_groups", "PlacementGroups", Filters=_project_filter()):
        if pg.get("State") in ("deleting", "deleted"):
            continue
        t = aws.tag_dict(pg.get("Tags"))
        yield Resource("ec2:placement-group", pg["GroupName"], c.region, t, pg["GroupName"])


def _ec2_nat_gateways(c: Clients) -> Iterator[Resource]:
    for nat in aws.pages(c.ec2, "describe_nat_gateways", "NatGateways", Filter=_project_filter()):
        if nat.get("State") in ("deleted", "deleting", "failed"):
            continue
        t = aws.tag_dict(nat.get("Tags"))
        enis = [a["NetworkInterfaceId"] for a in nat.get("NatGatewayAddresses", []) if a.get("NetworkInterfaceId")]
        yield Resource("ec2:nat-gateway", nat["NatGatewayId"], c.region, t, _name(t), data={"enis": enis})


def _ec2_elastic_ips(c: Clients) -> Iterator[Resource]:
    for a in aws.pages(c.ec2, "describe_addresses", "Addresses", Filters=_project_filter()):
        if "AllocationId" not in a:
            continue
        t = aws.tag_dict(a.get("Tags"))
        yield Resource("ec2:elastic-ip", a["AllocationId"], c.region, t, _name(t, a.get("PublicIp", "")))


def _ec2_vpc_endpoints(c: Clients) -> Iterator[Resource]:
    for e in aws.pages(c.ec2, "describe_vpc_endpoints", "VpcEndpoints", Filters=_project_filter()):
        if str(e.get("State", "")).lower() in ("deleted", "deleting"):
            continue
        t = aws.tag_dict(e.get("Tags"))
        yield Resource("ec2:vpc-endpoint", e["VpcEndpointId"], c.region, t, _name(t, e.get("ServiceName", "")))


def _ec2_security_groups(c: Clients) -> Iterator[Resource]:
    for g in aws.pages(c.ec2, "describe_security_groups", "SecurityGroups", Filters=_project_filter()):
        t = aws.tag_dict(g.get("Tags"))
        yield Resource("ec2:security-group", g["GroupId"], c.region, t, g.get("GroupName", ""),
                       data={"default": g.get("GroupName") == "default"})  # fmt: skip


def _ec2_route_tables(c: Clients) -> Iterator[Resource]:
    for rt in aws.pages(c.ec2, "describe_route_tables", "RouteTables", Filters=_project_filter()):
        t = aws.tag_dict(rt.get("Tags"))
        main = any(a.get("Main") for a in rt.get("Associations", []))
        yield Resource("ec2:route-table", rt["RouteTableId"], c.region, t, _name(t), data={"main": main})


def _list_efs(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    for fs in aws.pages(c.efs, "describe_file_systems", "FileSystems"):
        if fs.get("LifeCycleState") in ("deleted", "deleting"):
            continue
        t = aws.tag_dict(fs.get("Tags"))
        fid = fs["FileSystemId"]
        yield Resource("efs:file-system", fid, c.region, t, fs.get("Name") or _name(t))
        if verdict(t, now)[0]:
            for mt in aws.pages(c.efs, "describe_mount_targets", "MountTargets", FileSystemId=fid):
                yield Resource("efs:mount-target", mt["MountTargetId"], c.region, t, mt.get("SubnetId", ""),
                               parent=f"efs:file-system {fid}")  # fmt: skip


def _list_fsx(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    for fs in aws.pages(c.fsx, "describe_file_systems", "FileSystems"):
        if fs.get("Lifecycle") in ("DELETING",):
            continue
        t = aws.tag_dict(fs.get("Tags"))
        yield Resource("fsx:file-system", fs["FileSystemId"], c.region, t, _name(t))


def _list_ecr(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    for repo in aws.pages(c.ecr, "describe_repositories", "repositories"):
        try:
            t = aws.tag_dict(c.ecr.list_tags_for_resource(resourceArn=repo["repositoryArn"]).get("tags"))
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"the tags of ECR repository {repo['repositoryName']}", exc)
            continue
        yield Resource("ecr:repository", repo["repositoryName"], c.region, t, repo["repositoryName"])


def _list_kms(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    for key in aws.pages(c.kms, "list_keys", "Keys"):
        try:
            meta = c.kms.describe_key(KeyId=key["KeyId"])["KeyMetadata"]
            if meta.get("KeyManager") != "CUSTOMER" or meta.get("KeyState") in ("PendingDeletion", "PendingReplicaDeletion"):
                continue
            t = aws.tag_dict(aws.pages(c.kms, "list_resource_tags", "Tags", KeyId=key["KeyId"]), "TagKey", "TagValue")
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"KMS key {key['KeyId']}", exc)
            continue
        yield Resource("kms:key", key["KeyId"], c.region, t, meta.get("Description", ""))


def _log_group_arn(group: Mapping) -> str:
    """A DescribeLogGroups entry's ARN as ListTagsForResource takes it: `logGroupArn`, or `arn` without its
    `:*` (botocore's logs model, shape LogGroup)."""
    return group.get("logGroupArn") or str(group.get("arn", "")).removesuffix(":*")


def _list_logs(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    for g in aws.pages(c.logs, "describe_log_groups", "logGroups"):
        try:
            t = dict(c.logs.list_tags_for_resource(resourceArn=_log_group_arn(g)).get("tags") or {})
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"the tags of log group {g['logGroupName']}", exc)
            continue
        yield Resource("logs:log-group", g["logGroupName"], c.region, t, g["logGroupName"])


def _list_iam(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    for role in aws.pages(c.iam, "list_roles", "Roles"):
        if role.get("Path", "/").startswith("/aws-service-role/"):
            continue  # service-linked roles belong to AWS services
        try:
            t = aws.tag_dict(aws.pages(c.iam, "list_role_tags", "Tags", RoleName=role["RoleName"]))
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"the tags of IAM role {role['RoleName']}", exc)
            continue
        yield Resource("iam:role", role["RoleName"], GLOBAL, t, role["RoleName"])


def _list_instance_profiles(c: Clients, now: dt.datetime) -> Iterator[Resource]:
    for prof in aws.pages(c.iam, "list_instance_profiles", "InstanceProfiles"):
        name = prof["InstanceProfileName"]
        try:
            # ListInstanceProfiles leaves the tags out; GetInstanceProfile has them.
            t = aws.tag_dict(c.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"].get("Tags"))
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"IAM instance profile {name}", exc)
            continue
        yield Resource("iam:instance-profile", name, GLOBAL, t, name)


# --- the second pass: what EKS and the VPC CNI leave in a swept cluster's name -----------------


@dataclass
class Swept:
    """What a region's first pass will delete: clusters (by name, with why) and VPCs."""

    clusters: dict[str, str] = field(default_factory=dict)  # cluster name -> "eks:cluster X" or "stack S"
    vpcs: dict[str, Mapping[str, str]] = field(default_factory=dict)  # VPC id -> its tags


def swept_context(found: Iterable[Resource], now: dt.datetime) -> Swept:
    ctx = Swept()
    for r in found:
        if r.parent or not verdict(r.tags, now)[0]:
            continue
        if r.kind == "eks:cluster":
            ctx.clusters[r.id] = f"eks:cluster {r.id}"
        if r.kind == "ec2:vpc":
            ctx.vpcs[r.id] = r.tags
        if r.stack:
            ctx.clusters.setdefault(cluster_name(PROJECT, r.stack), f"the expired stack {r.stack}")
    return ctx


def _asg_cluster(tags: Mapping[str, str]) -> str:
    if tags.get(EKS_ASG_CLUSTER_TAG):
        return tags[EKS_ASG_CLUSTER_TAG]
    return next((k[len(K8S_CLUSTER_TAG):] for k in tags if k.startswith(K8S_CLUSTER_TAG)), "")


def _asg_parts(c: Clients, now: dt.datetime, ctx: Swept) -> Iterator[Resource]:
    for g in aws.pages(c.autoscaling, "describe_auto_scaling_groups", "AutoScalingGroups"):
        tags = aws.tag_dict(g.get("Tags"))
        cluster = _asg_cluster(tags)
        if cluster not in ctx.clusters or PROJECT_TAG in tags:
            continue  # not a swept cluster's (a group with tags of its own is judged by them)
        yield Resource("autoscaling:group", g["AutoScalingGroupName"], c.region, tags, g["AutoScalingGroupName"],
                       parent=ctx.clusters[cluster], data={"instances": len(g.get("Instances") or [])})  # fmt: skip


def _cni_interface_parts(c: Clients, now: dt.datetime, ctx: Swept) -> Iterator[Resource]:
    vpcs = sorted(ctx.vpcs)
    for i in range(0, len(vpcs), 200):  # EC2 takes up to 200 filter values
        filters = [{"Name": "vpc-id", "Values": vpcs[i : i + 200]}, {"Name": "tag-key", "Values": [CNI_CLUSTER_TAG]}]
        for n in aws.pages(c.ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=filters):
            t = aws.tag_dict(n.get("TagSet") or n.get("Tags"))
            if PROJECT_TAG in t:
                continue  # judged by its own tags in the first pass
            vpc = n.get("VpcId", "")
            yield Resource("ec2:network-interface", n["NetworkInterfaceId"], c.region, {**ctx.vpcs.get(vpc, {}), **t},
                           _name(t, n.get("Description", "")), parent=f"ec2:vpc {vpc}")  # fmt: skip


def _recreated_log_group_parts(c: Clients, now: dt.datetime, ctx: Swept) -> Iterator[Resource]:
    live_clusters: Optional[set[str]] = None
    for g in aws.pages(c.logs, "describe_log_groups", "logGroups", logGroupNamePrefix="/aws/eks/"):
        m = EKS_LOG_GROUP.match(g["logGroupName"])
        if not m:
            continue
        t = dict(c.logs.list_tags_for_resource(resourceArn=_log_group_arn(g)).get("tags") or {})
        if PROJECT_TAG in t:
            continue  # ours as the stack created it: judged by its own tags in the first pass
        cluster = m.group("cluster")
        if cluster in ctx.clusters:
            yield Resource("logs:log-group", g["logGroupName"], c.region, t, g["logGroupName"], parent=ctx.clusters[cluster])
            continue
        if not cluster.startswith(EPHEMERAL_CLUSTER_PREFIX):
            continue
        created = dt.datetime.fromtimestamp(int(g.get("creationTime", 0)) / 1000, dt.timezone.utc)
        if now - created <= dt.timedelta(hours=MAX_TTL_HOURS):
            continue
        if live_clusters is None:
            live_clusters = set(aws.pages(c.eks, "list_clusters", "clusters"))
        if cluster in live_clusters:
            continue
        yield Resource(
            "logs:log-group", g["logGroupName"], c.region, t, g["logGroupName"], parent=f"eks:cluster {cluster} (deleted)",
            data={"why": f"re-created by EKS for the ephemeral cluster {cluster}, which no longer exists; created "
                         f"{created:%Y-%m-%dT%H:%M:%SZ}, longer ago than an ephemeral stack may live ({MAX_TTL_HOURS:g} h)"},
        )  # fmt: skip


PartLister = Callable[[Clients, dt.datetime, Swept], Iterable[Resource]]
PART_LISTERS: tuple[tuple[str, PartLister], ...] = (
    ("autoscaling groups of swept clusters", _asg_parts),
    ("VPC CNI network interfaces in swept VPCs", _cni_interface_parts),
    ("control-plane log groups EKS re-created", _recreated_log_group_parts),
)

Lister = Callable[[Clients, dt.datetime], Iterable[Resource]]


def _ec2(fn: Callable[[Clients], Iterator[Resource]]) -> Lister:
    return lambda c, now: fn(c)


REGIONAL_LISTERS: tuple[tuple[str, Lister], ...] = (
    ("eks clusters, node groups, Fargate profiles", _list_eks),
    ("elbv2 load balancers, target groups", _list_elbv2),
    ("ec2 instances", _ec2(_ec2_instances)),
    ("ec2 volumes", _ec2(_ec2_by_name_tag("ec2:volume", "describe_volumes", "Volumes", "VolumeId"))),
    ("ec2 network interfaces", _ec2(_ec2_network_interfaces)),
    ("ec2 launch templates", _ec2(_ec2_launch_templates)),
    ("ec2 placement groups", _ec2(_ec2_placement_groups)),
    ("ec2 NAT gateways", _ec2(_ec2_nat_gateways)),
    ("ec2 elastic IPs", _ec2(_ec2_elastic_ips)),
    ("ec2 VPC endpoints", _ec2(_ec2_vpc_endpoints)),
    ("ec2 security groups", _ec2(_ec2_security_groups)),
    ("ec2 subnets", _ec2(_ec2_by_name_tag("ec2:subnet", "describe_subnets", "Subnets", "SubnetId"))),
    ("ec2 route tables", _ec2(_ec2_route_tables)),
    ("ec2 internet gateways", _ec2(_ec2_by_name_tag("ec2:internet-gateway", "describe_internet_gateways", "InternetGateways", "InternetGatewayId"))),
    ("ec2 VPCs", _ec2(_ec2_by_name_tag("ec2:vpc", "describe_vpcs", "Vpcs", "VpcId"))),
    ("efs file systems, mount targets", _list_efs),
    ("fsx file systems", _list_fsx),
    ("ecr repositories", _list_ecr),
    ("kms keys", _list_kms),
    ("logs log groups", _list_logs),
)
GLOBAL_LISTERS: tuple[tuple[str, Lister], ...] = (("iam roles", _list_iam), ("iam instance profiles", _list_instance_profiles))


def discover(
    session, regions: list[str], now: dt.datetime, on_progress: Optional[Callable[[str], None]] = None
) -> tuple[list[Entry], list[Entry], list[str]]:
    """(to delete, skipped, listing errors) over `regions`, and IAM (global) once."""
    planned: list[Entry] = []
    skipped: list[Entry] = []
    errors: list[str] = []
    for region in [*regions, GLOBAL]:
        clients = Clients(session, region)
        seen: dict[tuple[str, str], Resource] = {}

        def take(what: str, run: Callable[[], Iterable[Resource]]) -> None:
            if on_progress:
                on_progress(f"listing {what} ({region})")
            try:
                found = [r for r in run() if (r.kind, r.id) not in seen]
            except Exception as exc:  # noqa: BLE001 - report it, and keep looking at the rest
                errors.append(f"{region}: could not list {what}: {aws.error_text(exc)}")
                return
            finally:
                errors.extend(clients.errors)
                clients.errors.clear()
            for r in found:
                if _judge(r, now, planned, skipped):  # what is not the project's may still be a swept cluster's part
                    seen[(r.kind, r.id)] = r

        for what, lister in GLOBAL_LISTERS if region == GLOBAL else REGIONAL_LISTERS:
            take(what, lambda lister=lister: lister(clients, now))
        if region != GLOBAL:
            ctx = swept_context(seen.values(), now)  # the second pass: what goes with the swept clusters and VPCs
            for what, part in PART_LISTERS:
                take(what, lambda part=part: part(clients, now, ctx))
    rank = {k: i for i, k in enumerate(ORDER)}
    key = lambda e: (rank[e.resource.kind], e.resource.region, e.resource.id)  # noqa: E731
    return sorted(planned, key=key), sorted(skipped, key=key), errors


def _judge(r: Resource, now: dt.datetime, planned: list[Entry], skipped: list[Entry]) -> bool:
    """Add `r` to what is deleted or skipped; False when it is nothing of the project's (left out of both)."""
    if r.parent:
        planned.append(Entry(r, r.data.get("why") or f"part of {r.parent}"))
        return True
    delete, why = verdict(r.tags, now)
    if delete and r.kind == "ec2:security-group" and r.data.get("default"):
        skipped.append(Entry(r, "the VPC's default security group: it goes with its VPC"))
    elif delete and r.kind == "ec2:route-table" and r.data.get("main"):
        skipped.append(Entry(r, "the VPC's main route table: it goes with its VPC"))
    elif delete:
        planned.append(Entry(r, why))
    elif r.tags.get(PROJECT_TAG) == PROJECT:
        skipped.append(Entry(r, why))
    else:
        return False
    return True
