"""IAM policy documents and ARNs the stack's roles use, as plain JSON strings.

Pure (no Pulumi, no AWS calls): the components attach these to their roles, and
the tests read them back. Managed policy ARNs are built per partition so the
stack works in the China and GovCloud partitions too.
"""

from __future__ import annotations

import json
from typing import Any


def partition_of(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def managed_policy_arn(region: str, path: str) -> str:
    return f"arn:{partition_of(region)}:iam::aws:policy/{path}"


def node_policies(ssm: bool) -> tuple[str, ...]:
    """Managed policies on the node role, each needed:

    - AmazonEKSWorkerNodePolicy: the kubelet describes the cluster and its instance;
    - AmazonEC2ContainerRegistryReadOnly: pull the add-on and pause images from ECR;
    - AmazonEKS_CNI_Policy: the VPC CNI (aws-node, on the node's credentials)
      attaches ENIs and assigns pod IPs;
    - AmazonSSMManagedInstanceCore only on request: a shell on nodes without SSH
      keys or open ports, handy to debug EFA on a GPU node, not needed otherwise.
    """
    policies = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly", "AmazonEKS_CNI_Policy")
    return policies + (("AmazonSSMManagedInstanceCore",) if ssm else ())


def assume_role_policy(service: str, *, tag_session: bool = False) -> str:
    """A trust policy for an AWS service principal, as JSON (no invoke needed)."""
    actions: Any = ["sts:AssumeRole", "sts:TagSession"] if tag_session else "sts:AssumeRole"
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}],
        },
        sort_keys=True,
    )


def key_use_policy(key_arn: str) -> str:
    """What the cluster role needs on the secrets key (terraform-aws-eks's ClusterEncryption policy)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"],
                    "Resource": key_arn,
                }
            ],
        },
        sort_keys=True,
    )


def s3_read_policy(partition: str, bucket: str, prefix: str) -> str:
    """Read-only access to one S3 prefix: list it, get its objects."""
    prefix_slash = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": f"arn:{partition}:s3:::{bucket}",
                    "Condition": {"StringLike": {"s3:prefix": [f"{prefix_slash}*"]}},
                },
                {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:{partition}:s3:::{bucket}/{prefix_slash}*"},
            ],
        },
        sort_keys=True,
    )
