"""Tags every AWS resource of a stack carries (set once, as the AWS provider's default tags).

The provider's default tags reach the resources Pulumi creates, not what an
Auto Scaling group launches from a launch template (EKS node groups): those get
the stack's lasting tags, project and stack, through the template's tag
specifications (`launch_template_tags`, `tag_specifications`).

The leak sweeper finds a stack's resources by `project` and `stack`, and deletes
those tagged `lifecycle: ephemeral` once the time in `expires-at` has passed; it
never touches a resource tagged `lifecycle: production` or without the tags.
"""

from __future__ import annotations

from typing import Mapping

from infra.aws import names

PROJECT_TAG = "project"
STACK_TAG = "stack"
OWNER_TAG = "owner"
EXPIRES_TAG = "expires-at"  # ISO 8601 UTC, e.g. 2026-12-31T18:00:00Z
LIFECYCLE_TAG = "lifecycle"  # "production" (never swept) or "ephemeral" (swept once expired)
PRODUCTION = "production"
EPHEMERAL = "ephemeral"


def default_tags(*, project: str, stack: str, owner: str, production: bool, expires_at: str | None) -> dict[str, str]:
    tags = {PROJECT_TAG: project, STACK_TAG: stack, OWNER_TAG: owner, LIFECYCLE_TAG: PRODUCTION if production else EPHEMERAL}
    if not production:
        if not expires_at:
            raise ValueError("a non-production stack needs an expiry time")
        tags[EXPIRES_TAG] = expires_at
    return tags


# The tags a launch template gives what it launches: only those that never change in a stack's life. Any
# change to a template's tag specifications is a new template version (EC2 CreateLaunchTemplateVersion: the tag
# specifications are launch data), and a node group that follows the latest version replaces every node onto it
# (EKS UpdateNodegroupVersion): an owner or expiry edit would roll the GPU nodes and take serving down. The
# instances still carry project and stack, enough to attribute their cost to the stack (activate both as cost
# allocation tags in the Billing console); owner, lifecycle and expires-at are on the stack's own resources (the
# node group, the cluster), and the leak sweeper removes an expired stack's instances with its node groups and
# their Auto Scaling groups, not one by one.
LAUNCH_TEMPLATE_TAGS = (PROJECT_TAG, STACK_TAG)


def launch_template_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The stack's tags that may go into a launch template's tag specifications (LAUNCH_TEMPLATE_TAGS)."""
    return {k: tags[k] for k in LAUNCH_TEMPLATE_TAGS if k in tags}


# EC2 ResourceType values a launch template tags at launch: the instance, its volumes and its interfaces.
TAGGED_RESOURCE_TYPES = ("instance", "volume", "network-interface")


def tag_specifications(tags: Mapping[str, str], name: str) -> list[dict]:
    """Launch template tag specifications (pulumi_aws names): the stack's tags and a Name, on every launched kind.

    EKS User Guide, "Customize managed nodes with launch templates", section
    "Tagging Amazon EC2 instances": the tags must be in the template's
    TagSpecification; the node group's own tags do not reach its instances.
    """
    return [{"resource_type": kind, "tags": {**dict(tags), "Name": name}} for kind in TAGGED_RESOURCE_TYPES]


def cluster_name(project: str, stack: str) -> str:
    """The EKS cluster of a stack: project and stack, made to fit EKS (botocore's eks model, shape ClusterName:
    100 characters, no "."; infra/aws/names.py). The leak sweeper derives it the same way, for what EKS creates
    in the cluster's name without the stack's tags."""
    return names.cluster_name(project, stack.rsplit("/", 1)[-1])
