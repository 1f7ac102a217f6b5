from __future__ import annotations

import datetime as dt

import pytest

from infra.aws.tags import EXPIRES_TAG, default_tags


def test_production_stacks_never_expire():
    tags = default_tags(project="gpu-serving", stack="prod", owner="ml-platform", production=True, expires_at=None)
    assert tags == {"project": "gpu-serving", "stack": "prod", "owner": "ml-platform", "lifecycle": "production"}


def test_other_stacks_carry_a_parseable_utc_expiry():
    tags = default_tags(project="gpu-serving", stack="pr-42", owner="ci", production=False, expires_at="2026-12-31T23:00:00Z")
    assert tags["lifecycle"] == "ephemeral"
    when = dt.datetime.fromisoformat(tags[EXPIRES_TAG].replace("Z", "+00:00"))
    assert when.utcoffset() == dt.timedelta(0)
    with pytest.raises(ValueError):
        default_tags(project="gpu-serving", stack="pr-42", owner="ci", production=False, expires_at=None)
