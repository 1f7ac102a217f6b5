"""What changes between two syntheses, as Markdown for a pull-request comment.

`diff(base, head)` compares two synth documents (`infra.preview.synth`): resources are
matched by URN (a resource whose `aliases` name a URN that is gone counts as a
move, not as a deletion plus a creation, and references to it under its old
name, placeholders and dependencies, are the same references); for each changed resource every
changed field of its inputs and options is listed (nested keys as dotted paths,
`tags["kubernetes.io/role"]` for keys that are not identifiers, list items by
index). `render_markdown(d)` writes it up, with a loud callout at the top when
the change would

- replace an EKS node group, the EKS cluster, a launch template, the weights'
  file system or one of its EFS access points, or the weights' PersistentVolume
  or claim (a change to a field
  the provider can only set at creation, or to a `replaceOnChanges` path), or
  delete a node group or the cluster;
- swap a node group for a new one of another name under the same component
  (a Capacity Block's group is named after its block: a new reservation id
  brings a new group, created before the old one is deleted);
- roll the nodes of a node group (AMI release or Kubernetes version, launch
  template version; a new version of a launch template node groups use);
- switch `protect` off, or delete a protected resource.

Which fields force replacement is the provider's knowledge, not Pulumi's: the
tables, and where each was read, are in `infra/preview/replacements.py`.

`ignoreChanges` is honoured: a change under an ignored path is listed, marked
ignored, and never counts (the engine keeps the old value).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.errors import UserError
from infra.preview.markers import parse_placeholder, placeholder
from infra.preview.outage import RAYCLUSTER, block_cleanup_text, is_gpu_group, recreate_text, recreates_serving, serving_text
from infra.preview.replacements import (  # noqa: F401 - the type names are part of this module's interface
    CLUSTER,
    CONSEQUENCE,
    EFS,
    EFS_ACCESS_POINT,
    FORCE_NEW,
    FORCE_NEW_IF,
    FSX_LUSTRE,
    KIND,
    LAUNCH_TEMPLATE,
    LT_NOT_VERSIONED,
    MISSING,
    NODE_GROUP,
    NODE_ROLL,
    PERSISTENT_VOLUME,
    PERSISTENT_VOLUME_CLAIM,
    SET_FIELDS,
    lookup as _lookup,
)

MAX_VALUE = 80  # characters of a value shown in a table cell
MAX_ROWS = 40  # changed fields shown per resource
MAX_CHARS = 60_000  # a GitHub comment holds 65,536




@dataclass(frozen=True)
class FieldChange:
    path: str  # "inputs.scalingConfig.desiredSize", "options.protect", "parent"
    old: Any = MISSING
    new: Any = MISSING
    forces_replacement: bool = False
    ignored: bool = False  # under an ignoreChanges path: the engine keeps the old value


@dataclass
class ResourceChange:
    urn: str
    type: str
    name: str
    fields: list[FieldChange]
    replaced_by: list[str] = field(default_factory=list)  # why it is replaced (input paths)
    rolls_nodes: list[str] = field(default_factory=list)  # why its nodes (or its users' nodes) roll
    moved_from: str | None = None  # the old URN, when matched through an alias

    @property
    def replaced(self) -> bool:
        return bool(self.replaced_by)


@dataclass(frozen=True)
class Callout:
    level: str  # "CAUTION" or "WARNING"
    text: str


@dataclass
class Diff:
    base: str  # "project/stack"
    head: str
    added: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)
    changed: list[ResourceChange] = field(default_factory=list)
    outputs: list[FieldChange] = field(default_factory=list)
    unchanged: int = 0
    callouts: list[Callout] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.outputs)


# -- documents -----------------------------------------------------------------


def load(path: str | Path) -> dict:
    """Read and check a synth document; a `UserError` says what is wrong with it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return check(doc, str(path))


