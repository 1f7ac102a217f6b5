"""Leak sweeper: delete what failed teardowns of expired ephemeral stacks left behind.

    python -m infra sweep [--yes] [--region R ...] [--wait SECONDS] [--json]

Dry run by default: lists what it would delete and deletes nothing. `--yes`
deletes. Without `--region` it sweeps the region boto3's standard configuration
gives (AWS_REGION / AWS_DEFAULT_REGION / the profile's region); credentials come
from boto3's standard chain, and `AWS_ENDPOINT_URL` is honoured like any boto3
setting. IAM roles are global: they are swept once per run.

What it deletes: resources whose own tags (infra/aws/tags.py) say all of
`project=gpu-serving`, `lifecycle=ephemeral` and an `expires-at` (ISO 8601 with
a time zone, e.g. `2026-12-31T18:00:00Z`) earlier than now. Nothing else, ever:
a resource without those tags, with `lifecycle=production`, not yet expired, or
whose `expires-at` does not parse (or has no time zone) is left alone and, when
it carries `project=gpu-serving`, reported as skipped with the reason. The only
things deleted without tags of their own are parts that AWS cannot delete apart
from their tagged parent and that have no tags to read: EFS mount targets of a
swept file system, EKS node groups and Fargate profiles without tags of a swept
cluster, the aliases of a swept KMS key, the route-table associations, internet
gateway attachments and security-group rules of swept tables, gateways and groups,
and the policy attachments of a swept IAM role.

Order (`ORDER`): dependents before what they depend on, waiting (bounded by
`--wait`, polling) where AWS deletes asynchronously:

    EKS Fargate profiles, node groups (wait) -> EKS clusters (wait)
    -> ELBv2 load balancers (wait) -> target groups
    -> EC2 instances (wait until terminated)
    -> EFS mount targets (wait) -> EFS file systems; FSx file systems (wait)
    -> NAT gateways (wait until deleted) -> elastic IPs
    -> VPC endpoints (wait) -> network interfaces -> EBS volumes
    -> launch templates -> placement groups
    -> security groups (rules that reference groups revoked first)
    -> subnets -> route tables -> internet gateways (detached) -> VPCs
    -> ECR repositories -> KMS keys (deletion scheduled, 7 days) -> log groups -> IAM roles

A deletion that AWS refuses because something still depends on it
(DependencyViolation, ResourceInUse, ...) is retried until the step's `--wait`
runs out (load balancer ENIs, for one, take minutes to go), then reported as
failed with AWS's error. Exit status: 0 when nothing failed, 1 when a deletion or
a listing failed, 2 when boto3 has no region or credentials.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from infra.config import PROJECT
from infra.errors import UserError
from infra.aws.tags import EPHEMERAL, EXPIRES_TAG, LIFECYCLE_TAG, PRODUCTION, PROJECT_TAG, STACK_TAG
from infra.ops import aws

GLOBAL = "global"  # the "region" of IAM roles

ORDER: tuple[str, ...] = (
    "eks:fargate-profile",
    "eks:nodegroup",
    "eks:cluster",
    "elbv2:load-balancer",
    "elbv2:target-group",
    "ec2:instance",
    "efs:mount-target",
    "efs:file-system",
    "fsx:file-system",
    "ec2:nat-gateway",
    "ec2:elastic-ip",
    "ec2:vpc-endpoint",
    "ec2:network-interface",
    "ec2:volume",
    "ec2:launch-template",
    "ec2:placement-group",
    "ec2:security-group",
    "ec2:subnet",
    "ec2:route-table",
    "ec2:internet-gateway",
    "ec2:vpc",
    "ecr:repository",
    "kms:key",
    "logs:log-group",
    "iam:role",
)

# Errors that mean "something still depends on it; try again shortly".
RETRY_CODES = {
    "DependencyViolation",
    "ResourceInUse",
    "ResourceInUseException",
    "FileSystemInUse",
    "InvalidPlacementGroup.InUse",
    "InvalidIPAddress.InUse",
    "IncorrectState",
    "IncorrectInstanceState",
    "DeleteConflict",
}
KMS_PENDING_DAYS = 7  # the shortest deletion window KMS allows


# --------------------------------------------------------------------------- selection


def parse_expiry(value: str) -> Optional[dt.datetime]:
    """`expires-at` as an aware UTC datetime; None when it does not parse or has no time zone."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.astimezone(dt.timezone.utc)


