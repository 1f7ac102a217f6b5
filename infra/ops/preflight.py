"""AWS pre-flight: can this account actually get the GPUs the stack plans for?

    python -m infra preflight --stack prod [--region R] [--json] [--allow-unknown]

Run before `pulumi up`. Each check is a small function that returns a `Check`
(name, ok, detail, fix): `ok` is True (go), False (no-go) or None (unknown: the
answer could not be read, e.g. no permission). Exit status: 0 when every check
is a go, 1 otherwise (unknowns count as no-go unless `--allow-unknown`), 2 on a
config error or when boto3 has no credentials or region.

The checks, and the AWS calls behind them:

1. instance type offered in the GPU zone: EC2 DescribeInstanceTypeOfferings
   (LocationType availability-zone). Zone names map to different physical zones
   per account, so this is answered for this account.
2. On-Demand vCPU quota: Service Quotas GetServiceQuota for the instance
   family's quota (`QUOTAS`), compared with the vCPUs of the plan's nodes plus
   the node-update surge (EKS User Guide, "Understand each phase of node
   updates": an update raises the Auto Scaling group's maximum and desired size
   by the larger of twice the number of zones the group is in and
   maxUnavailable, so that many more nodes run for a while) plus the vCPUs of
   that family's instances already running in the region that are not this
   stack's (EC2 DescribeInstances). Does not apply to a capacity
   reservation or Capacity Block: EC2 checked the On-Demand limit when the
   reservation was created ("Your request could also fail if the requested
   quantity exceeds your On-Demand Instance limit", EC2 API reference,
   CreateCapacityReservation), and a Capacity Block is bought, not drawn from it.
3. capacity reservation / Capacity Block: EC2 DescribeCapacityReservations:
   exists, right kind (`ReservationType` default vs capacity-block), state
   active (a block that is `scheduled` shows when it starts and ends), in the GPU
   zone, the right instance type, at least `nodes` instances in total and
   available; in the placement group it was made in, when it was (its
   PlacementGroupArn), which the stack must name (`network.placementGroupName`).
   A Capacity Block's start and end are set against the planned change: the
   group is created about `CHANGE_LEAD` after `up` starts (a block that starts
   by then is a go), and the block must last the change, the nodes' start and
   the plan's cold start beyond EKS's scale-to-zero 40 minutes before it ends
   (EKS User Guide, Capacity Blocks).
4. EFA: EC2 DescribeInstanceTypes NetworkInfo.EfaSupported and
   EfaInfo.MaximumEfaInterfaces, when the plan wires EFA interfaces (every
   catalog type with `max_efa_interfaces > 0`: see infra/aws/gpu_nodes.py).
5. EKS version: EKS DescribeClusterVersions; where that call is not available
   (older endpoints, no permission, emulators) the calendar of
   infra/catalog/eks_versions.py is used and the detail says so. A version
   within 60 days of the end of its standard support is a go with a warning
   (extended support costs more per cluster hour).
6. Add-on versions: EKS DescribeAddonVersions for each add-on the cluster
   installs, at the cluster's Kubernetes version: every pinned version
   (infra/catalog/eks_versions.py) must be one EKS offers.
7. AMI release published: SSM GetParameter of the EKS-optimised AL2023 AMI
   parameter of each node group's release (GPU nodes: their AMI type; system
   nodes: AL2023_x86_64_STANDARD) in the region (preflight_stack.py, `ami_parameter_name`): a
   release EKS never published there fails the node group's creation. A
   Bottlerocket release is not looked up (unknown).
8. On-Demand vCPU quota of the system nodes and the bastion (usually the
   Standard quota, L-1216C47A): the system node group's nodes and its update
   surge (its subnets span every zone) plus the private-ssm bastion, against the
   quota less what other running instances of that class use.
9. VPCs per Region, NAT gateways per Availability Zone (Service Quotas,
   service code `vpc`) and EC2-VPC Elastic IPs (`ec2`), only for what the stack
   creates: a new VPC, one NAT gateway and one Elastic IP per NAT zone (one zone,
   or every zone with `network.natGatewayPerAz`); nothing with
   `network.existingVpcId`. Usage: EC2 DescribeVpcs, DescribeNatGateways (per
   zone, through DescribeSubnets) and DescribeAddresses, less this stack's own
   (tagged project and stack: a rerun reuses them).
10. Pulumi state backend (no AWS call): PULUMI_BACKEND_URL, else Pulumi.yaml's
   `backend.url`; a production stack on a local file is a go with a warning
   (one machine's copy, no locking, no versions) whose fix is an S3 backend
   with versioning and a KMS secrets provider.
11. Serving image pushed (preflight_image.py): ECR DescribeImages of the tag
   bin/build-image pushes, whose digest `pulumi up` runs; a new stack's missing
   repository is a go with a warning (push beside the first `up`).
12. Cluster admin access (preflight_admin.py): with adminPrincipalArns given,
   STS GetCallerIdentity's caller must be one of them (a new cluster makes no
   other admin, and the Kubernetes provider runs as the caller).

The region is `--region`, else the stack's `aws:region` (where Pulumi deploys), else
the region of boto3's standard configuration; credentials come from boto3's standard chain (environment, shared files, SSO,
instance role), and `AWS_ENDPOINT_URL` is honoured like any boto3 setting.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Optional

from infra.catalog import eks_versions
from infra.catalog.capacity import CAPACITY_BLOCK, CAPACITY_RESERVATION, ON_DEMAND
from infra.catalog.eks import AL2023, addon_names, ami_family
from infra.catalog.instances import InstanceType, get_instance_type
from infra.aws.tags import PROJECT_TAG, STACK_TAG
from infra.errors import UserError
from infra.ops import aws

# --------------------------------------------------------------------------- data

# EC2 On-Demand vCPU quotas (Service Quotas service code `ec2`), one per instance class.
# Sources: L-1216C47A, the example of `aws service-quotas get-service-quota` in the AWS CLI
# command reference (QuotaName "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z)
# instances", UsageMetric Class Standard/OnDemand, Resource vCPU); L-417A185B and L-DB2E81BA
# as linked from "Running On-Demand P instances" and "Running On-Demand G and VT instances"
# in the Service Quotas console (servicequotas/home/services/ec2/quotas/<code>), and used by
# many public quota scripts. The names are AWS's quota names: the check confirms the name the
# API returns for a code, and finds the quota by name (ListServiceQuotas) when a code is not
# known or does not match, so a wrong or renamed code degrades to a name lookup, never to a
# wrong answer.
QUOTA_SOURCE = (
    "Service Quotas, service code ec2: L-1216C47A per the AWS CLI reference example of "
    "get-service-quota; L-417A185B (P) and L-DB2E81BA (G and VT) per the Service Quotas console; "
    "names confirmed against the API's QuotaName at run time"
)


@dataclass(frozen=True)
class Quota:
    classes: tuple[str, ...]  # leading letters of the instance family, e.g. ("p",), ("g", "vt"); () for a count quota
    name: str  # AWS's quota name
    code: Optional[str]  # None: looked up by name
    service: str = "ec2"  # Service Quotas service code


QUOTAS: tuple[Quota, ...] = (
    Quota(("p",), "Running On-Demand P instances", "L-417A185B"),
    Quota(("g", "vt"), "Running On-Demand G and VT instances", "L-DB2E81BA"),
    Quota(("a", "c", "d", "h", "i", "m", "r", "t", "z"), "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "L-1216C47A"),
    # Codes not confirmed from a source we trust: found by name at run time.
    Quota(("inf",), "Running On-Demand Inf instances", None),
    Quota(("trn",), "Running On-Demand Trn instances", None),
    Quota(("dl",), "Running On-Demand DL instances", None),
    Quota(("f",), "Running On-Demand F instances", None),
    Quota(("x",), "Running On-Demand X instances", None),
    Quota(("u",), "Running On-Demand High Memory instances", None),
    Quota(("hpc",), "Running On-Demand HPC instances", None),
)  # fmt: skip

# Count quotas of what a new VPC brings, per region (NAT gateways: per zone). Sources:
# - L-F678F1CE "VPCs per Region" and L-FE5A380F "NAT gateways per Availability Zone", service code vpc:
#   moto 5.2.5's copy of AWS's default VPC quotas (moto/servicequotas/resources/default_quotas/vpc.py, both
#   5), which the moto server answers GetServiceQuota from;
# - L-0263D0A3 "EC2-VPC Elastic IPs", service code ec2: AWS's managed policy
#   AmazonRedshiftServiceLinkedRolePolicy grants servicequotas:GetServiceQuota on
#   arn:aws:servicequotas:*:*:ec2/L-0263D0A3 (moto/iam/aws_managed_policies.py, the copy of AWS's policies),
#   and public quota scripts name it "EC2-VPC Elastic IPs"; like the vCPU quotas, the name is confirmed
#   against the API's QuotaName at run time and looked up by name when it differs.
VPC_QUOTA = Quota((), "VPCs per Region", "L-F678F1CE", "vpc")
NAT_QUOTA = Quota((), "NAT gateways per Availability Zone", "L-FE5A380F", "vpc")
EIP_QUOTA = Quota((), "EC2-VPC Elastic IPs", "L-0263D0A3", "ec2")
# What the stack creates besides the GPU nodes (read here, not imported: those modules build Pulumi resources;
# tests/test_preflight.py checks they agree). components/cluster.py SYSTEM_AMI_TYPE, and the system node
# group's update_config maxUnavailable.
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
SYSTEM_MAX_UNAVAILABLE = 1


# EKS scales a Capacity Block node group to zero this long before the block ends (EKS User Guide).
BLOCK_SCALE_DOWN = dt.timedelta(minutes=40)
# ASSUMPTION: how long after `pulumi up` starts the GPU node group asks for its instances on a new stack (VPC, EKS
# control plane ~10-15 min, add-ons, system nodes), and how long a node then takes to be Ready (boot, join, the GPU
# operator's DaemonSets). Used only to set a Capacity Block's window against the change.
CHANGE_LEAD = dt.timedelta(minutes=30)
NODE_READY = dt.timedelta(minutes=15)

GO, NO_GO, UNKNOWN = "go", "no-go", "unknown"


@dataclass(frozen=True)
class Check:
    name: str
    ok: Optional[bool]  # True go, False no-go, None unknown
    detail: str
    fix: str = ""
    warning: str = ""  # a go that needs attention soon (e.g. standard support ends within 60 days)

    @property
    def status(self) -> str:
        return GO if self.ok is True else NO_GO if self.ok is False else UNKNOWN

    def to_json_dict(self) -> dict:
        return {**asdict(self), "status": self.status}


@dataclass(frozen=True)
class NodeAmi:
    """The AMI a node group launches from: its EKS AMI type and release version, and where the release is pinned."""

    group: str  # "GPU nodes", "system nodes"
    ami_type: str
    release: str
    pinned_in: str  # the file or config key to change


@dataclass(frozen=True)
class Target:
    """What the stack asks AWS for (from its stack file and plan)."""

    stack: str
    region: str
    instance: InstanceType
    nodes: int
    zone: str
    capacity_type: str  # on-demand | capacity-reservation | capacity-block
    reservation_id: Optional[str]
    kubernetes_version: str
    node_group_zones: int = 1  # the GPU node group's subnets span one zone (EFA)
    max_unavailable: int = 1  # infra/aws/gpu_nodes.py, update_config
    placement_group_name: Optional[str] = None  # network.placementGroupName: an existing group the nodes launch into
    addon_versions: tuple[tuple[str, str], ...] = ()  # (add-on, pinned version) the cluster installs
    cold_start: dt.timedelta = dt.timedelta(0)  # the plan's estimate: weights read and engine start
    node_amis: tuple[NodeAmi, ...] = ()  # the GPU and system node groups' AMI releases
    system_instance_type: str = "m7i.xlarge"  # cluster.systemInstanceType
    system_nodes: int = 2  # cluster.systemNodeCount
    system_zones: int = 2  # the zones (at most: subnets) the system node group's subnets span
    bastion_instance_type: Optional[str] = None  # private-ssm: the SSM bastion (infra/aws/access.py)
    existing_vpc_id: Optional[str] = None  # network.existingVpcId: no VPC, NAT gateway or Elastic IP created
    nat_zones: tuple[str, ...] = ()  # the zones that get a NAT gateway and its Elastic IP
    production: bool = False  # lifecycle.production
    backend_url: Optional[str] = None  # where `pulumi` keeps the stack's state (state_backend)
    backend_source: str = ""
    image_repository: Optional[str] = None  # the ECR repository of the serving image; None: serving.image names it
    image_tag: Optional[str] = None  # the tag bin/build-image pushes (preflight_image.py)
    admin_principal_arns: tuple[str, ...] = ()  # cluster.adminPrincipalArns (preflight_admin.py)

    @property
    def instance_type(self) -> str:
        return self.instance.name

    @property
    def creates_vpc(self) -> bool:
        return self.existing_vpc_id is None

    @property
    def system_update_surge(self) -> int:
        """Extra system nodes during a node update (the same EKS rule as `update_surge`)."""
        return max(2 * self.system_zones, SYSTEM_MAX_UNAVAILABLE)

    @property
    def other_instances(self) -> tuple[tuple[str, int, str], ...]:
        """(instance type, most running at once, what) of the On-Demand instances besides the GPU nodes."""
        out = [(self.system_instance_type, self.system_nodes + self.system_update_surge,
                f"{self.system_nodes} system node(s) and the update surge of {self.system_update_surge}")]  # fmt: skip
        if self.bastion_instance_type:
            out.append((self.bastion_instance_type, 1, "the SSM bastion"))
        return tuple(out)

    @property
    def update_surge(self) -> int:
        """Extra nodes an EKS managed node group update runs (EKS User Guide, "Understand each phase of node
        updates", setup phase): the larger of twice its zones and maxUnavailable."""
        return max(2 * self.node_group_zones, self.max_unavailable)

    @property
    def vcpus_needed(self) -> int:
        """vCPUs the On-Demand quota must cover: the nodes and the update surge."""
        return (self.nodes + self.update_surge) * self.instance.vcpus

    @property
    def uses_efa(self) -> bool:
        # The GPU launch template declares every EFA interface the type has (infra/aws/gpu_nodes.py).
        return self.instance.max_efa_interfaces > 0


def nat_zones(zones: Iterable[str], per_az: bool) -> tuple[str, ...]:
    """The zones that get a NAT gateway: every zone, or the first (as components/network.py nat_zones)."""
    zones = tuple(zones)
    return zones if per_az else zones[:1]


def node_amis(cfg, day: dt.date) -> tuple[NodeAmi, ...]:
    """The AMI release of the GPU and the system node group (as components/stack.py passes them)."""
    version = cfg.kubernetes_version(day)
    catalog = f"infra/catalog/eks_versions.py AL2023_RELEASES[{version!r}]"
    gpu_pin = "gpu-serving:gpu.amiReleaseVersion" if cfg.gpu.ami_release_version else catalog
    system_pin = gpu_pin if ami_family(cfg.gpu.ami_type) == AL2023 else catalog
    return (
        NodeAmi("GPU nodes", cfg.gpu.ami_type, cfg.ami_release_version(day), gpu_pin),
        NodeAmi("system nodes", SYSTEM_AMI_TYPE, cfg.system_ami_release_version(day), system_pin),
    )


def target_from_stack(stack: str, root=None, region: Optional[str] = None) -> Target:
    """The pre-flight target of `Pulumi.<stack>.yaml`; raises UserError on a config error."""
    from infra.aws.access import BASTION_INSTANCE_TYPE, needs_bastion
    from infra.ops import preflight_image, preflight_state
    from infra.config import load_stack_file, read_stack_file
    from infra.planning import make_plan

    cfg = load_stack_file(stack, root)
    if region is None and "aws:region" not in read_stack_file(stack, root):
        region = aws.new_session().region_name  # no aws:region in the stack file: boto3's configured region
    region = region or cfg.region
    plan = make_plan(cfg.plan_request())
    day = eks_versions.today()
    version = cfg.kubernetes_version(day)
    net = cfg.network
    pinned = eks_versions.addon_versions(version)
    installed = addon_names(cfg.cluster.fsx_csi)
    try:
        cold = plan.deployment().storage.estimated_cold_start_s
    except UserError:  # a plan that cannot be served: the other checks still answer, the window check has no cold start
        cold = 0.0
    return Target(
        stack=stack,
        region=region,
        instance=get_instance_type(cfg.gpu.instance_type),
        nodes=plan.nodes,
        zone=cfg.network.gpu_zone(region),
        capacity_type=cfg.gpu.capacity.type,
        reservation_id=cfg.gpu.capacity.reservation_id,
        kubernetes_version=version,
        placement_group_name=cfg.network.placement_group_name,
        addon_versions=tuple((a, pinned[a]) for a in installed),
        cold_start=dt.timedelta(seconds=cold),
        node_amis=node_amis(cfg, day),
        system_instance_type=cfg.cluster.system_instance_type,
        system_nodes=cfg.cluster.system_node_count,
        # The system node group spans the private subnets: one per zone of a new VPC; an existing VPC's
        # may share zones, so their number bounds the zones from above.
        system_zones=len(net.existing_private_subnet_ids or []) if net.existing_vpc_id else len(net.zones(region)),
        bastion_instance_type=BASTION_INSTANCE_TYPE if needs_bastion(cfg.cluster.endpoint_access) else None,
        existing_vpc_id=net.existing_vpc_id,
        nat_zones=() if net.existing_vpc_id else nat_zones(net.zones(region), net.nat_gateway_per_az),
        production=cfg.lifecycle.production,
        backend_url=(backend := preflight_state.state_backend(root, os.environ))[0],
        backend_source=backend[1],
        image_repository=(image := preflight_image.image_to_check(cfg, stack))[0],
        image_tag=image[1],
        admin_principal_arns=tuple(cfg.cluster.admin_principal_arns),
    )


# --------------------------------------------------------------------------- clients


@dataclass
class Clients:
    ec2: Any
    quotas: Any
    eks: Any
    ssm: Any = None
    ecr: Any = None
    sts: Any = None


def make_clients(region: str, session=None) -> Clients:
    session = session or aws.new_session(region)
    return Clients(
        ec2=session.client("ec2", region_name=region),
        quotas=session.client("service-quotas", region_name=region),
        eks=session.client("eks", region_name=region),
        ssm=session.client("ssm", region_name=region),
        ecr=session.client("ecr", region_name=region),
        sts=session.client("sts", region_name=region),
    )


def _error_text(exc: Exception) -> str:
    return aws.error_text(exc, limit=200)  # a table cell


# --------------------------------------------------------------------------- checks


def check_offering(ec2, t: Target) -> Check:
    """The instance type is offered in the GPU zone (for this account's zone names)."""
    name = "instance type offered in zone"
    try:
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [t.instance_type]}],
        )
        zones = sorted({o["Location"] for page in pages for o in page.get("InstanceTypeOfferings", [])})
    except Exception as exc:  # noqa: BLE001 - any API failure is an unknown, with its reason
        fix = "grant ec2:DescribeInstanceTypeOfferings" if aws.is_denied(exc) else "rerun; check the region and credentials"
        return Check(name, None, f"could not list offerings of {t.instance_type} in {t.region}: {_error_text(exc)}", fix)
    if t.zone in zones:
        return Check(name, True, f"{t.instance_type} is offered in {t.zone} ({len(zones)} zones of {t.region} offer it)")
    if not zones:
        return Check(
            name, False, f"{t.instance_type} is not offered in any zone of {t.region}",
            f"deploy to a region that offers {t.instance_type} (aws:region and gpu-serving:network zones), "
            "or choose another gpu-serving:gpu.instanceType",
        )  # fmt: skip
    return Check(
        name, False, f"{t.instance_type} is not offered in {t.zone}; offered in: {', '.join(zones)}",
        f"set gpu-serving:network.gpuAvailabilityZone to one of {', '.join(zones)} "
        "(and list it in availabilityZones)",
    )  # fmt: skip


