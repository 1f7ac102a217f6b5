"""Pre-flight checks 7 to 9 (infra/ops/preflight.py's module doc): what the stack creates besides the GPU nodes.

The pinned AMI release of each node group published in the region, the On-Demand
vCPU quota of the system nodes and the bastion, and the VPC, NAT gateway and
Elastic IP quotas of a VPC of the stack's own. Built on preflight.py's Target,
Check and quota helpers; `preflight.run_checks` runs them after checks 1 to 6.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from infra.catalog import eks_versions
from infra.catalog.capacity import ON_DEMAND
from infra.catalog.eks import AL2023
from infra.catalog.instances import InstanceType
from infra.ops import aws
from infra.ops.preflight import (
    EIP_QUOTA,
    NAT_QUOTA,
    VPC_QUOTA,
    Check,
    NodeAmi,
    Quota,
    Target,
    _error_text,
    _increase,
    _own,
    _running_vcpus,
    quota_for,
    read_quota,
)

# NAT gateways that hold a place in the per-zone quota. ASSUMPTION: pending, available and deleting (a
# deleting gateway counts until it is deleted, as NatGatewayLimitExceeded troubleshooting guides put it; the
# quota table says only "per Availability Zone"); states: botocore's ec2 model, NatGatewayState.
NAT_STATES_COUNTED = ("pending", "available", "deleting")

# The EKS-optimised AL2023 AMI of a release, in SSM Parameter Store. The EKS User Guide ("Retrieve
# recommended Amazon Linux AMI IDs", docs.aws.amazon.com/eks/latest/userguide/retrieve-ami-id.html)
# documents the tree /aws/service/eks/optimized-ami/<kubernetes-version>/<ami-type>/recommended/image_id,
# with <ami-type> amazon-linux-2023/x86_64/standard, .../arm64/standard, .../x86_64/nvidia,
# .../arm64/nvidia or .../x86_64/neuron; it does not spell out the name of one release. That name, in place
# of `recommended`, is amazon-eks-node-al2023-<arch>-<variant>-<kubernetes-version>-v<date> (the AMI's own
# name), as Karpenter resolves an `al2023@v<date>` alias (aws/karpenter-provider-aws,
# pkg/providers/amifamily/al2023.go, resolvePath) and as public Terraform reads it (e.g.
# .../1.30/amazon-linux-2023/x86_64/nvidia/amazon-eks-node-al2023-x86_64-nvidia-1.30-v20241024/image_id).
# A release version (EKS releaseVersion, infra/catalog/eks_versions.py) is <kubernetes>.<patch>-<date>.
AMI_PARAMETER_SOURCE = (
    "SSM public parameters of the EKS-optimised AL2023 AMIs: the tree of the EKS User Guide, 'Retrieve "
    "recommended Amazon Linux AMI IDs'; a release's name as Karpenter resolves it (amifamily/al2023.go)"
)
# EKS AMI type (botocore's eks model, AMITypes) -> (architecture, variant) in the parameter's path.
AL2023_AMI_PATHS: dict[str, tuple[str, str]] = {
    "AL2023_x86_64_STANDARD": ("x86_64", "standard"),
    "AL2023_ARM_64_STANDARD": ("arm64", "standard"),
    "AL2023_x86_64_NVIDIA": ("x86_64", "nvidia"),
    "AL2023_ARM_64_NVIDIA": ("arm64", "nvidia"),
    "AL2023_x86_64_NEURON": ("x86_64", "neuron"),
}
_AL2023_RELEASE = re.compile(r"^(\d+\.\d+)\.\d+-(\d{8})$")  # 1.35.6-20260714


@dataclass
class _Findings:
    """What a check made of several parts found: a no-go part makes it a no-go, else an unknown part an unknown."""

    facts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    unknown_fixes: list[str] = field(default_factory=list)

    def no_go(self, problem: str, fix: str) -> None:
        self.problems.append(problem)
        self.fixes.append(fix)

    def unknown(self, what: str, fix: str) -> None:
        self.unknowns.append(what)
        self.unknown_fixes.append(fix)

    def check(self, name: str) -> Check:
        detail = "; ".join(self.facts + self.problems + self.unknowns)
        if self.problems:
            return Check(name, False, detail, "; ".join(dict.fromkeys(self.fixes)))
        if self.unknowns:
            return Check(name, None, detail, "; ".join(dict.fromkeys(self.unknown_fixes)))
        return Check(name, True, detail)


def ami_parameter_name(ami_type: str, release: str) -> Optional[str]:
    """The SSM parameter holding the AMI id of EKS AL2023 release `release` of `ami_type` (AMI_PARAMETER_SOURCE).

    `AL2023_x86_64_NVIDIA`, `1.35.6-20260714` -> `/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/
    nvidia/amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id`; None for an AMI type that is not
    AL2023 (Bottlerocket) or a release not of the form <kubernetes>.<patch>-<yyyymmdd>.
    """
    path = AL2023_AMI_PATHS.get(ami_type)
    m = _AL2023_RELEASE.match(release or "")
    if path is None or m is None:
        return None
    (arch, variant), (k8s, date) = path, m.groups()
    return (f"/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2023/{arch}/{variant}/"
            f"amazon-eks-node-al2023-{arch}-{variant}-{k8s}-v{date}/image_id")  # fmt: skip


def _newest_release_hint(ami: NodeAmi, k8s: str, region: str) -> str:
    """How to read the newest release: `recommended/release_version` beside `recommended/image_id`, as eksctl and
    the terraform-aws-eks modules read a managed node group's latest release. Every AL2023 AMI type of a Kubernetes
    version shares the release version (infra/catalog/eks_versions.py), so one AMI type's answer serves all."""
    arch, variant = AL2023_AMI_PATHS[ami.ami_type]
    latest = f"/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2023/{arch}/{variant}/recommended/release_version"
    return f"the newest: `aws ssm get-parameter --name {latest} --region {region}`"


