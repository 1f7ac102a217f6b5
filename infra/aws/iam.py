"""IAM policy documents and ARNs the stack's roles use, as plain JSON strings.

Pure (no Pulumi, no AWS calls): the components attach these to their roles, and
the tests read them back. Managed policy ARNs are built per partition so the
stack works in the China and GovCloud partitions too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from infra.catalog.eks import FSX_CSI_ADDON


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

    - AmazonEKSWorkerNodePolicy: the kubelet describes the cluster and its instance, and the EKS Pod
      Identity agent (a DaemonSet on the node's credentials) calls eks-auth:AssumeRoleForPodIdentity
      (EKS User Guide, "Set up the Amazon EKS Pod Identity Agent": the node role needs that action,
      which this policy grants);
    - AmazonEC2ContainerRegistryReadOnly: pull the add-on and pause images from ECR;
    - AmazonSSMManagedInstanceCore only on request: a shell on nodes without SSH
      keys or open ports, handy to debug EFA on a GPU node, not needed otherwise.

    Not `VPC_CNI_POLICY`: the VPC CNI gets it on a role of its own (`VPC_CNI_SERVICE_ACCOUNT`, through
    EKS Pod Identity; components/cluster.py), so the other processes on a node's host network, which
    reach the node role through IMDS, cannot attach or free network interfaces and addresses.
    """
    policies = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly")
    return policies + (("AmazonSSMManagedInstanceCore",) if ssm else ())


# The VPC CNI's IAM policy and its service account (EKS User Guide, "Configure Amazon VPC CNI plugin to use
# IRSA", https://docs.aws.amazon.com/eks/latest/userguide/cni-iam-role.html: AmazonEKS_CNI_Policy for an IPv4
# cluster, which this stack is (it sets no ipFamily; EKS's default is ipv4), on "the node IAM role, or ... a
# separate IAM role. We recommend that you assign it to a separate role"; the plugin runs as the `aws-node`
# service account in kube-system). The separate role is given through EKS Pod Identity, which the VPC CNI
# add-on supports from v1.15.5-eksbuild.1 (EKS User Guide, "IAM roles for Amazon EKS add-ons", "Pod Identity
# Support Reference", https://docs.aws.amazon.com/eks/latest/userguide/add-ons-iam.html); the pinned versions
# are later (components/cluster.py, VPC_CNI_MIN_POD_IDENTITY).
VPC_CNI_POLICY = "AmazonEKS_CNI_Policy"
VPC_CNI_NAMESPACE = "kube-system"
VPC_CNI_SERVICE_ACCOUNT = "aws-node"


@dataclass(frozen=True)
class AddonIdentity:
    """An add-on's service account and the AWS managed policy its IAM role gets through EKS Pod Identity
    (`policy` None: the add-on needs no AWS permissions here, and gets no role)."""

    addon: str
    namespace: str
    service_account: str
    policy: Optional[str]  # AWS managed policy path under arn:<partition>:iam::aws:policy/


