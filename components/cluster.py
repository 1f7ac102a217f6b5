"""The EKS cluster: control plane, IAM, add-ons, a small system node group, access.

One `EksCluster` component (`gpu-serving:cluster:EksCluster`) creates:

- the cluster IAM role (AmazonEKSClusterPolicy, plus an inline policy letting it
  use the secrets key, as terraform-aws-eks does);
- a KMS key with yearly rotation (and an alias) for envelope encryption of
  Kubernetes secrets;
- the control-plane log group (`/aws/eks/<cluster>/cluster`) with a retention,
  created before the cluster so EKS does not create one that never expires and
  outlives the stack;
- the cluster: authentication through the EKS API only (access entries, no
  aws-auth ConfigMap); api, audit and authenticator logs; a private endpoint,
  public only from the CIDRs given; no self-managed add-ons (the managed ones
  below are ours);
- one node IAM role for every node group (the GPU node groups use it too);
- managed add-ons: vpc-cni (a pinned version that supports `efa-only`
  interfaces), kube-proxy and eks-pod-identity-agent before any node (a node
  without a CNI never becomes Ready, so its node group would never finish), then
  coredns and the EFS CSI driver (and the FSx CSI driver when asked), whose pods
  need a node to run on; each CSI driver's controller gets its IAM role through
  EKS Pod Identity;
- a small on-demand system node group (AL2023 x86_64) for operators and add-ons;
- access entries with the cluster-admin access policy for the given principals;
- a kubeconfig (exec auth through `aws eks get-token`), exported as a secret,
  and a Kubernetes provider built from it for the next layer (`k8s_provider`).

Resource options that matter are computed by the small functions below
(`cluster_ignore_changes`, `ADDONS_BEFORE_NODES`, ...) and tested directly.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.aws.iam import assume_role_policy, key_use_policy, managed_policy_arn, node_policies, partition_of
from infra.errors import UserError
from infra.k8s.scheduling import system_labels

TYPE = "gpu-serving:cluster:EksCluster"

AUTHENTICATION_MODE = "API"  # access entries only; the aws-auth ConfigMap is not read
LOG_TYPES = ("api", "audit", "authenticator")
ENCRYPTED_RESOURCES = ("secrets",)
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
SYSTEM_CAPACITY_TYPE = "ON_DEMAND"
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"

# vpc-cni: `efa-only` network interfaces need VPC CNI >= 1.18.4 (EKS User Guide,
# "Manage EFA devices on Amazon EKS": efa-only interfaces).
# v1.21.1-eksbuild.7 is the version the EKS user guide lists as the latest for
# Kubernetes 1.29 to 1.35 ("Amazon VPC CNI versions" table in
# https://docs.amazonaws.cn/eks/latest/userguide/managing-vpc-cni.md); the
# table for 1.28-1.34 a release earlier listed v1.20.4-eksbuild.1.
VPC_CNI_VERSION = "v1.21.1-eksbuild.7"
VPC_CNI_MIN_EFA_ONLY = (1, 18, 4)

# Add-ons that must be running before a node can become Ready: without a CNI the
# kubelet reports NetworkPluginNotReady and an EKS managed node group never
# finishes creating. The pod identity agent is a DaemonSet that must be on each
# node before a pod using Pod Identity starts. (terraform-aws-eks calls this
# `before_compute`.)
ADDONS_BEFORE_NODES = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
# Add-ons whose pods need a node to schedule on: creating them before any node
# exists leaves them DEGRADED and the create times out.
ADDONS_AFTER_NODES = ("coredns", "aws-efs-csi-driver")
FSX_CSI_ADDON = "aws-fsx-csi-driver"

# Log retention values CloudWatch Logs accepts (PutRetentionPolicy; 0 = never expire).
LOG_RETENTION_DAYS = (0, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)


@dataclass(frozen=True)
class CsiDriver:
    """A CSI driver add-on whose controller gets an IAM role through EKS Pod Identity."""

    addon: str
    namespace: str
    service_account: str
    policy: str  # AWS managed policy path under arn:<partition>:iam::aws:policy/


# EKS user guide, "Amazon EFS CSI driver": AmazonEFSCSIDriverPolicy for efs-csi-controller-sa.
EFS_CSI = CsiDriver("aws-efs-csi-driver", "kube-system", "efs-csi-controller-sa", "service-role/AmazonEFSCSIDriverPolicy")
# EKS user guide, "Deploy the FSx for Lustre driver": AmazonFSxFullAccess for fsx-csi-controller-sa.
FSX_CSI = CsiDriver(FSX_CSI_ADDON, "kube-system", "fsx-csi-controller-sa", "AmazonFSxFullAccess")


@dataclass(frozen=True)
class ClusterArgs:
    """What the cluster needs. Validated when built (a `UserError` says what is wrong).

    `public_access_cidrs`: empty = the API endpoint is reachable only from inside
    the VPC; otherwise it is public, limited to exactly these CIDRs (0.0.0.0/0
    only if written here). `admin_principal_arns` get cluster-admin through
    access entries; do not list the identity that runs `pulumi up`: it is
    already admin (bootstrap_cluster_creator_admin_permissions) and EKS rejects
    a second entry for it.
    """

    version: str
    vpc_id: pulumi.Input[str]  # not sent to EKS (it derives the VPC from the subnets); exposed for the next layer
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    region: str
    public_access_cidrs: tuple[str, ...] = ()
    admin_principal_arns: tuple[str, ...] = ()
    system_instance_type: str = "m7i.xlarge"
    system_node_count: int = 2
    system_subnet_ids: Optional[pulumi.Input[Sequence[pulumi.Input[str]]]] = None  # None: subnet_ids
    enable_fsx_csi: bool = False
    protect: bool = False
    cluster_name: Optional[str] = None  # None: the component's name (must match the network's subnet tags)
    vpc_cni_version: str = VPC_CNI_VERSION
    node_ssm_access: bool = False  # AmazonSSMManagedInstanceCore on the node role (shell on nodes without SSH)
    log_retention_days: int = 90
    tags: dict[str, str] = field(default_factory=dict)  # extra tags on top of the provider's default tags

    def __post_init__(self) -> None:
        object.__setattr__(self, "public_access_cidrs", tuple(self.public_access_cidrs))
        object.__setattr__(self, "admin_principal_arns", tuple(self.admin_principal_arns))
        validate_cluster_args(self)


# Access entries take IAM role or user ARNs (not STS assumed-role session ARNs).
_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/.+$")


def validate_cluster_args(args: ClusterArgs) -> None:
    if not re.fullmatch(r"1\.\d{2}", args.version):
        raise UserError(f"cluster: Kubernetes version {args.version!r} should look like 1.33")
    if args.system_node_count < 1:
        raise UserError(f"cluster: system_node_count is {args.system_node_count}; coredns and the CSI controllers need at least 1 node")
    for cidr in args.public_access_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise UserError(f"cluster: public access CIDR {cidr!r} is not a network address ({exc})") from exc
    for arn in args.admin_principal_arns:
        if not _ARN.match(arn):
            raise UserError(f"cluster: admin principal {arn!r} is not an IAM role or user ARN (arn:aws:iam::<account>:role/<name>)")
    if len(set(args.admin_principal_arns)) != len(args.admin_principal_arns):
        raise UserError("cluster: an admin principal ARN is listed twice")
    if args.log_retention_days not in LOG_RETENTION_DAYS:
        raise UserError(f"cluster: log_retention_days {args.log_retention_days} is not one CloudWatch accepts: {LOG_RETENTION_DAYS}")
    check_vpc_cni_version(args.vpc_cni_version)


# ---- pure helpers (tested directly) -------------------------------------------------


def cluster_ignore_changes() -> list[str]:
    """Cluster fields whose changes are ignored, and why.

    Both are create-time settings of the EKS API: changing them replaces the
    cluster. The provider does not read them back reliably (older clusters and
    imported ones report no value, and the default differs between provider
    versions), so without this every `pulumi up` could plan a replacement of the
    whole control plane. terraform-aws-eks and pulumi-eks ignore them for the
    same reason (pulumi-aws issue 3997).
    """
    return ["accessConfig.bootstrapClusterCreatorAdminPermissions", "bootstrapSelfManagedAddons"]


def protect_options(protect: bool) -> pulumi.ResourceOptions:
    """`protect` for the resources that are costly to lose (the cluster and its secrets key)."""
    return pulumi.ResourceOptions(protect=protect)


def parse_addon_version(version: str) -> tuple[int, int, int]:
    """"v1.21.1-eksbuild.7" -> (1, 21, 1)."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-eksbuild\.\d+", version)
    if not match:
        raise UserError(f"add-on version {version!r} should look like v1.21.1-eksbuild.7")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def check_vpc_cni_version(version: str) -> None:
    if parse_addon_version(version) < VPC_CNI_MIN_EFA_ONLY:
        minimum = ".".join(map(str, VPC_CNI_MIN_EFA_ONLY))
        raise UserError(f"vpc-cni {version} cannot drive efa-only interfaces; use v{minimum} or later (e.g. {VPC_CNI_VERSION})")


