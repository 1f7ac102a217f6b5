"""The deployer's way into the cluster API, per endpoint mode, as plain data.

Pure (no Pulumi, no AWS calls): `components/cluster.py` turns these into the
cluster's `vpc_config`, the security group rules, the SSM bastion and the
exported kubeconfig; the tests check each mode's way in.

Everything `pulumi up` creates through the Kubernetes provider (Helm releases,
the weights volume and claim, the staging Job, the RayCluster) and everything
`pulumi destroy` deletes through it needs the API endpoint, from wherever the
deployer runs (a laptop, a hosted CI runner). The modes (`gpu-serving:cluster.
endpointAccess`, checked in infra/config/stack.py so that none leaves the
deployer out):

- `public-restricted`: public endpoint open only to `deployerCidrs`, private
  endpoint on so the nodes reach the API inside the VPC. The kubeconfig names
  the endpoint itself.
- `private-ssm`: private endpoint only. The stack creates a small bastion in a
  private subnet, managed by SSM (an instance profile with
  AmazonSSMManagedInstanceCore, no inbound rules, no public address), and lets
  it reach the endpoint on 443. The kubeconfig points at
  `https://localhost:<apiTunnelPort>` with `tls-server-name` set to the
  endpoint's host, so the API server's certificate still verifies, and is used
  through `aws ssm start-session --document-name
  AWS-StartPortForwardingSessionToRemoteHost` (the stack output
  `apiTunnelCommand`, and docs/deploying.md's step-by-step). The kubeconfig holds
  nothing of the bastion, so a new bastion leaves the Kubernetes provider as
  it is.
- `private-vpc`: private endpoint only, the deployer runs inside the existing
  VPC (a runner or VPN); `deployerCidrs` get 443 on the cluster security group.

Sources: Amazon EKS User Guide, "Cluster API server endpoint" (public and
private access, CIDR restrictions, and that with public access off the
endpoint's name resolves to private addresses inside the VPC only, so access
from outside needs a bastion, a VPN or a connected network); AWS Systems
Manager User Guide, "Port forwarding using remote host" (the
AWS-StartPortForwardingSessionToRemoteHost document, parameters host,
portNumber, localPortNumber); the kubeconfig's `tls-server-name` field
(Kubernetes client-go `clientcmd/api/v1` Cluster).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Optional, Sequence

from infra.catalog.eks import ENDPOINT_ACCESS_MODES as MODES, PRIVATE_SSM, PRIVATE_VPC, PUBLIC_RESTRICTED


API_PORT = 443
TUNNEL_DOCUMENT = "AWS-StartPortForwardingSessionToRemoteHost"

# The bastion: the smallest current x86 burstable type, the latest AL2023 (its SSM agent is preinstalled),
# resolved by EC2 at launch from the public SSM parameter (EC2 User Guide, "Use a Systems Manager parameter
# instead of an AMI ID" in launch templates).
BASTION_INSTANCE_TYPE = "t3.micro"
BASTION_IMAGE = "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
BASTION_ROOT_DEVICE = "/dev/xvda"  # the AL2023 AMIs' root_device_name (moto's EC2 data, ec2/resources/latest_amis)
BASTION_ROOT_GIB = 8  # the AL2023 AMI's own root size
SSM_POLICY = "AmazonSSMManagedInstanceCore"


def bootstrap_creator_admin(admin_principal_arns: Sequence[str]) -> bool:
    """Whether EKS makes the cluster's creator an admin (`accessConfig.bootstrapClusterCreatorAdminPermissions`).

    Only when no admin principal is given: then whoever runs the first `pulumi up` is the one admin, and
    the Kubernetes provider works as that identity. Once `adminPrincipalArns` lists anyone, they are the
    only admins of a new cluster, and the identity that runs `pulumi up` must be one of them (the
    provider's `aws eks get-token` is that identity; the entries are made through the EKS API, which IAM
    allows, before the provider is used).

    EKS sets this at creation only: botocore's eks model has it in CreateAccessConfigRequest, not in
    UpdateAccessConfigRequest, and the Terraform provider pulumi-aws bridges marks it ForceNew
    (internal/service/eks/cluster.go), so a change would replace the cluster. The component ignores
    changes to it (components/cluster.py `cluster_ignore_changes`): a running cluster keeps the entry
    EKS made for its creator. To remove it, after checking that a listed admin works, delete it by hand:
    `aws eks delete-access-entry --cluster-name <cluster> --principal-arn <creator's role ARN>` (EKS User
    Guide, "Grant IAM users and roles access to Kubernetes APIs": "If you don't want that IAM principal to
    have administrator permissions to the cluster, remove the access entry that Amazon EKS created").
    `aws eks list-access-entries --cluster-name <cluster>` shows it: the entry no access entry resource of
    the stack holds.
    """
    return not admin_principal_arns


def needs_bastion(mode: str) -> bool:
    return mode == PRIVATE_SSM


def endpoint_settings(mode: str, deployer_cidrs: Sequence[str]) -> dict[str, Any]:
    """The cluster's `vpc_config` endpoint fields for `mode` (pulumi_aws argument names).

    Private access is always on (the nodes reach the API inside the VPC); the
    public endpoint only in `public-restricted`, and then only from the CIDRs.
    """
    _check_mode(mode)
    cidrs = list(deployer_cidrs)
    if mode == PUBLIC_RESTRICTED:
        if not cidrs:
            raise ValueError("public-restricted needs deployer CIDRs: a public endpoint open to no one leaves no way in")
        return {"endpoint_private_access": True, "endpoint_public_access": True, "public_access_cidrs": cidrs}
    return {"endpoint_private_access": True, "endpoint_public_access": False, "public_access_cidrs": None}


def cluster_sg_ingress_cidrs(mode: str, deployer_cidrs: Sequence[str]) -> list[str]:
    """CIDRs that get 443 on the cluster security group: the in-VPC deployers of `private-vpc`.

    The public endpoint is not behind the cluster security group, so
    `public-restricted` adds none; `private-ssm` adds a rule from the bastion's
    security group instead (see the component).
    """
    _check_mode(mode)
    return list(deployer_cidrs) if mode == PRIVATE_VPC else []


def cidr_slug(cidr: str) -> str:
    """A resource-name part for a CIDR that does not depend on its position in the list."""
    return re.sub(r"[^0-9a-z]+", "-", cidr.lower()).strip("-") + "-" + hashlib.sha256(cidr.encode()).hexdigest()[:4]


def endpoint_host(endpoint: str) -> str:
    """`https://ABC.gr7.us-east-1.eks.amazonaws.com` -> `ABC.gr7.us-east-1.eks.amazonaws.com`."""
    return re.sub(r"^https?://", "", endpoint).split("/", 1)[0]


def tunnel_command(bastion_id: str, endpoint: str, region: str, local_port: int, *, profile: Optional[str] = None) -> list[str]:
    """The command that opens the API tunnel through the bastion (run it, keep it open while using the cluster)."""
    return [
        "aws", "ssm", "start-session", "--region", region, *(("--profile", profile) if profile else ()),
        "--target", bastion_id, "--document-name", TUNNEL_DOCUMENT,
        "--parameters", f"host={endpoint_host(endpoint)},portNumber={API_PORT},localPortNumber={local_port}",
    ]  # fmt: skip


def kubeconfig_document(
    cluster_name: str,
    endpoint: str,
    ca_data: str,
    region: str,
    *,
    mode: str = PUBLIC_RESTRICTED,
    local_port: Optional[int] = None,
    profile: Optional[str] = None,
) -> dict[str, Any]:
    """A kubeconfig for `mode` that gets a token from `aws eks get-token` (the AWS CLI must be installed).

    It holds only what lasts as long as the cluster: the server (the endpoint, or for
    `private-ssm` the local end of the tunnel, `local_port`, with `tls-server-name` the
    endpoint's host, the name on the API server's certificate), the CA, and the exec
    command with the region and, when set, the profile. Nothing of the bastion: the
    Kubernetes provider is configured with this document, and pulumi-kubernetes replaces a
    provider whose kubeconfig cluster changes, and with it every object it manages
    (Helm releases, the weights volume, the RayCluster). A new bastion must not do that;
    its tunnel command is a stack output of its own (`tunnel_command`).
    """
    _check_mode(mode)
    cluster: dict[str, Any] = {"server": endpoint, "certificate-authority-data": ca_data}
    if mode == PRIVATE_SSM:
        if local_port is None:
            raise ValueError("a private-ssm kubeconfig needs the tunnel's local port")
        cluster = {
            "server": f"https://localhost:{local_port}",
            "tls-server-name": endpoint_host(endpoint),
            "certificate-authority-data": ca_data,
        }
    args = ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json"]
    if profile:
        args += ["--profile", profile]  # aws eks get-token takes the AWS CLI's global --profile
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": cluster}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "preferences": {},
        "users": [
            {
                "name": cluster_name,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "aws",
                        "args": args,
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
    }


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown endpoint access mode {mode!r}; known: {', '.join(MODES)}")