def check(doc: Any, source: str = "document") -> dict:
    """`doc` if it has the shape of a synth document, else a `UserError`."""
    if not isinstance(doc, dict):
        raise UserError(f"{source}: not a synth document (a JSON object), found {type(doc).__name__}")
    resources = doc.get("resources")
    if not isinstance(resources, list):
        raise UserError(f"{source}: not a synth document: no 'resources' list (write one with `python -m infra synth`)")
    for i, r in enumerate(resources):
        if not isinstance(r, dict) or not isinstance(r.get("urn"), str) or not isinstance(r.get("type"), str):
            raise UserError(f"{source}: resources[{i}] is not a resource (an object with 'urn' and 'type')")
    if not isinstance(doc.get("outputs", {}), dict):
        raise UserError(f"{source}: 'outputs' is not an object")
    return doc


# -- paths -----------------------------------------------------------------------

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key(prefix: str, key: str) -> str:
    if _IDENT.match(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key)}]"


def _is_marker(value: Any) -> bool:
    """A placeholder object (`{"<secret>": true}`, assets, resource references): one value."""
    return isinstance(value, dict) and any(isinstance(k, str) and k.startswith("<") for k in value)


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested objects and lists to {path: scalar}; empty containers are leaves."""
    if isinstance(value, dict) and value and not _is_marker(value):
        out: dict[str, Any] = {}
        for k in sorted(value, key=str):
            out.update(leaves(value[k], _key(prefix, str(k))))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, v in enumerate(value):
            out.update(leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _normalise_pulumi_path(path: str) -> str:
    """A Pulumi property path (`tags["Name"]`, `a["b"].c`) in the form `leaves` writes."""
    return re.sub(r'\["([A-Za-z_][A-Za-z0-9_]*)"\]', r".\1", path).lstrip(".")


def _path_pattern(path: str) -> re.Pattern:
    """Matches `path` and everything under it; `*` stands for one key or index."""
    norm = _normalise_pulumi_path(path)
    if norm in ("", "*"):
        return re.compile(r".*")
    rx = re.escape(norm).replace(r"\[\*\]", r"\[\d+\]").replace(r"\*", r"[^.\[]+")
    return re.compile(rf"^{rx}(?:$|[.\[])")


def _under(path: str, patterns: list[re.Pattern]) -> bool:
    return any(p.match(path) for p in patterns)


# -- comparing -------------------------------------------------------------------


def _field_changes(base: dict, head: dict, prefix: str) -> list[tuple[str, Any, Any]]:
    """(path, old, new) for every leaf that differs, paths prefixed with `prefix`."""
    old, new = leaves(base), leaves(head)
    changes = []
    for p in sorted(set(old) | set(new)):
        o, n = old.get(p, MISSING), new.get(p, MISSING)
        if o == n and type(o) is type(n):
            continue
        # `x: {}` on one side and `x.a: 1` on the other: only the inner change matters.
        lone, other = (o, new) if n is MISSING else (n, old) if o is MISSING else (None, {})
        if lone in ({}, []) and any(p == "" or q.startswith((p + ".", p + "[")) for q in other):
            continue
        changes.append((f"{prefix}.{p}" if prefix and p else prefix or p, o, n))
    return changes


def _canon(value: Any, is_set: bool) -> Any:
    if is_set and isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        return sorted(value, key=lambda v: json.dumps(v, sort_keys=True))
    return value


def _follow_renames(b: Any, h: Any, renames: set[tuple[str, str]]) -> Any:
    """`b` with each placeholder of a renamed resource (`<id:OLD>` where head has `<id:NEW>` at the same
    path, and OLD moved to NEW through an alias) written as head writes it: the same cloud value."""
    if not renames:
        return b
    if isinstance(b, str) and isinstance(h, str):
        pb, ph = parse_placeholder(b), parse_placeholder(h)
        return h if pb and ph and pb[0] == ph[0] and (pb[1], ph[1]) in renames else b
    if isinstance(b, dict) and isinstance(h, dict):
        return {k: _follow_renames(v, h[k], renames) if k in h else v for k, v in b.items()}
    if isinstance(b, list) and isinstance(h, list):
        return [_follow_renames(v, h[i], renames) if i < len(h) else v for i, v in enumerate(b)]
    return b


def _compare(b: dict, h: dict, renames: set[tuple[str, str]] = frozenset(), moves: dict[str, str] = {}) -> ResourceChange:  # noqa: B006 - read only
    """How `h` differs from `b`; `renames` (old name, new name) and `moves` (old URN -> new URN) of resources
    moved through an alias, whose references in `b` name the same cloud resources under their old names."""
    typ = h["type"]
    b_in, h_in = _follow_renames(b.get("inputs") or {}, h.get("inputs") or {}, renames), h.get("inputs") or {}
    h_opts = h.get("options") or {}
    ignore = [_path_pattern(p) for p in h_opts.get("ignore_changes") or []]
    replace_on = [_path_pattern(p) for p in h_opts.get("replace_on_changes") or []]

    # Why the resource would be replaced: provider ForceNew fields (by value, sets as sets) ...
    reasons: list[str] = []
    force_new = FORCE_NEW.get(typ, ())
    sets = SET_FIELDS.get(typ, frozenset())
    for f in force_new:
        if _under(f, ignore):
            continue
        if _canon(_lookup(b_in, f), f in sets) != _canon(_lookup(h_in, f), f in sets):
            reasons.append(f)
    for f, replaces in FORCE_NEW_IF.get(typ, ()):
        if not _under(f, ignore) and replaces(b_in, h_in):
            reasons.append(f)
    force_patterns = [_path_pattern(f) for f in reasons]

    fields: list[FieldChange] = []
    rolls: list[str] = []
    roll_patterns = [_path_pattern(p) for p in NODE_ROLL]
    for path, o, n in _field_changes(b_in, h_in, "inputs"):
        rel = path[len("inputs.") :]
        top = re.split(r"[.\[]", rel, maxsplit=1)[0]
        ignored = _under(rel, ignore)
        forces = False
        if not ignored:
            if _under(rel, force_patterns):
                forces = True
            elif _under(rel, replace_on):  # the program's own replaceOnChanges
                forces = True
                reasons.append(rel)
            if typ == NODE_GROUP and _under(rel, roll_patterns):
                rolls.append(rel)
            if typ == LAUNCH_TEMPLATE and top not in LT_NOT_VERSIONED:
                rolls.append(rel)
        fields.append(FieldChange(path, o, n, forces_replacement=forces, ignored=ignored))
    # A ForceNew block whose every changed leaf is ignored (ignoreChanges on a sub-path) replaces nothing.
    for r in list(reasons):
        under = [fc for fc in fields if _under(fc.path[len("inputs.") :], [_path_pattern(r)])]
        if under and all(fc.ignored for fc in under):
            reasons.remove(r)

    if b.get("parent") != h.get("parent"):
        fields.append(FieldChange("parent", b.get("parent", MISSING), h.get("parent", MISSING)))
    if b.get("custom") != h.get("custom"):
        fields.append(FieldChange("custom", b.get("custom", MISSING), h.get("custom", MISSING)))
    b_opts = {k: [moves.get(i, i) for i in v] if isinstance(v, list) else v for k, v in (b.get("options") or {}).items()}
    for key in sorted(set(b_opts) | set(h_opts)):
        o, n = b_opts.get(key, MISSING), h_opts.get(key, MISSING)
        if o == n:
            continue
        if isinstance(o, list) and isinstance(n, list):
            # Option lists (depends_on, ignore_changes, aliases, ...) are sets: one row per item gone or new.
            fields += [FieldChange(f"options.{key}", item, MISSING) for item in o if item not in n]
            fields += [FieldChange(f"options.{key}", MISSING, item) for item in n if item not in o]
        else:
            fields.append(FieldChange(f"options.{key}", o, n))
    return ResourceChange(
        urn=h["urn"],
        type=typ,
        name=h.get("name", h["urn"].rsplit("::", 1)[-1]),
        fields=fields,
        replaced_by=list(dict.fromkeys(reasons)),
        rolls_nodes=rolls,
    )


def diff(base: dict, head: dict) -> Diff:
    """Compare two synth documents (base: before, head: after)."""
    base, head = check(base, "base"), check(head, "head")
    b_res = {r["urn"]: r for r in base["resources"]}
    h_res = {r["urn"]: r for r in head["resources"]}
    result = Diff(base=_label(base), head=_label(head))

    # Moves: a new URN whose aliases name a URN that is gone.
    moved: dict[str, str] = {}  # head URN -> base URN
    gone = set(b_res) - set(h_res)
    for urn in sorted(set(h_res) - set(b_res)):
        for alias in (h_res[urn].get("options") or {}).get("aliases") or []:
            if alias in gone and alias not in moved.values():
                moved[urn] = alias
                break

    moves = {old: new for new, old in moved.items()}
    renames = {(b_res[old]["name"], h_res[new]["name"]) for new, old in moved.items() if b_res[old]["name"] != h_res[new]["name"]}
    for urn in sorted(h_res):
        h = h_res[urn]
        if urn in b_res or urn in moved:
            b = b_res.get(urn) or b_res[moved[urn]]
            change = _compare(b, h, renames, moves)
            if urn in moved:
                change.moved_from = moved[urn]
            if change.fields or change.moved_from:
                result.changed.append(change)
            else:
                result.unchanged += 1
        else:
            result.added.append(h)
    result.removed = [b_res[u] for u in sorted(gone - set(moved.values()))]
    result.outputs = [
        FieldChange(p, o, n) for p, o, n in _field_changes(base.get("outputs") or {}, head.get("outputs") or {}, "")
    ]
    result.callouts = _callouts(result, base, head)
    return result


def _label(doc: dict) -> str:
    return f"{doc.get('project', '?')}/{doc.get('stack', '?')}"


# -- callouts --------------------------------------------------------------------


def _short(value: Any, limit: int = MAX_VALUE) -> str:
    """JSON of `value`, shortened in the middle (URNs keep their type and their name)."""
    if value is MISSING:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 5
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def _code(text: str, table: bool = False) -> str:
    """`text` as an inline code span (safe for backticks; `|` escaped inside tables)."""
    if table:
        text = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _what(r: dict | ResourceChange) -> str:
    """`EKS node group `gpu``: what kind of thing, and its name."""
    typ = r.type if isinstance(r, ResourceChange) else r["type"]
    name = r.name if isinstance(r, ResourceChange) else r.get("name", r["urn"].rsplit("::", 1)[-1])
    return f"{KIND.get(typ, 'resource')} {_code(name)}"


def _type(r: dict | ResourceChange) -> str:
    return f"({_code(r.type if isinstance(r, ResourceChange) else r['type'])})"


def _dependents(doc: dict, urn: str, types: tuple[str, ...] | None = None) -> list[str]:
    return [
        r.get("name", r["urn"])
        for r in doc["resources"]
        if urn in ((r.get("options") or {}).get("depends_on") or []) and (types is None or r["type"] in types)
    ]


def _reason_text(c: ResourceChange, reason: str) -> str:
    """`field` `old` → `new` for a replacement reason (just `field` when it spans several leaves)."""
    exact = next((f for f in c.fields if f.path == f"inputs.{reason}"), None)
    if exact is None:
        return _code(reason)
    return f"{_code(reason)} {_code(_short(exact.old, 40))} → {_code(_short(exact.new, 40))}"


def node_group_swaps(d: Diff) -> list[tuple[dict, dict]]:
    """(removed, added) node groups of one component: one group replaced by a new one of another name.

    The GPU node group of a Capacity Block is named after its block
    (infra/aws/gpu_nodes.py, `resource_names`), so a new block shows as one
    group gone and one new under the same parent.
    """
    added = [r for r in d.added if r["type"] == NODE_GROUP]
    pairs = []
    for old in (r for r in d.removed if r["type"] == NODE_GROUP):
        same_parent = [a for a in added if a.get("parent") == old.get("parent")]
        if len(same_parent) == 1:
            pairs.append((old, same_parent[0]))
            added.remove(same_parent[0])
    return pairs


def _reservation_of(group: dict, doc: dict) -> Any:
    """The capacity reservation the group's launch template targets (found through `launchTemplate.id`), or None."""
    lt_id = _lookup(group.get("inputs") or {}, "launchTemplate.id")
    for r in doc["resources"]:
        if r["type"] == LAUNCH_TEMPLATE and lt_id in (placeholder("id", r.get("name")), r["urn"]):
            value = _lookup(r.get("inputs") or {}, "capacityReservationSpecification.capacityReservationTarget.capacityReservationId")
            return None if value is MISSING else value
    return None