def quota_for(instance_type: str) -> Optional[Quota]:
    """The On-Demand vCPU quota an instance type counts against (by its family's class letters).

    `p5.48xlarge` -> P, `g6e.xlarge` -> G and VT, `m7i.xlarge` -> Standard, `inf2.xlarge` -> Inf;
    None for families with no On-Demand vCPU quota known here (e.g. `mac`).
    """
    family = instance_type.split(".", 1)[0].lower()
    m = re.match(r"[a-z]+", family)
    if not m:
        return None
    letters = m.group(0)
    if letters.startswith("mac"):
        return None  # Mac instances run on Dedicated Hosts: host quotas, not vCPU quotas
    by_class = {c: q for q in QUOTAS for c in q.classes}
    for cls in sorted(by_class, key=len, reverse=True):  # "inf" before "i", "dl" before "d", "hpc" before "h"
        if len(cls) > 1 and letters.startswith(cls):
            return by_class[cls]
    return by_class.get(letters[0])


def _quota_by_name(sq, name: str, service: str = "ec2") -> Optional[dict]:
    pages = sq.get_paginator("list_service_quotas").paginate(ServiceCode=service)
    for page in pages:
        for q in page.get("Quotas", []):
            if q.get("QuotaName", "").lower() == name.lower():
                return q
    return None


