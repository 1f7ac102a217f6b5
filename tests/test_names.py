"""Names AWS limits stay within the limit for any valid stack name (infra/aws/names.py).

Two ways: the pure functions over every stack name Pulumi accepts and every name `python -m infra ephemeral`
makes; and the whole program, synthesized under the recording engine with such a stack name, where every AWS
resource's name (the one the program sets, or the one Pulumi makes from the resource name) is checked against
the limit botocore gives (`names.LIMITS`). Names of the existing stacks do not change.
"""

from __future__ import annotations

import importlib
import inspect
import json
import runpy
import string
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from components.cluster import control_plane_log_group
from components.network import flow_log_group_name
from infra.aws import names
from infra.aws.tags import cluster_name
from infra.config import PROJECT, engine_config
from infra.ops.ephemeral.naming import stack_name as ephemeral_stack_name
from infra.preview.recording import Recording, record

REPO = Path(__file__).resolve().parent.parent

# Every name `pulumi stack init` accepts (names.STACK_NAME), long ones drawn on purpose too.
STACK_CHARS = string.ascii_letters + string.digits + "-_."
STACK_NAMES = st.one_of(
    st.from_regex(names.STACK_NAME, fullmatch=True),
    st.text(STACK_CHARS, min_size=60, max_size=100),
)
# The names infra/ops/ephemeral gives its stacks: in GitHub Actions (run id, attempt) and elsewhere (8 hex digits).
EPHEMERAL_NAMES = st.one_of(
    st.builds(
        lambda run, attempt: ephemeral_stack_name({"GITHUB_RUN_ID": str(run), "GITHUB_RUN_ATTEMPT": str(attempt)}),
        st.integers(0, 2**63 - 1),
        st.integers(1, 999),
    ),
    st.builds(lambda n: ephemeral_stack_name({}, token=lambda k: f"{n:0{2 * k}x}"), st.integers(0, 2**32 - 1)),
)
ANY_STACK = st.one_of(STACK_NAMES, EPHEMERAL_NAMES)

LONG = "x" * 100  # the longest stack name


def accepted(kind: str, name: str) -> bool:
    return names.LIMITS[kind].accepts(name)


# --- the pure functions --------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(ANY_STACK)
@example(LONG)
@example("a" * 88)  # the longest whose cluster name is <project>-<stack> unchanged
@example("A" * 99 + ".")
@example("prod" + "-" * 96)
@example("_")
@example(".")
@example("a..b")
@example("Prod")
def test_names_built_from_any_stack_name_fit(stack):
    assert names.STACK_NAME.fullmatch(stack)
    cluster = cluster_name(PROJECT, stack)
    prefix = names.resource_prefix(cluster)
    assert accepted("eks-cluster", cluster), cluster
    assert accepted("eks-cluster", prefix) and accepted("eks-node-group", prefix), prefix
    assert len(prefix) <= names.PREFIX_MAX
    # The longest name Pulumi makes after the prefix, in the strictest kind (the CSI drivers' roles).
    assert accepted("iam-role", names.auto_name(prefix + names.LONGEST_ROLE_SUFFIX))
    assert accepted("ecr-repository", names.image_repository_name(cluster))
    assert accepted("kms-alias", f"alias/eks/{cluster}")  # components/cluster.py, the secrets key's alias
    assert accepted("log-group", control_plane_log_group(cluster))
    assert accepted("log-group", flow_log_group_name(prefix))
    # What fits stays as it is: a stack that could be deployed keeps every name.
    if accepted("eks-cluster", f"{PROJECT}-{stack}"):
        assert cluster == f"{PROJECT}-{stack}"
    if len(cluster) <= names.PREFIX_MAX:
        assert prefix == cluster


@settings(max_examples=200, deadline=None)
@given(EPHEMERAL_NAMES)
def test_ephemeral_stacks_keep_the_plain_cluster_name(stack):
    """The leak sweeper finds an ephemeral stack's leftovers by the cluster name `gpu-serving-eph-...`."""
    assert cluster_name(PROJECT, stack) == f"{PROJECT}-{stack}"


@pytest.mark.parametrize("stack", ["prod", "test", "eph-3q5v8k2-1", "eph-0a1b2c3d", "twenty-chars-stack-a"])
def test_the_names_of_stacks_that_fit_do_not_change(stack):
    cluster = f"gpu-serving-{stack}"
    assert cluster_name(PROJECT, stack) == cluster
    assert cluster_name(PROJECT, f"org/gpu-serving/{stack}") == cluster  # a fully qualified stack name
    assert names.resource_prefix(cluster) == cluster
    assert names.image_repository_name(cluster) == f"{cluster}/vllm"


