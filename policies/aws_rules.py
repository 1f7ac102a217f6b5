"""The policy pack's AWS hardening rules, as plain functions (registered in `rules.RULES`).

Same shapes as `rules.py` (see its docstring): resource rules are
`check(resource_type, props, options, context) -> [message]`, stack rules
`check(resources, context) -> [(urn, message)]`; props are camelCase inputs;
`UNKNOWN` ("<computed>") is a value nobody knows yet, on which no rule reports.
Standard library only, and nothing imported from `rules.py` (which imports this
module while it is still being defined), so the few helpers are repeated here.

- `eks-all-control-plane-logs`: an EKS cluster sends all five control-plane log
  types (EKS User Guide, "Send control plane logs to CloudWatch Logs").
- `log-groups-encrypted-and-retained`: a CloudWatch log group names a KMS key and
  a retention; in production at least a year (or never expiring), and it is
  protected and retained on delete (it holds audit data).
- `kms-keys-explicit-policy`: a KMS key rotates and has a policy of its own
  that keeps the account as its administrator and opens it to no one
  (`"Principal": "*"` without a condition).
- `vpcs-have-flow-logs`: every VPC the stack creates has a flow log.
- `default-security-groups-closed`: every VPC the stack creates adopts its
  default security group with no rules, and no rule resource adds one.
- `vpc-cni-network-policy`: the vpc-cni add-on enforces NetworkPolicies
  (`configurationValues` `{"enableNetworkPolicy": "true"}`).
- `iam-managed-policies-scoped`: no AWS managed policy of the `*FullAccess`,
  `AdministratorAccess` or `PowerUserAccess` kind is attached to a role, and
  `AmazonEKS_CNI_Policy` only to a role that EKS Pod Identity alone assumes,
  never one EC2 can (the node role: every process on a node's host network
  reaches its credentials through IMDS; the EKS User Guide recommends the VPC
  CNI's own role).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

if __package__:  # imported as policies.aws_rules
    from .values import UNKNOWN, _list, _map, is_unknown, same_resource
else:  # run by the policy analyzer from the pack's directory
    from values import UNKNOWN, _list, _map, is_unknown, same_resource  # type: ignore[no-redef]

MANDATORY = "mandatory"  # rules.MANDATORY

EKS_CLUSTER = "aws:eks/cluster:Cluster"
EKS_ADDON = "aws:eks/addon:Addon"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
KMS_KEY = "aws:kms/key:Key"
VPC = "aws:ec2/vpc:Vpc"
FLOW_LOG = "aws:ec2/flowLog:FlowLog"
DEFAULT_SECURITY_GROUP = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
IAM_ROLE = "aws:iam/role:Role"
ROLE_POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
MANAGED_POLICY_PREFIX = "arn:aws:iam::aws:policy/"
BROAD_MANAGED_POLICIES = ("AdministratorAccess", "PowerUserAccess")
CNI_POLICY = "AmazonEKS_CNI_Policy"
POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"  # EKS User Guide, "EKS Pod Identity": the role's trust policy
SG_RULE_TYPES = (
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
    "aws:ec2/securityGroupRule:SecurityGroupRule",
)

# botocore's eks LogType: every control-plane log EKS can send.
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
PRODUCTION_MIN_RETENTION_DAYS = 365  # a year of audit data (0: never expires)
_ACCOUNT_ROOT = re.compile(r"^(arn:aws[a-z-]*:iam::\d{12}:root|\d{12})$")


def _as_list(value: Any) -> list:
    return list(_list(value)) if _list(value) else ([] if value is None else [value])


# --- EKS control-plane logs ------------------------------------------------------------------


def check_eks_control_plane_logging(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """An EKS cluster sends every control-plane log type to CloudWatch Logs."""
    if resource_type != EKS_CLUSTER:
        return []
    logs = props.get("enabledClusterLogTypes")
    if is_unknown(logs) or any(is_unknown(t) for t in _list(logs)):
        return []
    missing = [t for t in CONTROL_PLANE_LOG_TYPES if t not in _list(logs)]
    if not missing:
        return []
    return [f"control-plane logs {', '.join(missing)} are off: enabledClusterLogTypes must list {', '.join(CONTROL_PLANE_LOG_TYPES)}"]


# --- CloudWatch log groups ----------------------------------------------------------------------


def check_log_groups(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """A log group is encrypted with a KMS key and expires; in production it keeps a year and is kept itself."""
    if resource_type != LOG_GROUP:
        return []
    out: list[str] = []
    if not props.get("kmsKeyId"):
        out.append("the log group names no kmsKeyId: CloudWatch Logs encrypts it with its own key, which no key policy governs")
    retention = props.get("retentionInDays")
    if retention is None:
        out.append("the log group has no retentionInDays: its events never expire (set one explicitly; 0 means never, on purpose)")
    elif not is_unknown(retention) and context.get("production"):
        days = int(retention) if isinstance(retention, (int, float)) else -1
        if days != 0 and days < PRODUCTION_MIN_RETENTION_DAYS:
            out.append(
                f"production stack: the log group keeps {days} days, less than a year of audit data "
                f"(gpu-serving:lifecycle.logRetentionDays at least {PRODUCTION_MIN_RETENTION_DAYS})"
            )
    if context.get("production"):
        # retain_on_delete None: not visible to the caller (CrossGuard 1.21 does not pass it).
        missing = [o for o, ok in (("protect", options.get("protect") is True), ("retain_on_delete", options.get("retain_on_delete") is not False)) if not ok]
        if missing:
            out.append(f"production stack: the log group lacks {' and '.join(missing)}: a destroy or replacement would delete its audit data")
    return out


# --- KMS key policies ------------------------------------------------------------------------------


def _statements(policy: Any) -> Optional[list[Mapping]]:
    if isinstance(policy, str):
        try:
            policy = json.loads(policy)
        except ValueError:
            return None
    return [_map(s) for s in _as_list(_map(policy).get("Statement"))] if isinstance(policy, Mapping) else None


def _principals(statement: Mapping) -> list[str]:
    principal = statement.get("Principal")
    if isinstance(principal, str):
        return [principal]
    return [str(p) for v in _map(principal).values() for p in _as_list(v)]


def check_kms_key_policies(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """A KMS key rotates and has an explicit policy: the account administers it (`kms:*` for its root), no one outside
    the account may use it (no unconditioned `*` principal)."""
    if resource_type != KMS_KEY:
        return []
    out: list[str] = []
    rotation = props.get("enableKeyRotation")
    if not is_unknown(rotation) and rotation is not True and str(rotation).lower() != "true":
        out.append("key rotation is off (enableKeyRotation: true rotates the key material yearly)")
    policy = props.get("policy")
    if is_unknown(policy):
        return out
    if not policy:
        return [*out, "the key has no policy of its own and gets the default one: set an explicit key policy (infra/aws/iam.py key_policy)"]
    statements = _statements(policy)
    if statements is None:
        return [*out, "the key policy is not a JSON policy document"]
    allowed = [s for s in statements if s.get("Effect") == "Allow"]
    if not any("kms:*" in _as_list(s.get("Action")) and any(_ACCOUNT_ROOT.match(p) for p in _principals(s)) for s in allowed):
        out.append("no statement keeps the account root as administrator (kms:*): a key whose named principals are gone cannot be managed")
    if any("*" in _principals(s) and not s.get("Condition") for s in allowed):
        out.append('a statement allows the principal "*" without a condition: anyone with the key id could use the key')
    return out


# --- VPC flow logs and default security groups ----------------------------------------------------------


def _of_type(resources: Sequence[Mapping], *types: str) -> list[Mapping]:
    return [r for r in resources if r.get("type") in types]


def check_vpc_flow_logs(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """Every VPC the stack creates has a flow log."""
    flow_logs = _of_type(resources, FLOW_LOG)
    out = []
    for vpc in _of_type(resources, VPC):
        if not any(same_resource(f, "vpcId", _map(f.get("inputs")).get("vpcId"), vpc) for f in flow_logs):
            out.append((vpc.get("urn", ""), f"VPC {vpc.get('name')} has no flow log: refused and accepted connections leave no record"))
    return out


def check_default_security_groups(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """Every VPC the stack creates adopts its default security group with no rules, and no rule resource adds one."""
    defaults = _of_type(resources, DEFAULT_SECURITY_GROUP)
    rule_resources = _of_type(resources, *SG_RULE_TYPES)
    out = []
    for vpc in _of_type(resources, VPC):
        adopted = [d for d in defaults if same_resource(d, "vpcId", _map(d.get("inputs")).get("vpcId"), vpc)]
        if not adopted:
            out.append((vpc.get("urn", ""), f"VPC {vpc.get('name')}: its default security group is not adopted (DefaultSecurityGroup with no rules), so it keeps AWS's allow-within-group rules"))
    for d in defaults:
        inputs = _map(d.get("inputs"))
        if any(_list(inputs.get(k)) for k in ("ingress", "egress")):
            out.append((d.get("urn", ""), f"default security group {d.get('name')} has rules: anything launched without a group of its own would get them"))
        for r in rule_resources:
            if same_resource(r, "securityGroupId", _map(r.get("inputs")).get("securityGroupId"), d):
                out.append((r.get("urn", ""), f"{r.get('name')} adds a rule to the default security group {d.get('name')}, which should have none"))
    return out


# --- VPC CNI network policies ---------------------------------------------------------------------------------


def check_vpc_cni_network_policy(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """The vpc-cni add-on enforces Kubernetes NetworkPolicies (EKS User Guide, "Restrict Pod network traffic with
    Kubernetes network policies"): without it a NetworkPolicy is stored and never applied."""
    if resource_type != EKS_ADDON or props.get("addonName") != "vpc-cni":
        return []
    raw = props.get("configurationValues")
    if is_unknown(raw):
        return []
    try:
        values = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return ["configurationValues is not JSON"]
    if str(_map(values).get("enableNetworkPolicy", "")).lower() == "true":
        return []
    return ['the vpc-cni add-on does not enforce NetworkPolicies: set configurationValues to {"enableNetworkPolicy": "true"}']


def _role_of(attachment: Mapping, roles: Sequence[Mapping]) -> Optional[Mapping]:
    """The Role an attachment's `role` (a role name) names, among the stack's."""
    value = _map(attachment.get("inputs")).get("role")
    for role in roles:
        inputs = _map(role.get("inputs"))
        if same_resource(attachment, "role", value, role) or (isinstance(value, str) and value in (inputs.get("name"), role.get("name"))):
            return role
    return None


def _trusted_services(role: Mapping) -> Optional[set[str]]:
    """The AWS services a role's trust policy lets assume it; None while the policy is unknown."""
    statements = _statements(_map(role.get("inputs")).get("assumeRolePolicy"))
    if statements is None:
        return None
    out: set[str] = set()
    for st in statements:
        if st.get("Effect") == "Allow":
            out.update(str(s) for s in _as_list(_map(st.get("Principal")).get("Service")))
    return out


def check_managed_policies(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """No broad AWS managed policy on any role; the VPC CNI's policy on a Pod Identity role only (module doc)."""
    roles = _of_type(resources, IAM_ROLE)
    out = []
    for attachment in _of_type(resources, ROLE_POLICY_ATTACHMENT):
        arn = _map(attachment.get("inputs")).get("policyArn")
        if not isinstance(arn, str) or is_unknown(arn) or not arn.startswith(MANAGED_POLICY_PREFIX):
            continue
        policy = arn.rsplit("/", 1)[-1]
        urn = attachment.get("urn", "")
        if policy.endswith("FullAccess") or policy in BROAD_MANAGED_POLICIES:
            out.append((urn, f"{attachment.get('name')} attaches {policy}: grant what the role's one job needs, scoped to the stack"))
        if policy == CNI_POLICY:
            role = _role_of(attachment, roles)
            services = _trusted_services(role) if role is not None else None
            if services is not None and services != {POD_IDENTITY_PRINCIPAL}:
                out.append((urn, f"{attachment.get('name')} attaches {CNI_POLICY} to role {role.get('name')}, which "
                                 f"{', '.join(sorted(services)) or 'no service'} can assume: give it to aws-node alone, on a "
                                 "role of its own through EKS Pod Identity"))
    return out


# --- the rules, as `rules.Rule` arguments ----------------------------------------------------------------------

RULES: tuple[dict[str, Any], ...] = (
    dict(
        name="eks-all-control-plane-logs",
        description="EKS clusters send all five control-plane log types (api, audit, authenticator, controllerManager, scheduler).",
        enforcement=MANDATORY,
        check=check_eks_control_plane_logging,
        scope="resource",
    ),
    dict(
        name="log-groups-encrypted-and-retained",
        description="CloudWatch log groups name a KMS key and a retention; in production at least a year, protected and retained on delete.",
        enforcement=MANDATORY,
        check=check_log_groups,
        scope="resource",
    ),
    dict(
        name="kms-keys-explicit-policy",
        description="KMS keys rotate and have an explicit policy that keeps the account as administrator and allows no unconditioned '*' principal.",
        enforcement=MANDATORY,
        check=check_kms_key_policies,
        scope="resource",
    ),
    dict(
        name="vpcs-have-flow-logs",
        description="Every VPC the stack creates has a flow log.",
        enforcement=MANDATORY,
        check=check_vpc_flow_logs,
        scope="stack",
    ),
    dict(
        name="default-security-groups-closed",
        description="Every VPC the stack creates adopts its default security group with no rules, and no rule resource adds one.",
        enforcement=MANDATORY,
        check=check_default_security_groups,
        scope="stack",
    ),
    dict(
        name="vpc-cni-network-policy",
        description="The vpc-cni add-on enforces Kubernetes NetworkPolicies (configurationValues enableNetworkPolicy: true).",
        enforcement=MANDATORY,
        check=check_vpc_cni_network_policy,
        scope="resource",
    ),
    dict(
        name="iam-managed-policies-scoped",
        description="No *FullAccess, AdministratorAccess or PowerUserAccess managed policy on a role; AmazonEKS_CNI_Policy only on a role EKS Pod Identity alone assumes.",
        enforcement=MANDATORY,
        check=check_managed_policies,
        scope="stack",
    ),
)
