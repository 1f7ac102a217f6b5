"""CloudWatch Logs and VPC Flow Logs values the stack's config and components share.

`LOG_RETENTION_DAYS`: what a log group's retention may be. CloudWatch Logs
PutRetentionPolicy takes these day counts (botocore's logs model, shape `Days`,
lists them; the tests read it); 0 is the Terraform provider's and Pulumi's
"never expire" (it removes the retention policy, DeleteRetentionPolicy;
pulumi_aws cloudwatch.LogGroup, `retention_in_days`: "If you select 0, the
events in the log group are always retained and never expire").

`FLOW_LOG_TRAFFIC_TYPES`: what a VPC flow log records (EC2 CreateFlowLogs
TrafficType; botocore's ec2 model, shape `TrafficType`, also has ACCEPT, which
leaves out exactly the refused traffic a flow log is here for).
"""

from __future__ import annotations

NEVER_EXPIRE = 0
LOG_RETENTION_DAYS = (
    NEVER_EXPIRE, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
)  # fmt: skip
# A year: audit and network logs kept long enough for an investigation and most audit regimes
# (checkov CKV_AWS_338 asks for at least 365 days).
DEFAULT_LOG_RETENTION_DAYS = 365
FLOW_LOG_TRAFFIC_TYPES = ("REJECT", "ALL")
DEFAULT_FLOW_LOG_TRAFFIC_TYPE = "REJECT"
