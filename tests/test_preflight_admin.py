"""Pre-flight check 12 (infra/ops/preflight_admin.py): with adminPrincipalArns given, the caller is one of them.

Against a real moto server: STS GetCallerIdentity as moto answers it (its default user, and an assumed-role
session after IAM CreateRole and STS AssumeRole, whose ARN keeps the role's name but not its path).
"""

from __future__ import annotations

import dataclasses
import json

import boto3

from infra.catalog.instances import get_instance_type
from infra.ops import preflight as pf
from infra.ops import preflight_admin as pfa
from tests.moto_server import REGION, aws, moto_server  # noqa: F401  (pytest fixtures)

ACCOUNT = "123456789012"  # moto's default account
TRUST = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                                                  "Action": "sts:AssumeRole"}]}  # fmt: skip


def _target(*admins: str) -> pf.Target:
    return pf.Target(stack="prod", region=REGION, instance=get_instance_type("p5.48xlarge"), nodes=4, zone=f"{REGION}a",
                     capacity_type="on-demand", reservation_id=None, kubernetes_version="1.35", admin_principal_arns=admins)  # fmt: skip


def test_no_admin_principals_means_the_creator_is_the_admin():
    check = pfa.check_admin_access(None, _target())  # nothing to ask
    assert check.ok is True and "first `pulumi up`" in check.detail


def test_the_caller_must_be_listed(aws):
    sts = boto3.client("sts", region_name=REGION)
    caller = sts.get_caller_identity()["Arn"]
    refused = pfa.check_admin_access(sts, _target(f"arn:aws:iam::{ACCOUNT}:role/platform-admin"))
    assert refused.ok is False and caller in refused.detail and "adminPrincipalArns" in refused.fix
    user = f"arn:aws:iam::{ACCOUNT}:user/{caller.rsplit('/', 1)[-1]}"  # the caller, as adminPrincipalArns names a user
    assert pfa.check_admin_access(sts, _target(f"arn:aws:iam::{ACCOUNT}:role/platform-admin", user)).ok is True


def test_an_assumed_role_matches_its_role_whatever_the_path(aws):
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(RoleName="deployer", Path="/ci/", AssumeRolePolicyDocument=json.dumps(TRUST))["Role"]
    creds = boto3.client("sts", region_name=REGION).assume_role(RoleArn=role["Arn"], RoleSessionName="pulumi-up")["Credentials"]
    session_sts = boto3.client("sts", region_name=REGION, aws_access_key_id=creds["AccessKeyId"],
                               aws_secret_access_key=creds["SecretAccessKey"], aws_session_token=creds["SessionToken"])  # fmt: skip
    caller = session_sts.get_caller_identity()["Arn"]
    assert caller.startswith(f"arn:aws:sts::{ACCOUNT}:assumed-role/deployer/")  # the path is gone from the session's ARN
    t = _target(role["Arn"])
    assert role["Arn"] == f"arn:aws:iam::{ACCOUNT}:role/ci/deployer"
    assert pfa.check_admin_access(session_sts, t).ok is True
    # The same name in another account, or a user of that name, is someone else.
    assert pfa.check_admin_access(session_sts, dataclasses.replace(t, admin_principal_arns=("arn:aws:iam::210987654321:role/deployer",))).ok is False
    assert pfa.check_admin_access(session_sts, dataclasses.replace(t, admin_principal_arns=(f"arn:aws:iam::{ACCOUNT}:user/deployer",))).ok is False


def test_principal_keys():
    assert pfa.principal_key("arn:aws:iam::123456789012:role/a/b/ops") == ("123456789012", "role", "ops")
    assert pfa.principal_key("arn:aws-us-gov:sts::123456789012:assumed-role/ops/s") == ("123456789012", "role", "ops")
    assert pfa.principal_key("arn:aws:iam::123456789012:user/alice") == ("123456789012", "user", "alice")
    assert pfa.principal_key("arn:aws:iam::123456789012:group/admins") is None
    assert pfa.principal_key("not-an-arn") is None
