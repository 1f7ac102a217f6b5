"""How the pack reads a resource's properties: unknown values, maps and lists that may be missing, references.

Standard library only, like the rest of the pack. A value nobody knows yet (a
preview's computed output) is `UNKNOWN`, as in the synth document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

UNKNOWN = "<computed>"


def is_unknown(value: Any) -> bool:
    return isinstance(value, str) and value == UNKNOWN


def has_unknown(value: Any) -> bool:
    """Whether `value` is UNKNOWN or holds an UNKNOWN anywhere in its maps and lists."""
    if isinstance(value, Mapping):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return any(has_unknown(v) for v in value)
    return is_unknown(value)


def _map(value: Any) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence:
    return value if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else []


def same_resource(holder: Mapping, prop: str, value: Any, target: Mapping) -> bool:
    """Whether `holder`'s property `prop` (value `value`) refers to `target`'s id.

    By value: the target's id (once deployed) or the synth placeholder
    `<id:NAME>`; or by the engine's property dependencies (CrossGuard), which is
    all there is while a preview does not know the id yet.
    """
    if isinstance(value, str) and not is_unknown(value):
        target_id = _map(target.get("inputs")).get("id")
        if value == f"<id:{target.get('name')}>" or (isinstance(target_id, str) and not is_unknown(target_id) and value == target_id):
            return True
    return target.get("urn") in _list(_map(holder.get("property_dependencies")).get(prop))