def test_a_stack_name_that_does_not_fit_gets_a_shortened_name_with_its_hash():
    cluster = cluster_name(PROJECT, LONG)
    assert cluster == f"gpu-serving-{'x' * 79}-{names.short_hash('gpu-serving-' + LONG)}"
    assert len(cluster) == 100
    assert names.resource_prefix(cluster) == f"gpu-serving-xxxxxxxxxxx-{names.short_hash(cluster)}"
    # "." is no EKS name character; upper case is no ECR one.
    assert cluster_name(PROJECT, "a.b") == f"gpu-serving-a-b-{names.short_hash('gpu-serving-a.b')}"
    assert names.image_repository_name("gpu-serving-Prod") == f"gpu-serving-prod-{names.short_hash('gpu-serving-Prod/vllm')}/vllm"


@settings(max_examples=200, deadline=None)
@given(st.text(STACK_CHARS, min_size=70, max_size=99), st.sampled_from(STACK_CHARS), st.sampled_from(STACK_CHARS))
def test_two_long_stack_names_never_share_a_name(common, a, b):
    if a == b:
        return
    one, two = common + a, common + b
    c1, c2 = cluster_name(PROJECT, one), cluster_name(PROJECT, two)
    assert c1 != c2
    assert names.resource_prefix(c1) != names.resource_prefix(c2)
    assert names.image_repository_name(c1) != names.image_repository_name(c2)


def test_stack_names_differing_only_where_aws_refuses_a_character_stay_apart():
    assert cluster_name(PROJECT, "a.b") != cluster_name(PROJECT, "a-b")
    assert names.image_repository_name("gpu-serving-A") != names.image_repository_name("gpu-serving-a")


# --- the whole program ------------------------------------------------------------------------------------

# Resource types with a name AWS limits: the input that holds it (absent: Pulumi makes it), and its kind.
NAMED = {
    "aws:eks/cluster:Cluster": ("name", "eks-cluster"),
    "aws:eks/nodeGroup:NodeGroup": ("nodeGroupName", "eks-node-group"),
    "aws:iam/role:Role": ("name", "iam-role"),
    "aws:iam/rolePolicy:RolePolicy": ("name", "iam-role-policy"),
    "aws:iam/instanceProfile:InstanceProfile": ("name", "iam-instance-profile"),
    "aws:ec2/launchTemplate:LaunchTemplate": ("name", "launch-template"),
    "aws:ec2/securityGroup:SecurityGroup": ("name", "security-group"),
    "aws:ec2/placementGroup:PlacementGroup": ("name", "placement-group"),
    "aws:cloudwatch/logGroup:LogGroup": ("name", "log-group"),
    "aws:kms/alias:Alias": ("name", "kms-alias"),
    "aws:ecr/repository:Repository": ("name", "ecr-repository"),
    "aws:efs/fileSystem:FileSystem": ("creationToken", "efs-creation-token"),
}
# The stack's other AWS types: none has a name input (checked below against the SDK).
UNNAMED = {
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup", "aws:ec2/eip:Eip", "aws:ec2/flowLog:FlowLog",
    "aws:ec2/instance:Instance", "aws:ec2/internetGateway:InternetGateway", "aws:ec2/natGateway:NatGateway",
    "aws:ec2/route:Route", "aws:ec2/routeTable:RouteTable", "aws:ec2/routeTableAssociation:RouteTableAssociation",
    "aws:ec2/subnet:Subnet", "aws:ec2/vpc:Vpc", "aws:ec2/vpcEndpoint:VpcEndpoint", "aws:efs/mountTarget:MountTarget",
    "aws:efs/accessPoint:AccessPoint", "aws:efs/fileSystemPolicy:FileSystemPolicy",
    "aws:eks/addon:Addon", "aws:eks/podIdentityAssociation:PodIdentityAssociation", "aws:eks/accessEntry:AccessEntry",
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation", "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment", "aws:kms/key:Key",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
}  # fmt: skip


def _with(config: dict[str, str], area: str, **changes) -> dict[str, str]:
    out = dict(config)
    value = json.loads(out.get(f"{PROJECT}:{area}", "{}"))
    value.update(changes)
    out[f"{PROJECT}:{area}"] = json.dumps(value)
    return out


# The stack files, and prod with everything that adds a named resource: a Capacity Block node group (named
# after the block), FSx with its CSI driver (a second Pod Identity role), an S3 source (the staging role).
CONFIGS = {
    "test": lambda: engine_config("test", REPO),
    "prod": lambda: engine_config("prod", REPO),
    "prod-block-fsx-s3": lambda: _with(
        _with(
            _with(engine_config("prod", REPO), "gpu", capacity={"type": "capacity-block", "reservationId": "cr-0123456789abcdef0"}),
            "storage", type="fsx", source="s3", s3Uri="s3://weights-bucket/models/checkpoint",
        ),
        "cluster", fsxCsi=True,
    ),
}  # fmt: skip


