"""The IAM and KMS policy documents of infra/aws/iam.py, read back as JSON.

Each document is checked for what it grants and to whom, against the AWS
documentation it follows (named in its docstring), and the actions against
botocore's service models where an action is an API operation.
"""

from __future__ import annotations

import json

import botocore.session
import pytest

from infra.aws import iam

ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/gs-cluster-role"


def _statements(document: str) -> dict[str, dict]:
    doc = json.loads(document)
    assert doc["Version"] == "2012-10-17"
    return {s.get("Sid", str(i)): s for i, s in enumerate(doc["Statement"])}


def test_key_policy_keeps_the_account_as_administrator():
    (admin,) = _statements(iam.key_policy("us-east-1", ACCOUNT)).values()
    # The default key policy's statement (AWS KMS Developer Guide, "Default key policy").
    assert admin == {"Sid": "AccountAdministersTheKey", "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                     "Action": "kms:*", "Resource": "*"}  # fmt: skip


def test_key_policy_lets_the_cluster_role_use_the_key_for_secrets():
    s = _statements(iam.key_policy("us-east-1", ACCOUNT, key_users=[ROLE]))["ClusterRoleEncryptsSecrets"]
    assert s["Principal"] == {"AWS": [ROLE]} and s["Effect"] == "Allow"
    assert s["Action"] == list(iam.KEY_USER_ACTIONS) == json.loads(iam.key_use_policy("k"))["Statement"][0]["Action"]
    assert not any(a in s["Action"] for a in ("kms:*", "kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:CreateGrant"))


def test_key_policy_lets_cloudwatch_logs_encrypt_only_the_stacks_log_groups():
    groups = ["/aws/vpc/gs/flow-logs", "/aws/eks/gs/cluster"]
    s = _statements(iam.key_policy("eu-west-1", ACCOUNT, log_group_names=groups))["CloudWatchLogsEncryptsTheStacksLogGroups"]
    assert s["Principal"] == {"Service": "logs.eu-west-1.amazonaws.com"}  # regional (CloudWatch Logs User Guide)
    assert s["Action"] == ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    assert s["Condition"] == {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": [
        f"arn:aws:logs:eu-west-1:{ACCOUNT}:log-group:/aws/eks/gs/cluster",
        f"arn:aws:logs:eu-west-1:{ACCOUNT}:log-group:/aws/vpc/gs/flow-logs"]}}  # fmt: skip
    assert "ClusterRoleEncryptsSecrets" not in _statements(iam.key_policy("eu-west-1", ACCOUNT, log_group_names=groups))


@pytest.mark.parametrize(
    ("region", "root", "principal", "group"),
    [
        ("cn-north-1", "arn:aws-cn:iam::1:root", "logs.cn-north-1.amazonaws.com.cn", "arn:aws-cn:logs:cn-north-1:1:log-group:/g"),
        ("us-gov-west-1", "arn:aws-us-gov:iam::1:root", "logs.us-gov-west-1.amazonaws.com", "arn:aws-us-gov:logs:us-gov-west-1:1:log-group:/g"),
    ],
)
def test_key_policy_in_the_other_partitions(region, root, principal, group):
    s = _statements(iam.key_policy(region, "1", log_group_names=["/g"]))
    assert s["AccountAdministersTheKey"]["Principal"] == {"AWS": root}
    logs = s["CloudWatchLogsEncryptsTheStacksLogGroups"]
    assert logs["Principal"] == {"Service": principal}
    assert logs["Condition"]["ArnEquals"][iam.LOGS_ENCRYPTION_CONTEXT] == [group]


def test_flow_logs_role_is_trusted_by_vpc_flow_logs_of_this_account_only():
    (s,) = _statements(iam.flow_logs_trust_policy("us-east-1", ACCOUNT)).values()
    assert s["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"} and s["Action"] == "sts:AssumeRole"
    assert s["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT},
                              "ArnLike": {"aws:SourceArn": f"arn:aws:ec2:us-east-1:{ACCOUNT}:vpc-flow-log/*"}}  # fmt: skip


def test_flow_logs_role_writes_only_into_its_log_group():
    stream, groups = _statements(iam.flow_logs_publish_policy("us-east-1", ACCOUNT, "/aws/vpc/gs/flow-logs")).values()
    arn = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/vpc/gs/flow-logs"
    assert stream["Resource"] == [arn, f"{arn}:*"]
    assert stream["Action"] == ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    assert groups == {"Effect": "Allow", "Action": "logs:DescribeLogGroups", "Resource": "*"}  # takes no resource
    operations = set(botocore.session.get_session().get_service_model("logs").operation_names)
    assert {a.split(":")[1] for a in [*stream["Action"], groups["Action"]]} <= operations
    assert "logs:CreateLogGroup" not in stream["Action"]  # the stack creates the group, encrypted and retained


def test_assume_role_policy_without_a_condition_is_unchanged():
    (s,) = _statements(iam.assume_role_policy("ec2.amazonaws.com")).values()
    assert s == {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
