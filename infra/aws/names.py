"""Names AWS limits in length and characters, built from the stack name so they fit for any stack name.

Every AWS name the program sets or has Pulumi make comes from three strings (components/stack.py):

- `cluster_name`: the EKS cluster, `<project>-<stack>`, which also names the control-plane log group
  (`/aws/eks/<cluster>/cluster`), the secrets key's alias (`alias/eks/<cluster>`) and the image repository;
- `resource_prefix`: the start of every Pulumi resource name. A resource given no name of its own
  (IAM roles, role policies and instance profiles, launch templates, node groups, security groups, the
  placement group, the EFS creation token) is named by Pulumi after it: the resource name, "-" and 7 random
  hex digits (pulumi-terraform-bridge `AutoName`; pulumi-aws, provider/resource_overrides.go and autonaming.go,
  caps the IAM role's at 64 and the others at 255, so only the role's limit is checked before AWS sees a name);
- `image_repository_name`: the ECR repository of the serving image, `<cluster>/vllm`.

Each function returns its name unchanged when AWS accepts it, so a running stack's names never change.
Otherwise it returns an accepted name: the refused characters turned into "-", cut to the limit, then "-" and
8 hex digits of the SHA-256 of the whole name it replaces, so two stack names never share a name, however
long a start they share.

Stack names: Pulumi accepts at most 100 characters, each a letter, digit, "-", "_" or "." (the CLI's message:
"stack names are limited to 100 characters and may only contain alphanumeric, hyphens, underscores, or
periods"; pulumi/pulumi pkg/backend/diy, ParseReference). `STACK_NAME` is that rule; the tests draw from it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")  # what `pulumi stack init` accepts (module docstring)

PULUMI_SUFFIX = 8  # what Pulumi's auto-naming appends: "-" and 7 random hex digits
HASH_LENGTH = 8  # hex digits of the SHA-256 a shortened name ends with


@dataclass(frozen=True)
class Limit:
    """What AWS accepts as a name of one kind: `min` to `max` characters, all of them matching `pattern`."""

    max: int
    pattern: str  # matched against the whole name (re.fullmatch, ASCII)
    source: str  # botocore's service model (venv/.../botocore/data/<service>/<version>/service-2.json)
    min: int = 1

    def accepts(self, name: str) -> bool:
        return self.min <= len(name) <= self.max and re.fullmatch(self.pattern, name, re.ASCII) is not None


# Where botocore gives a shape's min, max and pattern, they are copied here as they are; where the request
# member is a plain String, the limit is the one its documentation (or the provider) states, and says so.
LIMITS: dict[str, Limit] = {
    "eks-cluster": Limit(100, r"^[0-9A-Za-z][A-Za-z0-9\-_]*", "eks 2017-11-01, shape ClusterName"),
    # botocore: CreateNodegroupRequest.nodegroupName is shape String (no limit); 63 is what the provider
    # checks (terraform-provider-aws internal/service/eks/node_group.go, node_group_name: StringLenBetween(0, 63))
    # and the characters are the cluster name's (EKS User Guide, "Create a managed node group").
    "eks-node-group": Limit(63, r"[0-9A-Za-z][A-Za-z0-9\-_]*", "eks CreateNodegroupRequest.nodegroupName (String); see comment"),
    "iam-role": Limit(64, r"[\w+=,.@-]+", "iam 2010-05-08, shape roleNameType"),
    "iam-role-policy": Limit(128, r"[\w+=,.@-]+", "iam 2010-05-08, shape policyNameType"),
    "iam-instance-profile": Limit(128, r"[\w+=,.@-]+", "iam 2010-05-08, shape instanceProfileNameType"),
    "launch-template": Limit(128, r"[a-zA-Z0-9\(\)\.\-/_]+", "ec2 2016-11-15, shape LaunchTemplateName", min=3),
    # botocore: shape String; the member's documentation: "Up to 255 characters in length. Can't start with sg-.
    # Valid characters: a-z, A-Z, 0-9, spaces, and ._-:/()#,@[]+=&;{}!$*".
    "security-group": Limit(255, r"(?!sg-)[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]+", "ec2 CreateSecurityGroupRequest.GroupName (documentation)"),
    # botocore: shape PlacementGroupName (no limit); CreatePlacementGroupRequest.GroupName's documentation:
    # "Up to 255 ASCII characters".
    "placement-group": Limit(255, r"[\x20-\x7e]+", "ec2 CreatePlacementGroupRequest.GroupName (documentation)"),
    "log-group": Limit(512, r"[\.\-_/#A-Za-z0-9]+", "logs 2014-03-28, shape LogGroupName"),
    "kms-alias": Limit(256, r"^[a-zA-Z0-9:/_-]+$", "kms 2014-11-01, shape AliasNameType"),
    "ecr-repository": Limit(
        256, r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(\/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*",
        "ecr 2015-09-21, shape RepositoryName", min=2,
    ),
    "efs-creation-token": Limit(64, r".+", "efs 2015-02-01, shape CreationToken"),
}  # fmt: skip

# The longest name a component appends to the prefix before Pulumi's suffix, in the strictest kind: the CSI
# drivers' Pod Identity roles (components/cluster.py, f"{name}-{driver.addon}-role"). So the prefix may have
# 64 - 8 - 24 = 32 characters; tests/test_names.py checks every auto-name of the synthesized stack against LIMITS.
LONGEST_ROLE_SUFFIX = "-aws-efs-csi-driver-role"
PREFIX_MAX = LIMITS["iam-role"].max - PULUMI_SUFFIX - len(LONGEST_ROLE_SUFFIX)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # refused by an EKS name; every other kind here accepts the rest


def short_hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:HASH_LENGTH]


def shortened(name: str, max_length: int) -> str:
    """`name` with its unsafe characters made "-", cut so that "-" and its hash fit in `max_length`."""
    head = _UNSAFE.sub("-", name)[: max_length - HASH_LENGTH - 1].rstrip("-_")
    return f"{head}-{short_hash(name)}"


def fit(name: str, kind: str, max_length: int | None = None) -> str:
    """`name` when AWS accepts it as a `kind` name (and it has at most `max_length` characters), else `shortened`."""
    limit = LIMITS[kind]
    longest = limit.max if max_length is None else min(max_length, limit.max)
    return name if limit.accepts(name) and len(name) <= longest else shortened(name, longest)


def cluster_name(project: str, stack: str) -> str:
    """The EKS cluster: `<project>-<stack>`, made to fit (a stack name may hold "." and 100 characters)."""
    return fit(f"{project}-{stack}", "eks-cluster")


def resource_prefix(cluster: str) -> str:
    """The start of every Pulumi resource name: the cluster name, while what Pulumi names after it fits."""
    return fit(cluster, "eks-cluster", PREFIX_MAX)


def auto_name(resource_name: str) -> str:
    """The name Pulumi gives a resource it names: `<resource name>-<7 random hex digits>` (here "0000000")."""
    return f"{resource_name}-{'0' * (PULUMI_SUFFIX - 1)}"


def image_repository_name(cluster: str, image: str = "vllm") -> str:
    """The ECR repository of an image: `<cluster>/<image>`, in lower case when the cluster name is not
    (shape RepositoryName takes lower-case letters, digits and single separators only)."""
    name = f"{cluster}/{image}"
    if LIMITS["ecr-repository"].accepts(name):
        return name
    room = LIMITS["ecr-repository"].max - len(f"/{image}") - HASH_LENGTH - 1
    head = re.sub(r"[^a-z0-9]+", "-", cluster.lower())[:room].strip("-")
    return f"{head}-{short_hash(name)}/{image}"