# EKS user guide, "Amazon EFS CSI driver": AmazonEFSCSIDriverPolicy for efs-csi-controller-sa.
EFS_CSI = AddonIdentity("aws-efs-csi-driver", "kube-system", "efs-csi-controller-sa", "service-role/AmazonEFSCSIDriverPolicy")
# EKS user guide, "Amazon EBS CSI driver" (add-ons-aws-ebs-csi-driver.html): the add-on aws-ebs-csi-driver needs
# AmazonEBSCSIDriverPolicy for ebs-csi-controller-sa in kube-system; it provisions (CreateVolume) the dynamic gp3
# volumes of the monitoring Prometheus, so, unlike the FSx driver's static volumes, its controller calls EC2.
EBS_CSI = AddonIdentity("aws-ebs-csi-driver", "kube-system", "ebs-csi-controller-sa", "service-role/AmazonEBSCSIDriverPolicy")
# The FSx CSI driver with no IAM role. The EKS User Guide ("Deploy the FSx for Lustre driver",
# https://docs.aws.amazon.com/eks/latest/userguide/fsx-csi-create.html) gives its controller AmazonFSxFullAccess
# for dynamic provisioning: a StorageClass whose claims make the controller create (CreateFileSystem) and delete
# (DeleteFileSystem) file systems. This stack has none: components/storage.py creates the file system with
# Pulumi and binds two static PersistentVolumes to it (`storageClassName: ""`, no StorageClass, reclaim policy
# Retain), which the node plugin mounts with the Lustre client, calling no AWS API (aws-fsx-csi-driver
# pkg/driver/node.go); the controller is asked for nothing (CreateVolume and DeleteVolume are for provisioned
# volumes; ControllerPublishVolume is not implemented, pkg/driver/controller.go). No policy, so no role and no
# Pod Identity association either. Dynamic provisioning is no option of the stack; one that adds it gives this
# service account a policy of its own scoped to the stack's tags (fsx:CreateFileSystem with aws:RequestTag,
# fsx:DeleteFileSystem with aws:ResourceTag), not AmazonFSxFullAccess.
FSX_CSI = AddonIdentity(FSX_CSI_ADDON, "kube-system", "fsx-csi-controller-sa", None)
# The VPC CNI on a role of its own through EKS Pod Identity (VPC_CNI_POLICY above, and its sources), off the
# node role: every process on a node's host network reaches the node role through IMDS (the hop limit of 1 stops
# only pods with a network namespace of their own), and with the CNI policy there any of them could create,
# attach and delete network interfaces and assign addresses in the VPC.
#
# Safe at node bootstrap: aws-node needs its credentials before the node is Ready, and they come from the EKS Pod
# Identity agent, a DaemonSet on the host network (EKS User Guide, "EKS Pod Identity considerations",
# https://docs.aws.amazon.com/eks/latest/userguide/pod-identities.html: it "uses the hostNetwork of the node", so
# it needs no CNI to start) that tolerates every taint (its chart, aws/eks-pod-identity-agent
# charts/eks-pod-identity-agent/values.yaml: `tolerations: - operator: Exists`; the not-ready taint since
# v1.2.0-eksbuild.1, aws/amazon-vpc-cni-k8s issue #2780), so it runs on a new node, GPU taint or not, beside
# aws-node. The agent uses the node role (AmazonEKSWorkerNodePolicy) and calls the EKS Auth API, through the NAT
# gateway here (an existing VPC without one needs its PrivateLink endpoint: "Set up the Amazon EKS Pod Identity
# Agent"). Until the agent answers, aws-node exits and the kubelet restarts it (aws/amazon-vpc-cni-k8s issue
# #3840: with an association and no agent, aws-node exits after "Checking for IPAM connectivity").
#
# The association is the add-on's own (`podIdentityAssociations` of the vpc-cni add-on; "IAM roles for Amazon EKS
# add-ons", https://docs.aws.amazon.com/eks/latest/userguide/add-ons-iam.html: "If you update the pod identity
# associations for an existing add-on, Amazon EKS initiates a rolling restart of the add-on pods"), so on a
# running cluster the add-on update restarts aws-node onto the new role before `pulumi up` detaches the policy
# from the node role (Pulumi deletes what left the program last). Every node group waits for the role's policy
# and, on destroy, goes before it (components/cluster.py, `node_prerequisites`): the CNI frees its network
# interfaces while it still may.
VPC_CNI_IDENTITY = AddonIdentity("vpc-cni", VPC_CNI_NAMESPACE, VPC_CNI_SERVICE_ACCOUNT, VPC_CNI_POLICY)


def dns_suffix(region: str) -> str:
    """The domain of the region's service endpoints and principals (`amazonaws.com.cn` in China)."""
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def assume_role_policy(service: str, *, tag_session: bool = False, condition: Optional[Mapping[str, Any]] = None) -> str:
    """A trust policy for an AWS service principal, as JSON (no invoke needed); `condition` limits who may pass it on."""
    actions: Any = ["sts:AssumeRole", "sts:TagSession"] if tag_session else "sts:AssumeRole"
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}
    if condition:
        statement["Condition"] = dict(condition)
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]}, sort_keys=True)


# What the EKS cluster role does with the secrets key: terraform-aws-modules/terraform-aws-eks, main.tf,
# aws_iam_policy.cluster_encryption (the ClusterEncryption policy it attaches to the cluster role); the EKS
# User Guide, "Encrypt Kubernetes secrets with KMS on existing clusters", asks only for a symmetric key in the
# cluster's region that the principal may use.
KEY_USER_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey")
# What CloudWatch Logs does with a log group's key (CloudWatch Logs User Guide, "Encrypt log data in
# CloudWatch Logs using AWS Key Management Service", step 2: the key policy's statement for logs, principal
# logs.<region>.amazonaws.com, these actions, and the encryption context key below with the log group's ARN;
# https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html).
LOGS_KEY_ACTIONS = ("kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*")
LOGS_ENCRYPTION_CONTEXT = "kms:EncryptionContext:aws:logs:arn"