def read_quota(sq, quota: Quota) -> tuple[Optional[dict], list[str]]:
    """The applied quota (or its default) as Service Quotas returns it, and the errors met on the way."""
    errors: list[str] = []
    if quota.code:
        for call in (sq.get_service_quota, sq.get_aws_default_service_quota):
            try:
                q = call(ServiceCode=quota.service, QuotaCode=quota.code)["Quota"]
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{call.__name__}({quota.code}): {_error_text(exc)}")
                if aws.is_denied(exc):
                    return None, errors
                continue
            if q.get("QuotaName", "").lower() == quota.name.lower():
                return q, errors
            errors.append(f"{quota.code} is {q.get('QuotaName')!r}, not {quota.name!r}")
            break
    try:
        q = _quota_by_name(sq, quota.name, quota.service)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"list_service_quotas({quota.service}): {_error_text(exc)}")
        return None, errors
    if q is None:
        errors.append(f"no quota named {quota.name!r}")
    return q, errors


def _own(resource: dict, stack: str) -> bool:
    """Tagged as this stack's (project and stack tags): a rerun or an update reuses it, it needs no new quota."""
    tags = aws.tag_dict(resource.get("Tags"))
    return tags.get(STACK_TAG) == stack and bool(tags.get(PROJECT_TAG))


