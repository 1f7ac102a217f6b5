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

# EKS AMI type with the NVIDIA driver -> CPU architecture of its instances (EC2 ArchitectureType).
GPU_AMI_TYPES: dict[str, str] = {
    "AL2023_x86_64_NVIDIA": "x86_64",
    "AL2023_ARM_64_NVIDIA": "arm64",
    "BOTTLEROCKET_x86_64_NVIDIA": "x86_64",
    "BOTTLEROCKET_ARM_64_NVIDIA": "arm64",
}
DEFAULT_GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"


def gpu_ami_types(architecture: str) -> tuple[str, ...]:
    """The GPU AMI types for instances of one CPU architecture (`x86_64`, `arm64`)."""
    return tuple(name for name, arch in GPU_AMI_TYPES.items() if arch == architecture)


def ami_family(ami_type: str) -> str:
    """The OS family of any EKS AMI type: `BOTTLEROCKET_x86_64_NVIDIA` -> `BOTTLEROCKET`."""
    return ami_type.split("_", 1)[0]
