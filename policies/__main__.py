"""The CrossGuard policy pack `gpu-serving`: `pulumi preview --policy-pack policies`.

Only wiring: each rule of `rules.py` becomes one ResourceValidationPolicy or
StackValidationPolicy with the rule's name, description and enforcement level,
and an adapter turns CrossGuard's `args` into the rule's plain arguments:

- resource policies: `args.resource_type`, `args.props` (the resource's inputs,
  camelCase, as in the synth document), `args.opts` (protect, ...; pulumi-policy
  1.21 passes no retainOnDelete, so it is None), and a context from the policy's
  config and the resource's AWS provider (`args.provider.props.defaultTags`);
- stack policies: every `args.resources[i]` as a synth-shaped dict (type, name,
  urn, `inputs` = its props, `options` from `opts`, `property_dependencies` as
  URNs: what links a security-group rule to its group while ids are unknown),
  and a context from the stack's AWS providers, `args.stack_tags` and the config.

CrossGuard's props are proxies that raise on values unknown during a preview;
the adapter copies them into plain dicts with those values as `rules.UNKNOWN`,
which the rules treat as "cannot judge yet" (resource policies run again with
resolved inputs during `pulumi up`, before anything is created).

The Pulumi CLI runs this file as the pack's program (`python -m pulumi.policy`
runs the directory with `__name__ == "__main__"`, the directory first on
`sys.path`: the pulumi SDK's pulumi/policy/__main__.py, `runpy.run_path(program,
run_name="__main__")`); tests and `infra/preview/policy_check.py` import it as
`policies.__main__`. The argument objects are pulumi-policy 1.21's
(pulumi_policy/policy.py: `ResourceValidationArgs`, `StackValidationArgs`,
`PolicyResource`, `PolicyResourceOptions`; `report_violation(message, urn=None)`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ResourceValidationPolicy,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

if __package__:  # imported as policies.__main__
    from . import rules
else:  # run by the policy analyzer from the pack's directory
    import rules  # type: ignore[no-redef]

PACK_NAME = "gpu-serving"
LEVELS = {rules.MANDATORY: EnforcementLevel.MANDATORY, rules.ADVISORY: EnforcementLevel.ADVISORY}


def plain(value: Any) -> Any:
    """CrossGuard props as plain dicts and lists, values unknown in a preview as `rules.UNKNOWN`.

    The props are pulumi-policy's unknown-checking proxies: reading an unknown
    value raises `UnknownValueError`, so each read is guarded.
    """
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key in value:  # iterating keys reads no value
            try:
                out[key] = plain(value[key])
            except UnknownValueError:
                out[key] = rules.UNKNOWN
        return out
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items: list[Any] = []
        for i in range(len(value)):
            try:
                items.append(plain(value[i]))
            except UnknownValueError:
                items.append(rules.UNKNOWN)
        return items
    return value


def options(opts: Any) -> dict[str, Any]:
    """`PolicyResourceOptions` with the synth document's keys; what CrossGuard does not pass is None."""
    if opts is None:
        return {"protect": None, "retain_on_delete": None}
    return {
        "protect": bool(opts.protect),
        "retain_on_delete": None,  # not in pulumi-policy 1.21's PolicyResourceOptions
        "ignore_changes": list(opts.ignore_changes or []),
        "delete_before_replace": opts.delete_before_replace,
        "aliases": list(opts.aliases or []),
        "additional_secret_outputs": list(opts.additional_secret_outputs or []),
        "parent": opts.parent,
    }


def resource_document(resource: Any) -> dict[str, Any]:
    """A CrossGuard `PolicyResource` as a synth-document resource."""
    provider = getattr(resource, "provider", None)
    parent = getattr(resource, "parent", None)
    return {
        "type": resource.resource_type,
        "name": resource.name,
        "urn": resource.urn,
        "parent": getattr(parent, "urn", None),
        "inputs": plain(resource.props),
        "options": options(resource.opts),
        "provider": getattr(provider, "urn", None),
        "property_dependencies": {
            k: [d.urn for d in deps] for k, deps in (getattr(resource, "property_dependencies", None) or {}).items()
        },
    }


def _provider_resources(resources: Sequence[Any]) -> list[dict[str, Any]]:
    """Every provider the stack's resources name (providers are resources of the stack too, but say it twice)."""
    seen: dict[str, dict[str, Any]] = {}
    for r in resources:
        p = getattr(r, "provider", None)
        if p is not None and p.urn not in seen:
            seen[p.urn] = {"type": p.resource_type, "name": p.name, "urn": p.urn, "inputs": plain(p.props)}
    return list(seen.values())


def resource_context(args: Any) -> dict[str, Any]:
    context = dict(rules.CONTEXT_DEFAULTS)
    provider = getattr(args, "provider", None)
    if provider is not None and str(provider.resource_type).startswith(rules.AWS_PROVIDER):
        context["production"] = rules.production_from_provider(plain(provider.props))
    if (getattr(args, "stack_tags", None) or {}).get(rules.LIFECYCLE_TAG) == rules.PRODUCTION:
        context["production"] = True
    context.update(rules.config_context(args.get_config()))
    return context


def resource_validator(rule: rules.Rule):
    def validate(args, report_violation) -> None:
        props = plain(args.props)
        for message in rule.check(args.resource_type, props, options(args.opts), resource_context(args)):
            report_violation(message)

    return validate


def stack_validator(rule: rules.Rule):
    def validate(args, report_violation) -> None:
        resources = [resource_document(r) for r in args.resources]
        context = rules.stack_context(
            [*resources, *_provider_resources(args.resources)], stack_tags=args.stack_tags, config=args.get_config()
        )
        for urn, message in rule.check(resources, context):
            report_violation(message, urn or None)

    return validate


def _schema(rule: rules.Rule) -> Optional[PolicyConfigSchema]:
    return PolicyConfigSchema(properties=dict(rule.config)) if rule.config else None


def policies() -> list:
    """One CrossGuard policy per rule, in `rules.RULES` order."""
    out: list = []
    for rule in rules.RULES:
        common = dict(
            name=rule.name,
            description=rule.description,
            enforcement_level=LEVELS[rule.enforcement],
            config_schema=_schema(rule),
        )
        if rule.scope == "resource":
            out.append(ResourceValidationPolicy(validate=resource_validator(rule), **common))
        else:
            out.append(StackValidationPolicy(validate=stack_validator(rule), **common))
    return out


def main() -> None:
    PolicyPack(
        name=PACK_NAME,
        policies=policies(),
        description="GPU serving stack: TP within a node, EFA, IMDSv2, encryption, EKS hardening, protected weights, serving pods, least-privilege pods, Pod Security admission, network policies, no public load balancers.",
    )


if __name__ == "__main__":
    main()
