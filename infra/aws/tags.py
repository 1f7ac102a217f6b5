"""Tags every AWS resource of a stack carries (set once, as the AWS provider's default tags).

The leak sweeper finds a stack's resources by `project` and `stack`, and deletes
those tagged `lifecycle: ephemeral` once the time in `expires-at` has passed; it
never touches a resource tagged `lifecycle: production` or without the tags.
"""

from __future__ import annotations

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