def _increase(code: str, service: str, desired: int, region: str) -> str:
    """The fix of a quota that is too small: the CLI request for it."""
    return (f"request {code} >= {desired}: aws service-quotas request-service-quota-increase --service-code {service} "
            f"--quota-code {code} --desired-value {desired} --region {region}")  # fmt: skip


def _running_vcpus(ec2, quota: Quota, stack: str) -> tuple[int, list[str]]:
    """vCPUs of running/pending instances counted by `quota`, not tagged as this stack's."""
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    counts: dict[str, int] = {}
    for page in pages:
        for res in page.get("Reservations", []):
            for inst in res.get("Instances", []):
                if _own(inst, stack):
                    continue  # this stack's own nodes (an update re-uses them)
                itype = inst.get("InstanceType", "")
                if quota_for(itype) is quota:
                    counts[itype] = counts.get(itype, 0) + 1
    if not counts:
        return 0, []
    sizes: dict[str, int] = {}
    for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=sorted(counts)):
        for it in page.get("InstanceTypes", []):
            sizes[it["InstanceType"]] = int(it["VCpuInfo"]["DefaultVCpus"])
    total = sum(sizes.get(k, 0) * n for k, n in counts.items())
    return total, [f"{n} x {k}" for k, n in sorted(counts.items())]


def check_quota(sq, ec2, t: Target) -> Check:
    """The On-Demand vCPU quota of the instance family covers the plan (on demand only)."""
    name = "On-Demand vCPU quota"
    if t.capacity_type != ON_DEMAND:
        kind = "Capacity Block" if t.capacity_type == CAPACITY_BLOCK else "capacity reservation"
        return Check(
            name, True,
            f"not applicable: the nodes launch into {kind} {t.reservation_id}; EC2 checked the On-Demand "
            "limit when the reservation was created (a Capacity Block is bought, not drawn from it). No update "
            "surge either: reserved node groups update MINIMAL (a node goes before its replacement comes), "
            "so the reservation needs the plan's nodes and no more",
        )  # fmt: skip
    quota = quota_for(t.instance_type)
    need = t.vcpus_needed
    n = t.nodes + t.update_surge
    sizing = (
        f"{t.nodes} x {t.instance_type} and the update surge of {t.update_surge} (the larger of 2 x "
        f"{t.node_group_zones} zone(s) and maxUnavailable {t.max_unavailable}) = {n} x {t.instance.vcpus} = {need} vCPUs"
    )
    if quota is None:
        return Check(
            name, None, f"no known On-Demand quota for the family of {t.instance_type}; the plan needs {sizing}",
            f"look up the family's 'Running On-Demand ... instances' quota in the Service Quotas console ({t.region})",
        )  # fmt: skip
    q, errors = read_quota(sq, quota)
    label = f"{quota.name} ({quota.code or 'code looked up by name'})"
    if q is None:
        return Check(
            name, None, f"could not read {label} in {t.region}: {'; '.join(errors)}; the plan needs {sizing}",
            f"grant servicequotas:GetServiceQuota and servicequotas:ListServiceQuotas, or check "
            f"'{quota.name}' in the Service Quotas console ({t.region}): it must be at least {need}",
        )  # fmt: skip
    code = q.get("QuotaCode") or quota.code
    value = float(q["Value"])
    try:
        used, used_by = _running_vcpus(ec2, quota, t.stack)
    except Exception as exc:  # noqa: BLE001 - the quota alone still answers most of the question
        used, used_by = 0, []
        errors.append(f"running instances not counted: {_error_text(exc)}")
    free = value - used
    detail = f"{quota.name} ({code}) = {value:g} vCPUs"
    if used:
        detail += f", {used} in use by other instances ({', '.join(used_by)})"
    detail += f"; the plan needs {sizing}"
    if errors:
        detail += f" (notes: {'; '.join(errors)})"
    if free >= need:
        return Check(name, True, detail)
    desired = int(used + need)
    return Check(
        name, False, detail,
        _increase(code, quota.service, desired, t.region)
        + (" (or stop the other instances)" if used else "")
        + "; or use a capacity reservation / Capacity Block (gpu-serving:gpu.capacity)",
    )  # fmt: skip


