"""What a config field takes, read off its pydantic annotation: shared by the messages and the reference."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, Union

import annotated_types
from pydantic import BaseModel


def nested_model(field: Any) -> type[BaseModel] | None:
    """The model a field holds (`gpu.capacity` holds `CapacityConfig`), or None for a plain value."""
    for a in flatten(field.annotation):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def field_name(model: type[BaseModel] | None, key: str) -> str | None:
    """The Python name of `key` (camelCase alias or snake_case name) in `model`, or None."""
    if model is None:
        return None
    for name, fi in model.model_fields.items():
        if key == name or key == fi.alias:
            return name
    return None


def flatten(annotation: Any) -> list[Any]:
    """The types a field accepts: `Optional[Annotated[int, ...]]` -> `[int, NoneType]`."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return flatten(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(flatten(arg))
        return out
    return [annotation]


def _number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _bounds_text(kind: str, metadata: list[Any]) -> str:
    lo = hi = None
    lo_strict = hi_strict = False
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo, lo_strict = m.gt, True
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi, hi_strict = m.lt, True
    if lo is not None and hi is not None and not lo_strict and not hi_strict:
        return f"{kind} from {_number(lo)} to {_number(hi)}"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_strict else '>='} {_number(lo)}")
    if hi is not None:
        parts.append(f"{'<' if hi_strict else '<='} {_number(hi)}")
    return f"{kind} {' and '.join(parts)}" if parts else kind


def describe_allowed(field: Any, nullable: bool = True) -> str:
    """What values a field takes, in words (used in error messages and the README)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "allowed" in extra:
        return str(extra["allowed"])
    nested = nested_model(field)
    if nested is not None:
        required = [f.alias or n for n, f in nested.model_fields.items() if f.is_required()]
        if not required:
            return "an object of keys"
        return f"an object with at least the keys {', '.join(required)}"
    options = flatten(field.annotation)
    nullable = nullable and type(None) in options
    options = [o for o in options if o is not type(None)]
    text = ""
    for o in options:
        if typing.get_origin(o) is Literal:
            text = "one of " + ", ".join(repr(v) for v in typing.get_args(o))
        elif o is bool:
            text = "true or false"
        elif o is int:
            text = _bounds_text("an integer", field.metadata)
        elif o is float:
            text = _bounds_text("a number", field.metadata)
        elif o is str:
            text = "a non-empty string"
    if nullable:
        text += ", or null"
    return text