def _swap_reason(old: dict, new: dict, base: dict, head: dict) -> str:
    """` (capacity reservation `cr-a` → `cr-b`)` when the two groups launch into different reservations."""
    a, b = _reservation_of(old, base), _reservation_of(new, head)
    if a != b and (a or b):
        return f" (capacity reservation {_code(str(a))} → {_code(str(b))})"
    return ""


# Stack outputs that carry the plan's prediction at the SLA capacity (__main__.py): a change
# there is a change in what the cluster delivers or costs, called out even when no resource
# changes (a new workload or SLA, say). Label, format, and whether more is better.
PREDICTION_OUTPUTS: dict[str, tuple[str, str, bool]] = {
    "slaCapacityConcurrency": ("SLA capacity", "{:,.0f} concurrent requests", True),
    "slaCapacityRequestsPerSecond": ("request rate within the SLA", "{:,.2f} requests/s", True),
    "predictedOutputTokensPerSecond": ("output throughput", "{:,.0f} tokens/s", True),
    "predictedCostPerMillionTokensUsd": ("cost", "${:,.2f} per million output tokens", False),
}
# A prediction that gets worse by this share (or more) is a CAUTION, else a WARNING.
PREDICTION_CAUTION_SHARE = 0.25


def _prediction_callout(d: Diff) -> Callout | None:
    changed = {f.path: f for f in d.outputs if f.path in PREDICTION_OUTPUTS}
    if not changed:
        return None
    parts, worse = [], 0.0
    for key, (label, fmt, more_is_better) in PREDICTION_OUTPUTS.items():
        f = changed.get(key)
        if f is None:
            continue
        old, new = (v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in (f.old, f.new))
        show = lambda v: fmt.format(v) if v is not None else "none"  # noqa: E731
        share = ""
        if old and new is not None:
            change = (new - old) / old
            share = f" ({change:+.0%})"
            worse = max(worse, -change if more_is_better else change)
        elif old and new is None:
            worse = 1.0
        parts.append(f"{label} {show(old)} → {show(new)}{share}")
    level = "CAUTION" if worse >= PREDICTION_CAUTION_SHARE else "WARNING"
    return Callout(level, "**The predicted performance changes** (the plan's model, at the SLA and workload of each side): "
                   + "; ".join(parts) + ".")