def synthesize(stack: str, config: str) -> Recording:
    return record(lambda: runpy.run_path(str(REPO), run_name="__main__"), stack=stack, config=CONFIGS[config]())


def aws_names(rec: Recording) -> dict[tuple[str, str], tuple[str, Optional[str]]]:
    """(type, resource name) -> (kind, the AWS name: the program's, or the one Pulumi makes)."""
    out = {}
    for r in rec.resources:
        if not r.type.startswith("aws:") or r.type in UNNAMED:
            continue
        assert r.type in NAMED, f"{r.type} ({r.name}): add it to NAMED (with its limit in names.LIMITS) or UNNAMED"
        field, kind = NAMED[r.type]
        out[(r.type, r.name)] = (kind, r.inputs.get(field) or names.auto_name(r.name))
    return out


def assert_all_fit(rec: Recording) -> None:
    found = aws_names(rec)
    assert found
    for (typ, resource), (kind, name) in found.items():
        assert accepted(kind, name), f"{typ} {resource}: {name!r} ({len(name)} characters) is no {kind} name: {names.LIMITS[kind]}"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_STACK)
@example(LONG)
@example("My.Stack_-" * 10)
def test_every_aws_name_of_the_synthesized_stack_fits(stack):
    assert_all_fit(synthesize(stack, "test"))


@pytest.mark.parametrize("config", ["prod", "prod-block-fsx-s3"])
@pytest.mark.parametrize("stack", [LONG, "Z.9_" * 25])
def test_every_aws_name_of_the_largest_stacks_fits(config, stack):
    rec = synthesize(stack, config)
    assert_all_fit(rec)
    if config == "prod-block-fsx-s3":  # the variant did add its named resources
        prefix = names.resource_prefix(cluster_name(PROJECT, stack))
        roles = {r.name for r in rec.of_type("aws:iam/role:Role")}
        # The FSx CSI driver has no role (its volumes are static: components/cluster.py); the S3 staging Job has one.
        assert f"{prefix}-weights-staging-role" in roles and f"{prefix}-aws-fsx-csi-driver-role" not in roles


def test_unnamed_types_have_no_name_input():
    for token in UNNAMED:
        module, cls = token.split(":")[1].split("/")[0], token.split(":")[2]
        params = inspect.signature(getattr(importlib.import_module(f"pulumi_aws.{module}"), cls)._internal_init).parameters
        assert not [p for p in params if p in ("name", "name_prefix", "creation_token") or p.endswith("_name_prefix")], token


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_todays_names_of_prod_and_test_are_unchanged(stack):
    found = {(typ.split(":")[-1], resource, name) for (typ, resource), (_, name) in aws_names(synthesize(stack, stack)).items()}
    p = f"gpu-serving-{stack}"
    auto = names.auto_name
    expected = {
        ("Cluster", f"{p}-eks", p),
        ("Alias", f"{p}-secrets-alias", f"alias/eks/{p}"),
        ("LogGroup", f"{p}-control-plane-logs", f"/aws/eks/{p}/cluster"),
        ("LogGroup", f"{p}-flow-logs", f"/aws/vpc/{p}/flow-logs"),
        ("Repository", f"{p}-vllm", f"{p}/vllm"),
        *(("Role", n, auto(n)) for n in (f"{p}-cluster-role", f"{p}-node-role", f"{p}-bastion-role", f"{p}-aws-efs-csi-driver-role", f"{p}-aws-ebs-csi-driver-role", f"{p}-flow-logs-role", f"{p}-vpc-cni-role")),
        *(("RolePolicy", n, auto(n)) for n in (f"{p}-cluster-encryption", f"{p}-flow-logs-publish")),
        ("InstanceProfile", f"{p}-bastion-profile", auto(f"{p}-bastion-profile")),
        *(("LaunchTemplate", n, auto(n)) for n in (f"{p}-system-lt", f"{p}-bastion-lt", f"{p}-gpu-lt")),
        *(("NodeGroup", n, auto(n)) for n in (f"{p}-system", f"{p}-gpu-ng")),
        *(("SecurityGroup", n, auto(n)) for n in (f"{p}-efa", f"{p}-bastion-sg", f"{p}-weights-efs-sg")),
        ("PlacementGroup", f"{p}-gpu", auto(f"{p}-gpu")),
        ("FileSystem", f"{p}-weights-efs", auto(f"{p}-weights-efs")),
    }  # fmt: skip
    assert found == expected, (found - expected, expected - found)


def test_two_long_stack_names_give_the_synthesized_stacks_different_names():
    one, two = ("q" * 99 + "1", "q" * 99 + "2")
    first = {name for _, name in aws_names(synthesize(one, "test")).values()}
    second = {name for _, name in aws_names(synthesize(two, "test")).values()}
    assert first.isdisjoint(second)
