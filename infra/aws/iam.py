"""IAM policy documents and ARNs the stack's roles use, as plain JSON strings.

Pure (no Pulumi, no AWS calls): the components attach these to their roles, and
the tests read them back. Managed policy ARNs are built per partition so the
stack works in the China and GovCloud partitions too.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence


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
