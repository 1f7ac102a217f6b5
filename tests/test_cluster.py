"""The EKS cluster component under the recording engine, and its pure helpers.

The recorder returns plain data once the program has finished (inputs and the
resource options the engine saw); every test asserts on that data. AWS enum
values are checked against botocore's EKS service model; add-on names, which
botocore does not list, against tests/fixtures/eks_addons.yaml (its sources inside).
"""

from __future__ import annotations

import asyncio
import json

import botocore.session
import pulumi
import pulumi_aws as aws
import pytest
from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret

from components.cluster import (
    ADDONS_AFTER_NODES,
    ADDONS_BEFORE_NODES,
    VPC_CNI_MIN_EFA_ONLY,
    VPC_CNI_MIN_NETWORK_POLICY,
    VPC_CNI_MIN_POD_IDENTITY,
    ClusterArgs,
    EksCluster,
    addon_names,
    check_vpc_cni_version,
    cluster_ignore_changes,
    parse_addon_version,
    principal_slug,
    SUPPORT_TYPES,
)
from components.protection import kept
from infra.catalog.eks_versions import ADDON_VERSIONS, addon_versions
from infra.aws.iam import assume_role_policy, managed_policy_arn, node_policies
from infra.errors import UserError
from infra.preview.recording import placeholder, record
from tests import yaml_text

CLUSTER = "aws:eks/cluster:Cluster"
ADDON = "aws:eks/addon:Addon"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
KEY = "aws:kms/key:Key"
ROLE = "aws:iam/role:Role"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
POD_IDENTITY = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
K8S_PROVIDER = "pulumi:providers:kubernetes"
COMPONENT = "gpu-serving:cluster:EksCluster"

ADMINS = ("arn:aws:iam::123456789012:role/platform-admin", "arn:aws:iam::123456789012:user/alice")
SUBNETS = ["subnet-a", "subnet-b", "subnet-c"]
ACCOUNT = "123456789012"


@pytest.fixture(scope="module")
def eks_model():
    return botocore.session.get_session().get_service_model("eks")


TAGS = {"project": "gpu-serving", "stack": "test", "owner": "ci", "lifecycle": "ephemeral", "expires-at": "2026-12-31T23:00:00Z"}


def _args(**overrides) -> ClusterArgs:
    base = dict(version="1.35", vpc_id="vpc-0123", subnet_ids=SUBNETS, region="us-east-1", cluster_name="gs-test",
                addon_versions=addon_versions("1.35"), account_id=ACCOUNT, bastion_subnet_id="subnet-a", instance_tags=TAGS,
                system_release_version="1.35.6-20260714")
    base.update(overrides)
    return ClusterArgs(**base)


def _record(args: ClusterArgs):
    def program() -> None:
        provider = aws.Provider("aws-test", region="us-east-1")
        EksCluster("gs", args, opts=pulumi.ResourceOptions(providers=[provider]))

    return record(program)


@pytest.fixture(scope="module")
def private_cluster():
    """The prod shape: private endpoint, protected, two admins."""
    return _record(_args(protect=True, admin_principal_arns=ADMINS))


@pytest.fixture(scope="module")
def public_cluster():
    """An ephemeral shape: public endpoint from two CIDRs, FSx CSI, not protected."""
    return _record(_args(endpoint_access="public-restricted", deployer_cidrs=("203.0.113.0/24", "198.51.100.7/32"), enable_fsx_csi=True))


def _depends_on(rec, name: str) -> set[str]:
    return {u.rsplit("::", 1)[-1] for u in rec.named(name).options["depends_on"]}


# ---- the control plane ---------------------------------------------------------------


def test_authentication_through_access_entries(private_cluster, eks_model):
    access = private_cluster.one(CLUSTER).inputs["accessConfig"]
    assert access["authenticationMode"] == "API"
    assert access["authenticationMode"] in eks_model.shape_for("AuthenticationMode").enum

def test_the_creator_is_admin_only_when_no_admin_principal_is_given(private_cluster, public_cluster, eks_model):
    # With admin principals (the prod shape) they are the only admins; without, the creator is the one admin.
    assert private_cluster.one(CLUSTER).inputs["accessConfig"]["bootstrapClusterCreatorAdminPermissions"] is False
    assert public_cluster.one(CLUSTER).inputs["accessConfig"]["bootstrapClusterCreatorAdminPermissions"] is True
    # EKS takes it at creation only (botocore: CreateAccessConfigRequest has it, UpdateAccessConfigRequest not), so
    # a running cluster must never see the change: it is ignored, and the synth diff (tests/test_access_day_two.py)
    # shows no replacement.
    assert "bootstrapClusterCreatorAdminPermissions" in eks_model.shape_for("CreateAccessConfigRequest").members
    assert "bootstrapClusterCreatorAdminPermissions" not in eks_model.shape_for("UpdateAccessConfigRequest").members
    assert "accessConfig.bootstrapClusterCreatorAdminPermissions" in private_cluster.one(CLUSTER).options["ignore_changes"]


def test_secrets_encrypted_with_a_rotating_key(private_cluster):
    cluster = private_cluster.one(CLUSTER).inputs
    key = private_cluster.one(KEY)
    assert cluster["encryptionConfig"]["resources"] == ["secrets"]
    assert cluster["encryptionConfig"]["provider"]["keyArn"] == placeholder("arn", key.name)
    assert key.inputs["enableKeyRotation"] is True
    alias = private_cluster.one("aws:kms/alias:Alias").inputs
    assert alias["name"] == "alias/eks/gs-test"
    assert alias["targetKeyId"] == placeholder("key-id", key.name)


def test_cluster_role_can_use_the_key_and_has_only_the_cluster_policy(private_cluster):
    role = private_cluster.named("gs-cluster-role").inputs
    trust = json.loads(role["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "eks.amazonaws.com"}
    attachments = private_cluster.of_type(ATTACHMENT)
    assert len(attachments) == 7  # cluster role 1, node role 2, VPC CNI role 1, EFS and EBS CSI roles 1 each, bastion role 1 (SSM)
    attached = [a.inputs["policyArn"] for a in attachments if a.inputs["role"] == "gs-cluster-role"]
    assert attached == ["arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"]
    inline = json.loads(private_cluster.named("gs-cluster-encryption").inputs["policy"])
    assert inline["Statement"][0]["Resource"] == placeholder("arn", "gs-secrets")
    assert set(inline["Statement"][0]["Action"]) == {"kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"}


def test_control_plane_logs(private_cluster, eks_model):
    logs = private_cluster.one(CLUSTER).inputs["enabledClusterLogTypes"]
    assert logs == ["api", "audit", "authenticator", "controllerManager", "scheduler"]
    assert set(logs) == set(eks_model.shape_for("LogType").enum)  # every type EKS has
    group = private_cluster.one("aws:cloudwatch/logGroup:LogGroup").inputs
    assert group["name"] == "/aws/eks/gs-test/cluster"  # the name EKS writes to
    assert "gs-control-plane-logs" in _depends_on(private_cluster, "gs-eks")


def test_control_plane_logs_are_encrypted_with_the_stacks_key_and_kept_for_the_retention(private_cluster, public_cluster):
    for rec in (private_cluster, public_cluster):
        group = rec.named("gs-control-plane-logs")
        assert group.inputs["kmsKeyId"] == placeholder("arn", "gs-secrets")
        assert group.inputs["retentionInDays"] == 365  # the config's default
        assert "gs-secrets" in _depends_on(rec, "gs-control-plane-logs")  # the key policy lets Logs use it first
    assert _record(_args(log_retention_days=30)).named("gs-control-plane-logs").inputs["retentionInDays"] == 30


def test_the_key_policy_is_explicit(private_cluster):
    policy = json.loads(private_cluster.one(KEY).inputs["policy"])
    statements = {s["Sid"]: s for s in policy["Statement"]}
    assert statements["AccountAdministersTheKey"]["Principal"] == {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}
    assert statements["AccountAdministersTheKey"]["Action"] == "kms:*"
    assert statements["ClusterRoleEncryptsSecrets"]["Principal"] == {"AWS": [placeholder("arn", "gs-cluster-role")]}
    logs = statements["CloudWatchLogsEncryptsTheStacksLogGroups"]
    assert logs["Principal"] == {"Service": "logs.us-east-1.amazonaws.com"}
    assert logs["Condition"] == {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": [
        f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/eks/gs-test/cluster"]}}  # fmt: skip
    assert "gs-cluster-role" in _depends_on(private_cluster, "gs-secrets")  # KMS refuses a principal it cannot find


def test_the_account_may_be_an_output():
    rec = _record(_args(account_id=pulumi.Output.from_input("210987654321")))
    root = json.loads(rec.one(KEY).inputs["policy"])["Statement"][0]["Principal"]["AWS"]
    assert root == "arn:aws:iam::210987654321:root"


def test_vpc_cni_enforces_network_policies(private_cluster, public_cluster):
    for rec in (private_cluster, public_cluster):
        config = {r.inputs["addonName"]: r.inputs.get("configurationValues") for r in rec.of_type(ADDON)}
        assert json.loads(config.pop("vpc-cni")) == {"enableNetworkPolicy": "true"}
        assert set(json.loads(config.pop("eks-node-monitoring-agent"))) == {"dcgmAgent"}  # tests/test_node_health.py
        assert set(config.values()) == {None}  # the other add-ons keep their defaults
    cni = next(r.inputs for r in private_cluster.of_type(ADDON) if r.inputs["addonName"] == "vpc-cni")
    assert parse_addon_version(cni["addonVersion"]) >= VPC_CNI_MIN_NETWORK_POLICY
    with pytest.raises(UserError, match="efa-only"):
        check_vpc_cni_version("v1.13.4-eksbuild.1")


def test_kept_protects_and_retains_in_production_only():
    assert (kept(True).protect, kept(True).retain_on_delete) == (True, True)
    assert (kept(False).protect, kept(False).retain_on_delete) == (False, False)


def test_endpoint_private_only_in_private_ssm(private_cluster):
    vpc = private_cluster.one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True
    assert vpc["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in vpc
    assert vpc["subnetIds"] == SUBNETS


def test_endpoint_public_only_from_the_given_cidrs(public_cluster):
    vpc = public_cluster.one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True
    assert vpc["endpointPublicAccess"] is True
    assert vpc["publicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.7/32"]
    assert "0.0.0.0/0" not in vpc["publicAccessCidrs"]


def test_no_self_managed_addons(private_cluster):
    assert private_cluster.one(CLUSTER).inputs["bootstrapSelfManagedAddons"] is False


def test_ignore_changes_recorded_on_the_cluster(private_cluster, public_cluster):
    expected = cluster_ignore_changes()
    assert "accessConfig.bootstrapClusterCreatorAdminPermissions" in expected
    assert "bootstrapSelfManagedAddons" in expected
    for rec in (private_cluster, public_cluster):
        assert rec.one(CLUSTER).options["ignore_changes"] == sorted(expected)


def test_protect_only_when_asked(private_cluster, public_cluster):
    protected = {r.name for r in private_cluster.resources if r.options["protect"]}
    assert protected == {"gs-eks", "gs-secrets", "gs-control-plane-logs"}
    # The audit logs outlive the cluster for their retention, and the key that reads them (and the weights) stays.
    assert {r.name for r in private_cluster.resources if r.options["retain_on_delete"]} == {"gs-secrets", "gs-control-plane-logs"}
    assert [r.name for r in public_cluster.resources if r.options["retain_on_delete"]] == []
    assert private_cluster.one(CLUSTER).inputs["deletionProtection"] is True
    assert private_cluster.one(KEY).inputs["deletionWindowInDays"] == 30
    assert [r.name for r in public_cluster.resources if r.options["protect"]] == []
    assert public_cluster.one(CLUSTER).inputs["deletionProtection"] is False
    assert public_cluster.one(KEY).inputs["deletionWindowInDays"] == 7


# ---- add-ons ------------------------------------------------------------------------------


def _known_addon_names(fixture_file) -> set[str]:
    doc = yaml_text.safe_load(fixture_file("eks_addons.yaml").read_text())
    names = {addon["name"] for addon in doc["addons"]}
    assert "vpc-cni" in names and len(names) >= 6, names
    # Not in the reference notes' list: the node monitoring agent, an EKS add-on (EKS User Guide, "Detect node
    # health issues and enable automatic node repair") named as its chart (the fixture's Chart.yaml).
    agent = yaml_text.safe_load(fixture_file("eks-node-monitoring-agent-v1.7.0", "Chart.yaml").read_text())["name"]
    return names | {agent}


def test_addon_names_are_known_to_eks(private_cluster, public_cluster, fixture_file):
    known = _known_addon_names(fixture_file)
    base = {r.inputs["addonName"] for r in private_cluster.of_type(ADDON)}
    assert base == {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "aws-efs-csi-driver", "aws-ebs-csi-driver", "eks-node-monitoring-agent"}
    with_fsx = {r.inputs["addonName"] for r in public_cluster.of_type(ADDON)}
    assert with_fsx == base | {"aws-fsx-csi-driver"}
    assert with_fsx <= known
    assert set(addon_names(True)) == with_fsx and set(addon_names(False)) == base


def test_every_addon_is_pinned_for_the_kubernetes_version(private_cluster, public_cluster):
    for rec in (private_cluster, public_cluster):
        pinned = {r.inputs["addonName"]: r.inputs["addonVersion"] for r in rec.of_type(ADDON)}
        assert pinned == {name: ADDON_VERSIONS["1.35"][name].version for name in pinned}
    cni = [r.inputs for r in private_cluster.of_type(ADDON) if r.inputs["addonName"] == "vpc-cni"]
    assert len(cni) == 1 and parse_addon_version(cni[0]["addonVersion"]) >= (1, 18, 4)
    with pytest.raises(UserError, match="aws-fsx-csi-driver"):
        _args(enable_fsx_csi=True, addon_versions={k: v for k, v in addon_versions("1.35").items() if k != "aws-fsx-csi-driver"})


def test_addon_order_around_the_system_node_group(private_cluster, public_cluster):
    for rec in (private_cluster, public_cluster):
        node_group = _depends_on(rec, "gs-system")
        for addon in ADDONS_BEFORE_NODES:
            assert f"gs-{addon}" in node_group, addon
            assert "gs-system" not in _depends_on(rec, f"gs-{addon}")
        after = [r.name for r in rec.of_type(ADDON) if r.inputs["addonName"] not in ADDONS_BEFORE_NODES]
        assert len(after) >= len(ADDONS_AFTER_NODES)
        for name in after:
            assert "gs-system" in _depends_on(rec, name), name


def test_csi_drivers_get_pod_identity_roles(private_cluster, public_cluster):
    by_account = {r.inputs["serviceAccount"]: r.inputs for r in private_cluster.of_type(POD_IDENTITY)}
    assert set(by_account) == {"efs-csi-controller-sa", "ebs-csi-controller-sa"}
    # EBS (EKS user guide, "Amazon EBS CSI driver"): AmazonEBSCSIDriverPolicy for kube-system/ebs-csi-controller-sa,
    # which provisions the monitoring Prometheus' gp3 volume; installed after the nodes, like EFS's.
    ebs = by_account["ebs-csi-controller-sa"]
    assert (ebs["namespace"], ebs["roleArn"]) == ("kube-system", placeholder("arn", "gs-aws-ebs-csi-driver-role"))
    assert private_cluster.named("gs-aws-ebs-csi-driver-policy").inputs["policyArn"] == "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
    assert private_cluster.named("gs-aws-ebs-csi-driver").inputs["addonName"] == "aws-ebs-csi-driver"
    assert {"gs-aws-ebs-csi-driver-identity", "gs-eks-pod-identity-agent", "gs-system"} <= _depends_on(private_cluster, "gs-aws-ebs-csi-driver")
    efs = by_account["efs-csi-controller-sa"]
    assert (efs["namespace"], efs["serviceAccount"]) == ("kube-system", "efs-csi-controller-sa")
    assert efs["roleArn"] == placeholder("arn", "gs-aws-efs-csi-driver-role")
    trust = json.loads(private_cluster.named("gs-aws-efs-csi-driver-role").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(trust["Statement"][0]["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
    policy = private_cluster.named("gs-aws-efs-csi-driver-policy").inputs["policyArn"]
    assert policy == "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"
    assert {"gs-aws-efs-csi-driver-identity", "gs-eks-pod-identity-agent"} <= _depends_on(private_cluster, "gs-aws-efs-csi-driver")
    # The running stacks' EFS role keeps its names and description (no replacement, no update).
    assert private_cluster.named("gs-aws-efs-csi-driver-role").inputs["description"] == "aws-efs-csi-driver controller in gs-test"


def test_the_fsx_csi_driver_gets_no_aws_permissions(public_cluster):
    # Static volumes only (components/storage.py): the controller is asked for nothing, so no role, no policy
    # (was AmazonFSxFullAccess), no association; the add-on itself is still installed, after the nodes.
    assert {r.inputs["serviceAccount"] for r in public_cluster.of_type(POD_IDENTITY)} == {"efs-csi-controller-sa", "ebs-csi-controller-sa"}
    fsx = public_cluster.named("gs-aws-fsx-csi-driver")
    assert fsx.inputs["addonName"] == "aws-fsx-csi-driver" and "podIdentityAssociations" not in fsx.inputs
    assert "gs-system" in _depends_on(public_cluster, "gs-aws-fsx-csi-driver")
    assert not [r.name for r in public_cluster.resources if "fsx" in r.name and r.type in (ROLE, ATTACHMENT)]
    assert not [a for a in public_cluster.of_type(ATTACHMENT) if "FSx" in a.inputs["policyArn"]]


def test_the_vpc_cni_has_a_role_of_its_own_through_pod_identity(private_cluster, public_cluster):
    for rec in (private_cluster, public_cluster):
        cni = rec.named("gs-vpc-cni").inputs
        # The add-on's own association (EKS restarts aws-node when it changes), to the aws-node service account.
        assert cni["podIdentityAssociations"] == [{"roleArn": placeholder("arn", "gs-vpc-cni-role"), "serviceAccount": "aws-node"}]
        assert parse_addon_version(cni["addonVersion"]) >= VPC_CNI_MIN_POD_IDENTITY
        trust = json.loads(rec.named("gs-vpc-cni-role").inputs["assumeRolePolicy"])
        assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert set(trust["Statement"][0]["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
        attached = [a.inputs["policyArn"] for a in rec.of_type(ATTACHMENT) if a.inputs["role"] == "gs-vpc-cni-role"]
        assert attached == ["arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"]
        # The role's policy is there before the add-on and the agent that hands out its credentials; every node
        # group waits for the policy (and, on destroy, goes before it: the CNI frees its interfaces).
        assert {"gs-vpc-cni-aws-node-AmazonEKS_CNI_Policy", "gs-eks-pod-identity-agent"} <= _depends_on(rec, "gs-vpc-cni")
        assert {"gs-vpc-cni-aws-node-AmazonEKS_CNI_Policy", "gs-vpc-cni"} <= _depends_on(rec, "gs-system")
    # The EFA minimum the version check enforces already implies the first version with Pod Identity.
    assert VPC_CNI_MIN_POD_IDENTITY <= VPC_CNI_MIN_EFA_ONLY


# ---- nodes -----------------------------------------------------------------------------------


def test_system_node_group(private_cluster, eks_model):
    group = private_cluster.one(NODE_GROUP).inputs
    assert group["amiType"] == "AL2023_x86_64_STANDARD"
    assert group["amiType"] in eks_model.shape_for("AMITypes").enum
    assert group["capacityType"] == "ON_DEMAND"
    assert group["capacityType"] in eks_model.shape_for("CapacityTypes").enum
    assert group["instanceTypes"] == ["m7i.xlarge"]
    assert group["releaseVersion"] == "1.35.6-20260714"
    assert group["launchTemplate"] == {"id": placeholder("id", "gs-system-lt"), "version": "1"}
    assert group["scalingConfig"] == {"minSize": 2, "maxSize": 2, "desiredSize": 2}
    assert group["updateConfig"] == {"maxUnavailable": 1}
    assert group["labels"] == {"gpu-serving/role": "system"}
    assert group["nodeRoleArn"] == placeholder("arn", "gs-node-role")
    assert group["subnetIds"] == SUBNETS
    assert group["clusterName"] == "gs-test"


def test_system_node_group_size_and_subnets_from_args():
    rec = _record(_args(system_node_count=3, system_subnet_ids=["subnet-x", "subnet-y"], system_instance_type="m7i.2xlarge"))
    group = rec.one(NODE_GROUP).inputs
    assert group["scalingConfig"] == {"minSize": 3, "maxSize": 3, "desiredSize": 3}
    assert group["subnetIds"] == ["subnet-x", "subnet-y"]
    assert group["instanceTypes"] == ["m7i.2xlarge"]


def test_node_role_policies_are_minimal(private_cluster):
    node_policies_seen = sorted(a.inputs["policyArn"] for a in private_cluster.of_type(ATTACHMENT) if a.name.startswith("gs-node-"))
    assert node_policies_seen == sorted(
        f"arn:aws:iam::aws:policy/{p}" for p in ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly")
    )
    # The CNI's policy is on the aws-node role only (test_the_vpc_cni_has_a_role_of_its_own_through_pod_identity).
    assert "AmazonEKS_CNI_Policy" not in node_policies(ssm=True)
    assert "AmazonSSMManagedInstanceCore" in node_policies(ssm=True)
    assert "AmazonSSMManagedInstanceCore" not in node_policies(ssm=False)
    trust = json.loads(private_cluster.named("gs-node-role").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    # The node group is created after its role's policies are attached (and deleted before they go).
    assert {f"gs-node-{p}" for p in node_policies(ssm=False)} <= _depends_on(private_cluster, "gs-system")


# ---- access ------------------------------------------------------------------------------------


def test_admin_access_entries(private_cluster, public_cluster, eks_model):
    entries = {r.inputs["principalArn"]: r for r in private_cluster.of_type(ACCESS_ENTRY)}
    assert set(entries) == set(ADMINS)
    policies = [r.inputs for r in private_cluster.of_type(ACCESS_POLICY)]
    assert len(policies) == len(ADMINS)
    for policy in policies:
        assert policy["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
        assert policy["accessScope"]["type"] == "cluster"
        assert policy["accessScope"]["type"] in eks_model.shape_for("AccessScopeType").enum
        assert policy["principalArn"] in ADMINS
        assert policy["clusterName"] == "gs-test"
    assert all(e.inputs["type"] == "STANDARD" for e in entries.values())
    assert public_cluster.of_type(ACCESS_ENTRY) == []
    # The deployer is one of them on a new cluster (no creator admin): the Kubernetes provider waits for every
    # admin entry and its policy, and on destroy goes before them.
    waits_for = _depends_on(private_cluster, "gs-k8s")
    assert {r.name for r in private_cluster.of_type(ACCESS_ENTRY) + private_cluster.of_type(ACCESS_POLICY)} <= waits_for


# ---- kubeconfig and the Kubernetes provider ---------------------------------------------------


def test_kubeconfig_is_secret_and_feeds_a_kubernetes_provider(private_cluster):
    provider = private_cluster.one(K8S_PROVIDER)
    assert provider.name == "gs-k8s"
    assert provider.parent == private_cluster.one(COMPONENT).urn
    raw = provider.inputs["kubeconfig"]
    assert is_rpc_secret(raw), "the kubeconfig must reach the engine as a secret"
    config = json.loads(unwrap_rpc_secret(raw))
    cluster = config["clusters"][0]["cluster"]
    # private-ssm: the local end of the SSM tunnel, the certificate checked against the endpoint's name.
    assert cluster["server"] == "https://localhost:9443"
    assert cluster["tls-server-name"] == placeholder("endpoint", "gs-eks")
    assert cluster["certificate-authority-data"] == placeholder("ca-data", "gs-eks")
    # Whatever is deployed through the provider waits for a node, every add-on and the way in
    # (and, on destroy, goes before them: the tunnel stays up until the last object is deleted).
    waits_for = _depends_on(private_cluster, "gs-k8s")
    addons = {r.name for r in private_cluster.of_type(ADDON)}
    assert len(addons) == 7
    assert {"gs-eks", "gs-system", *addons, "gs-bastion", "gs-api-from-bastion", "gs-bastion-out-https"} <= waits_for
    exec_ = config["users"][0]["user"]["exec"]
    assert exec_["command"] == "aws"
    assert exec_["args"][:4] == ["eks", "get-token", "--cluster-name", "gs-test"]
    assert exec_["args"][exec_["args"].index("--region") + 1] == "us-east-1"


def test_component_outputs():
    seen: dict = {}
    secret: dict = {}

    def program() -> None:
        cluster = EksCluster("gs", _args())
        pulumi.Output.all(
            cluster.cluster_name,
            cluster.vpc_id,
            cluster.endpoint,
            cluster.cluster_security_group_id,
            cluster.node_role_arn,
            cluster.node_role_name,
            cluster.oidc_issuer,
        ).apply(lambda v: seen.update(zip(("name", "vpc", "endpoint", "sg", "role_arn", "role_name", "oidc"), v)))
        pulumi.Output.all(cluster.kubeconfig).apply(lambda v: secret.update(kubeconfig=v[0]))
        secret["future"] = asyncio.ensure_future(cluster.kubeconfig.is_secret())
        assert len(cluster.node_prerequisites) == len(ADDONS_BEFORE_NODES) + 3  # and the node role's three policies

    record(program)
    assert seen == {
        "name": "gs-test",
        "vpc": "vpc-0123",
        "endpoint": f"https://{placeholder('endpoint', 'gs-eks')}",
        "sg": placeholder("cluster-sg", "gs-eks"),
        "role_arn": placeholder("arn", "gs-node-role"),
        "role_name": "gs-node-role",
        "oidc": f"https://{placeholder('oidc', 'gs-eks')}",
    }
    assert json.loads(secret["kubeconfig"])["current-context"] == "gs-test"
    assert secret["future"].done() and secret["future"].result() is True


# ---- pure helpers and validation ---------------------------------------------------------------


def test_parse_and_check_vpc_cni_version():
    assert parse_addon_version("v1.21.1-eksbuild.7") == (1, 21, 1)
    assert parse_addon_version("v1.18.4-eksbuild.1") == (1, 18, 4)
    check_vpc_cni_version("v1.18.4-eksbuild.1")
    with pytest.raises(UserError, match="efa-only"):
        check_vpc_cni_version("v1.18.3-eksbuild.3")
    with pytest.raises(UserError, match="look like"):
        parse_addon_version("1.21.1")
    with pytest.raises(UserError, match="efa-only"):
        _args(addon_versions={**addon_versions("1.35"), "vpc-cni": "v1.17.1-eksbuild.1"})


def test_principal_slug_is_stable_and_order_free():
    a, b = ADMINS
    assert principal_slug(a) == principal_slug(a)
    assert principal_slug(a).startswith("platform-admin-")
    assert principal_slug(a) != principal_slug("arn:aws:iam::999999999999:role/platform-admin")
    ab = _record(_args(admin_principal_arns=(a, b)))
    ba = _record(_args(admin_principal_arns=(b, a)))
    assert sorted(r.name for r in ab.of_type(ACCESS_ENTRY)) == sorted(r.name for r in ba.of_type(ACCESS_ENTRY))
    assert len(ab.of_type(ACCESS_ENTRY)) == 2


def test_partitions_and_trust_policies():
    assert managed_policy_arn("us-gov-west-1", "AmazonEKSClusterPolicy") == "arn:aws-us-gov:iam::aws:policy/AmazonEKSClusterPolicy"
    assert managed_policy_arn("cn-north-1", "X") == "arn:aws-cn:iam::aws:policy/X"
    assert json.loads(assume_role_policy("ec2.amazonaws.com"))["Statement"][0]["Action"] == "sts:AssumeRole"


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"version": "1.33.2"}, "1.33"),
        ({"system_node_count": 0}, "at least 1"),
        ({"endpoint_access": "public-restricted", "deployer_cidrs": ("203.0.113.1/24",)}, "not a network"),
        ({"endpoint_access": "public-restricted"}, "no way in"),
        ({"endpoint_access": "private-vpc"}, "in-VPC CIDRs"),
        ({"bastion_subnet_id": None}, "bastion_subnet_id"),
        ({"endpoint_access": "wide-open"}, "not one of"),
        ({"admin_principal_arns": ("alice",)}, "not an IAM role"),
        ({"admin_principal_arns": ("arn:aws:sts::123456789012:assumed-role/admin/session",)}, "not an IAM role"),
        ({"admin_principal_arns": (ADMINS[0], ADMINS[0])}, "twice"),
        ({"log_retention_days": 10}, "CloudWatch"),
    ],
)
def test_bad_cluster_args_fail_before_any_resource(overrides, match):
    with pytest.raises(UserError, match=match):
        _args(**overrides)


# ---- the upgrade policy ----------------------------------------------------------------------------


def test_the_upgrade_policy_is_stated_and_one_eks_knows(private_cluster, eks_model):
    """EKS's own default is EXTENDED (botocore's UpgradePolicyRequest doc); the stack states it rather than inherit it."""
    policy = private_cluster.one(CLUSTER).inputs["upgradePolicy"]
    assert policy == {"supportType": "EXTENDED"}
    enum = set(eks_model.shape_for("SupportType").enum)
    assert set(SUPPORT_TYPES) == enum
    standard = _record(_args(support_type="STANDARD")).one(CLUSTER).inputs["upgradePolicy"]
    assert standard == {"supportType": "STANDARD"}
    with pytest.raises(UserError, match="support type 'standard'"):
        _record(_args(support_type="standard"))


def test_the_stack_config_reaches_the_upgrade_policy():
    from infra.config import from_mapping

    base = {"model": {"name": "deepseek-v4-pro"}, "gpu": {"instanceType": "p5.48xlarge", "nodes": 4}, "lifecycle": {"production": True}}
    assert from_mapping("x", base).cluster.support_type == "EXTENDED"
    assert from_mapping("x", {**base, "cluster": {"supportType": "STANDARD"}}).cluster.support_type == "STANDARD"
    with pytest.raises(UserError, match="supportType"):
        from_mapping("x", {**base, "cluster": {"supportType": "NONE"}})