def verdict(tags: Mapping[str, str], now: dt.datetime) -> tuple[bool, str]:
    """(delete it?, why) for a resource's own tags."""
    if tags.get(PROJECT_TAG) != PROJECT:
        return False, f"not tagged {PROJECT_TAG}={PROJECT}"
    life = tags.get(LIFECYCLE_TAG)
    if life == PRODUCTION:
        return False, f"{LIFECYCLE_TAG}={PRODUCTION}"
    if life != EPHEMERAL:
        return False, f"no {LIFECYCLE_TAG}={EPHEMERAL} tag" + (f" ({LIFECYCLE_TAG}={life!r})" if life else "")
    raw = tags.get(EXPIRES_TAG)
    if not raw:
        return False, f"{LIFECYCLE_TAG}={EPHEMERAL} but no {EXPIRES_TAG} tag"
    when = parse_expiry(raw)
    if when is None:
        return False, f"{EXPIRES_TAG}={raw!r} is not an ISO 8601 time with a time zone (e.g. 2026-12-31T18:00:00Z)"
    if when > now:
        return False, f"not expired: {EXPIRES_TAG}={raw}"
    return True, f"expired at {raw}"


# --------------------------------------------------------------------------- records


@dataclass
class Resource:
    kind: str  # one of ORDER
    id: str
    region: str
    tags: dict[str, str] = field(default_factory=dict)
    name: str = ""
    parent: str = ""  # for parts deleted with a tagged parent: "efs:file-system fs-1"
    data: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def stack(self) -> str:
        return self.tags.get(STACK_TAG, "")

    @property
    def expires_at(self) -> str:
        return self.tags.get(EXPIRES_TAG, "")

    def label(self) -> str:
        return f"{self.kind} {self.id}" + (f" ({self.name})" if self.name and self.name != self.id else "")

    def to_json_dict(self) -> dict:
        return {
            "region": self.region, "kind": self.kind, "id": self.id, "name": self.name,
            "stack": self.stack, "expires_at": self.expires_at, "parent": self.parent,
        }  # fmt: skip


@dataclass
class Entry:
    resource: Resource
    detail: str = ""

    def to_json_dict(self) -> dict:
        return {**self.resource.to_json_dict(), "detail": self.detail}


