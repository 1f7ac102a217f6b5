"""Amazon Managed Service for Prometheus (`gpu-serving:monitoring.mode: amp`) as plain data.

Pure (no Pulumi, no AWS calls): components/monitoring.py turns these into resources, and
tests/test_monitoring_amp.py reads them back against botocore's `amp` model and promtool.

- The workspace's endpoints: pulumi-aws `amp.Workspace.prometheus_endpoint` is
  `https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/` (with the final slash;
  the Terraform provider's `aws_prometheus_workspace` docs, attribute `prometheus_endpoint`);
  remote write goes to `<endpoint>api/v1/remote_write` and queries to `<endpoint>api/v1/query`
  (AMP User Guide, "Ingest metrics ... remote write" and "Query your Prometheus metrics":
  the URLs of a workspace), so Grafana's data source takes the endpoint itself.
- IAM, scoped to the one workspace (resource ARN) rather than the AWS managed policies
  (AmazonPrometheusRemoteWriteAccess: `aps:RemoteWrite` on `*`; AmazonPrometheusQueryAccess:
  `aps:GetLabels`, `aps:GetMetricMetadata`, `aps:GetSeries`, `aps:QueryMetrics` on `*`; AWS
  Managed Policy Reference, those two pages). These are data-plane permissions, not
  operations of the `amp` service model (botocore's `amp` covers the control plane); their
  prefix, `aps`, is that model's signing name.
- Rules: the workspace's rule groups namespace takes a Prometheus rule file (AMP User Guide,
  "Create a rules file": "the same format as a rules file in standalone Prometheus"), the same
  groups the in-cluster PrometheusRule carries.
- Alerts: AMP's alert manager has one kind of receiver, Amazon SNS (AMP User Guide, "Setting
  up your alert receiver": "The only alert receiver currently supported in Amazon Managed
  Service for Prometheus is Amazon Simple Notification Service"); its definition is
  `alertmanager_config` (and optional `template_files`) as YAML (AMP User Guide, "Create an
  alert manager configuration"), an `sns_configs` receiver needs `sigv4.region` and takes no
  `api_url` (AMP User Guide, "Configure alert manager to send messages to your Amazon SNS
  topic"). The topic lets AMP publish (`sns:Publish`, `sns:GetTopicAttributes`) only for this
  account's workspace (AMP User Guide, "Giving Amazon Managed Service for Prometheus
  permission to send messages to your Amazon SNS topic": principal `aps.amazonaws.com`, with
  `aws:SourceAccount` and `aws:SourceArn` against the confused deputy).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import yaml

REMOTE_WRITE_PATH = "api/v1/remote_write"
AMP_SERVICE = "aps.amazonaws.com"
REMOTE_WRITE_ACTIONS = ("aps:RemoteWrite",)  # AmazonPrometheusRemoteWriteAccess, on one workspace
QUERY_ACTIONS = ("aps:GetLabels", "aps:GetMetricMetadata", "aps:GetSeries", "aps:QueryMetrics")  # AmazonPrometheusQueryAccess
SNS_PUBLISH_ACTIONS = ("sns:Publish", "sns:GetTopicAttributes")
# What AMP does with the topic's key when the topic is encrypted (AMP User Guide, the same page: an encrypted topic's
# key policy lets aps.amazonaws.com use the key; SNS Developer Guide, "Configure AWS KMS permissions for AWS
# services": kms:GenerateDataKey* and kms:Decrypt for a service that publishes to an encrypted topic).
SNS_KEY_ACTIONS = ("kms:GenerateDataKey*", "kms:Decrypt")
ALERT_RECEIVER = "sns"


def remote_write_url(prometheus_endpoint: str) -> str:
    """The workspace's remote-write URL from its `prometheus_endpoint` (module doc)."""
    return prometheus_endpoint.rstrip("/") + "/" + REMOTE_WRITE_PATH


def _policy(sid: str, actions: Sequence[str], resource: str) -> str:
    return json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Sid": sid, "Effect": "Allow", "Action": list(actions), "Resource": resource}]},
        sort_keys=True,
    )


def remote_write_policy(workspace_arn: str) -> str:
    """Prometheus' role: remote write to this workspace and nothing else."""
    return _policy("RemoteWriteToTheStacksWorkspace", REMOTE_WRITE_ACTIONS, workspace_arn)


def query_policy(workspace_arn: str) -> str:
    """Grafana's role: query this workspace (the actions of AmazonPrometheusQueryAccess) and nothing else."""
    return _policy("QueryTheStacksWorkspace", QUERY_ACTIONS, workspace_arn)


def rule_groups_namespace_data(groups: Sequence[Mapping[str, Any]]) -> str:
    """The rule file the workspace's rule groups namespace holds: the PrometheusRule's `spec.groups`, as YAML."""
    return yaml.safe_dump({"groups": [dict(g) for g in groups]}, sort_keys=False, width=1000)


def alert_manager_definition(topic_arn: str, region: str) -> str:
    """The workspace's alert manager: every alert to the stack's SNS topic, grouped as in-cluster (module doc).

    The message is the alert's labels and annotations as the SNS receiver's default template renders them; the
    subject is short (SNS takes at most 100 characters: AMP User Guide, "SNS receiver message validation and
    truncation rules").
    """
    config = {
        "route": {"receiver": ALERT_RECEIVER, "group_by": ["namespace", "alertname"]},
        "receivers": [
            {
                "name": ALERT_RECEIVER,
                "sns_configs": [
                    {
                        "topic_arn": topic_arn,
                        "sigv4": {"region": region},
                        "subject": "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}",
                        "send_resolved": True,
                    }
                ],
            }
        ],
    }
    return yaml.safe_dump({"alertmanager_config": yaml.safe_dump(config, sort_keys=False)}, sort_keys=False, width=1000)


def topic_policy(topic_arn: str, workspace_arn: str, account_id: str) -> str:
    """The alert topic's access policy: AMP publishes for this account's workspace only."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "AmpPublishesTheStacksAlerts",
                    "Effect": "Allow",
                    "Principal": {"Service": AMP_SERVICE},
                    "Action": list(SNS_PUBLISH_ACTIONS),
                    "Resource": topic_arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": workspace_arn}, "StringEquals": {"aws:SourceAccount": account_id}},
                }
            ],
        },
        sort_keys=True,
    )


def with_amp_key_use(key_policy: str, account_id: str) -> str:
    """A key policy (infra/aws/iam.py `key_policy`) plus AMP's use of the key for the encrypted alert topic, from
    this account only (the workspace's ARN is not known before the key, which its log group needs)."""
    doc = json.loads(key_policy)
    doc["Statement"].append(
        {
            "Sid": "AmpPublishesToTheEncryptedTopic",
            "Effect": "Allow",
            "Principal": {"Service": AMP_SERVICE},
            "Action": list(SNS_KEY_ACTIONS),
            "Resource": "*",
            "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
        }
    )
    return json.dumps(doc, sort_keys=True)