def check_ami_release(ssm, t: Target) -> Check:
    """Each node group's pinned AMI release is published in the region (SSM GetParameter of its AMI parameter)."""
    name = "AMI release published"
    if not t.node_amis:
        return Check(name, True, "no AMI release pinned: EKS launches the latest of each AMI type")
    f = _Findings()
    newest: list[str] = []
    for ami in t.node_amis:
        label = f"{ami.group}: {ami.ami_type} {ami.release}"
        param = ami_parameter_name(ami.ami_type, ami.release)
        if param is None:
            f.unknown(f"{label} not looked up (pre-flight knows the SSM names of EKS AL2023 releases only)",
                      f"confirm that {ami.ami_type} release {ami.release} is published in {t.region}, then rerun "
                      "with --allow-unknown")  # fmt: skip
            continue
        k8s = param.split("/")[5]
        if k8s != t.kubernetes_version:
            f.no_go(f"{label} is a release of Kubernetes {k8s}; the cluster runs {t.kubernetes_version}",
                    f"pin a Kubernetes {t.kubernetes_version} release: {ami.pinned_in}")  # fmt: skip
            continue
        try:
            image = ssm.get_parameter(Name=param)["Parameter"]["Value"]
        except Exception as exc:  # noqa: BLE001
            if aws.error_code(exc) == "ParameterNotFound":
                f.no_go(f"{label} is not published in {t.region} (no SSM parameter {param})",
                        f"pin an AMI release that exists in {t.region}: {ami.pinned_in}")  # fmt: skip
                newest = newest or [_newest_release_hint(ami, k8s, t.region)]
            elif aws.is_denied(exc):
                f.unknown(f"{label}: could not read {param}: {_error_text(exc)}",
                          f"grant ssm:GetParameter on arn:aws:ssm:{t.region}::parameter/aws/service/eks/*")  # fmt: skip
            else:
                f.unknown(f"{label}: could not read {param}: {_error_text(exc)}", "rerun; check the region and credentials")
            continue
        f.facts.append(f"{label} is {image}")
    f.fixes.extend(newest)
    return f.check(name)


def _vcpus_of(ec2, instance_types: Iterable[str]) -> dict[str, int]:
    """Default vCPUs of each instance type EC2 knows (DescribeInstanceTypes)."""
    pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=sorted(set(instance_types)))
    return {it["InstanceType"]: int(it["VCpuInfo"]["DefaultVCpus"]) for page in pages for it in page.get("InstanceTypes", [])}


def _vcpu_quota_part(sq, ec2, t: Target, quota: Quota, items: list[tuple[str, int, str]], sizes: dict[str, int],
                     f: _Findings) -> None:  # fmt: skip
    """One On-Demand vCPU quota against the instances of `items` (and the GPU nodes, when they share it)."""
    need = sum(n * sizes[i] for i, n, _ in items)
    sizing = " + ".join(f"{what} = {n} x {i} ({n * sizes[i]} vCPUs)" for i, n, what in items)
    if t.capacity_type == ON_DEMAND and quota_for(t.instance_type) is quota:
        need += t.vcpus_needed  # the GPU check counts them against the same quota: both must fit
        sizing += f" + the GPU nodes and their surge ({t.vcpus_needed} vCPUs)"
    q, errors = read_quota(sq, quota)
    if q is None:
        f.unknown(f"could not read {quota.name} ({quota.code or 'code looked up by name'}) in {t.region}: "
                  f"{'; '.join(errors)}; the stack needs {sizing}",
                  f"grant servicequotas:GetServiceQuota and servicequotas:ListServiceQuotas, or check '{quota.name}' "
                  f"in the Service Quotas console ({t.region}): it must be at least {need} more than other instances use")  # fmt: skip
        return
    code, value = q.get("QuotaCode") or quota.code, float(q["Value"])
    try:
        used, used_by = _running_vcpus(ec2, quota, t.stack)
    except Exception as exc:  # noqa: BLE001 - the quota alone still answers most of the question
        used, used_by = 0, []
        errors.append(f"running instances not counted: {_error_text(exc)}")
    text = f"{quota.name} ({code}) = {value:g} vCPUs" + (f", {used} in use by other instances ({', '.join(used_by)})" if used else "")
    text += f"; the stack needs {sizing}" + (f" (notes: {'; '.join(errors)})" if errors else "")
    if value - used >= need:
        f.facts.append(text)
        return
    f.no_go(text, _increase(code, quota.service, int(used + need), t.region) + (" (or stop the other instances)" if used else "")
            + "; or fewer or smaller system nodes (gpu-serving:cluster.systemNodeCount, systemInstanceType)")  # fmt: skip


def check_system_vcpu_quota(sq, ec2, t: Target) -> Check:
    """The On-Demand vCPU quota (Standard, for the default types) covers the system nodes and the bastion."""
    name = "On-Demand vCPU quota: system nodes, bastion"
    items = list(t.other_instances)
    try:
        sizes = _vcpus_of(ec2, [i for i, _, _ in items])
    except Exception as exc:  # noqa: BLE001
        if aws.error_code(exc) != "InvalidInstanceType":
            fix = "grant ec2:DescribeInstanceTypes" if aws.is_denied(exc) else "rerun; check the region and credentials"
            return Check(name, None, f"could not describe {', '.join(sorted({i for i, _, _ in items}))}: {_error_text(exc)}", fix)
        sizes = {}
    unknown_types = sorted({i for i, _, _ in items if i not in sizes})
    if unknown_types:
        return Check(name, False, f"EC2 does not know {', '.join(unknown_types)} in {t.region}",
                     "set gpu-serving:cluster.systemInstanceType to a type EC2 offers in this region")  # fmt: skip
    f = _Findings()
    by_quota: dict[Optional[Quota], list[tuple[str, int, str]]] = {}
    for item in items:
        by_quota.setdefault(quota_for(item[0]), []).append(item)
    for quota, part in by_quota.items():
        if quota is None:
            f.unknown(f"no known On-Demand quota for {', '.join(i for i, _, _ in part)}",
                      f"look up the family's 'Running On-Demand ... instances' quota in the Service Quotas console ({t.region})")  # fmt: skip
        else:
            _vcpu_quota_part(sq, ec2, t, quota, part, sizes, f)
    return f.check(name)


def _count_part(t: Target, quota: Quota, read: tuple[Optional[dict], list[str]], f: _Findings, *, need: int, used: int,
                what: str, where: str = "", instead: str = "") -> None:  # fmt: skip
    """A count quota (VPCs, NAT gateways, Elastic IPs) against what is in use and what the stack adds."""
    q, errors = read
    if q is None:
        f.unknown(f"could not read {quota.name} ({quota.code}) in {t.region}: {'; '.join(errors)}; "
                  f"{used} in use{where}, the stack adds {need} ({what})",
                  f"grant servicequotas:GetServiceQuota, or check '{quota.name}' in the Service Quotas console "
                  f"({t.region}): it must be at least {used + need}")  # fmt: skip
        return
    code, value = q.get("QuotaCode") or quota.code, float(q["Value"])
    text = f"{quota.name} ({code}) = {value:g}{where}: {used} in use, the stack adds {need} ({what})"
    if used + need <= value:
        f.facts.append(text)
    else:
        f.no_go(text, _increase(code, quota.service, used + need, t.region) + instead)


