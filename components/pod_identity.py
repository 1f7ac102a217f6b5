"""A role EKS Pod Identity gives one service account, with an inline policy, and its association.

Used where a pod of the stack (the staging Job reading S3, Prometheus writing to and Grafana reading
from an AMP workspace) needs AWS permissions of its own: never the node role, which every process on
a node's host network reaches through IMDS. The add-ons' roles (VPC CNI, EBS and EFS CSI) attach AWS
managed policies instead and live with the cluster (components/cluster.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pulumi
import pulumi_aws as aws

from infra.aws.iam import assume_role_policy

POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"  # EKS User Guide, "Learn how EKS Pod Identity grants pods access"


@dataclass(frozen=True)
class PodIdentityNames:
    """Pulumi names of the three resources (kept as they were when each component made its own: a rename would
    replace them)."""

    role: str
    policy: str
    association: str


def pod_identity(
    names: PodIdentityNames,
    *,
    cluster_name: pulumi.Input[str],
    namespace: str,
    service_account: str,
    description: str,
    policy: pulumi.Input[str],
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.eks.PodIdentityAssociation:
    """The role, its inline `policy` and the association; the association waits for the policy, and whatever runs the
    pod must wait for the association: Pod Identity injects credentials only into pods created after it."""
    role = aws.iam.Role(names.role, assume_role_policy=assume_role_policy(POD_IDENTITY_PRINCIPAL, tag_session=True),
                        description=description, tags=dict(tags), opts=opts)  # fmt: skip
    inline = aws.iam.RolePolicy(names.policy, role=role.id, policy=policy, opts=opts)
    return aws.eks.PodIdentityAssociation(
        names.association,
        cluster_name=cluster_name,
        namespace=namespace,
        service_account=service_account,
        role_arn=role.arn,
        tags=dict(tags),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[inline])),
    )
