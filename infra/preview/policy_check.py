"""The policy pack's rules over a synth document, offline (`python -m infra check`).

`check_document(doc)` runs every rule of `policies/rules.py` over a synth
document (`infra.synth.synthesize`): each resource rule on each resource (its
type, `inputs` and `options`), each stack rule once on all of them. The context
the rules need comes from the document itself (`document_context`):

- `production`: the AWS provider's default tags say `lifecycle: production`
  (infra/aws/tags.py), exactly what the CrossGuard pack reads;
- `gpus_per_node`: the GPU count of the GPU launch template's instance type,
  from the catalog (the CrossGuard pack has no catalog; there it is an optional
  config value);
- `allow_internet_facing`: False: the stack config has no option for an
  internet-facing endpoint (`gpu-serving:serving.serviceType` is `cluster-ip`
  or `internal-lb`). A future option would be read here from the stack's config
  and passed through `overrides` (see the `policies/rules.py` docstring).

Unlike CrossGuard (pulumi-policy 1.21 does not pass `retainOnDelete` to a
policy), the synth document records every resource option, so
`production-weights-protected` checks `retain_on_delete` here too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from policies import rules as policy_rules
from policies.rules import RULES, Rule


@dataclass(frozen=True)
class Violation:
    rule: str
    enforcement: str
    urn: str
    type: str
    name: str
    message: str

    @property
    def mandatory(self) -> bool:
        return self.enforcement == policy_rules.MANDATORY


def gpus_per_node(doc: dict) -> Optional[int]:
    """GPUs of one GPU node: the smallest GPU count among the launch templates' instance types."""
    from infra.catalog.instances import INSTANCE_TYPES

    counts = []
    for r in doc.get("resources", []):
        if r.get("type") != policy_rules.LAUNCH_TEMPLATE:
            continue
        itype = INSTANCE_TYPES.get(str(r.get("inputs", {}).get("instanceType")))
        if itype is not None and itype.gpu_count > 0:
            counts.append(itype.gpu_count)
    return min(counts) if counts else None


def document_context(doc: dict, **overrides: Any) -> dict[str, Any]:
    """The rules' context for a synth document (see the module docstring)."""
    resources = doc.get("resources", [])
    return policy_rules.stack_context(resources, gpus_per_node=gpus_per_node(doc), **overrides)


def check_document(doc: dict, *, rules: Sequence[Rule] = RULES, **overrides: Any) -> list[Violation]:
    """Every violation of `rules` in a synth document, in rule order, then resource order."""
    resources = doc.get("resources", [])
    by_urn = {r.get("urn"): r for r in resources}
    context = document_context(doc, **overrides)
    found: list[Violation] = []
    for rule in rules:
        if rule.scope == "resource":
            for r in resources:
                for message in rule.check(r.get("type", ""), r.get("inputs") or {}, r.get("options") or {}, context):
                    found.append(Violation(rule.name, rule.enforcement, r.get("urn", ""), r.get("type", ""), r.get("name", ""), message))
        else:
            for urn, message in rule.check(resources, context):
                r = by_urn.get(urn, {})
                found.append(Violation(rule.name, rule.enforcement, urn or "", r.get("type", ""), r.get("name", ""), message))
    return found


def check_stack(stack: str, root: Optional[Path] = None, **overrides: Any) -> tuple[dict, list[Violation]]:
    """Synthesise `stack` offline and check it; a config mistake is a `UserError`."""
    from infra.preview.synth import synthesize

    doc = synthesize(stack, root)
    return doc, check_document(doc, **overrides)


def report(doc: dict, violations: Sequence[Violation], rules: Sequence[Rule] = RULES) -> dict[str, Any]:
    """The `--json` document: the rules, the violations, and whether a mandatory rule failed."""
    return {
        "stack": doc.get("stack"),
        "resources": len(doc.get("resources", [])),
        "rules": [{"name": r.name, "description": r.description, "enforcement": r.enforcement, "scope": r.scope} for r in rules],
        "violations": [asdict(v) for v in violations],
        "passed": not any(v.mandatory for v in violations),
    }
