"""What holds data worth keeping (audit logs, the model weights, and the keys that decrypt them).

In production such a resource is protected (`pulumi destroy` refuses until it is
unprotected) and retained on delete (a delete, or a replacement, leaves the cloud
resource in place): its data outlives the stack for as long as its own retention
says. Elsewhere it goes with the stack. Tested directly, as the mocks never see
resource options (only the recording engine does).

`kms_key` and `encrypted_log_group` are the two such resources more than one
component creates (the cluster's key and control-plane logs, the network's
flow-log key and flow logs), made the same way wherever they are.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import pulumi
import pulumi_aws as aws

def kept(production: bool) -> pulumi.ResourceOptions:
    """Protected and retained on delete in production; neither otherwise."""
    return pulumi.ResourceOptions(protect=production, retain_on_delete=production)


def kms_key(
    resource_name: str,
    *,
    description: str,
    policy: pulumi.Input[str],
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
    production: bool,
) -> aws.kms.Key:
    """A KMS key of the stack: yearly rotation, an explicit key policy (`infra.aws.iam.key_policy`), kept in production."""
    return aws.kms.Key(
        resource_name,
        description=description,
        enable_key_rotation=True,
        # KMS waits 7 to 30 days before it deletes a key (pulumi_aws kms.Key, deletion_window_in_days): the
        # longest wait when the data matters, the shortest otherwise.
        deletion_window_in_days=30 if production else 7,
        policy=policy,
        tags=dict(tags),
        opts=pulumi.ResourceOptions.merge(opts, kept(production)),
    )


def encrypted_log_group(
    resource_name: str,
    *,
    name: str,
    key: aws.kms.Key,
    retention_in_days: int,
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
    production: bool,
) -> aws.cloudwatch.LogGroup:
    """A CloudWatch log group encrypted with `key`, with a retention, kept in production.

    `key`'s policy must let CloudWatch Logs use it for this group. CloudWatch
    Logs checks that when the group is associated with the key, so the group
    waits for the key (through `kms_key_id`).
    """
    existing = existing_log_group_names(name, opts) if production else []
    return aws.cloudwatch.LogGroup(
        resource_name,
        name=name,
        retention_in_days=retention_in_days,
        kms_key_id=key.arn,
        tags=dict(tags),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions.merge(kept(production), adopt(production, name, existing))),
    )


def adopt(production: bool, name: str, existing: Iterable[str]) -> pulumi.ResourceOptions:
    """Import the log group a production stack kept from an earlier life, instead of failing to create it.

    A production log group is retained on delete under a name fixed by the stack (EKS writes the control
    plane's to /aws/eks/<cluster>/cluster, whatever we would call it), so a prod stack destroyed and created
    again would meet ResourceAlreadyExistsException. With `import_` set to the group's name (a log group's
    id), the engine adopts the group when the stack does not hold it yet, and treats it like any other
    resource once it does (pulumi/pulumi developer-docs/architecture/import.md: "If the resource exists
    and has the same ID ... treated like any other resource"); the program's retention, key and tags are
    then applied to it. Never on a group that does not exist: an import of nothing fails.
    """
    if production and name in set(existing):
        return pulumi.ResourceOptions(import_=name)
    return pulumi.ResourceOptions()


def existing_log_group_names(name: str, opts: pulumi.ResourceOptions) -> list[str]:
    """The log groups whose names start with `name` (CloudWatch Logs DescribeLogGroups, through the stack's
    AWS provider): a read, the same in preview and update."""
    found = aws.cloudwatch.get_log_groups(log_group_name_prefix=name, opts=pulumi.InvokeOptions(parent=opts.parent))
    return list(found.log_group_names or [])