@dataclass
class Report:
    regions: list[str]
    dry_run: bool
    now: dt.datetime
    planned: list[Entry] = field(default_factory=list)  # what the sweep deletes (or would)
    deleted: list[Entry] = field(default_factory=list)
    failed: list[Entry] = field(default_factory=list)
    skipped: list[Entry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # listings that failed: what could not be looked at

    @property
    def ok(self) -> bool:
        return not self.failed and not self.errors

    def to_json_dict(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "now": self.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "regions": list(self.regions),
            "would_delete" if self.dry_run else "planned": [e.to_json_dict() for e in self.planned],
            "deleted": [e.to_json_dict() for e in self.deleted],
            "failed": [e.to_json_dict() for e in self.failed],
            "skipped": [e.to_json_dict() for e in self.skipped],
            "errors": list(self.errors),
            "ok": self.ok,
        }


# --------------------------------------------------------------------------- helpers


def _project_filter() -> list[dict]:
    return [{"Name": f"tag:{PROJECT_TAG}", "Values": [PROJECT]}]


class _Clients:
    """boto3 clients of one region, made when first used."""

    def __init__(self, session, region: str):
        self._session, self.region, self._made = session, region, {}
        self.errors: list[str] = []  # per-item read failures met while listing (the listing goes on)

    def unreadable(self, what: str, exc: Exception) -> None:
        self.errors.append(f"{self.region}: could not read {what}: {aws.error_text(exc)}")

    def __getattr__(self, service: str):
        if service.startswith("_"):
            raise AttributeError(service)
        name = {"quotas": "service-quotas"}.get(service, service)
        if name not in self._made:
            self._made[name] = self._session.client(name, region_name=None if self.region == GLOBAL else self.region)
        return self._made[name]


# --------------------------------------------------------------------------- listing


def _list_eks(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
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


def _elbv2_tags(c: _Clients, arns: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for i in range(0, len(arns), 20):
        for d in c.elbv2.describe_tags(ResourceArns=arns[i : i + 20]).get("TagDescriptions", []):
            out[d["ResourceArn"]] = aws.tag_dict(d.get("Tags"))
    return out


def _list_elbv2(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
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


# EC2, one lister per kind (each makes its own call, so one failing call hides nothing else).


def _ec2_instances(c: _Clients) -> Iterator[Resource]:
    for res in aws.pages(c.ec2, "describe_instances", "Reservations", Filters=_project_filter()):
        for i in res.get("Instances", []):
            if i.get("State", {}).get("Name") == "terminated":
                continue
            t = aws.tag_dict(i.get("Tags"))
            yield Resource("ec2:instance", i["InstanceId"], c.region, t, _name(t))


def _ec2_volumes(c: _Clients) -> Iterator[Resource]:
    for v in aws.pages(c.ec2, "describe_volumes", "Volumes", Filters=_project_filter()):
        t = aws.tag_dict(v.get("Tags"))
        yield Resource("ec2:volume", v["VolumeId"], c.region, t, _name(t))


def _ec2_network_interfaces(c: _Clients) -> Iterator[Resource]:
    for n in aws.pages(c.ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=_project_filter()):
        t = aws.tag_dict(n.get("TagSet") or n.get("Tags"))
        yield Resource("ec2:network-interface", n["NetworkInterfaceId"], c.region, t, _name(t, n.get("Description", "")))


def _ec2_launch_templates(c: _Clients) -> Iterator[Resource]:
    for lt in aws.pages(c.ec2, "describe_launch_templates", "LaunchTemplates", Filters=_project_filter()):
        t = aws.tag_dict(lt.get("Tags"))
        yield Resource("ec2:launch-template", lt["LaunchTemplateId"], c.region, t, lt.get("LaunchTemplateName", ""))


def _ec2_placement_groups(c: _Clients) -> Iterator[Resource]:
    for pg in aws.pages(c.ec2, "describe_placement_groups", "PlacementGroups", Filters=_project_filter()):
        if pg.get("State") in ("deleting", "deleted"):
            continue
        t = aws.tag_dict(pg.get("Tags"))
        yield Resource("ec2:placement-group", pg["GroupName"], c.region, t, pg["GroupName"])


def _ec2_nat_gateways(c: _Clients) -> Iterator[Resource]:
    for nat in aws.pages(c.ec2, "describe_nat_gateways", "NatGateways", Filter=_project_filter()):
        if nat.get("State") in ("deleted", "deleting", "failed"):
            continue
        t = aws.tag_dict(nat.get("Tags"))
        enis = [a["NetworkInterfaceId"] for a in nat.get("NatGatewayAddresses", []) if a.get("NetworkInterfaceId")]
        yield Resource("ec2:nat-gateway", nat["NatGatewayId"], c.region, t, _name(t), data={"enis": enis})


def _ec2_elastic_ips(c: _Clients) -> Iterator[Resource]:
    for a in aws.pages(c.ec2, "describe_addresses", "Addresses", Filters=_project_filter()):
        if "AllocationId" not in a:
            continue
        t = aws.tag_dict(a.get("Tags"))
        yield Resource("ec2:elastic-ip", a["AllocationId"], c.region, t, _name(t, a.get("PublicIp", "")))


def _ec2_vpc_endpoints(c: _Clients) -> Iterator[Resource]:
    for e in aws.pages(c.ec2, "describe_vpc_endpoints", "VpcEndpoints", Filters=_project_filter()):
        if str(e.get("State", "")).lower() in ("deleted", "deleting"):
            continue
        t = aws.tag_dict(e.get("Tags"))
        yield Resource("ec2:vpc-endpoint", e["VpcEndpointId"], c.region, t, _name(t, e.get("ServiceName", "")))


def _ec2_security_groups(c: _Clients) -> Iterator[Resource]:
    for g in aws.pages(c.ec2, "describe_security_groups", "SecurityGroups", Filters=_project_filter()):
        t = aws.tag_dict(g.get("Tags"))
        yield Resource("ec2:security-group", g["GroupId"], c.region, t, g.get("GroupName", ""),
                       data={"default": g.get("GroupName") == "default"})  # fmt: skip


def _ec2_subnets(c: _Clients) -> Iterator[Resource]:
    for s in aws.pages(c.ec2, "describe_subnets", "Subnets", Filters=_project_filter()):
        t = aws.tag_dict(s.get("Tags"))
        yield Resource("ec2:subnet", s["SubnetId"], c.region, t, _name(t))


def _ec2_route_tables(c: _Clients) -> Iterator[Resource]:
    for rt in aws.pages(c.ec2, "describe_route_tables", "RouteTables", Filters=_project_filter()):
        t = aws.tag_dict(rt.get("Tags"))
        main = any(a.get("Main") for a in rt.get("Associations", []))
        yield Resource("ec2:route-table", rt["RouteTableId"], c.region, t, _name(t), data={"main": main})


def _ec2_internet_gateways(c: _Clients) -> Iterator[Resource]:
    for igw in aws.pages(c.ec2, "describe_internet_gateways", "InternetGateways", Filters=_project_filter()):
        t = aws.tag_dict(igw.get("Tags"))
        yield Resource("ec2:internet-gateway", igw["InternetGatewayId"], c.region, t, _name(t))


def _ec2_vpcs(c: _Clients) -> Iterator[Resource]:
    for vpc in aws.pages(c.ec2, "describe_vpcs", "Vpcs", Filters=_project_filter()):
        t = aws.tag_dict(vpc.get("Tags"))
        yield Resource("ec2:vpc", vpc["VpcId"], c.region, t, _name(t))


def _list_efs(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
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


def _list_fsx(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
    for fs in aws.pages(c.fsx, "describe_file_systems", "FileSystems"):
        if fs.get("Lifecycle") in ("DELETING",):
            continue
        t = aws.tag_dict(fs.get("Tags"))
        yield Resource("fsx:file-system", fs["FileSystemId"], c.region, t, _name(t))


def _list_ecr(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
    for repo in aws.pages(c.ecr, "describe_repositories", "repositories"):
        try:
            t = aws.tag_dict(c.ecr.list_tags_for_resource(resourceArn=repo["repositoryArn"]).get("tags"))
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"the tags of ECR repository {repo['repositoryName']}", exc)
            continue
        yield Resource("ecr:repository", repo["repositoryName"], c.region, t, repo["repositoryName"])


def _list_kms(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
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


def _list_logs(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
    for g in aws.pages(c.logs, "describe_log_groups", "logGroups"):
        arn = g.get("logGroupArn") or str(g.get("arn", "")).removesuffix(":*")
        try:
            t = dict(c.logs.list_tags_for_resource(resourceArn=arn).get("tags") or {})
        except Exception as exc:  # noqa: BLE001
            if not aws.is_gone(exc):
                c.unreadable(f"the tags of log group {g['logGroupName']}", exc)
            continue
        yield Resource("logs:log-group", g["logGroupName"], c.region, t, g["logGroupName"])


def _list_iam(c: _Clients, now: dt.datetime) -> Iterator[Resource]:
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


Lister = Callable[[_Clients, dt.datetime], Iterable[Resource]]


def _ec2(fn: Callable[[_Clients], Iterator[Resource]]) -> Lister:
    return lambda c, now: fn(c)


REGIONAL_LISTERS: tuple[tuple[str, Lister], ...] = (
    ("eks clusters, node groups, Fargate profiles", _list_eks),
    ("elbv2 load balancers, target groups", _list_elbv2),
    ("ec2 instances", _ec2(_ec2_instances)),
    ("ec2 volumes", _ec2(_ec2_volumes)),
    ("ec2 network interfaces", _ec2(_ec2_network_interfaces)),
    ("ec2 launch templates", _ec2(_ec2_launch_templates)),
    ("ec2 placement groups", _ec2(_ec2_placement_groups)),
    ("ec2 NAT gateways", _ec2(_ec2_nat_gateways)),
    ("ec2 elastic IPs", _ec2(_ec2_elastic_ips)),
    ("ec2 VPC endpoints", _ec2(_ec2_vpc_endpoints)),
    ("ec2 security groups", _ec2(_ec2_security_groups)),
    ("ec2 subnets", _ec2(_ec2_subnets)),
    ("ec2 route tables", _ec2(_ec2_route_tables)),
    ("ec2 internet gateways", _ec2(_ec2_internet_gateways)),
    ("ec2 VPCs", _ec2(_ec2_vpcs)),
    ("efs file systems, mount targets", _list_efs),
    ("fsx file systems", _list_fsx),
    ("ecr repositories", _list_ecr),
    ("kms keys", _list_kms),
    ("logs log groups", _list_logs),
)
GLOBAL_LISTERS: tuple[tuple[str, Lister], ...] = (("iam roles", _list_iam),)


def discover(
    session, regions: list[str], now: dt.datetime, on_progress: Optional[Callable[[str], None]] = None
) -> tuple[list[Entry], list[Entry], list[str]]:
    """(to delete, skipped, listing errors) over `regions`, and IAM (global) once."""
    planned: list[Entry] = []
    skipped: list[Entry] = []
    errors: list[str] = []
    scopes = [(r, REGIONAL_LISTERS) for r in regions] + [(GLOBAL, GLOBAL_LISTERS)]
    for region, listers in scopes:
        clients = _Clients(session, region)
        for what, lister in listers:
            if on_progress:
                on_progress(f"listing {what} ({region})")
            try:
                found = list(lister(clients, now))
            except Exception as exc:  # noqa: BLE001 - report it, and keep looking at the rest
                errors.append(f"{region}: could not list {what}: {aws.error_text(exc)}")
                continue
            finally:
                errors.extend(clients.errors)
                clients.errors.clear()
            for r in found:
                if r.parent:
                    planned.append(Entry(r, f"part of {r.parent}"))
                    continue
                delete, why = verdict(r.tags, now)
                if delete and r.kind == "ec2:security-group" and r.data.get("default"):
                    skipped.append(Entry(r, "the VPC's default security group: it goes with its VPC"))
                elif delete and r.kind == "ec2:route-table" and r.data.get("main"):
                    skipped.append(Entry(r, "the VPC's main route table: it goes with its VPC"))
                elif delete:
                    planned.append(Entry(r, why))
                elif r.tags.get(PROJECT_TAG) == PROJECT:
                    skipped.append(Entry(r, why))
    rank = {k: i for i, k in enumerate(ORDER)}
    key = lambda e: (rank[e.resource.kind], e.resource.region, e.resource.id)  # noqa: E731
    return sorted(planned, key=key), sorted(skipped, key=key), errors


# --------------------------------------------------------------------------- deleting


class _Retry(Exception):
    """Not deletable yet, for a reason that may pass (e.g. still attached); retried until the deadline."""


class _Refused(Exception):
    """Not deleted, on purpose or because AWS said no; the message is the report's detail as it is."""


def _exists(call: Callable[[], Any]) -> bool:
    try:
        return bool(call())
    except Exception as exc:  # noqa: BLE001
        if aws.is_gone(exc):
            return False
        raise


# Each kind: delete(c, r) -> detail or "", and exists(c, r) -> bool when AWS deletes asynchronously.


def _del_fargate(c: _Clients, r: Resource) -> str:
    c.eks.delete_fargate_profile(clusterName=r.data["cluster"], fargateProfileName=r.data["profile"])
    return ""


def _has_fargate(c: _Clients, r: Resource) -> bool:
    return _exists(lambda: c.eks.describe_fargate_profile(clusterName=r.data["cluster"], fargateProfileName=r.data["profile"]))


def _del_nodegroup(c: _Clients, r: Resource) -> str:
    c.eks.delete_nodegroup(clusterName=r.data["cluster"], nodegroupName=r.data["nodegroup"])
    return ""


def _has_nodegroup(c: _Clients, r: Resource) -> bool:
    return _exists(lambda: c.eks.describe_nodegroup(clusterName=r.data["cluster"], nodegroupName=r.data["nodegroup"]))


def _del_cluster(c: _Clients, r: Resource) -> str:
    c.eks.delete_cluster(name=r.id)
    return ""


def _has_cluster(c: _Clients, r: Resource) -> bool:
    return _exists(lambda: c.eks.describe_cluster(name=r.id))


def _del_lb(c: _Clients, r: Resource) -> str:
    c.elbv2.delete_load_balancer(LoadBalancerArn=r.id)
    return ""


def _has_lb(c: _Clients, r: Resource) -> bool:
    return _exists(lambda: c.elbv2.describe_load_balancers(LoadBalancerArns=[r.id])["LoadBalancers"])


def _del_tg(c: _Clients, r: Resource) -> str:
    c.elbv2.delete_target_group(TargetGroupArn=r.id)
    return ""


def _del_instance(c: _Clients, r: Resource) -> str:
    c.ec2.terminate_instances(InstanceIds=[r.id])
    return "terminated"


def _has_instance(c: _Clients, r: Resource) -> bool:
    def live() -> bool:
        for res in c.ec2.describe_instances(InstanceIds=[r.id]).get("Reservations", []):
            for i in res.get("Instances", []):
                if i.get("State", {}).get("Name") != "terminated":
                    return True
        return False

    return _exists(live)


def _del_mount_target(c: _Clients, r: Resource) -> str:
    c.efs.delete_mount_target(MountTargetId=r.id)
    return ""


def _has_mount_target(c: _Clients, r: Resource) -> bool:
    return _exists(
        lambda: [m for m in c.efs.describe_mount_targets(MountTargetId=r.id).get("MountTargets", []) if m.get("LifeCycleState") != "deleted"]
    )


def _del_efs(c: _Clients, r: Resource) -> str:
    c.efs.delete_file_system(FileSystemId=r.id)
    return ""


def _has_efs(c: _Clients, r: Resource) -> bool:
    return _exists(
        lambda: [f for f in c.efs.describe_file_systems(FileSystemId=r.id).get("FileSystems", []) if f.get("LifeCycleState") != "deleted"]
    )


def _del_fsx(c: _Clients, r: Resource) -> str:
    c.fsx.delete_file_system(FileSystemId=r.id)
    return ""


def _has_fsx(c: _Clients, r: Resource) -> bool:
    return _exists(lambda: c.fsx.describe_file_systems(FileSystemIds=[r.id]).get("FileSystems"))


def _del_nat(c: _Clients, r: Resource) -> str:
    c.ec2.delete_nat_gateway(NatGatewayId=r.id)
    return ""


def _has_nat(c: _Clients, r: Resource) -> bool:
    return _exists(
        lambda: [n for n in c.ec2.describe_nat_gateways(NatGatewayIds=[r.id]).get("NatGateways", []) if n.get("State") not in ("deleted", "failed")]
    )


def _del_eip(c: _Clients, r: Resource) -> str:
    addrs = c.ec2.describe_addresses(AllocationIds=[r.id]).get("Addresses", [])
    a = addrs[0] if addrs else {}
    if a.get("AssociationId"):
        # AWS lets go of a deleted NAT gateway's address by itself. An address still held by an
        # instance or interface of the swept set (or by a swept NAT gateway's interface) is
        # disassociated; one held by anything else is not ours to touch.
        holder = a.get("InstanceId") or a.get("NetworkInterfaceId") or a["AssociationId"]
        if holder not in r.data.get("ours", ()):
            raise _Retry(f"still associated with {holder}, which is not being swept")
        c.ec2.disassociate_address(AssociationId=a["AssociationId"])
        c.ec2.release_address(AllocationId=r.id)
        return f"released (disassociated from {holder}, swept too)"
    c.ec2.release_address(AllocationId=r.id)
    return "released"


def _del_vpce(c: _Clients, r: Resource) -> str:
    out = c.ec2.delete_vpc_endpoints(VpcEndpointIds=[r.id])
    for u in out.get("Unsuccessful", []) or []:
        err = u.get("Error", {})
        raise _Refused(f"{err.get('Code', '')}: {err.get('Message', '')}")
    return ""


def _has_vpce(c: _Clients, r: Resource) -> bool:
    return _exists(
        lambda: [e for e in c.ec2.describe_vpc_endpoints(VpcEndpointIds=[r.id]).get("VpcEndpoints", []) if str(e.get("State", "")).lower() != "deleted"]
    )


def _del_eni(c: _Clients, r: Resource) -> str:
    enis = c.ec2.describe_network_interfaces(NetworkInterfaceIds=[r.id]).get("NetworkInterfaces", [])
    att = (enis[0].get("Attachment") or {}) if enis else {}
    if att.get("Status") in ("attached", "attaching", "detaching"):
        holder = att.get("InstanceId") or att.get("InstanceOwnerId") or att.get("AttachmentId")
        if att.get("InstanceId") and att["InstanceId"] not in r.data.get("ours", ()):
            raise _Refused(f"attached to {holder}, which is not being swept; left alone")
        raise _Retry(f"still attached to {holder}")
    c.ec2.delete_network_interface(NetworkInterfaceId=r.id)
    return ""


def _del_volume(c: _Clients, r: Resource) -> str:
    vols = c.ec2.describe_volumes(VolumeIds=[r.id]).get("Volumes", [])
    attached = [a for a in (vols[0].get("Attachments") or []) if a.get("State") in ("attached", "attaching", "detaching")] if vols else []
    if attached:
        holder = attached[0].get("InstanceId")
        if holder not in r.data.get("ours", ()):
            raise _Refused(f"attached to {holder}, which is not being swept; left alone")
        raise _Retry(f"still attached to {holder}")
    c.ec2.delete_volume(VolumeId=r.id)
    return ""


def _del_lt(c: _Clients, r: Resource) -> str:
    c.ec2.delete_launch_template(LaunchTemplateId=r.id)
    return ""


def _del_pg(c: _Clients, r: Resource) -> str:
    c.ec2.delete_placement_group(GroupName=r.id)
    return ""


def _revoke_group_rules(c: _Clients, groups: list[Resource]) -> dict[str, int]:
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


def _del_sg(c: _Clients, r: Resource) -> str:
    c.ec2.delete_security_group(GroupId=r.id)
    n = r.data.get("revoked", 0)
    return f"after revoking {n} rule(s) that referenced security groups" if n else ""


def _del_subnet(c: _Clients, r: Resource) -> str:
    c.ec2.delete_subnet(SubnetId=r.id)
    return ""


def _del_route_table(c: _Clients, r: Resource) -> str:
    tables = c.ec2.describe_route_tables(RouteTableIds=[r.id]).get("RouteTables", [])
    n = 0
    for a in (tables[0].get("Associations") or []) if tables else []:
        if not a.get("Main") and a.get("RouteTableAssociationId"):
            c.ec2.disassociate_route_table(AssociationId=a["RouteTableAssociationId"])
            n += 1
    c.ec2.delete_route_table(RouteTableId=r.id)
    return f"after {n} association(s) removed" if n else ""


def _del_igw(c: _Clients, r: Resource) -> str:
    igws = c.ec2.describe_internet_gateways(InternetGatewayIds=[r.id]).get("InternetGateways", [])
    detached = []
    for a in (igws[0].get("Attachments") or []) if igws else []:
        if a.get("VpcId"):
            c.ec2.detach_internet_gateway(InternetGatewayId=r.id, VpcId=a["VpcId"])
            detached.append(a["VpcId"])
    c.ec2.delete_internet_gateway(InternetGatewayId=r.id)
    return f"detached from {', '.join(detached)} first" if detached else ""


def _del_vpc(c: _Clients, r: Resource) -> str:
    c.ec2.delete_vpc(VpcId=r.id)
    return ""


def _del_ecr(c: _Clients, r: Resource) -> str:
    c.ecr.delete_repository(repositoryName=r.id, force=True)
    return "with its images"


def _del_kms(c: _Clients, r: Resource) -> str:
    for alias in list(aws.pages(c.kms, "list_aliases", "Aliases", KeyId=r.id)):
        name = alias.get("AliasName", "")
        if name and not name.startswith("alias/aws/"):
            c.kms.delete_alias(AliasName=name)
    out = c.kms.schedule_key_deletion(KeyId=r.id, PendingWindowInDays=KMS_PENDING_DAYS)
    when = out.get("DeletionDate")
    when_text = when.strftime("%Y-%m-%d") if isinstance(when, dt.datetime) else f"in {KMS_PENDING_DAYS} days"
    return f"deletion scheduled for {when_text} (KMS's shortest window); aliases removed"


def _del_log_group(c: _Clients, r: Resource) -> str:
    c.logs.delete_log_group(logGroupName=r.id)
    return ""


def _del_role(c: _Clients, r: Resource) -> str:
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
    delete: Callable[[_Clients, Resource], str]
    exists: Optional[Callable[[_Clients, Resource], bool]] = None  # set where AWS deletes asynchronously


STEPS: dict[str, Step] = {
    s.kind: s
    for s in (
        Step("eks:fargate-profile", _del_fargate, _has_fargate),
        Step("eks:nodegroup", _del_nodegroup, _has_nodegroup),
        Step("eks:cluster", _del_cluster, _has_cluster),
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
    )
}
assert tuple(STEPS) == ORDER, "every kind has a step, in ORDER"


class _Clock:
    """Time and sleep (tests may pass their own)."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


def _run_step(step: Step, entries: list[Entry], clients: dict[str, _Clients], report: Report,
              wait: float, poll: float, clock=_Clock, advance: Callable[[str], None] = lambda label: None) -> None:  # fmt: skip
    deadline = clock.monotonic() + wait
    if step.kind == "ec2:security-group":
        by_region: dict[str, list[Resource]] = {}
        for e in entries:
            by_region.setdefault(e.resource.region, []).append(e.resource)
        for region, groups in by_region.items():
            try:
                revoked = _revoke_group_rules(clients[region], groups)
            except Exception as exc:  # noqa: BLE001 - the deletions below will say what is still blocked
                report.errors.append(f"{region}: could not revoke security group rules: {aws.error_text(exc)}")
                revoked = {}
            for g in groups:
                g.data["revoked"] = revoked.get(g.id, 0)
    started: list[tuple[Entry, str]] = []
    for e in entries:
        r = e.resource
        advance(f"deleting {r.label()}")
        while True:
            try:
                started.append((e, step.delete(clients[r.region], r)))
                break
            except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the sweep
                if aws.is_gone(exc):
                    report.deleted.append(Entry(r, "already gone (went with what it belonged to)"))
                    break
                retry = isinstance(exc, _Retry) or aws.error_code(exc) in RETRY_CODES
                if retry and clock.monotonic() + poll <= deadline:
                    clock.sleep(poll)
                    continue
                why = str(exc) if isinstance(exc, (_Retry, _Refused)) else aws.error_text(exc)
                if retry:
                    why += f" (still so after waiting {wait:g} s)"
                report.failed.append(Entry(r, why))
                break
    waiting = [(e, d) for e, d in started if step.exists is not None]
    done = [(e, d) for e, d in started if step.exists is None]
    while waiting:
        still = []
        for e, d in waiting:
            try:
                there = step.exists(clients[e.resource.region], e.resource)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001
                report.failed.append(Entry(e.resource, f"deletion started; could not confirm: {aws.error_text(exc)}"))
                continue
            (still if there else done).append((e, d))
        waiting = still
        if not waiting:
            break
        if clock.monotonic() + poll > deadline:
            for e, _ in waiting:
                report.failed.append(Entry(e.resource, f"deletion started but it is still there after {wait:g} s; rerun the sweep later"))
            break
        clock.sleep(poll)
    for e, d in done:
        report.deleted.append(Entry(e.resource, d or "deleted"))


def sweep(
    regions: Optional[list[str]] = None,
    *,
    yes: bool = False,
    now: Optional[dt.datetime] = None,
    session=None,
    wait: float = 900.0,
    poll: float = 10.0,
    progress: Optional["Progress"] = None,
) -> Report:
    """Find (and with `yes`, delete) the resources of expired ephemeral stacks in `regions`.

    `regions` None: the region of boto3's standard configuration. Raises UserError when
    there is no region or no credentials.
    """
    session = session or aws.new_session()
    regions = list(dict.fromkeys(regions or ([session.region_name] if session.region_name else [])))
    if not regions:
        raise UserError("no AWS region: pass --region, or set AWS_REGION / AWS_DEFAULT_REGION or a profile's region")
    aws.require_credentials(session)
    now = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    progress = progress or Progress()
    report = Report(regions=regions, dry_run=not yes, now=now)
    report.planned, report.skipped, report.errors = discover(session, regions, now, progress.note)
    if not yes:
        return report
    clients = {r: _Clients(session, r) for r in [*regions, GLOBAL]}
    ours = {e.resource.id for e in report.planned if e.resource.kind in ("ec2:instance", "ec2:network-interface")}
    ours |= {eni for e in report.planned if e.resource.kind == "ec2:nat-gateway" for eni in e.resource.data.get("enis", [])}
    instances = {e.resource.id for e in report.planned if e.resource.kind == "ec2:instance"}
    for e in report.planned:
        if e.resource.kind == "ec2:elastic-ip":
            e.resource.data["ours"] = ours
        elif e.resource.kind in ("ec2:network-interface", "ec2:volume"):
            e.resource.data["ours"] = instances
    progress.start(len(report.planned))
    for kind in ORDER:
        entries = [e for e in report.planned if e.resource.kind == kind]
        if entries:
            _run_step(STEPS[kind], entries, clients, report, wait, poll, advance=progress.advance)
    progress.finish()
    return report


class Progress:
    """What the sweep reports while it works (the CLI draws a rich progress bar with it)."""

    def note(self, text: str) -> None:  # discovery steps
        pass

    def start(self, total: int) -> None:  # deletion begins
        pass

    def advance(self, text: str) -> None:  # one resource handled
        pass

    def finish(self) -> None:
        pass


class RichProgress(Progress):
    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)  # fmt: skip
        self._bar.start()
        self._task = self._bar.add_task("discovering", total=None)
        self._listing = 0

    def note(self, text: str) -> None:
        self._listing += 1
        self._bar.update(self._task, description=text, completed=self._listing)

    def start(self, total: int) -> None:
        self._bar.reset(self._task, total=total, completed=0, description="deleting")

    def advance(self, text: str) -> None:
        self._bar.update(self._task, description=text[:70])
        self._bar.advance(self._task)

    def finish(self) -> None:
        self.close()

    def close(self) -> None:
        self._bar.stop()


# --------------------------------------------------------------------------- report


def _short(r: Resource) -> str:
    # An ELBv2 ARN is long: show its name and the tail of the ARN.
    if r.kind.startswith("elbv2:") and "/" in r.id:
        return r.id.split(":", 5)[-1]
    return r.id


def render(report: Report, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    def table(title: str, entries: list[Entry], detail: str) -> None:
        t = Table(title=title, title_justify="left", title_style="bold")
        for col in ("region", "kind", "id", "name", "stack", "expires-at", detail):
            t.add_column(col, overflow="fold")
        for e in entries:
            r = e.resource
            t.add_row(*(escape(x) for x in (r.region, r.kind, _short(r), r.name if r.name != r.id else "", r.stack,
                                           r.expires_at, e.detail)))  # fmt: skip
        console.print(t)

    when = report.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    scope = ", ".join(report.regions) + " and IAM (global)"
    if report.dry_run:
        if report.planned:
            table(f"Would delete ({len(report.planned)}), expired before {when}", report.planned, "why")
        else:
            console.print(f"Nothing to delete in {escape(scope)}: no expired ephemeral resources (as of {when}).")
    else:
        if report.deleted:
            table(f"Deleted ({len(report.deleted)})", report.deleted, "detail")
        if report.failed:
            table(f"Failed ({len(report.failed)})", report.failed, "error")
        if not report.planned:
            console.print(f"Nothing to delete in {escape(scope)}: no expired ephemeral resources (as of {when}).")
    if report.skipped:
        table(f"Skipped ({len(report.skipped)}): tagged {PROJECT_TAG}={PROJECT} but not to be deleted", report.skipped, "why")
    for err in report.errors:
        console.print(f"[red]could not look:[/red] {escape(err)}", soft_wrap=True)
    if report.dry_run:
        tail = f"dry run: {len(report.planned)} to delete, {len(report.skipped)} skipped; rerun with --yes to delete."
    else:
        tail = f"{len(report.deleted)} deleted, {len(report.failed)} failed, {len(report.skipped)} skipped."
    if report.errors:
        tail += f" {len(report.errors)} listing(s) failed."
    console.print(("[green]" if report.ok else "[red]") + escape(tail) + ("[/green]" if report.ok else "[/red]"))
