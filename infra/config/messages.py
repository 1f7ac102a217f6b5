"""Pydantic's validation errors as one clear message per key.

Each message names the full key path (`gpu-serving:serving.gpuMemoryUtilization`),
the value given and what is allowed, in the words of the config reference; a
misspelt key gets the closest known one. Several mistakes are listed together.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel

from infra.config.areas import AREAS, PROJECT
from infra.config.fields import describe_allowed, field_name, nested_model
from infra.config.stack import StackConfig
from infra.errors import UserError


def key_path(loc: tuple) -> str:
    """`('serving', 'gpuMemoryUtilization')` -> `gpu-serving:serving.gpuMemoryUtilization`."""
    if not loc:
        return f"{PROJECT} config"
    head, rest = str(loc[0]), [str(p) for p in loc[1:]]
    if head == "region":
        return "aws:region"
    if head == "stack":
        return "stack name"
    return ".".join([f"{PROJECT}:{head}", *rest])


def user_error(source: str, messages: list[str]) -> UserError:
    """One `UserError` for all the mistakes found in `source` (a stack file name)."""
    if len(messages) == 1:
        return UserError(f"{source}: {messages[0]}")
    lines = "\n".join(f"  - {m}" for m in messages)
    return UserError(f"{source} has {len(messages)} config errors:\n{lines}")


def unknown_key_message(loc: tuple, known: list[str], area_level: bool = False) -> str:
    """An unknown key (or area), the closest known one and all the known ones."""
    bad = str(loc[-1])
    close = difflib.get_close_matches(bad, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    where = "areas" if area_level else f"keys of {key_path(loc[:-1])}"
    path = f"{PROJECT}:{bad}" if area_level else key_path(loc)
    return f"unknown key {path}{hint} (known {where}: {', '.join(known)})"


def error_message(err: dict, data: dict) -> str:
    """One pydantic error (an item of `ValidationError.errors()`) on `data` as a message about its key."""
    loc = tuple(err["loc"])
    typ = err["type"]
    owner, field = _resolve(loc)
    if typ == "extra_forbidden":
        known = [_alias(owner, n) for n in owner.model_fields] if owner is not None else []
        return unknown_key_message(loc, known)
    if typ == "required_for_objective":
        key = err.get("ctx", {}).get("key", "")
        area = AREAS.get(str(loc[0])) if loc else None
        name = field_name(area, key)
        fi = area.model_fields[name] if area is not None and name is not None else None
        allowed = f" ({describe_allowed(fi, nullable=False)})" if fi is not None else ""
        return f"{key_path(loc + (key,))} is {err['msg']}{allowed}"
    ctx = err.get("ctx") or {}
    if typ in _CROSS_CHECKS:
        # Our own checks: the key they are about is in the context.
        where = tuple(ctx["loc"]) if "loc" in ctx else loc + ((ctx["key"],) if "key" in ctx else ())
        if loc and where and loc[-1] == where[-1]:  # the location names the key already
            where = loc
        return f"{key_path(where)}: {err['msg']}"
    path = key_path(loc)
    if typ == "missing":
        allowed = f" ({describe_allowed(field)})" if field is not None else ""
        return f"{path} is required{allowed}"
    got = _value_at(data, loc)
    if field is not None and nested_model(field) is not None and typ in _NOT_AN_OBJECT:
        return f"{path} must be an object of keys, got {got!r}"
    allowed = f"; allowed: {describe_allowed(field)}" if field is not None else ""
    if typ in _OUT_OF_RANGE:
        return f"{path} = {got!r} is out of range{allowed}"
    if typ in _NOT_ALLOWED:
        return f"{path} = {got!r} is not allowed{allowed}"
    msg = err["msg"]
    msg = msg[0].lower() + msg[1:] if msg else msg
    return f"{path} = {got!r}: {msg}{allowed}"


_OUT_OF_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
# The kinds of the package's own checks (the PydanticCustomError types raised in
# areas.py and stack.py); their context names the key the message is about.
_CROSS_CHECKS = {
    "required_for_capacity", "reservation_without_type", "one_gpu_zone", "existing_vpc_needs_subnets",
    "gpu_zone_not_listed", "unknown_instance_type", "placement_with_reservation", "nodes_below_pipeline",
    "fsx_needs_driver", "zone_listed_twice", "zone_outside_region", "endpoint_unreachable", "renamed_key",
    "version_not_pinned", "image_by_tag", "monitoring_not_available", "secret_missing", "prometheus_duration",
}  # fmt: skip
_NOT_ALLOWED = {"literal_error", "string_pattern_mismatch", "string_too_short", "enum"}
_NOT_AN_OBJECT = {"model_type", "model_attributes_type", "dict_type"}


def _resolve(loc: tuple) -> tuple[type[BaseModel] | None, Any]:
    """The model owning the last key of `loc` and that key's FieldInfo (or None).

    Inside a mapping value (e.g. `cost.tco.<category>`) the field holding the
    mapping is returned.
    """
    model: type[BaseModel] | None = StackConfig
    owner: type[BaseModel] | None = None
    field = None
    for part in loc:
        if model is None:
            break
        owner = model
        name = field_name(model, str(part))
        if name is None:
            return owner, None
        field = model.model_fields[name]
        model = nested_model(field)
    return owner, field


def _alias(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].alias or name


def _value_at(data: Any, loc: tuple) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data