def _count_or_unknown(name: str, what: str, permission: str, count: Callable[[], Any]) -> tuple[Any, Optional[Check]]:
    """`count()`, or the unknown Check that says why it could not be counted."""
    try:
        return count(), None
    except Exception as exc:  # noqa: BLE001
        fix = f"grant {permission}" if aws.is_denied(exc) else "rerun; check the region and credentials"
        return None, Check(name, None, f"could not count the {what}: {_error_text(exc)}", fix)


def _others(ec2, op: str, key: str, stack: str) -> int:
    """How many items of EC2 list operation `op` are not this stack's."""
    return sum(1 for item in aws.pages(ec2, op, key) if not _own(item, stack))


def _existing_vpc(name: str, t: Target) -> Optional[Check]:
    if t.creates_vpc:
        return None
    return Check(name, True, f"not applicable: the stack uses the existing VPC {t.existing_vpc_id} "
                             "(no VPC, NAT gateway or Elastic IP of its own)")  # fmt: skip


def check_vpc_quota(sq, ec2, t: Target) -> Check:
    """VPCs per Region has room for the stack's VPC (when it creates one)."""
    name = "VPC quota"
    if (na := _existing_vpc(name, t)) is not None:
        return na
    used, err = _count_or_unknown(name, "VPCs", "ec2:DescribeVpcs", lambda: _others(ec2, "describe_vpcs", "Vpcs", t.stack))
    if err:
        return err
    f = _Findings()
    _count_part(t, VPC_QUOTA, read_quota(sq, VPC_QUOTA), f, need=1, used=used, what="its VPC",
                instead="; or delete an unused VPC, or use an existing one (gpu-serving:network.existingVpcId)")  # fmt: skip
    return f.check(name)


def _nat_gateways_per_zone(ec2, stack: str) -> dict[str, int]:
    """NAT gateways that count against the per-zone quota (NAT_STATES_COUNTED), not this stack's, by zone."""
    nats = [n for n in aws.pages(ec2, "describe_nat_gateways", "NatGateways")
            if n.get("State") in NAT_STATES_COUNTED and not _own(n, stack) and n.get("SubnetId")]  # fmt: skip
    if not nats:
        return {}
    subnets = sorted({n["SubnetId"] for n in nats})
    zone_of = {s["SubnetId"]: s["AvailabilityZone"] for s in aws.pages(ec2, "describe_subnets", "Subnets", SubnetIds=subnets)}
    counts: dict[str, int] = {}
    for n in nats:
        zone = zone_of.get(n["SubnetId"], "?")
        counts[zone] = counts.get(zone, 0) + 1
    return counts


def check_nat_quota(sq, ec2, t: Target) -> Check:
    """NAT gateways per Availability Zone has room for the stack's NAT gateway in each of its NAT zones."""
    name = "NAT gateway quota"
    if (na := _existing_vpc(name, t)) is not None:
        return na
    per_zone, err = _count_or_unknown(name, "NAT gateways", "ec2:DescribeNatGateways and ec2:DescribeSubnets",
                                      lambda: _nat_gateways_per_zone(ec2, t.stack))  # fmt: skip
    if err:
        return err
    f = _Findings()
    read = read_quota(sq, NAT_QUOTA)
    for zone in t.nat_zones:
        instead = f"; or delete unused NAT gateways in {zone}"
        if len(t.nat_zones) > 1:
            instead += "; or one NAT gateway (gpu-serving:network.natGatewayPerAz: false)"
        _count_part(t, NAT_QUOTA, read, f, need=1, used=per_zone.get(zone, 0), what="one NAT gateway", where=f" in {zone}",
                    instead=instead)  # fmt: skip
    return f.check(name)


def check_eip_quota(sq, ec2, t: Target) -> Check:
    """EC2-VPC Elastic IPs has room for one address per NAT gateway the stack creates."""
    name = "Elastic IP quota"
    if (na := _existing_vpc(name, t)) is not None:
        return na
    used, err = _count_or_unknown(name, "Elastic IP addresses", "ec2:DescribeAddresses",
                                  lambda: _others(ec2, "describe_addresses", "Addresses", t.stack))  # fmt: skip
    if err:
        return err
    f = _Findings()
    n = len(t.nat_zones)
    instead = "; or release unassociated Elastic IPs (aws ec2 describe-addresses)"
    if n > 1:
        instead += "; or one NAT gateway (gpu-serving:network.natGatewayPerAz: false)"
    _count_part(t, EIP_QUOTA, read_quota(sq, EIP_QUOTA), f, need=n, used=used,
                what=f"one per NAT gateway, in {', '.join(t.nat_zones)}", instead=instead)  # fmt: skip
    return f.check(name)
