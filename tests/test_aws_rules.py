"""The policy pack's AWS hardening rules (policies/aws_rules.py): each on a small passing and
failing hand-made resource, unknown values during a preview, the real stacks, and the
CrossGuard wiring (registered in rules.RULES, matched by property dependencies in a preview).
"""

from __future__ import annotations

import json

import botocore.session
import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

import policies.__main__ as pack
from infra.aws.iam import key_policy
from infra.catalog.cloudwatch import LOG_RETENTION_DAYS
from infra.preview.policy_check import check_document
from policies import aws_rules as A
from policies import rules as R
from tests.synthesized import repo_stack

CTX = dict(R.CONTEXT_DEFAULTS)
PROD = {**CTX, "production": True}
KEPT = {"protect": True, "retain_on_delete": True}
ACCOUNT = "123456789012"


def one(messages: list, *fragments: str) -> str:
    assert len(messages) == 1, messages
    for f in fragments:
        assert f in messages[0], (f, messages[0])
    return messages[0]


def res(typ: str, name: str, inputs: dict, **extra) -> dict:
    return {"type": typ, "name": name, "urn": f"urn:pulumi:s::p::{typ}::{name}", "inputs": inputs, "options": {}, **extra}


# --- registration ----------------------------------------------------------------------------


def test_the_aws_rules_are_registered_after_the_others_as_mandatory_rules():
    names = [r["name"] for r in A.RULES]
    assert [r.name for r in R.RULES][-len(names):] == names
    assert len({r.name for r in R.RULES}) == len(R.RULES)
    for spec in A.RULES:
        rule = R.rule(spec["name"])
        assert rule.enforcement == R.MANDATORY and rule.check is spec["check"] and rule.description.endswith(".")
    assert [p.name for p in pack.policies()] == [r.name for r in R.RULES]
    with pytest.raises(KeyError):
        R.rule("no-such-rule")


# --- EKS control-plane logs -----------------------------------------------------------------------------------


def test_the_packs_aws_values_are_the_apis():
    """The pack repeats these values (it imports nothing of the project): botocore's eks LogType, and a
    retention CloudWatch Logs accepts (infra/catalog/cloudwatch.py, checked against botocore's logs model)."""
    log_types = botocore.session.get_session().get_service_model("eks").shape_for("LogType").enum
    assert sorted(A.CONTROL_PLANE_LOG_TYPES) == sorted(log_types)
    assert A.PRODUCTION_MIN_RETENTION_DAYS in LOG_RETENTION_DAYS


def test_eks_sends_every_control_plane_log_type():
    check = A.check_eks_control_plane_logging
    assert check(A.EKS_CLUSTER, {"enabledClusterLogTypes": list(A.CONTROL_PLANE_LOG_TYPES)}, {}, CTX) == []
    one(check(A.EKS_CLUSTER, {"enabledClusterLogTypes": ["api", "audit", "authenticator"]}, {}, CTX), "controllerManager, scheduler are off")
    one(check(A.EKS_CLUSTER, {}, {}, CTX), "api, audit, authenticator, controllerManager, scheduler are off")
    assert check(A.EKS_CLUSTER, {"enabledClusterLogTypes": R.UNKNOWN}, {}, CTX) == []
    assert check(A.LOG_GROUP, {}, {}, CTX) == []


# --- log groups ------------------------------------------------------------------------------------------------


GOOD_GROUP = {"name": "/aws/eks/c/cluster", "kmsKeyId": "<arn:key>", "retentionInDays": 365}


def test_a_log_group_is_encrypted_and_expires():
    check = A.check_log_groups
    assert check(A.LOG_GROUP, GOOD_GROUP, {}, CTX) == []
    one(check(A.LOG_GROUP, {**GOOD_GROUP, "kmsKeyId": None}, {}, CTX), "no kmsKeyId")
    one(check(A.LOG_GROUP, {"name": "/x", "kmsKeyId": "k"}, {}, CTX), "never expire")
    assert check(A.LOG_GROUP, {**GOOD_GROUP, "retentionInDays": 7}, {}, CTX) == []  # not production
    assert check(A.LOG_GROUP, {**GOOD_GROUP, "kmsKeyId": R.UNKNOWN}, {}, CTX) == []  # a key is named, its ARN unknown