def _fmt_time(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return str(value)


def _utc(value: Any) -> Optional[dt.datetime]:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None


def _hours(delta: dt.timedelta) -> str:
    h = delta.total_seconds() / 3600
    return f"{h / 24:.1f} days" if h >= 48 else f"{h:.1f} h"


def check_reservation(ec2, t: Target, now: Optional[dt.datetime] = None) -> Check:
    """The capacity reservation or Capacity Block exists, is usable now, and fits the plan."""
    kind = "Capacity Block" if t.capacity_type == CAPACITY_BLOCK else "capacity reservation"
    name = "capacity reservation" if t.capacity_type != CAPACITY_BLOCK else "Capacity Block"
    if t.capacity_type == ON_DEMAND:
        return Check("capacity reservation", True, "not used: on-demand capacity (gpu-serving:gpu.capacity.type)")
    now = now or dt.datetime.now(dt.timezone.utc)
    rid = t.reservation_id
    try:
        found = ec2.describe_capacity_reservations(CapacityReservationIds=[rid]).get("CapacityReservations", [])
    except Exception as exc:  # noqa: BLE001
        code = aws.error_code(exc)
        if code.startswith("InvalidCapacityReservationId"):
            found = []
        else:
            fix = "grant ec2:DescribeCapacityReservations" if aws.is_denied(exc) else "rerun; check the region and credentials"
            return Check(name, None, f"could not read {rid} in {t.region}: {_error_text(exc)}", fix)
    if not found:
        return Check(
            name, False, f"{kind} {rid} not found in {t.region} for this account",
            f"check gpu-serving:gpu.capacity.reservationId, the region ({t.region}) and the account; list them with "
            f"`aws ec2 describe-capacity-reservations --region {t.region}`",
        )  # fmt: skip
    cr = found[0]
    problems: list[str] = []
    fixes: list[str] = []
    rtype = cr.get("ReservationType", "default")
    state = cr.get("State", "?")
    start, end = _utc(cr.get("StartDate")), _utc(cr.get("EndDate"))
    itype, zone = cr.get("InstanceType"), cr.get("AvailabilityZone")
    total, avail = int(cr.get("TotalInstanceCount", 0)), int(cr.get("AvailableInstanceCount", 0))
    facts = [f"{rid}: {rtype}, {state}", f"{total} x {itype} in {zone}", f"{avail} available"]
    if start or end:
        facts.append(f"{_fmt_time(start) if start else '?'} -> {_fmt_time(end) if end else 'no end date'}")

    if t.capacity_type == CAPACITY_BLOCK and rtype != "capacity-block":
        problems.append(f"it is an On-Demand Capacity Reservation, not a Capacity Block")
        fixes.append("set gpu-serving:gpu.capacity.type to capacity-reservation")
    elif t.capacity_type == CAPACITY_RESERVATION and rtype == "capacity-block":
        problems.append("it is a Capacity Block, not an On-Demand Capacity Reservation")
        fixes.append("set gpu-serving:gpu.capacity.type to capacity-block (market type capacity-block, node group CAPACITY_BLOCK)")
    starts_in_time = state == "scheduled" and rtype == "capacity-block" and start is not None and start - now <= CHANGE_LEAD
    if state == "active" or starts_in_time:
        if starts_in_time:
            facts.append(f"starts {_fmt_time(start)}, before the change reaches the node group (~{_hours(CHANGE_LEAD)} after `up` starts)")
        if rtype == "capacity-block" and end is not None:
            left = end - now
            serving_from = max(now + CHANGE_LEAD, start or now) + NODE_READY + t.cold_start
            serving = end - BLOCK_SCALE_DOWN - serving_from
            if left <= BLOCK_SCALE_DOWN:
                problems.append(f"the block ends at {_fmt_time(end)}: EKS scales its node group to zero 40 minutes before")
                fixes.append("buy a new Capacity Block (aws ec2 describe-capacity-block-offerings / purchase-capacity-block-offering)")
            elif serving <= dt.timedelta(0):
                problems.append(
                    f"the block ends at {_fmt_time(end)} (in {_hours(left)}): the change reaches the node group in ~"
                    f"{_hours(CHANGE_LEAD)}, nodes are Ready ~{_hours(NODE_READY)} later and the plan's cold start takes "
                    f"{_hours(t.cold_start)}, and EKS scales the group to zero 40 minutes before the end: nothing would serve"
                )
                fixes.append("buy a later or longer Capacity Block and set gpu-serving:gpu.capacity.reservationId to it "
                             "(a new block gets a new node group, created before the old one goes)")  # fmt: skip
            else:
                facts.append(f"ends in {_hours(left)}; EKS scales the node group to zero 40 minutes before, leaving "
                             f"~{_hours(serving)} of serving after this change")  # fmt: skip
    elif state == "scheduled":
        when = f"starts {_fmt_time(start)} (in {_hours(start - now)})" if start else "has not started"
        problems.append(f"it is scheduled: {when}, ends {_fmt_time(end) if end else '?'}")
        lead = f"{_fmt_time(start - CHANGE_LEAD)}" if start else "it starts"
        fixes.append(f"run `pulumi up` after {lead} (the node group is created ~{_hours(CHANGE_LEAD)} into it; until the "
                     "block starts its launches fail)")  # fmt: skip
    elif state in ("pending", "assessing", "payment-pending", "delayed"):
        problems.append(f"it is not active yet (state {state})")
        fixes.append("wait until it is active (aws ec2 describe-capacity-reservations), then rerun")
    else:
        problems.append(f"it cannot be used (state {state})")
        fixes.append(f"get a new {kind} and set gpu-serving:gpu.capacity.reservationId")
    # botocore's ec2 model, CapacityReservation.PlacementGroupArn: the cluster placement group it was created in.
    group_arn = cr.get("PlacementGroupArn")
    group = str(group_arn).rsplit("placement-group/", 1)[-1] if group_arn else None
    if group:
        facts.append(f"in placement group {group}")
    if group != t.placement_group_name:
        if group:
            problems.append(f"it was made in placement group {group}, and launches only into it")
            fixes.append(f"set gpu-serving:network.placementGroupName to {group}")
        else:
            problems.append(f"it is in no placement group, but the nodes would launch into {t.placement_group_name}")
            fixes.append("remove gpu-serving:network.placementGroupName")
    if zone != t.zone:
        problems.append(f"it is in {zone}, the GPU nodes go to {t.zone}")
        fixes.append(f"set gpu-serving:network.gpuAvailabilityZone to {zone} (and list it in availabilityZones)")
    if itype != t.instance_type:
        problems.append(f"it holds {itype}, the plan uses {t.instance_type}")
        fixes.append(f"set gpu-serving:gpu.instanceType to {itype}, or use a reservation of {t.instance_type}")
    if total < t.nodes:
        problems.append(f"it holds {total} instances, the plan needs {t.nodes}")
        fixes.append(f"use a reservation of at least {t.nodes} x {t.instance_type} (or plan for {total} nodes)")
    elif avail < t.nodes:
        problems.append(f"only {avail} of {total} instances are available, the plan needs {t.nodes}")
        fixes.append("free the instances running in it (if they are not this stack's nodes), or use a larger reservation")
    detail = "; ".join(facts)
    if problems:
        return Check(name, False, detail + ". No-go: " + "; ".join(problems), "; ".join(fixes))
    return Check(name, True, detail)


def check_efa(ec2, t: Target) -> Check:
    """EFA is supported by the instance type (when the plan wires EFA interfaces)."""
    name = "EFA supported"
    if not t.uses_efa:
        return Check(name, True, f"not used: the plan wires no EFA interfaces on {t.instance_type}")
    try:
        types = ec2.describe_instance_types(InstanceTypes=[t.instance_type]).get("InstanceTypes", [])
    except Exception as exc:  # noqa: BLE001
        code = aws.error_code(exc)
        if code == "InvalidInstanceType":
            return Check(name, False, f"EC2 does not know {t.instance_type} in {t.region}",
                         "choose an instance type EC2 offers in this region (gpu-serving:gpu.instanceType)")  # fmt: skip
        fix = "grant ec2:DescribeInstanceTypes" if aws.is_denied(exc) else "rerun; check the region and credentials"
        return Check(name, None, f"could not describe {t.instance_type}: {_error_text(exc)}", fix)
    if not types:
        return Check(name, False, f"EC2 does not know {t.instance_type} in {t.region}",
                     "choose an instance type EC2 offers in this region (gpu-serving:gpu.instanceType)")  # fmt: skip
    net = types[0].get("NetworkInfo", {})
    supported = bool(net.get("EfaSupported"))
    max_efa = int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0))
    want = t.instance.max_efa_interfaces
    if not supported:
        return Check(
            name, False, f"{t.instance_type} does not support EFA; the plan wires {want} EFA interfaces",
            "choose an EFA instance type (p4d, p5, p5e, p5en, p6-b200, g6e.12xlarge and larger)",
        )  # fmt: skip
    if max_efa < want:
        return Check(
            name, False, f"{t.instance_type} takes {max_efa} EFA interfaces, the launch template declares {want}",
            "update infra/catalog/instances.py (max_efa_interfaces) from EC2 DescribeInstanceTypes",
        )  # fmt: skip
    return Check(name, True, f"{t.instance_type}: EFA supported, up to {max_efa} interfaces; the plan uses {want}")


