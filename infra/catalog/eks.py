"""EKS facts about the GPU nodes' machine images, with their sources.

AMI types are the values of a managed node group's `amiType`: botocore's eks
service model, shape `AMITypes` (the enum the AWS CLI and SDKs validate
against; the tests check these names against it). The `*_NVIDIA` types are the
ones that carry the NVIDIA driver and container toolkit for G and P instances
(Amazon EKS User Guide, "Use EKS-optimized accelerated AMIs for GPU instances":
AL2023 x86_64 / ARM NVIDIA and Bottlerocket aws-k8s-nvidia). Left out on
purpose: `AL2_x86_64_GPU` (EKS stopped publishing Amazon Linux 2 AMIs on
26 November 2025: EKS User Guide, "Build a custom EKS-optimized Amazon Linux
AMI") and the `*_NVIDIA_FIPS` variants.

The family (the name's first part) decides where container images live: the
root volume on AL2023, a separate data volume on Bottlerocket (its root volume
is the small OS volume).
"""

from __future__ import annotations

BOTTLEROCKET = "BOTTLEROCKET"
AL2023 = "AL2023"

# EKS AMI type with the NVIDIA driver -> CPU architecture of its instances (EC2 ArchitectureType).
GPU_AMI_TYPES: dict[str, str] = {
    "AL2023_x86_64_NVIDIA": "x86_64",
    "AL2023_ARM_64_NVIDIA": "arm64",
    "BOTTLEROCKET_x86_64_NVIDIA": "x86_64",
    "BOTTLEROCKET_ARM_64_NVIDIA": "arm64",
}
DEFAULT_GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"

# EC2 instance families (the part of the type name before the dot) each NVIDIA AMI type
# supports: Amazon EKS User Guide, "Use EKS-optimized accelerated AMIs for GPU instances",
# table of supported GPU instance types per EKS AMI variant (read 2026-12-03). Not in it:
# g7 (RTX PRO 4500), g5g on x86_64, the Grace families on x86_64.
_X86_NVIDIA_FAMILIES = (
    "p6-b300", "p6-b200", "p5", "p5e", "p5en", "p4d", "p4de", "p3", "p3dn",
    "g7e", "gr6", "g6", "g6e", "g6f", "gr6f", "g5", "g4dn",
)
NVIDIA_AMI_INSTANCE_FAMILIES: dict[str, tuple[str, ...]] = {
    "AL2023_x86_64_NVIDIA": _X86_NVIDIA_FAMILIES,
    "AL2023_ARM_64_NVIDIA": ("p6e-gb200", "p6e-gb300", "g5g"),
    "BOTTLEROCKET_x86_64_NVIDIA": _X86_NVIDIA_FAMILIES,
    "BOTTLEROCKET_ARM_64_NVIDIA": ("g5g",),
}


def gpu_ami_types(architecture: str) -> tuple[str, ...]:
    """The GPU AMI types for instances of one CPU architecture (`x86_64`, `arm64`)."""
    return tuple(name for name, arch in GPU_AMI_TYPES.items() if arch == architecture)


def ami_supports(ami_type: str, instance_type: str) -> bool:
    """Whether the EKS user guide lists `instance_type`'s family for the NVIDIA AMI `ami_type`."""
    return instance_type.split(".", 1)[0] in NVIDIA_AMI_INSTANCE_FAMILIES.get(ami_type, ())


def ami_family(ami_type: str) -> str:
    """The OS family of any EKS AMI type: `BOTTLEROCKET_x86_64_NVIDIA` -> `BOTTLEROCKET`."""
    return ami_type.split("_", 1)[0]


# Managed add-ons the cluster installs, in creation order (names: EKS User Guide, "Amazon EKS add-ons";
# the tests check them against the add-on list). Versions: pinned per Kubernetes version in eks_versions.py.
# Add-ons that must be running before a node can become Ready: without a CNI the
# kubelet reports NetworkPluginNotReady and an EKS managed node group never
# finishes creating. The pod identity agent is a DaemonSet that must be on each
# node before a pod using Pod Identity starts. (terraform-aws-eks calls this
# `before_compute`.)
ADDONS_BEFORE_NODES = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
# Add-ons whose pods need a node to schedule on: creating them before any node
# exists leaves them DEGRADED and the create times out.
# The node monitoring agent (a DaemonSet on every node, and a DCGM host engine on
# the GPU nodes) reports GPU faults (XID errors, DCGM health) as the node condition
# AcceleratedHardwareReady, which node auto repair acts on (EKS User Guide,
# "Detect node health issues and enable automatic node repair"; "Automatically
# repair nodes in EKS clusters": AcceleratedHardwareReady false for 10 minutes,
# replace or reboot). Without it auto repair sees only a NotReady node.
NODE_MONITORING_ADDON = "eks-node-monitoring-agent"
# The EBS CSI driver provisions the gp3 volumes the monitoring Prometheus claims (components/monitoring.py).
EBS_CSI_ADDON = "aws-ebs-csi-driver"
ADDONS_AFTER_NODES = ("coredns", "aws-efs-csi-driver", EBS_CSI_ADDON, NODE_MONITORING_ADDON)
FSX_CSI_ADDON = "aws-fsx-csi-driver"  # only when the stack asks for FSx for Lustre


def addon_names(enable_fsx_csi: bool) -> tuple[str, ...]:
    """Every managed add-on the cluster gets, in creation order."""
    return ADDONS_BEFORE_NODES + ADDONS_AFTER_NODES + ((FSX_CSI_ADDON,) if enable_fsx_csi else ())


# How the deployer reaches the cluster API (`gpu-serving:cluster.endpointAccess`), after the EKS
# User Guide's "Cluster API server endpoint": public access limited to CIDRs, or private access
# only, reached from inside the VPC (through an SSM-managed bastion, or from a runner in the VPC).
# What each mode creates: infra/aws/access.py.
PUBLIC_RESTRICTED = "public-restricted"
PRIVATE_SSM = "private-ssm"
PRIVATE_VPC = "private-vpc"
ENDPOINT_ACCESS_MODES = (PUBLIC_RESTRICTED, PRIVATE_SSM, PRIVATE_VPC)