def _claim_mounters(head: dict, claim: dict) -> str:
    """Who mounts a replaced claim in the head: a RayCluster means every serving pod is recreated (KubeRay's
    `upgradeStrategy: Recreate`); a Job only means that Job's next pod."""
    name = _lookup(claim.get("inputs") or {}, "metadata.name")
    needle = json.dumps({"claimName": name})[1:-1]  # `"claimName": "<name>"` as it appears in a dumped pod spec
    users = [r for r in head["resources"] if r is not claim and needle in json.dumps(r.get("inputs") or {})]
    if any(r["type"] == RAYCLUSTER for r in users):
        return "The RayCluster mounts it: its template changes and KubeRay recreates every serving pod."
    if users:
        names = ", ".join(f"{r['type'].rsplit(':', 1)[-1]} {_code(r.get('name', r['urn'].rsplit('::', 1)[-1]))}" for r in users)
        return f"Mounted by {names}, not by the serving pods, which keep running."
    return "No workload of the stack mounts it."


def _callouts(d: Diff, base: dict, head: dict) -> list[Callout]:
    out: list[Callout] = []
    prediction = _prediction_callout(d)
    if prediction is not None:
        out.append(prediction)
    head_by_urn = {r["urn"]: r for r in head["resources"]}

    for c in d.changed:
        if c.replaced and c.type in KIND:
            opts = head_by_urn[c.urn].get("options") or {}
            text = f"**Replaces {_what(c)}** {_type(c)}: {'; '.join(_reason_text(c, r) for r in c.replaced_by)} forces replacement; {CONSEQUENCE[c.type]}."
            if opts.get("delete_before_replace"):
                text += " It is deleted **before** its replacement exists (`deleteBeforeReplace`)."
            if c.type == PERSISTENT_VOLUME_CLAIM:
                text += " " + _claim_mounters(head, head_by_urn[c.urn])
            if c.type == CLUSTER:
                deps = _dependents(head, c.urn, (NODE_GROUP,))
                if deps:
                    text += f" Node groups on it: {', '.join(_code(n) for n in deps)}."
            if opts.get("protect"):
                text += " It is protected: `pulumi up` refuses to replace it until `protect` is off."
            if c.type == NODE_GROUP and is_gpu_group(head_by_urn[c.urn]):
                text += serving_text(head_by_urn[c.urn], base, head)[0]
                if opts.get("delete_before_replace"):
                    text += block_cleanup_text(head_by_urn[c.urn])
            out.append(Callout("CAUTION", text))
    swaps = node_group_swaps(d)
    for old, new in swaps:
        why = _swap_reason(old, new, base, head)
        out.append(
            Callout(
                "WARNING",
                f"**Swaps {_what(old)} for {_code(new.get('name', ''))}** {_type(old)}{why}: the new group is created "
                "first, then the old one is drained and deleted (blue/green; Pulumi deletes what the program no "
                "longer declares at the end of the update)." + (serving_text(new, base, head)[0] if is_gpu_group(new) else ""),
            )
        )
    swapped = {o["urn"] for o, _ in swaps}
    for r in d.removed:
        if r["type"] in (NODE_GROUP, CLUSTER) and r["urn"] not in swapped:
            tail = ": with every node group, add-on and workload on it" if r["type"] == CLUSTER else ": every node is drained and terminated"
            out.append(Callout("CAUTION", f"**Deletes {_what(r)}** {_type(r)}{tail}."))
    for c in d.changed:
        fc = next((f for f in c.fields if f.path == "options.protect"), None)
        if fc is not None and fc.old is True and fc.new is not True:
            out.append(Callout("CAUTION", f"**Protection switched off** on {_what(c)} {_type(c)}: `protect` true → false; it can now be deleted or replaced."))
    for r in d.removed:
        if (r.get("options") or {}).get("protect"):
            out.append(Callout("WARNING", f"**Deletes protected** {_what(r)} {_type(r)}: `pulumi up` refuses until it is unprotected."))
    for c in d.changed:
        if c.replaced or not c.rolls_nodes:
            continue
        fields = ", ".join(_code(p) for p in dict.fromkeys(c.rolls_nodes))
        if c.type == NODE_GROUP:
            text = (f"**Rolls every node** of {_what(c)} {_type(c)} ({fields}): nodes are replaced in place, "
                    "as many at a time as `updateConfig` allows.")  # fmt: skip
            level = "WARNING"
            group = head_by_urn[c.urn]
            if is_gpu_group(group):
                serving, stalls = serving_text(group, base, head)
                text += serving
                level = "CAUTION" if stalls else level
            out.append(Callout(level, text))
        elif c.type == LAUNCH_TEMPLATE:
            users = _dependents(head, c.urn, (NODE_GROUP,))
            who = f"node groups using it ({', '.join(_code(u) for u in users)})" if users else "node groups using it"
            text = (f"**New version of** {_what(c)} {_type(c)} ({fields}): {who} roll every node onto it "
                    "when their `launchTemplate.version` follows the latest version.")  # fmt: skip
            level = "WARNING"
            gpu = next((r for r in head["resources"] if r["type"] == NODE_GROUP and r.get("name") in users and is_gpu_group(r)), None)
            if gpu is not None:
                serving, stalls = serving_text(gpu, base, head)
                text += serving
                level = "CAUTION" if stalls else level
            out.append(Callout(level, text))
    for c in d.changed:
        if c.type == RAYCLUSTER and not c.replaced:
            paths = [f.path for f in c.fields if not f.ignored]
            if recreates_serving(paths, base, head):
                moved = ", ".join(_code(p.removeprefix("inputs.")) for p in dict.fromkeys(paths) if p.startswith("inputs.spec."))
                out.append(Callout("WARNING", f"**Recreates every serving pod** of {_what(c)} {_type(c)} ({moved}): " + recreate_text(head)))
    for c in d.changed:
        if c.type == CLUSTER and not c.replaced:
            fc = next((f for f in c.fields if f.path == "inputs.version" and not f.ignored), None)
            if fc is not None:
                out.append(
                    Callout("WARNING", f"**Kubernetes upgrade** of {_what(c)} {_type(c)}: {_code(_short(fc.old))} → {_code(_short(fc.new))} (control plane, in place).")
                )
    return out