# --------------------------------------------------------------------------- run and render


def run_checks(t: Target, clients: Clients, now: Optional[dt.datetime] = None) -> list[Check]:
    # Checks 5 and 6 (EKS) live in preflight_eks.py, 7 to 9 (what the stack creates besides the GPU nodes) in
    # preflight_stack.py; both build on this module.
    from infra.ops import preflight_admin, preflight_image, preflight_state
    from infra.ops.preflight_eks import check_addon_versions, check_eks_version
    from infra.ops.preflight_stack import (
        check_ami_release,
        check_eip_quota,
        check_nat_quota,
        check_system_vcpu_quota,
        check_vpc_quota,
    )

    now = now or dt.datetime.now(dt.timezone.utc)
    steps: list[Callable[[], Check]] = [
        lambda: check_offering(clients.ec2, t),
        lambda: check_quota(clients.quotas, clients.ec2, t),
        lambda: check_reservation(clients.ec2, t, now),
        lambda: check_efa(clients.ec2, t),
        lambda: check_eks_version(clients.eks, t, now.date()),
        lambda: check_addon_versions(clients.eks, t),
        lambda: check_ami_release(clients.ssm, t),
        lambda: check_system_vcpu_quota(clients.quotas, clients.ec2, t),
        lambda: check_vpc_quota(clients.quotas, clients.ec2, t),
        lambda: check_nat_quota(clients.quotas, clients.ec2, t),
        lambda: check_eip_quota(clients.quotas, clients.ec2, t),
        lambda: preflight_state.check_state_backend(t),
        lambda: preflight_image.check_serving_image(clients.ecr, t),
        lambda: preflight_admin.check_admin_access(clients.sts, t),
    ]
    return [step() for step in steps]