def addon_names(enable_fsx_csi: bool) -> tuple[str, ...]:
    """Every managed add-on the cluster gets, in creation order."""
    return ADDONS_BEFORE_NODES + ADDONS_AFTER_NODES + ((FSX_CSI_ADDON,) if enable_fsx_csi else ())


def csi_drivers(enable_fsx_csi: bool) -> tuple[CsiDriver, ...]:
    return (EFS_CSI, FSX_CSI) if enable_fsx_csi else (EFS_CSI,)


def endpoint_access(public_access_cidrs: Sequence[str]) -> dict[str, Any]:
    """vpc_config fields for the API endpoint: always private, public only with CIDRs."""
    cidrs = list(public_access_cidrs)
    return {
        "endpoint_private_access": True,
        "endpoint_public_access": bool(cidrs),
        "public_access_cidrs": cidrs or None,
    }


def principal_slug(arn: str) -> str:
    """A stable, readable resource-name part for a principal: its name plus a short hash of the ARN.

    Names must not depend on the position in the list, or reordering the
    config would replace access entries.
    """
    tail = re.sub(r"[^a-z0-9-]+", "-", arn.rsplit("/", 1)[-1].lower()).strip("-")[:32] or "principal"
    return f"{tail}-{hashlib.sha256(arn.encode()).hexdigest()[:6]}"


