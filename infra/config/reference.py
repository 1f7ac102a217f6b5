"""The config reference: every key with its type, default, range and meaning, as Markdown.

docs/configuration.md carries this text (a test checks it is current): regenerate it with
`reference_markdown()` after changing a key.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from infra.config.areas import AREAS, PROJECT, SECRET_KEYS
from infra.config.fields import describe_allowed, flatten, nested_model
from infra.config.stack import StackConfig


def describe_type(field: Any) -> str:
    """Short type name for the reference table: `int`, `float | null`, `bool | null`, ..."""
    names = []
    for a in flatten(field.annotation):
        if a is type(None):
            continue
        origin = typing.get_origin(a)
        if origin is Literal:
            names.append("string")
        elif origin is dict:
            names.append("map of string -> float")
        elif origin is list:
            names.append("list of string")
        elif a is bool:
            names.append("bool")
        elif a is int:
            names.append("int")
        elif a is float:
            names.append("float")
        elif a is str:
            names.append("string")
        else:
            names.append(getattr(a, "__name__", str(a)))
    if type(None) in flatten(field.annotation):
        names.append("null")
    return " \\| ".join(names)


def describe_default(field: Any) -> str:
    if field.is_required():
        return "required"
    d = field.get_default(call_default_factory=True)
    if d is None:
        return "null"
    if isinstance(d, str):
        return f"`{d}`"
    return f"`{d:g}`" if isinstance(d, float) else f"`{d}`"


def reference_markdown() -> str:
    """The config reference as Markdown tables, one per area (docs/configuration.md carries this)."""
    out: list[str] = []
    for area, model in AREAS.items():
        out.append(f"#### `{PROJECT}:{area}`\n")
        out.append("| key | type | default | range | meaning |")
        out.append("|---|---|---|---|---|")
        for name, fi in model.model_fields.items():
            nested = nested_model(fi)
            rows = [(f"{fi.alias}.{sub.alias}", sub) for sub in nested.model_fields.values()] if nested else [(fi.alias, fi)]
            for key, f in rows:
                out.append(
                    f"| `{key}` | {describe_type(f)} | {describe_default(f)} | "
                    f"{describe_allowed(f)} | {f.description} |"
                )
        out.append("")
    out.append("#### Secrets (`pulumi config set --secret <key> <value>`)\n")
    out.append("| key | meaning |")
    out.append("|---|---|")
    for name, meaning in SECRET_KEYS.items():
        out.append(f"| `{PROJECT}:{name}` | {meaning} |")
    out.append("")
    out.append("#### `aws:region`, `aws:profile`\n")
    out.append("| key | type | default | range | meaning |")
    out.append("|---|---|---|---|---|")
    for key, field_name in (("aws:region", "region"), ("aws:profile", "aws_profile")):
        f = StackConfig.model_fields[field_name]
        out.append(f"| `{key}` | string | {describe_default(f)} | {describe_allowed(f)} | {f.description} |")
    return "\n".join(out) + "\n"