def all_go(checks: Iterable[Check], allow_unknown: bool = False) -> bool:
    return all(c.ok is True or (allow_unknown and c.ok is None) for c in checks)


def to_json_dict(t: Target, checks: list[Check], allow_unknown: bool = False) -> dict:
    return {
        "stack": t.stack,
        "region": t.region,
        "zone": t.zone,
        "instance_type": t.instance_type,
        "nodes": t.nodes,
        "capacity": {"type": t.capacity_type, "reservation_id": t.reservation_id},
        "kubernetes_version": t.kubernetes_version,
        "go": all_go(checks, allow_unknown),
        "checks": [c.to_json_dict() for c in checks],
    }


def render(t: Target, checks: list[Check], console, allow_unknown: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table

    style = {GO: "[green]go[/green]", NO_GO: "[red]no-go[/red]", UNKNOWN: "[yellow]unknown[/yellow]"}
    table = Table(
        title=f"Pre-flight: stack {t.stack}, {t.nodes} x {t.instance_type} in {t.zone} ({t.region})",
        title_justify="left", title_style="bold",
    )  # fmt: skip
    table.add_column("check", style="bold")
    table.add_column("status")
    table.add_column("detail")
    table.add_column("fix")
    for c in checks:
        status = style[c.status] + (" [yellow](warning)[/yellow]" if c.warning else "")
        detail = c.detail + (f". Warning: {c.warning}" if c.warning else "")
        table.add_row(escape(c.name), status, escape(detail), escape(c.fix) if c.ok is not True or c.warning else "")
    console.print(table)
    go = all_go(checks, allow_unknown)
    bad = [c for c in checks if c.ok is False]
    unknown = [c for c in checks if c.ok is None]
    if go:
        extra = f" ({len(unknown)} unknown, allowed)" if unknown else ""
        warned = [c for c in checks if c.warning]
        extra += f"; {len(warned)} warning(s) above" if warned else ""
        console.print(f"[green bold]GO[/green bold]: every check passed{extra}.")
    else:
        parts = []
        if bad:
            parts.append(f"{len(bad)} no-go")
        if unknown:
            parts.append(f"{len(unknown)} unknown")
        console.print(f"[red bold]NO-GO[/red bold]: {', '.join(parts)}; fix the above before `pulumi up`.")


def preflight(stack: str, region: Optional[str] = None, root=None, session=None,
              now: Optional[dt.datetime] = None) -> tuple[Target, list[Check]]:  # fmt: skip
    """Load the stack, build clients from boto3's standard configuration, run every check.

    Raises UserError on a config error or when boto3 has no credentials.
    """
    t = target_from_stack(stack, root, region)
    session = session or aws.new_session(t.region)
    aws.require_credentials(session)
    return t, run_checks(t, make_clients(t.region, session), now)