# -- Markdown --------------------------------------------------------------------


def _cell(value: Any) -> str:
    return "*(absent)*" if value is MISSING else _code(_short(value), table=True)


def _parent_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if urn else ""


def _resource_table(resources: list[dict]) -> list[str]:
    lines = ["| Name | Type | Parent | Notes |", "|---|---|---|---|"]
    for r in resources:
        opts = r.get("options") or {}
        notes = ", ".join(n for n, on in (("protected", opts.get("protect")), ("retained on delete", opts.get("retain_on_delete"))) if on)
        parent = r.get("parent") or ""
        parent_cell = "" if not parent or "::pulumi:pulumi:Stack::" in parent else _code(_parent_name(parent), table=True)
        lines.append(
            f"| {_code(r.get('name', r['urn'].rsplit('::', 1)[-1]), table=True)} | {_code(r['type'], table=True)} | {parent_cell} | {notes} |"
        )
    return lines


def _field_table(changes: list[FieldChange], header: str = "Field") -> list[str]:
    lines = [f"| {header} | Before | After |", "|---|---|---|"]
    for fc in changes[:MAX_ROWS]:
        mark = " **forces replacement**" if fc.forces_replacement else " *(ignored: ignoreChanges)*" if fc.ignored else ""
        lines.append(f"| {_code(fc.path, table=True)}{mark} | {_cell(fc.old)} | {_cell(fc.new)} |")
    if len(changes) > MAX_ROWS:
        lines.append(f"| … and {len(changes) - MAX_ROWS} more | | |")
    return lines


