"""EKS Kubernetes versions: the release calendar, the add-on versions and node AMI releases pinned per version.

Pure data with its sources, and small functions of a date (no AWS calls): the
stack config takes its default Kubernetes version from here, the cluster its
add-on versions, the node groups their AMI release, and pre-flight the support
dates (which it checks against EKS DescribeClusterVersions and
DescribeAddonVersions when it can call them).

Release calendar
----------------
Amazon EKS User Guide, "Understand the Kubernetes version lifecycle on EKS",
section "Amazon EKS Kubernetes release calendar"
(https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html).
A minor version has standard support for 14 months from its EKS release, then
extended support, at an extra cost per cluster hour, for 12 more. Rows 1.28 to
1.31: the guide's own table (awsdocs/amazon-eks-user-guide,
latest/ug/clusters/kubernetes-versions.adoc, 2024-12-18). Rows 1.32 to 1.35:
the guide's end-of-support dates as published on 2026-04-24, with the EKS
release dates endoflife.date/amazon-eks shows. Row 1.36: EKS release
2026-06-02, end of standard support 2027-08-02, end of extended support
2028-08-02, as endoflife.date's amazon-eks release data carries them from the
same calendar (read 2026-12-03).

Add-on versions (`ADDON_VERSIONS`)
----------------------------------
Every managed add-on the cluster installs is pinned, per Kubernetes version, so
that a `pulumi up` months later installs what was reviewed, and an add-on
changes only when this table (or the Kubernetes version) does. botocore's EKS
model names the API fields (`addonName`, `addonVersion`) but lists no versions;
the names are checked against the EKS add-on list in the tests, and pre-flight
asks EKS DescribeAddonVersions whether each pinned version is offered for the
cluster's Kubernetes version. Each pin carries its source:

- vpc-cni, coredns, kube-proxy: the EKS User Guide's "latest version for each
  Kubernetes version" tables ("Amazon VPC CNI versions", "CoreDNS versions",
  "kube-proxy versions");
- eks-pod-identity-agent, aws-efs-csi-driver, eks-node-monitoring-agent: the
  guide publishes no table for these; their versions are what
  DescribeAddonVersions returns, read from a public EKS template that writes
  the newest one per Kubernetes version into its config with the AWS CLI
  (devopscoop/aws-eks-template, `cluster/update_eks_addons.sh`): the pod
  identity agent for 1.33, 1.34 and 1.35, the EFS CSI driver and the node
  monitoring agent for 1.35. The same EFS and node monitoring builds for 1.33
  and 1.34 have no such record and stay labelled ASSUMPTION;
- aws-ebs-csi-driver: the same template's record for 1.35 (commit 03f3e08);
  the same build for 1.33 and 1.34 is labelled ASSUMPTION;
- aws-fsx-csi-driver: no DescribeAddonVersions record was found for any
  Kubernetes version; the pin is the first add-on version the guide names
  (its hybrid nodes add-on table), labelled ASSUMPTION.

Each ASSUMPTION says what was searched for it (`_SEARCHED`, 2026-12): none of
the places that publish EKS add-on versions shows these builds for these
Kubernetes versions, and the FSx CSI add-on is known to be offered per
Kubernetes version (it was refused on 1.33 in 2025, aws/containers-roadmap
issue 2625), so none of them can be taken as offered everywhere.

Pre-flight asks EKS DescribeAddonVersions whether each pinned version is
offered for the cluster's Kubernetes version, which is what confirms an
ASSUMPTION for a real account and region.

A Kubernetes version is usable by the stack only when every add-on has a pin
for it (`supported_versions`). 1.36 is in the calendar but not yet usable: the
VPC CNI table read here stops at 1.35.

Upgrading on purpose: add the new row (calendar, add-ons, AMI release), then
set `gpu-serving:cluster.kubernetesVersion` one minor version up at a time (EKS
upgrades the control plane one minor version per update).

AMI release versions (`AMI_RELEASES`)
-------------------------------------
The `releaseVersion` of managed node groups on the EKS-optimised AL2023 AMIs
(every AL2023 AMI type of a Kubernetes version shares it), from
awslabs/amazon-eks-ami CHANGELOG.md, "AMI Release v20260714" (commit
158225113dac62583729bca127cce67b4211737a): the "Release version" column of
each Kubernetes version's table. Bottlerocket AMIs have their own release
versions; a Bottlerocket node group names one in its stack config.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Mapping, Optional

from infra.catalog.eks import addon_names

CALENDAR_SOURCE = (
    "Amazon EKS User Guide, Kubernetes release calendar "
    "(https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html), read 2026-12-03"
)

# Pre-flight warns this long before a version's standard support ends.
STANDARD_SUPPORT_WARNING = dt.timedelta(days=60)


@dataclass(frozen=True)
class EksRelease:
    """One Kubernetes minor version on EKS."""

    version: str
    released: dt.date  # Amazon EKS release
    end_of_standard: dt.date
    end_of_extended: dt.date

    def in_standard_support(self, day: dt.date) -> bool:
        return self.released <= day < self.end_of_standard

    def in_extended_support(self, day: dt.date) -> bool:
        return self.end_of_standard <= day < self.end_of_extended

    def supported(self, day: dt.date) -> bool:
        return self.released <= day < self.end_of_extended


def _r(version: str, released: str, standard: str, extended: str) -> EksRelease:
    return EksRelease(version, dt.date.fromisoformat(released), dt.date.fromisoformat(standard), dt.date.fromisoformat(extended))


RELEASES: dict[str, EksRelease] = {
    r.version: r
    for r in (
        _r("1.28", "2023-09-26", "2024-11-26", "2025-11-26"),
        _r("1.29", "2024-01-23", "2025-03-23", "2026-03-23"),
        _r("1.30", "2024-05-23", "2025-07-23", "2026-07-23"),
        _r("1.31", "2024-09-26", "2025-11-26", "2026-11-26"),
        _r("1.32", "2025-01-25", "2026-03-23", "2027-03-23"),
        _r("1.33", "2025-05-28", "2026-07-29", "2027-07-29"),
        _r("1.34", "2025-10-06", "2026-12-02", "2027-12-02"),
        _r("1.35", "2026-01-28", "2027-03-27", "2028-03-27"),
        _r("1.36", "2026-06-02", "2027-08-02", "2028-08-02"),
    )
}


@dataclass(frozen=True)
class AddonPin:
    version: str
    source: str


# Sources, by what they are.
_VPC_CNI_GUIDE = (
    "EKS User Guide, 'Amazon VPC CNI versions' (docs.amazonaws.cn/eks/latest/userguide/managing-vpc-cni.md): "
    "v1.21.1-eksbuild.7 for Kubernetes 1.29 to 1.35"
)
_COREDNS_GUIDE = "EKS User Guide, 'CoreDNS versions' (docs.aws.amazon.com/ja_jp/eks/latest/userguide/managing-coredns.md)"
_KUBE_PROXY_GUIDE = "EKS User Guide, 'kube-proxy versions' (docs.aws.amazon.com/ja_jp/eks/latest/userguide/managing-kube-proxy.md)"
# Add-on versions EKS DescribeAddonVersions returned as the newest for a Kubernetes version, as a public
# EKS template records them: devopscoop/aws-eks-template, cluster/terraform.tfvars, whose versions are
# written by its cluster/update_eks_addons.sh (`aws eks describe-addon-versions --addon-name A
# --kubernetes-version V --query "addons[].addonVersions[].addonVersion" | jq -r '.[0]'`, us-east-2).
_DESCRIBED = "DescribeAddonVersions for Kubernetes {v}, newest then: devopscoop/aws-eks-template cluster/terraform.tfvars, {at}"
_POD_IDENTITY_133 = _DESCRIBED.format(v="1.33", at="commit 51a556a, 2025-09-02")
_POD_IDENTITY_134 = _DESCRIBED.format(v="1.34", at="commit d72b85e, 2026-04-10")
_POD_IDENTITY_135 = _DESCRIBED.format(v="1.35", at="the file's version with cluster_version 1.35 (2026)")
_EFS_CSI_135 = _DESCRIBED.format(v="1.35", at="the file's version with cluster_version 1.35 and eks-node-monitoring-agent (2026)")
# What was searched, without finding the pinned build offered for the Kubernetes version, before a pin is
# left labelled ASSUMPTION (2026-12, issue 18 item 7). Every ASSUMPTION source ends with it.
_SEARCHED = (
    "searched: the EKS User Guide's add-on pages (Amazon EBS, EFS and FSx CSI driver, node health, "
    "'AWS add-ons', hybrid nodes add-ons), which give no add-on version per Kubernetes version; "
    "kubernetes-sigs/aws-ebs-csi-driver, aws-efs-csi-driver and aws-fsx-csi-driver (CHANGELOGs, docs, "
    "charts) and aws/eks-node-monitoring-agent, which name releases and image tags but no EKS add-on "
    "compatibility; awslabs/cdk-eks-blueprints, aws-ia/terraform-aws-eks-blueprints-addons and "
    "aws-samples/eks-workshop-v2, which pin other builds or take the newest at deploy time; and public "
    "DescribeAddonVersions records (devopscoop/aws-eks-template at every stored commit: on 1.33 and 1.34 it had "
    "not yet installed this add-on or this build; aws/aws-cli examples/eks/describe-addon-versions.rst: "
    "vpc-cni on 1.26 only; botocore's EKS examples: none for add-ons)"
)
_EFS_CSI = (
    "ASSUMPTION: the build DescribeAddonVersions offers for 1.35 (" + _EFS_CSI_135 + "); no record for this "
    "version was found: the driver's add-on builds are not tied to a Kubernetes version in the guide, and its "
    "compatibility matrix (kubernetes-sigs/aws-efs-csi-driver docs/compatibility.md) gives Kubernetes 1.17+ for "
    "every release without naming EKS builds; " + _SEARCHED
)
_NODE_MONITORING_135 = (
    _DESCRIBED.format(v="1.35", at="the file's version with cluster_version 1.35 and eks-node-monitoring-agent (2026)")
    + "; the image the agent's chart v1.7.0 pins (aws/eks-node-monitoring-agent values.yaml nodeAgent.image.tag)"
)
_NODE_MONITORING = (
    "ASSUMPTION: the build DescribeAddonVersions offers for 1.35 and the agent's chart v1.7.0 pins; no record for "
    "this version was found: the agent's builds are not tied to a Kubernetes version in the guide (its hybrid "
    "nodes table gives 'v1.2.0-eksbuild.1 and above' for any version), and the agent's repository records "
    "the release (aws/eks-node-monitoring-agent CHANGELOG.md, chart 1.7.0, commit c399089, 2026-08-04) but "
    "not the add-on offer; " + _SEARCHED
)
# The EBS CSI driver: the same public template's DescribeAddonVersions record (cluster/terraform.tfvars at
# commit 03f3e08, cluster_version 1.35: eks_addon_version_aws-ebs-csi-driver).
_EBS_CSI_135 = _DESCRIBED.format(v="1.35", at="commit 03f3e08 (2026)")
_EBS_CSI = (
    "ASSUMPTION: the build DescribeAddonVersions offers for 1.35 (" + _EBS_CSI_135 + "); no record for this "
    "version was found: the driver says it is compatible with every Kubernetes version EKS supports, extended "
    "support included (kubernetes-sigs/aws-ebs-csi-driver README.md 'Compatibility', commit 429e202), which is "
    "not an add-on offer; the one per-version record from AWS, awslabs/cdk-eks-blueprints "
    "lib/addons/ebs-csi-driver/index.ts (commit 0b82904, 2026-04-08), names the then default v1.56.0-eksbuild.1 "
    "for 1.31 to 1.34, an older build recorded before this one existed, not taken: it says nothing against this "
    "build and would move a 1.33/1.34 stack's driver seven releases back; " + _SEARCHED
)
_FSX_CSI = (
    "ASSUMPTION: the first add-on version the EKS User Guide names for the FSx CSI driver ('Configure add-ons "
    "for hybrid nodes', docs.amazonaws.cn/eks/latest/userguide/hybrid-nodes-add-ons.md: 'v1.7.0-eksbuild.1 and "
    "above'; first proposed in awsdocs/amazon-eks-user-guide pull request 1215, 2026-01), which names no Kubernetes "
    "version; the FSx CSI add-on is offered per Kubernetes version (CreateAddon refused it on 1.33 in 2025-06, "
    "aws/containers-roadmap issue 2625), and newer drivers exist (v1.8.0 2025-12, v1.9.0 2026-04, "
    "kubernetes-sigs/aws-fsx-csi-driver tags), so pre-flight's DescribeAddonVersions check decides; " + _SEARCHED
)

ADDON_VERSIONS: dict[str, dict[str, AddonPin]] = {
    "1.33": {
        "vpc-cni": AddonPin("v1.21.1-eksbuild.7", _VPC_CNI_GUIDE),
        "coredns": AddonPin("v1.12.4-eksbuild.18", _COREDNS_GUIDE),
        "kube-proxy": AddonPin("v1.33.10-eksbuild.13", _KUBE_PROXY_GUIDE),
        "eks-pod-identity-agent": AddonPin("v1.3.8-eksbuild.2", _POD_IDENTITY_133),
        "aws-efs-csi-driver": AddonPin("v3.4.1-eksbuild.1", _EFS_CSI),
        "aws-ebs-csi-driver": AddonPin("v1.63.1-eksbuild.1", _EBS_CSI),
        "aws-fsx-csi-driver": AddonPin("v1.7.0-eksbuild.1", _FSX_CSI),
        "eks-node-monitoring-agent": AddonPin("v1.7.0-eksbuild.1", _NODE_MONITORING),
    },
    "1.34": {
        "vpc-cni": AddonPin("v1.21.1-eksbuild.7", _VPC_CNI_GUIDE),
        "coredns": AddonPin("v1.13.2-eksbuild.11", _COREDNS_GUIDE),
        "kube-proxy": AddonPin("v1.34.6-eksbuild.13", _KUBE_PROXY_GUIDE),
        "eks-pod-identity-agent": AddonPin("v1.3.10-eksbuild.3", _POD_IDENTITY_134),
        "aws-efs-csi-driver": AddonPin("v3.4.1-eksbuild.1", _EFS_CSI),
        "aws-ebs-csi-driver": AddonPin("v1.63.1-eksbuild.1", _EBS_CSI),
        "aws-fsx-csi-driver": AddonPin("v1.7.0-eksbuild.1", _FSX_CSI),
        "eks-node-monitoring-agent": AddonPin("v1.7.0-eksbuild.1", _NODE_MONITORING),
    },
    "1.35": {
        "vpc-cni": AddonPin("v1.21.1-eksbuild.7", _VPC_CNI_GUIDE),
        "coredns": AddonPin("v1.14.3-eksbuild.3", _COREDNS_GUIDE),
        "kube-proxy": AddonPin("v1.35.3-eksbuild.13", _KUBE_PROXY_GUIDE),
        "eks-pod-identity-agent": AddonPin("v1.3.10-eksbuild.3", _POD_IDENTITY_135),
        "aws-efs-csi-driver": AddonPin("v3.4.1-eksbuild.1", _EFS_CSI_135),
        "aws-ebs-csi-driver": AddonPin("v1.63.1-eksbuild.1", _EBS_CSI_135),
        "aws-fsx-csi-driver": AddonPin("v1.7.0-eksbuild.1", _FSX_CSI),
        "eks-node-monitoring-agent": AddonPin("v1.7.0-eksbuild.1", _NODE_MONITORING_135),
    },
}

# The add-ons every row must pin: every one the cluster may install (FSx CSI on request).
PINNED_ADDONS = addon_names(enable_fsx_csi=True)

AMI_RELEASE_SOURCE = "awslabs/amazon-eks-ami CHANGELOG.md, AMI Release v20260714 (commit 158225113dac)"
# EKS-optimised AL2023 AMI release version per Kubernetes version (all AL2023 AMI types).
AL2023_RELEASES: dict[str, str] = {
    "1.33": "1.33.13-20260714",
    "1.34": "1.34.9-20260714",
    "1.35": "1.35.6-20260714",
    "1.36": "1.36.2-20260714",
}


def version_key(version: str) -> tuple[int, ...]:
    """`1.35` -> (1, 35), for ordering Kubernetes versions."""
    return tuple(int(p) for p in version.split("."))


def supported_versions() -> tuple[str, ...]:
    """Kubernetes versions the stack can deploy: in the calendar, every add-on pinned, an AL2023 release known."""
    ok = [v for v in RELEASES if v in ADDON_VERSIONS and v in AL2023_RELEASES and set(PINNED_ADDONS) <= set(ADDON_VERSIONS[v])]
    return tuple(sorted(ok, key=version_key))


def release(version: str) -> Optional[EksRelease]:
    return RELEASES.get(version)


def default_version(day: dt.date) -> str:
    """The default Kubernetes version on `day`: the newest supported version in standard support.

    When the table has none left in standard support on `day` (it has not been
    brought up to date), its newest supported version; pre-flight then says
    that standard support has ended.
    """
    versions = supported_versions()
    current = [v for v in versions if RELEASES[v].in_standard_support(day)]
    return max(current or versions, key=version_key)


def addon_versions(version: str) -> Mapping[str, str]:
    """add-on name -> pinned version for Kubernetes `version` (KeyError when the version has no row)."""
    return {name: pin.version for name, pin in ADDON_VERSIONS[version].items()}


def al2023_release(version: str) -> str:
    """The pinned EKS-optimised AL2023 AMI release for Kubernetes `version` (KeyError when unknown)."""
    return AL2023_RELEASES[version]


def today() -> dt.date:
    """The day (UTC) a program or a tool runs; tests replace it to freeze the date."""
    return dt.datetime.now(dt.timezone.utc).date()
