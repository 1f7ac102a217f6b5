"""Pre-flight check 12 (infra/ops/preflight.py's module doc): whoever runs `pulumi up` can administer the cluster.

With `gpu-serving:cluster.adminPrincipalArns` given, a new cluster has exactly those admins: EKS does not make its
creator one (infra/aws/access.py, `bootstrap_creator_admin`), and the stack's Kubernetes provider authenticates as
the identity that runs `pulumi up` (`aws eks get-token`). A caller that is not listed would create the cluster and
then be refused by it, with everything Kubernetes left undeployed. STS GetCallerIdentity names the caller: an IAM
user's ARN, or for a role the session's `arn:<partition>:sts::<account>:assumed-role/<role name>/<session>`, which
keeps the role's name but not its path (IAM user guide, "IAM identifiers", "Unique identifiers" and ARNs of
assumed-role sessions); a role matches a listed `arn:<partition>:iam::<account>:role/<path><role name>` by account
and name.
"""

from __future__ import annotations

from typing import Any, Optional

from infra.ops import aws
from infra.ops.preflight import Check, Target

NAME = "cluster admin access"


def principal_key(arn: str) -> Optional[tuple[str, str, str]]:
    """(account, "role" | "user", name) of an IAM role or user ARN, or of an STS assumed-role session; None otherwise."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn":
        return None
    service, account, resource = parts[2], parts[4], parts[5]
    if service == "sts" and resource.startswith("assumed-role/"):
        return account, "role", resource.split("/")[1]
    # An IAM user's caller ARN is its IAM ARN (moto writes it under `sts`: taken alike).
    if service == "iam" and resource.startswith("role/") or service in ("iam", "sts") and resource.startswith("user/"):
        kind, _, rest = resource.partition("/")
        return account, kind, rest.rsplit("/", 1)[-1]  # the name after any path
    return None


def check_admin_access(sts: Any, t: Target) -> Check:
    if not t.admin_principal_arns:
        return Check(NAME, True, "no adminPrincipalArns: whoever runs the first `pulumi up` is the cluster's admin")
    fix = ("add the role or user that runs `pulumi up` to gpu-serving:cluster.adminPrincipalArns (or run it as one "
           "of them)")  # fmt: skip
    try:
        caller = sts.get_caller_identity()["Arn"]
    except Exception as exc:  # noqa: BLE001 - every AWS failure becomes the check's answer
        return Check(NAME, None, f"STS GetCallerIdentity failed: {aws.error_text(exc, limit=200)}", fix)
    key = principal_key(caller)
    listed = {principal_key(a) for a in t.admin_principal_arns}
    if key is not None and key in listed:
        return Check(NAME, True, f"{caller} is among adminPrincipalArns")
    return Check(NAME, False, f"{caller} is not among adminPrincipalArns ({', '.join(t.admin_principal_arns)}): a new "
                              "cluster would refuse the Kubernetes provider, which runs as the caller", fix)  # fmt: skip