def render_markdown(d: Diff) -> str:
    """The diff as a pull-request comment; `No changes.` when the documents are equal."""
    if d.empty:
        return "No changes."
    lines: list[str] = []
    title = d.head if d.base == d.head else f"{d.base} → {d.head}"
    lines.append(f"### Synth diff: {_code(title)}")
    lines.append("")
    for level in ("CAUTION", "WARNING"):
        items = [c for c in d.callouts if c.level == level]
        if items:
            lines.append(f"> [!{level}]")
            for i, c in enumerate(items):
                if i:
                    lines.append(">")
                lines.append(f"> {'⚠️' if level == 'CAUTION' else 'ℹ️'} {c.text}")
            lines.append("")
    replaced = sum(1 for c in d.changed if c.replaced)
    summary = (
        f"**{len(d.added)} to add, {len(d.changed)} to change"
        + (f" ({replaced} replaced)" if replaced else "")
        + f", {len(d.removed)} to delete**, {d.unchanged} unchanged"
        + (f"; {len(d.outputs)} stack output field{'s' if len(d.outputs) != 1 else ''} changed" if d.outputs else "")
        + "."
    )
    lines.append(summary)
    lines.append("")
    if d.added:
        lines += [f"#### Added ({len(d.added)})", "", *_resource_table(d.added), ""]
    if d.removed:
        lines += [f"#### Deleted ({len(d.removed)})", "", *_resource_table(d.removed), ""]
    if d.changed:
        lines += [f"#### Changed ({len(d.changed)})", ""]
        for c in d.changed:
            verb = "**replace**" if c.replaced else "update"
            moved = f" (moved from {_code(c.moved_from)})" if c.moved_from else ""
            lines.append(f"**{_code(c.name)}** {_code(c.type)}: {verb}{moved}")
            lines.append("")
            if c.fields:
                lines += [*_field_table(c.fields), ""]
    if d.outputs:
        lines += [f"#### Stack outputs ({len(d.outputs)} changed)", "", *_field_table(d.outputs, "Output"), ""]
    lines.append(
        "<sub>Replacements are judged from the Terraform AWS provider's ForceNew fields for EKS clusters, node groups, "
        "launch templates and EFS / FSx for Lustre file systems, from Kubernetes' immutable fields for PersistentVolumes and claims, "
        "and from `replaceOnChanges`; a change to another resource type is shown as an update "
        "even where its provider would replace it. Values only the cloud knows are placeholders.</sub>"
    )
    text = "\n".join(lines).rstrip() + "\n"
    if len(text) > MAX_CHARS:
        cut = text.rfind("\n", 0, MAX_CHARS)
        text = text[:cut] + f"\n\n… diff truncated ({len(text):,} characters); run `python -m infra diff` for all of it.\n"
    return text
