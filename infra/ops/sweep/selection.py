"""Which resources the sweep deletes: the verdict on a resource's own tags.

A resource is deleted when its own tags (infra/aws/tags.py) say all of
`project=gpu-serving`, `lifecycle=ephemeral` and an `expires-at` (ISO 8601 with
a time zone, e.g. `2026-12-31T18:00:00Z`) earlier than now. Nothing else, ever:
a resource without those tags, with `lifecycle=production`, not yet expired, or
whose `expires-at` does not parse (or has no time zone) is left alone and, when
it carries `project=gpu-serving`, reported as skipped with the reason.
"""

from __future__ import annotations

import datetime as dt
from typing import Mapping, Optional

from infra.aws.tags import EPHEMERAL, EXPIRES_TAG, LIFECYCLE_TAG, PRODUCTION, PROJECT_TAG
from infra.config import PROJECT


def parse_expiry(value: str) -> Optional[dt.datetime]:
    """`expires-at` as an aware UTC datetime; None when it does not parse or has no time zone."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.astimezone(dt.timezone.utc)


def verdict(tags: Mapping[str, str], now: dt.datetime) -> tuple[bool, str]:
    """(delete it?, why) for a resource's own tags."""
    if tags.get(PROJECT_TAG) != PROJECT:
        return False, f"not tagged {PROJECT_TAG}={PROJECT}"
    life = tags.get(LIFECYCLE_TAG)
    if life == PRODUCTION:
        return False, f"{LIFECYCLE_TAG}={PRODUCTION}"
    if life != EPHEMERAL:
        return False, f"no {LIFECYCLE_TAG}={EPHEMERAL} tag" + (f" ({LIFECYCLE_TAG}={life!r})" if life else "")
    raw = tags.get(EXPIRES_TAG)
    if not raw:
        return False, f"{LIFECYCLE_TAG}={EPHEMERAL} but no {EXPIRES_TAG} tag"
    when = parse_expiry(raw)
    if when is None:
        return False, f"{EXPIRES_TAG}={raw!r} is not an ISO 8601 time with a time zone (e.g. 2026-12-31T18:00:00Z)"
    if when > now:
        return False, f"not expired: {EXPIRES_TAG}={raw}"
    return True, f"expired at {raw}"