def test_a_production_log_group_keeps_a_year_and_is_kept():
    check = A.check_log_groups
    assert check(A.LOG_GROUP, GOOD_GROUP, KEPT, PROD) == []
    assert check(A.LOG_GROUP, {**GOOD_GROUP, "retentionInDays": 0}, KEPT, PROD) == []  # never expires: on purpose
    assert check(A.LOG_GROUP, {**GOOD_GROUP, "retentionInDays": 731.0}, KEPT, PROD) == []  # the wire's float
    one(check(A.LOG_GROUP, {**GOOD_GROUP, "retentionInDays": 90}, KEPT, PROD), "keeps 90 days", "logRetentionDays")
    one(check(A.LOG_GROUP, GOOD_GROUP, {"protect": False, "retain_on_delete": True}, PROD), "lacks protect:")
    one(check(A.LOG_GROUP, GOOD_GROUP, {"protect": True, "retain_on_delete": False}, PROD), "lacks retain_on_delete")
    # CrossGuard passes no retain_on_delete (None): only protect is judged.
    assert check(A.LOG_GROUP, GOOD_GROUP, {"protect": True, "retain_on_delete": None}, PROD) == []
    assert check(A.LOG_GROUP, {**GOOD_GROUP, "retentionInDays": R.UNKNOWN}, KEPT, PROD) == []


# --- KMS key policies -------------------------------------------------------------------------------------------------


def test_a_key_has_an_explicit_policy_that_keeps_the_account_in_charge():
    check = A.check_kms_key_policies
    good = {"enableKeyRotation": True, "policy": key_policy("us-east-1", ACCOUNT, log_group_names=["/g"])}
    assert check(A.KMS_KEY, good, {}, CTX) == []
    one(check(A.KMS_KEY, {"enableKeyRotation": True}, {}, CTX), "gets the default one")
    one(check(A.KMS_KEY, {**good, "enableKeyRotation": False}, {}, CTX), "rotation is off")
    only_logs = json.loads(good["policy"])
    only_logs["Statement"] = only_logs["Statement"][1:]
    one(check(A.KMS_KEY, {**good, "policy": json.dumps(only_logs)}, {}, CTX), "keeps the account root as administrator")
    anyone = {"Version": "2012-10-17", "Statement": [*json.loads(good["policy"])["Statement"],
              {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "kms:Decrypt", "Resource": "*"}]}  # fmt: skip
    one(check(A.KMS_KEY, {**good, "policy": json.dumps(anyone)}, {}, CTX), 'principal "*" without a condition')
    conditioned = json.loads(json.dumps(anyone))
    conditioned["Statement"][-1]["Condition"] = {"StringEquals": {"kms:CallerAccount": ACCOUNT}}
    assert check(A.KMS_KEY, {**good, "policy": json.dumps(conditioned)}, {}, CTX) == []
    one(check(A.KMS_KEY, {**good, "policy": "{not json"}, {}, CTX), "not a JSON policy")
    assert check(A.KMS_KEY, {**good, "policy": R.UNKNOWN}, {}, CTX) == []  # a preview: the role's ARN is not known yet


# --- VPC flow logs and default security groups ---------------------------------------------------------------------


VPC = res(A.VPC, "vpc", {"cidrBlock": "10.0.0.0/16"})


def test_every_vpc_has_a_flow_log():
    flow = res(A.FLOW_LOG, "fl", {"vpcId": "<id:vpc>", "trafficType": "REJECT"})
    assert A.check_vpc_flow_logs([VPC, flow], CTX) == []
    other = res(A.FLOW_LOG, "fl", {"vpcId": "<id:other-vpc>"})
    ((urn, message),) = A.check_vpc_flow_logs([VPC, other], CTX)
    assert urn == VPC["urn"] and "has no flow log" in message
    assert A.check_vpc_flow_logs([flow], CTX) == []  # no VPC of the stack's (an existing one): nothing to judge