def k8s_provider_depends_on(system_node_group: pulumi.Resource, addons: dict[str, pulumi.Resource]) -> list[pulumi.Resource]:
    """What the Kubernetes provider waits for: a schedulable node and every add-on.

    Charts and operators installed through the provider need DNS (coredns) and
    storage drivers before their pods work, and on `pulumi destroy` their load
    balancers and ENIs must be cleaned up by controllers that are still running.
    """
    return [system_node_group, *addons.values()]


def kubeconfig_document(cluster_name: str, endpoint: str, ca_data: str, region: str) -> dict[str, Any]:
    """A kubeconfig that gets a token from `aws eks get-token` (the AWS CLI must be installed)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
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
                        "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json"],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
    }


# ---- the component ----------------------------------------------------------------


class EksCluster(pulumi.ComponentResource):
    """The EKS control plane, its add-ons, a system node group and access (see the module docstring)."""

    cluster_name: pulumi.Output[str]
    vpc_id: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    cluster_security_group_id: pulumi.Output[str]
    node_role_arn: pulumi.Output[str]
    node_role_name: pulumi.Output[str]
    oidc_issuer: pulumi.Output[Optional[str]]
    k8s_provider: k8s.Provider

    def __init__(self, name: str, args: ClusterArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self.args = args
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        cluster_name = args.cluster_name or name
        region = args.region

        # -- cluster role and secrets key -------------------------------------------
        self.cluster_role = aws.iam.Role(
            f"{name}-cluster-role",
            assume_role_policy=assume_role_policy("eks.amazonaws.com", tag_session=True),
            description=f"EKS control plane of {cluster_name}",
            tags=tags,
            opts=child,
        )
        cluster_policy = aws.iam.RolePolicyAttachment(
            f"{name}-cluster-AmazonEKSClusterPolicy",
            role=self.cluster_role.name,
            policy_arn=managed_policy_arn(region, "AmazonEKSClusterPolicy"),
            opts=child,
        )
        self.kms_key = aws.kms.Key(
            f"{name}-secrets",
            description=f"Envelope encryption of Kubernetes secrets in {cluster_name}",
            enable_key_rotation=True,
            # The longest wait when the data matters, the shortest otherwise.
            deletion_window_in_days=30 if args.protect else 7,
            tags=tags,
            opts=pulumi.ResourceOptions.merge(child, protect_options(args.protect)),
        )
        aws.kms.Alias(
            f"{name}-secrets-alias",
            name=f"alias/eks/{cluster_name}",
            target_key_id=self.kms_key.key_id,
            opts=child,
        )
        key_policy = aws.iam.RolePolicy(
            f"{name}-cluster-encryption",
            role=self.cluster_role.id,
            policy=self.kms_key.arn.apply(key_use_policy),
            opts=child,
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs",
            name=f"/aws/eks/{cluster_name}/cluster",
            retention_in_days=args.log_retention_days,
            tags=tags,
            opts=child,
        )

        # -- the cluster ----------------------------------------------------------------
        self.cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=cluster_name,
            version=args.version,
            role_arn=self.cluster_role.arn,
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode=AUTHENTICATION_MODE,
                bootstrap_cluster_creator_admin_permissions=True,
            ),
            bootstrap_self_managed_addons=False,
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=self.kms_key.arn),
                resources=list(ENCRYPTED_RESOURCES),
            ),
            enabled_cluster_log_types=list(LOG_TYPES),
            vpc_config=aws.eks.ClusterVpcConfigArgs(subnet_ids=args.subnet_ids, **endpoint_access(args.public_access_cidrs)),
            deletion_protection=args.protect,
            tags=tags,
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    protect=args.protect,
                    ignore_changes=cluster_ignore_changes(),
                    # The role's permissions must exist when the cluster is created and
                    # outlive it on delete; the log group must exist before EKS writes to it.
                    depends_on=[cluster_policy, key_policy, log_group],
                ),
            ),
        )

        # -- node role (every node group) -------------------------------------------
        self.node_role = aws.iam.Role(
            f"{name}-node-role",
            assume_role_policy=assume_role_policy("ec2.amazonaws.com"),
            description=f"EKS nodes of {cluster_name}",
            tags=tags,
            opts=child,
        )
        node_attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy}",
                role=self.node_role.name,
                policy_arn=managed_policy_arn(region, policy),
                opts=child,
            )
            for policy in node_policies(args.node_ssm_access)
        ]

        # -- add-ons that nodes need -------------------------------------------------
        self.addons: dict[str, aws.eks.Addon] = {}
        for addon in ADDONS_BEFORE_NODES:
            self.addons[addon] = self._addon(name, addon, args, child)

        # -- system node group ---------------------------------------------------------
        self.system_node_group = aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=self.cluster.name,
            node_role_arn=self.node_role.arn,
            subnet_ids=args.system_subnet_ids if args.system_subnet_ids is not None else args.subnet_ids,
            instance_types=[args.system_instance_type],
            ami_type=SYSTEM_AMI_TYPE,
            capacity_type=SYSTEM_CAPACITY_TYPE,
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=args.system_node_count,
                max_size=args.system_node_count,
                desired_size=args.system_node_count,
            ),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            labels=system_labels(),
            tags={**tags, "Name": f"{cluster_name}-system"},
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(depends_on=[*node_attachments, *(self.addons[a] for a in ADDONS_BEFORE_NODES)]),
            ),
        )

        # -- add-ons that run on nodes -------------------------------------------------
        after_nodes = [self.system_node_group]
        self.addons["coredns"] = self._addon(name, "coredns", args, child, depends_on=after_nodes)
        self.pod_identity_roles: dict[str, aws.iam.Role] = {}
        for driver in csi_drivers(args.enable_fsx_csi):
            association = self._pod_identity(name, driver, args, tags, child)
            self.addons[driver.addon] = self._addon(
                name,
                driver.addon,
                args,
                child,
                depends_on=[*after_nodes, self.addons["eks-pod-identity-agent"], association],
            )

        # -- access ----------------------------------------------------------------------
        for arn in args.admin_principal_arns:
            slug = principal_slug(arn)
            entry = aws.eks.AccessEntry(
                f"{name}-admin-{slug}",
                cluster_name=self.cluster.name,
                principal_arn=arn,
                type="STANDARD",
                tags=tags,
                opts=child,
            )
            aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{slug}-policy",
                cluster_name=self.cluster.name,
                principal_arn=entry.principal_arn,
                policy_arn=f"arn:{partition_of(region)}:eks::aws:cluster-access-policy/{CLUSTER_ADMIN_POLICY}",
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=child,
            )

        # -- outputs -----------------------------------------------------------------------
        self.cluster_name = self.cluster.name
        self.vpc_id = pulumi.Output.from_input(args.vpc_id)
        self.endpoint = self.cluster.endpoint
        self.cluster_security_group_id = self.cluster.vpc_config.cluster_security_group_id
        self.node_role_arn = self.node_role.arn
        self.node_role_name = self.node_role.name
        self.oidc_issuer = self.cluster.identities.apply(_oidc_issuer)
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority.data).apply(
                lambda v: json.dumps(kubeconfig_document(v[0], v[1], v[2], region), sort_keys=True)
            )
        )
        # Everything deployed through this provider waits for a node and the add-ons
        # (DNS, CSI) and, on destroy, is deleted while they still exist.
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=k8s_provider_depends_on(self.system_node_group, self.addons))
            ),
        )
        # For GPU node groups: they must wait for the add-ons a node needs, as the system group does.
        self.node_prerequisites: list[pulumi.Resource] = [self.addons[a] for a in ADDONS_BEFORE_NODES]
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "vpc_id": self.vpc_id,
                "endpoint": self.endpoint,
                "kubeconfig": self.kubeconfig,
                "cluster_security_group_id": self.cluster_security_group_id,
                "node_role_arn": self.node_role_arn,
                "node_role_name": self.node_role_name,
                "oidc_issuer": self.oidc_issuer,
            }
        )

    def _addon(
        self,
        name: str,
        addon: str,
        args: ClusterArgs,
        child: pulumi.ResourceOptions,
        depends_on: Optional[list[pulumi.Resource]] = None,
    ) -> aws.eks.Addon:
        return aws.eks.Addon(
            f"{name}-{addon}",
            cluster_name=self.cluster.name,
            addon_name=addon,
            # Only vpc-cni is pinned (efa-only support); the others take EKS's default
            # for the cluster's Kubernetes version.
            addon_version=args.vpc_cni_version if addon == "vpc-cni" else None,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=dict(args.tags),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=depends_on or [])),
        )

    def _pod_identity(
        self, name: str, driver: CsiDriver, args: ClusterArgs, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> aws.eks.PodIdentityAssociation:
        role = aws.iam.Role(
            f"{name}-{driver.addon}-role",
            # EKS Pod Identity assumes the role with session tags.
            assume_role_policy=assume_role_policy("pods.eks.amazonaws.com", tag_session=True),
            description=f"{driver.addon} controller in {args.cluster_name or name}",
            tags=tags,
            opts=child,
        )
        self.pod_identity_roles[driver.addon] = role
        attachment = aws.iam.RolePolicyAttachment(
            f"{name}-{driver.addon}-policy",
            role=role.name,
            policy_arn=managed_policy_arn(args.region, driver.policy),
            opts=child,
        )
        return aws.eks.PodIdentityAssociation(
            f"{name}-{driver.addon}-identity",
            cluster_name=self.cluster.name,
            namespace=driver.namespace,
            service_account=driver.service_account,
            role_arn=role.arn,
            tags=tags,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[attachment])),
        )


def _oidc_issuer(identities: Any) -> Optional[str]:
    for identity in identities or []:
        for oidc in getattr(identity, "oidcs", None) or []:
            if getattr(oidc, "issuer", None):
                return oidc.issuer
    return None
