"""The base of every config area: camelCase keys, no unknown keys, immutable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class _Area(BaseModel):
    """Common settings: camelCase keys, no unknown keys, immutable."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )
