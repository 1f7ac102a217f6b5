"""The EKS cluster: control plane, IAM, add-ons, a small system node group, access.

One `EksCluster` component (`gpu-serving:cluster:EksCluster`) creates:

- the cluster IAM role (AmazonEKSClusterPolicy, plus an inline policy letting it
  use the secrets key, as terraform-aws-eks does);
- the stack's KMS key, with yearly rotation (and an alias), for envelope
  encryption of Kubernetes secrets, the control-plane logs and (passed on by
  components/stack.py) the model weights' file system; its key policy is
  explicit (`infra.aws.iam.key_policy`: the account administers it, the cluster
  role uses it for secrets, CloudWatch Logs for the control-plane log group
  only);
- the control-plane log group (`/aws/eks/<cluster>/cluster`), encrypted with
  that key, with the config's retention, created before the cluster so EKS does
  not create one that never expires and outlives the stack; in production it
  and the key are protected and retained on delete (`components.protection.kept`:
  audit logs outlive the cluster for their retention, and the key stays to read
  them and the retained weights);
- the cluster: authentication through the EKS API only (access entries, no
  aws-auth ConfigMap); all five control-plane log types; the API endpoint of
  the endpoint access mode (`infra/aws/access.py`): public only from the
  deployer's CIDRs, or private only with a way in from the VPC; no self-managed
  add-ons (the managed ones below are ours);
- the deployer's way in: with `private-ssm` an SSM-managed bastion (its role,
  instance profile, a security group with no inbound rules, a launch template,
  the instance in a private subnet) and a 443 rule from it on the cluster
  security group; with `private-vpc` a 443 rule per deployer CIDR;
- one node IAM role for every node group (the GPU node groups use it too),
  without the VPC CNI's policy, which is on a role of the CNI's own
  (`aws-node`, through EKS Pod Identity: `VPC_CNI_IDENTITY`);
- managed add-ons, every one at the version pinned for the Kubernetes version
  (`infra/catalog/eks_versions.py`; vpc-cni must support `efa-only`
  interfaces; network policy enforcement on, `ADDON_CONFIGURATION`): vpc-cni,
  kube-proxy and eks-pod-identity-agent before any node (a node
  without a CNI never becomes Ready, so its node group would never finish), then
  coredns and the EFS CSI driver (and the FSx CSI driver when asked), whose pods
  need a node to run on; the EFS CSI driver's controller gets its IAM role through
  EKS Pod Identity, the FSx CSI driver's none (`FSX_CSI`: the volumes are static);
- a small on-demand system node group (AL2023 x86_64, the pinned AMI release)
  for operators and add-ons, on a launch template that requires IMDSv2 and tags
  its instances, volumes and interfaces with the stack's tags;
- access entries with the cluster-admin access policy for the given principals;
  when any is given, the identity that creates the cluster gets no admin entry of
  its own (`infra.aws.access.bootstrap_creator_admin`);
- a kubeconfig for the endpoint mode (exec auth through `aws eks get-token`;
  with `private-ssm` it points at the local end of the SSM tunnel), exported
  as a secret, and a Kubernetes provider built from it for the next layer
  (`k8s_provider`), which waits for the nodes, the add-ons and the way in, so
  that on destroy everything deployed through it goes while the way in remains.

Resource options that matter are computed by the small functions below
(`cluster_ignore_changes`, ...) and data (`ADDONS_BEFORE_NODES`, with the
add-on names in infra/catalog/eks.py), and tested directly.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.protection import encrypted_log_group, kms_key
from infra.aws import access
from infra.aws.iam import (
    EBS_CSI,
    EFS_CSI,
    FSX_CSI,
    VPC_CNI_IDENTITY,
    AddonIdentity,
    assume_role_policy,
    key_policy,
    key_use_policy,
    managed_policy_arn,
    node_policies,
    partition_of,
)
from infra.aws.launch_template import metadata_options, template_version
from infra.aws.tags import tag_specifications
from infra.catalog.cloudwatch import DEFAULT_LOG_RETENTION_DAYS, LOG_RETENTION_DAYS
from infra.catalog.eks import ADDONS_AFTER_NODES, ADDONS_BEFORE_NODES, NODE_MONITORING_ADDON, addon_names
from infra.errors import UserError
from infra.k8s.scheduling import gpu_tolerations, system_labels

TYPE = "gpu-serving:cluster:EksCluster"

AUTHENTICATION_MODE = "API"  # access entries only; the aws-auth ConfigMap is not read
# Every control-plane log type (EKS User Guide, "Send control plane logs to CloudWatch Logs": the API server,
# audit, authenticator, controller manager and scheduler logs; botocore's eks LogType, which the tests read).
LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
ENCRYPTED_RESOURCES = ("secrets",)
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
SYSTEM_CAPACITY_TYPE = "ON_DEMAND"
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"

# vpc-cni: `efa-only` network interfaces need VPC CNI >= 1.18.4 (EKS User Guide,
# "Manage EFA devices on Amazon EKS": efa-only interfaces). The version itself is
# pinned per Kubernetes version in infra/catalog/eks_versions.py.
VPC_CNI_MIN_EFA_ONLY = (1, 18, 4)

# Add-on configuration values (the add-on's configuration schema, `aws eks describe-addon-configuration`).
# vpc-cni: enforce Kubernetes NetworkPolicies with its node agent (EKS User Guide, "Restrict Pod network
# traffic with Kubernetes network policies", step 4: `{"enableNetworkPolicy": "true"}`, VPC CNI 1.14 or
# later; the network policy controller runs in the EKS control plane). Standard mode: a new pod starts
# allowed until its policies are in place; strict mode would need a policy for CoreDNS and every add-on.
# eks-node-monitoring-agent (chart v1.7.0, tests/fixtures/eks-node-monitoring-agent-v1.7.0): the agent
# DaemonSet tolerates every taint by default (`nodeAgent.tolerations: [operator: Exists]`), but the DCGM host
# engine it reads GPU health from (`dcgm-server`, hostPort 5555) tolerates none, so on our tainted GPU nodes it
# would never run and the agent would latch AcceleratedHardwareReady=False with reason DCGMError (upstream issue
# aws/eks-node-monitoring-agent#243 shows that state). Exactly the GPU taint, like the GPU operator's operands.
ADDON_CONFIGURATION: dict[str, dict[str, Any]] = {
    "vpc-cni": {"enableNetworkPolicy": "true"},
    NODE_MONITORING_ADDON: {"dcgmAgent": {"tolerations": gpu_tolerations()}},
}
VPC_CNI_MIN_NETWORK_POLICY = (1, 14, 0)
# The VPC CNI add-on takes an EKS Pod Identity association from v1.15.5-eksbuild.1 (EKS User Guide, "IAM roles
# for Amazon EKS add-ons", "Pod Identity Support Reference"); below the EFA minimum today, kept for the pairing.
VPC_CNI_MIN_POD_IDENTITY = (1, 15, 5)
# The cluster's upgrade policy (botocore eks, shape SupportType).
SUPPORT_TYPES = ("STANDARD", "EXTENDED")


CsiDriver = AddonIdentity  # the CSI drivers' name for it (infra/aws/iam.py: EFS_CSI, FSX_CSI, VPC_CNI_IDENTITY)


@dataclass(frozen=True)
class ClusterArgs:
    """What the cluster needs. Validated when built (a `UserError` says what is wrong).

    `endpoint_access` and `deployer_cidrs`: the deployer's way in (see
    `infra/aws/access.py`); `bastion_subnet_id` is the private subnet of the
    `private-ssm` bastion. `addon_versions`: add-on name -> version, one for
    every add-on the cluster installs. `admin_principal_arns` get cluster-admin
    through access entries, and are then the only admins of a new cluster: list
    the identity that runs `pulumi up` among them (its IAM role's ARN), or the
    Kubernetes provider is refused. With none, the creator is the admin
    (`infra.aws.access.bootstrap_creator_admin`, which says what a running
    cluster keeps). `instance_tags`: the stack's tags, for what
    the system node group's launch template launches (the provider's default
    tags do not reach instances an Auto Scaling group launches).
    """

    version: str
    vpc_id: pulumi.Input[str]  # not sent to EKS (it derives the VPC from the subnets); exposed for the next layer
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    region: str
    addon_versions: Mapping[str, str]
    account_id: pulumi.Input[str]  # the account the stack deploys into, for the key policy
    endpoint_access: str = access.PRIVATE_SSM
    deployer_cidrs: tuple[str, ...] = ()
    api_tunnel_port: int = 9443
    aws_profile: Optional[str] = None  # `aws:profile`, for the kubeconfig's `aws eks get-token`
    bastion_subnet_id: Optional[pulumi.Input[str]] = None  # private-ssm: the bastion's private subnet
    admin_principal_arns: tuple[str, ...] = ()
    system_instance_type: str = "m7i.xlarge"
    system_node_count: int = 2
    system_subnet_ids: Optional[pulumi.Input[Sequence[pulumi.Input[str]]]] = None  # None: subnet_ids
    system_release_version: Optional[str] = None  # the AL2023 AMI release of the system nodes; None: EKS's latest
    enable_fsx_csi: bool = False
    # The upgrade policy at the end of standard support (gpu-serving:cluster.supportType). Stated, never
    # left to EKS's default (EXTENDED, botocore eks UpgradePolicyRequest), so the bill it implies is a choice.
    support_type: str = "EXTENDED"
    protect: bool = False
    cluster_name: Optional[str] = None  # None: the component's name (must match the network's subnet tags)
    node_ssm_access: bool = False  # AmazonSSMManagedInstanceCore on the node role (shell on nodes without SSH)
    log_retention_days: int = DEFAULT_LOG_RETENTION_DAYS
    tags: dict[str, str] = field(default_factory=dict)  # extra tags on top of the provider's default tags
    instance_tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "deployer_cidrs", tuple(self.deployer_cidrs))
        object.__setattr__(self, "admin_principal_arns", tuple(self.admin_principal_arns))
        object.__setattr__(self, "addon_versions", dict(self.addon_versions))
        object.__setattr__(self, "instance_tags", dict(self.instance_tags))
        validate_cluster_args(self)


# Access entries take IAM role or user ARNs (not STS assumed-role session ARNs).
_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/.+$")


def validate_cluster_args(args: ClusterArgs) -> None:
    if not re.fullmatch(r"1\.\d{2}", args.version):
        raise UserError(f"cluster: Kubernetes version {args.version!r} should look like 1.33")
    if args.system_node_count < 1:
        raise UserError(f"cluster: system_node_count is {args.system_node_count}; coredns and the CSI controllers need at least 1 node")
    if args.endpoint_access not in access.MODES:
        raise UserError(f"cluster: endpoint access {args.endpoint_access!r} is not one of {', '.join(access.MODES)}")
    for cidr in args.deployer_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise UserError(f"cluster: deployer CIDR {cidr!r} is not a network address ({exc})") from exc
    if args.endpoint_access == access.PUBLIC_RESTRICTED and not args.deployer_cidrs:
        raise UserError("cluster: public-restricted needs deployer CIDRs; a public endpoint open to no one is no way in")
    if args.endpoint_access == access.PRIVATE_VPC and not args.deployer_cidrs:
        raise UserError("cluster: private-vpc needs the deployer's in-VPC CIDRs (the cluster security group admits 443 only from itself)")
    if access.needs_bastion(args.endpoint_access) and args.bastion_subnet_id is None:
        raise UserError("cluster: private-ssm needs bastion_subnet_id, a private subnet for the SSM bastion")
    if args.support_type not in SUPPORT_TYPES:
        raise UserError(f"cluster: support type {args.support_type!r} is not one of {', '.join(SUPPORT_TYPES)}")
    missing = [a for a in addon_names(args.enable_fsx_csi) if a not in args.addon_versions]
    if missing:
        raise UserError(f"cluster: no pinned version for the add-on(s) {', '.join(missing)} (infra/catalog/eks_versions.py)")
    for version in args.addon_versions.values():
        parse_addon_version(version)
    for arn in args.admin_principal_arns:
        if not _ARN.match(arn):
            raise UserError(f"cluster: admin principal {arn!r} is not an IAM role or user ARN (arn:aws:iam::<account>:role/<name>)")
    if len(set(args.admin_principal_arns)) != len(args.admin_principal_arns):
        raise UserError("cluster: an admin principal ARN is listed twice")
    if args.log_retention_days not in LOG_RETENTION_DAYS:
        raise UserError(f"cluster: log_retention_days {args.log_retention_days} is not one CloudWatch accepts: {LOG_RETENTION_DAYS}")
    check_vpc_cni_version(args.addon_versions["vpc-cni"])


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


def addon_configuration(addon: str) -> Optional[str]:
    """The add-on's configuration values as the JSON EKS takes, or None for its defaults."""
    values = ADDON_CONFIGURATION.get(addon)
    return json.dumps(values, sort_keys=True) if values else None