def key_use_policy(key_arn: str) -> str:
    """What the cluster role needs on the secrets key, as its IAM policy (terraform-aws-eks's ClusterEncryption policy)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": list(KEY_USER_ACTIONS), "Resource": key_arn}],
        },
        sort_keys=True,
    )


def account_root_arn(partition: str, account_id: str) -> str:
    return f"arn:{partition}:iam::{account_id}:root"


def log_group_arn(region: str, account_id: str, name: str) -> str:
    """A log group's ARN as its encryption context carries it (no `:*` at the end)."""
    return f"arn:{partition_of(region)}:logs:{region}:{account_id}:log-group:{name}"


def logs_principal(region: str) -> str:
    """The CloudWatch Logs service principal of a region (regional, unlike most service principals: the CloudWatch
    Logs User Guide's key policy names `logs.<region>.amazonaws.com`)."""
    return f"logs.{region}.{dns_suffix(region)}"


def key_policy(
    region: str, account_id: str, *, key_users: Sequence[str] = (), log_group_names: Sequence[str] = ()
) -> str:
    """A KMS key policy: the account administers the key, `key_users` (role ARNs) use it, CloudWatch Logs
    encrypts the named log groups of this account and region with it; nothing outside the account may.

    - The account root with `kms:*`: the key policy AWS gives a key created without one (AWS KMS
      Developer Guide, "Default key policy": it lets the account's IAM policies grant access, and keeps
      the key manageable; without it a key whose named principals are all gone is lost).
    - `key_users`: the actions of `KEY_USER_ACTIONS`, the EKS cluster role's use for secrets.
    - CloudWatch Logs (`logs.<region>.amazonaws.com`): the actions of `LOGS_KEY_ACTIONS`, only with the
      encryption context of one of the stack's log groups (`kms:EncryptionContext:aws:logs:arn`), so the
      key cannot encrypt any other log group.

    No statement for EFS or FSx: they use the key on behalf of the principal that creates the file system
    (EFS User Guide, "Managing access to encrypted file systems": IAM policies and the key policy decide
    who may use the key), which the account statement lets IAM allow.
    """
    partition = partition_of(region)
    statements: list[dict[str, Any]] = [
        {
            "Sid": "AccountAdministersTheKey",
            "Effect": "Allow",
            "Principal": {"AWS": account_root_arn(partition, account_id)},
            "Action": "kms:*",
            "Resource": "*",
        }
    ]
    if key_users:
        statements.append(
            {
                "Sid": "ClusterRoleEncryptsSecrets",
                "Effect": "Allow",
                "Principal": {"AWS": sorted(key_users)},
                "Action": list(KEY_USER_ACTIONS),
                "Resource": "*",
            }
        )
    if log_group_names:
        statements.append(
            {
                "Sid": "CloudWatchLogsEncryptsTheStacksLogGroups",
                "Effect": "Allow",
                "Principal": {"Service": logs_principal(region)},
                "Action": list(LOGS_KEY_ACTIONS),
                "Resource": "*",
                "Condition": {
                    "ArnEquals": {
                        LOGS_ENCRYPTION_CONTEXT: sorted(log_group_arn(region, account_id, n) for n in log_group_names)
                    }
                },
            }
        )
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


FLOW_LOGS_SERVICE = "vpc-flow-logs.amazonaws.com"


def flow_logs_trust_policy(region: str, account_id: str) -> str:
    """The flow-log delivery role's trust policy: VPC Flow Logs, for this account's flow logs only.

    Amazon VPC User Guide, "IAM role for publishing flow logs to CloudWatch Logs": the trust policy, and
    the `aws:SourceAccount` / `aws:SourceArn` condition it recommends against the confused deputy
    problem (the flow log's id is not known before the role exists: a wildcard).
    """
    source = f"arn:{partition_of(region)}:ec2:{region}:{account_id}:vpc-flow-log/*"
    return assume_role_policy(
        FLOW_LOGS_SERVICE,
        condition={"StringEquals": {"aws:SourceAccount": account_id}, "ArnLike": {"aws:SourceArn": source}},
    )


def flow_logs_publish_policy(region: str, account_id: str, log_group_name: str) -> str:
    """What the flow-log delivery role may do: write streams and events into its one log group.

    The VPC User Guide's list of permissions ("IAM role for publishing flow logs to CloudWatch Logs"),
    narrowed: the streams' actions only on the stack's log group, DescribeLogGroups on `*` (it takes no
    resource), and no CreateLogGroup: the stack creates the group (encrypted, with a retention), and a
    deleted one is not silently made again without either. terraform-aws-modules/terraform-aws-vpc
    (vpc-flow-logs.tf, the role for a log group it creates) grants the same four actions.
    """
    group = log_group_arn(region, account_id, log_group_name)
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                    "Resource": [group, f"{group}:*"],
                },
                {"Effect": "Allow", "Action": "logs:DescribeLogGroups", "Resource": "*"},
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