def test_every_vpc_adopts_its_default_security_group_with_no_rules():
    closed = res(A.DEFAULT_SECURITY_GROUP, "dsg", {"vpcId": "<id:vpc>"})
    assert A.check_default_security_groups([VPC, closed], CTX) == []
    ((urn, message),) = A.check_default_security_groups([VPC], CTX)
    assert urn == VPC["urn"] and "not adopted" in message
    open_ = res(A.DEFAULT_SECURITY_GROUP, "dsg", {"vpcId": "<id:vpc>", "ingress": [{"protocol": "-1", "self": True, "fromPort": 0, "toPort": 0}]})
    ((urn, message),) = A.check_default_security_groups([VPC, open_], CTX)
    assert urn == open_["urn"] and "has rules" in message
    rule = res(A.SG_RULE_TYPES[0], "in", {"securityGroupId": "<id:dsg>", "ipProtocol": "tcp", "cidrIpv4": "10.0.0.0/8"})
    ((urn, message),) = A.check_default_security_groups([VPC, closed, rule], CTX)
    assert urn == rule["urn"] and "adds a rule to the default security group dsg" in message


# --- the VPC CNI's network policies ---------------------------------------------------------------------------------


def test_the_vpc_cni_enforces_network_policies():
    check = A.check_vpc_cni_network_policy
    cni = {"addonName": "vpc-cni", "addonVersion": "v1.21.1-eksbuild.7"}
    assert check(A.EKS_ADDON, {**cni, "configurationValues": '{"enableNetworkPolicy": "true"}'}, {}, CTX) == []
    one(check(A.EKS_ADDON, cni, {}, CTX), "does not enforce NetworkPolicies")
    one(check(A.EKS_ADDON, {**cni, "configurationValues": '{"enableNetworkPolicy": "false"}'}, {}, CTX), "does not enforce")
    one(check(A.EKS_ADDON, {**cni, "configurationValues": "{"}, {}, CTX), "not JSON")
    assert check(A.EKS_ADDON, {**cni, "configurationValues": R.UNKNOWN}, {}, CTX) == []
    assert check(A.EKS_ADDON, {"addonName": "coredns"}, {}, CTX) == []


# --- the real stacks, and CrossGuard ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_the_stacks_pass_every_aws_rule(stack):
    names = {r["name"] for r in A.RULES}
    doc = repo_stack(stack)
    assert [v for v in check_document(doc) if v.rule in names] == []
    # ... and each rule has something to judge there.
    types = {r["type"] for r in doc["resources"]}
    assert {A.EKS_CLUSTER, A.LOG_GROUP, A.KMS_KEY, A.VPC, A.FLOW_LOG, A.DEFAULT_SECURITY_GROUP, A.EKS_ADDON} <= types


def _opts(protect=False):
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], None)


def _resource(type_, name, props, deps=None):
    return PolicyResource(type_, unknown_checking_proxy(props), f"urn:pulumi:s::p::{type_}::{name}", name, _opts(), None, None, [], deps or {})


def _policy(name):
    return next(p for p in pack.policies() if p.name == name)


def test_crossguard_matches_a_flow_log_to_its_vpc_by_property_dependencies():
    vpc = _resource(A.VPC, "vpc", {"cidrBlock": "10.0.0.0/16"})
    flow = _resource(A.FLOW_LOG, "fl", {"vpcId": UNKNOWN_STRING_VALUE, "trafficType": "REJECT"}, deps={"vpcId": [vpc]})
    reported: list = []
    _policy("vpcs-have-flow-logs").validate(StackValidationArgs([vpc, flow]), lambda m, urn=None: reported.append((urn, m)))
    assert reported == []
    _policy("vpcs-have-flow-logs").validate(StackValidationArgs([vpc]), lambda m, urn=None: reported.append((urn, m)))
    assert [urn for urn, _ in reported] == [vpc.urn]


def test_crossguard_runs_a_resource_rule_with_unknowns():
    reported: list = []
    args = ResourceValidationArgs(A.KMS_KEY, unknown_checking_proxy({"enableKeyRotation": True, "policy": UNKNOWN_STRING_VALUE}),
                                  "urn:pulumi:s::p::k::k", "k", _opts(), None, {})  # fmt: skip
    _policy("kms-keys-explicit-policy").validate(args, lambda m, urn=None: reported.append(m))
    assert reported == []
    args = ResourceValidationArgs(A.KMS_KEY, unknown_checking_proxy({"enableKeyRotation": True}), "urn:pulumi:s::p::k::k", "k", _opts(), None, {})
    _policy("kms-keys-explicit-policy").validate(args, lambda m, urn=None: reported.append(m))
    one(reported, "default one")