def control_plane_log_group(cluster_name: str) -> str:
    """The log group EKS writes the control-plane logs to (EKS User Guide, "Send control plane logs to CloudWatch Logs")."""
    return f"/aws/eks/{cluster_name}/cluster"


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
        raise UserError(f"vpc-cni {version} cannot drive efa-only interfaces; use v{minimum} or later")
    if parse_addon_version(version) < VPC_CNI_MIN_NETWORK_POLICY:  # below the EFA minimum today; kept for the pairing
        raise UserError(f"vpc-cni {version} cannot enforce network policies; use v1.14.0 or later")
    if parse_addon_version(version) < VPC_CNI_MIN_POD_IDENTITY:  # likewise
        raise UserError(f"vpc-cni {version} takes no EKS Pod Identity association; use v1.15.5 or later")


def csi_drivers(enable_fsx_csi: bool) -> tuple[CsiDriver, ...]:
    return (EFS_CSI, EBS_CSI, FSX_CSI) if enable_fsx_csi else (EFS_CSI, EBS_CSI)


def principal_slug(arn: str) -> str:
    """A stable, readable resource-name part for a principal: its name plus a short hash of the ARN.

    Names must not depend on the position in the list, or reordering the
    config would replace access entries.
    """
    tail = re.sub(r"[^a-z0-9-]+", "-", arn.rsplit("/", 1)[-1].lower()).strip("-")[:32] or "principal"
    return f"{tail}-{hashlib.sha256(arn.encode()).hexdigest()[:6]}"


def k8s_provider_depends_on(
    system_node_group: pulumi.Resource, addons: dict[str, pulumi.Resource], way_in: Sequence[pulumi.Resource] = ()
) -> list[pulumi.Resource]:
    """What the Kubernetes provider waits for: a schedulable node, every add-on, and the deployer's way in
    (with it the admin access entries: with admin principals given, the deployer is admin through one).

    Charts and operators installed through the provider need DNS (coredns) and
    storage drivers before their pods work, and on `pulumi destroy` their load
    balancers and ENIs must be cleaned up by controllers that are still running.
    The way in (the bastion, its instance profile and security group rules)
    must exist before the provider is used and outlive everything deployed
    through it: destroy deletes dependents first, so the tunnel stays usable
    until the last Kubernetes object is gone.
    """
    return [system_node_group, *addons.values(), *way_in]


def system_launch_template_args(name: str, instance_tags: Mapping[str, str]) -> dict[str, Any]:
    """The system node group's launch template (pulumi_aws argument names).

    No instance type, image or security groups: the node group sets the type,
    EKS the AMI (and merges its bootstrap user data), and EKS adds the cluster
    security group because the template names none. IMDSv2 only, hop limit 1
    (nothing on the system nodes uses the node role through IMDS; the CSI
    controllers use Pod Identity). The tag specifications carry the stack's
    tags to the instances, their volumes and interfaces (EKS User Guide,
    "Customize managed nodes with launch templates", "Tagging Amazon EC2
    instances").
    """
    return {
        "description": "System nodes: IMDSv2, the stack's tags on instances, volumes and interfaces",
        "update_default_version": True,
        "metadata_options": metadata_options(),
        "tag_specifications": tag_specifications(instance_tags, name),
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
        log_group_name = control_plane_log_group(cluster_name)
        account_id = pulumi.Output.from_input(args.account_id)
        self.kms_key = kms_key(
            f"{name}-secrets",
            description=f"{cluster_name}: Kubernetes secrets, control-plane logs and model weights",
            # The role exists before the key: KMS refuses a policy naming a principal it cannot find (botocore's
            # kms model, CreateKey Policy: "The principals in the key policy must exist and be visible to KMS";
            # the provider retries while IAM propagates: MalformedPolicyDocumentException).
            policy=pulumi.Output.all(account_id, self.cluster_role.arn).apply(
                lambda v: key_policy(region, v[0], key_users=[v[1]], log_group_names=[log_group_name])
            ),
            tags=tags,
            opts=child,
            production=args.protect,
        )
        aws.kms.Alias(
            f"{name}-secrets-alias",
            name=f"alias/eks/{cluster_name}",
            target_key_id=self.kms_key.key_id,
            opts=child,
        )
        key_use = aws.iam.RolePolicy(
            f"{name}-cluster-encryption",
            role=self.cluster_role.id,
            policy=self.kms_key.arn.apply(key_use_policy),
            opts=child,
        )
        self.log_group = encrypted_log_group(
            f"{name}-control-plane-logs",
            name=log_group_name,
            key=self.kms_key,
            retention_in_days=args.log_retention_days,
            tags=tags,
            opts=child,
            production=args.protect,
        )
        log_group = self.log_group

        # -- the cluster ----------------------------------------------------------------
        self.cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=cluster_name,
            version=args.version,
            role_arn=self.cluster_role.arn,
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode=AUTHENTICATION_MODE,
                # Create-only (ignored on a running cluster: `cluster_ignore_changes`).
                bootstrap_cluster_creator_admin_permissions=access.bootstrap_creator_admin(args.admin_principal_arns),
            ),
            bootstrap_self_managed_addons=False,
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=args.support_type),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=self.kms_key.arn),
                resources=list(ENCRYPTED_RESOURCES),
            ),
            enabled_cluster_log_types=list(LOG_TYPES),
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=args.subnet_ids, **access.endpoint_settings(args.endpoint_access, args.deployer_cidrs)
            ),
            deletion_protection=args.protect,
            tags=tags,
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    protect=args.protect,
                    ignore_changes=cluster_ignore_changes(),
                    # The role's permissions must exist when the cluster is created and
                    # outlive it on delete; the log group must exist before EKS writes to it.
                    depends_on=[cluster_policy, key_use, log_group],
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
        # The Pod Identity agent first: the VPC CNI's credentials come through it (VPC_CNI_IDENTITY).
        self.pod_identity_roles: dict[str, aws.iam.Role] = {}
        self.addons: dict[str, aws.eks.Addon] = {}
        for addon in sorted(ADDONS_BEFORE_NODES, key=lambda a: a != "eks-pod-identity-agent"):
            if addon != VPC_CNI_IDENTITY.addon:
                self.addons[addon] = self._addon(name, addon, args, child)
                continue
            cni_role, cni_policy = self._addon_role(name, VPC_CNI_IDENTITY, args, tags, child)
            node_attachments.append(cni_policy)  # every node group waits for it, and outlives it on destroy
            self.addons[addon] = self._addon(
                name,
                addon,
                args,
                child,
                depends_on=[cni_policy, self.addons["eks-pod-identity-agent"]],
                pod_identity_associations=[
                    aws.eks.AddonPodIdentityAssociationArgs(role_arn=cni_role.arn, service_account=VPC_CNI_IDENTITY.service_account)
                ],
            )

        # -- system node group ---------------------------------------------------------
        lt = system_launch_template_args(f"{cluster_name}-system", args.instance_tags)
        self.system_launch_template = aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            description=lt["description"],
            update_default_version=lt["update_default_version"],
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(**lt["metadata_options"]),
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(**t) for t in lt["tag_specifications"]],
            opts=child,
        )
        self.system_node_group = aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=self.cluster.name,
            node_role_arn=self.node_role.arn,
            subnet_ids=args.system_subnet_ids if args.system_subnet_ids is not None else args.subnet_ids,
            instance_types=[args.system_instance_type],
            ami_type=SYSTEM_AMI_TYPE,
            capacity_type=SYSTEM_CAPACITY_TYPE,
            release_version=args.system_release_version,
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.system_launch_template.id,
                version=self.system_launch_template.latest_version.apply(template_version),
            ),
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
        self.addons[NODE_MONITORING_ADDON] = self._addon(name, NODE_MONITORING_ADDON, args, child, depends_on=after_nodes)
        for driver in csi_drivers(args.enable_fsx_csi):
            needs: list[pulumi.Resource] = []
            if driver.policy is not None:
                needs = [self.addons["eks-pod-identity-agent"], self._pod_identity(name, driver, args, tags, child)]
            self.addons[driver.addon] = self._addon(name, driver.addon, args, child, depends_on=[*after_nodes, *needs])

        # -- access ----------------------------------------------------------------------
        admin_access: list[pulumi.Resource] = []
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
            admin_policy = aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{slug}-policy",
                cluster_name=self.cluster.name,
                principal_arn=entry.principal_arn,
                policy_arn=f"arn:{partition_of(region)}:eks::aws:cluster-access-policy/{CLUSTER_ADMIN_POLICY}",
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=child,
            )
            admin_access += [entry, admin_policy]

        # -- outputs -----------------------------------------------------------------------
        self.cluster_name = self.cluster.name
        self.vpc_id = pulumi.Output.from_input(args.vpc_id)
        self.endpoint = self.cluster.endpoint
        self.cluster_security_group_id = self.cluster.vpc_config.cluster_security_group_id
        self.node_role_arn = self.node_role.arn
        self.node_role_name = self.node_role.name
        self.oidc_issuer = self.cluster.identities.apply(_oidc_issuer)

        # -- the deployer's way in ------------------------------------------------------------
        self.bastion: Optional[aws.ec2.Instance] = None
        way_in = self._way_in(name, cluster_name, args, child)
        mode, port, profile = args.endpoint_access, args.api_tunnel_port, args.aws_profile
        # Only what lasts as long as the cluster (infra/aws/access.py kubeconfig_document): a new bastion
        # must not change the provider's kubeconfig, which would replace the provider and all it deploys.
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority.data).apply(
                lambda v: json.dumps(
                    access.kubeconfig_document(v[0], v[1], v[2], region, mode=mode, local_port=port, profile=profile),
                    sort_keys=True,
                )
            )
        )
        # private-ssm: the command that opens the tunnel (a stack output; it names the bastion, which may change).
        self.api_tunnel_command: Optional[pulumi.Output[str]] = None
        if self.bastion is not None:
            self.api_tunnel_command = pulumi.Output.all(self.bastion.id, self.cluster.endpoint).apply(
                lambda v: shlex.join(access.tunnel_command(v[0], v[1], region, port, profile=profile))
            )
        # Everything deployed through this provider waits for a node, the add-ons (DNS,
        # CSI) and the way in and, on destroy, is deleted while they still exist.
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    depends_on=k8s_provider_depends_on(self.system_node_group, self.addons, [*way_in, *admin_access])
                ),
            ),
        )
        # For GPU node groups, as for the system group: the node role's policies and the VPC CNI's (without
        # the worker and CNI policies a node never joins, and on destroy they must outlive the nodes, or the
        # ENIs the CNI holds block the VPC's deletion) and the add-ons a node needs.
        self.node_prerequisites: list[pulumi.Resource] = [*node_attachments, *(self.addons[a] for a in ADDONS_BEFORE_NODES)]
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
                "api_tunnel_command": self.api_tunnel_command,
            }
        )

    def _way_in(self, name: str, cluster_name: str, args: ClusterArgs, child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """The security group rules (and, for private-ssm, the SSM bastion) that let the deployer reach the API."""
        cluster_sg = self.cluster.vpc_config.cluster_security_group_id
        created: list[pulumi.Resource] = []
        for cidr in access.cluster_sg_ingress_cidrs(args.endpoint_access, args.deployer_cidrs):
            created.append(
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-api-from-{access.cidr_slug(cidr)}",
                    security_group_id=cluster_sg,
                    cidr_ipv4=cidr,
                    ip_protocol="tcp",
                    from_port=access.API_PORT,
                    to_port=access.API_PORT,
                    description="Kubernetes API from the deployer (in the VPC)",
                    opts=child,
                )
            )
        if not access.needs_bastion(args.endpoint_access):
            return created
        tags = dict(args.tags)
        role = aws.iam.Role(
            f"{name}-bastion-role",
            assume_role_policy=assume_role_policy("ec2.amazonaws.com"),
            description=f"SSM bastion to the private API endpoint of {cluster_name}",
            tags=tags,
            opts=child,
        )
        ssm = aws.iam.RolePolicyAttachment(
            f"{name}-bastion-{access.SSM_POLICY}",
            role=role.name,
            policy_arn=managed_policy_arn(args.region, access.SSM_POLICY),
            opts=child,
        )
        # The instance, its profile and its group once shared one name; resources of different types may, but
        # the offline tools' placeholders (`<id:NAME>`) name a resource by its name alone. The aliases keep
        # the deployed profile and group.
        profile = aws.iam.InstanceProfile(
            f"{name}-bastion-profile", role=role.name, tags=tags, opts=_renamed(child, f"{name}-bastion")
        )
        group = aws.ec2.SecurityGroup(
            f"{name}-bastion-sg",
            vpc_id=args.vpc_id,
            description="SSM bastion: no inbound rules; HTTPS out (SSM and the cluster API)",
            tags={**tags, "Name": f"{cluster_name}-bastion"},
            opts=_renamed(child, f"{name}-bastion"),
        )
        out = aws.vpc.SecurityGroupEgressRule(
            f"{name}-bastion-out-https",
            security_group_id=group.id,
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="tcp",
            from_port=access.API_PORT,
            to_port=access.API_PORT,
            description="HTTPS: the SSM endpoints and the private API endpoint",
            opts=child,
        )
        api = aws.vpc.SecurityGroupIngressRule(
            f"{name}-api-from-bastion",
            security_group_id=cluster_sg,
            referenced_security_group_id=group.id,
            ip_protocol="tcp",
            from_port=access.API_PORT,
            to_port=access.API_PORT,
            description="Kubernetes API from the SSM bastion",
            opts=child,
        )
        template = aws.ec2.LaunchTemplate(
            f"{name}-bastion-lt",
            description="SSM bastion to the private API endpoint",
            image_id=access.BASTION_IMAGE,
            instance_type=access.BASTION_INSTANCE_TYPE,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            vpc_security_group_ids=[group.id],
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(**metadata_options()),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=access.BASTION_ROOT_DEVICE,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=access.BASTION_ROOT_GIB, volume_type="gp3", encrypted="true", delete_on_termination="true"
                    ),
                )
            ],
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(**t) for t in tag_specifications(args.instance_tags, f"{cluster_name}-bastion")
            ],
            update_default_version=True,
            opts=child,
        )
        self.bastion = aws.ec2.Instance(
            f"{name}-bastion",
            subnet_id=args.bastion_subnet_id,
            associate_public_ip_address=False,
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(**metadata_options()),
            # Metrics every minute (EC2 User Guide, "Manage detailed monitoring for your EC2 instances"). On the
            # instance, not in its template: EC2 switches it on a running instance (MonitorInstances), while any
            # change to the template would be a new template version, which replaces the instance, and a new
            # bastion is a new kubeconfig for everything deployed through the Kubernetes provider.
            monitoring=True,
            launch_template=aws.ec2.InstanceLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(template_version)
            ),
            tags={**tags, "Name": f"{cluster_name}-bastion"},
            # The instance profile's role needs its SSM policy before the agent registers.
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[ssm])),
        )
        return [*created, out, api, self.bastion]

    def _addon(
        self,
        name: str,
        addon: str,
        args: ClusterArgs,
        child: pulumi.ResourceOptions,
        depends_on: Optional[list[pulumi.Resource]] = None,
        pod_identity_associations: Optional[list[aws.eks.AddonPodIdentityAssociationArgs]] = None,
    ) -> aws.eks.Addon:
        return aws.eks.Addon(
            f"{name}-{addon}",
            cluster_name=self.cluster.name,
            addon_name=addon,
            # Every add-on at the version pinned for the cluster's Kubernetes version.
            addon_version=args.addon_versions[addon],
            configuration_values=addon_configuration(addon),
            pod_identity_associations=pod_identity_associations,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=dict(args.tags),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=depends_on or [])),
        )

    def _addon_role(
        self, name: str, identity: AddonIdentity, args: ClusterArgs, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> tuple[aws.iam.Role, aws.iam.RolePolicyAttachment]:
        """The IAM role EKS Pod Identity gives `identity`'s service account, with its managed policy."""
        assert identity.policy is not None
        base = f"{name}-{identity.addon}"
        role = aws.iam.Role(
            f"{base}-role",
            # EKS Pod Identity assumes the role with session tags.
            assume_role_policy=assume_role_policy("pods.eks.amazonaws.com", tag_session=True),
            description=(
                f"VPC CNI ({identity.namespace}/{identity.service_account}) in {args.cluster_name or name}"
                if identity is VPC_CNI_IDENTITY
                else f"{identity.addon} controller in {args.cluster_name or name}"
            ),
            tags=tags,
            opts=child,
        )
        self.pod_identity_roles[identity.addon] = role
        policy = identity.policy
        attachment = aws.iam.RolePolicyAttachment(
            # The CNI's names the service account and the policy, as the node role's attachments name theirs.
            f"{base}-{identity.service_account}-{policy}" if identity is VPC_CNI_IDENTITY else f"{base}-policy",
            role=role.name,
            policy_arn=managed_policy_arn(args.region, policy),
            opts=child,
        )
        return role, attachment

    def _pod_identity(
        self, name: str, driver: AddonIdentity, args: ClusterArgs, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> aws.eks.PodIdentityAssociation:
        role, attachment = self._addon_role(name, driver, args, tags, child)
        return aws.eks.PodIdentityAssociation(
            f"{name}-{driver.addon}-identity",
            cluster_name=self.cluster.name,
            namespace=driver.namespace,
            service_account=driver.service_account,
            role_arn=role.arn,
            tags=tags,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[attachment])),
        )


def _renamed(opts: pulumi.ResourceOptions, old_name: str) -> pulumi.ResourceOptions:
    """`opts` plus an alias to the resource's former name (same type and parent): a rename, not a replacement."""
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(name=old_name)]))


def _oidc_issuer(identities: Any) -> Optional[str]:
    for identity in identities or []:
        for oidc in getattr(identity, "oidcs", None) or []:
            if getattr(oidc, "issuer", None):
                return oidc.issuer
    return None
