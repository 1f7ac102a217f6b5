"""Issue 19 item 5 on the synthesized program: who may call AWS and who administers the cluster.

- The FSx CSI driver gets no AWS permissions because nothing in the stack makes its controller
  call AWS: the volumes are static (a PersistentVolume naming the file system Pulumi created,
  no StorageClass), checked here on the whole program with FSx for Lustre on.
- Giving a running stack its first admin principal must not replace the cluster: the creator's
  admin is a create-only setting (botocore's eks model; the Terraform provider's ForceNew, which
  infra/preview/diff.py carries), so the program ignores it on a running cluster. The synth diff
  of that config edit shows no replacement of the cluster or the Kubernetes provider and no node
  roll.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import botocore.session
import pytest

from infra.config import engine_config
from infra.preview.diff import CLUSTER, FORCE_NEW, LAUNCH_TEMPLATE, NODE_GROUP, diff
from infra.preview.recording import placeholder, record
from infra.preview.synth import document, synthesize
from tests.project_copy import edited_project
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent
K8S_PROVIDER = "pulumi:providers:kubernetes"
PV = "kubernetes:core/v1:PersistentVolume"
FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
ADMIN = "arn:aws:iam::123456789012:role/platform-admin"
BOOTSTRAP = "accessConfig.bootstrapClusterCreatorAdminPermissions"


@pytest.fixture(scope="module")
def prod() -> dict:
    return repo_stack("prod")


@pytest.fixture(scope="module")
def fsx_prod() -> dict:
    """prod with FSx for Lustre (and its CSI driver) as the weights' file system."""
    config = dict(engine_config("prod", REPO))
    for area, changes in (("storage", {"type": "fsx"}), ("cluster", {"fsxCsi": True})):
        value = json.loads(config.get(f"gpu-serving:{area}", "{}"))
        value.update(changes)
        config[f"gpu-serving:{area}"] = json.dumps(value)
    rec = record(lambda: runpy.run_path(str(REPO), run_name="__main__"), stack="prod", config=config)
    return document(rec, "gpu-serving", "prod")


def _of(doc: dict, typ: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == typ]


def test_the_fsx_volumes_are_static_so_the_csi_controller_needs_no_aws_permissions(fsx_prod):
    (fs,) = _of(fsx_prod, FSX)
    fsx_pvs = [r for r in _of(fsx_prod, PV) if r["inputs"]["spec"]["csi"]["driver"] == "fsx.csi.aws.com"]
    assert len(fsx_pvs) == 2
    for pv in fsx_pvs:
        spec = pv["inputs"]["spec"]
        # The file system Pulumi created, bound by name: nothing for the controller to create or delete.
        assert spec["csi"]["volumeHandle"] == placeholder("id", fs["name"])
        assert spec["storageClassName"] == "" and spec["persistentVolumeReclaimPolicy"] == "Retain"
    # (The monitoring's gp3 StorageClass is EBS's, ebs.csi.aws.com, not the FSx driver's.)
    assert not [r for r in fsx_prod["resources"] if r["type"].endswith(":StorageClass") and r["inputs"]["provisioner"] == "fsx.csi.aws.com"], (
        "an FSx StorageClass provisions dynamically"
    )
    # The driver is installed, with no role, association or FSx policy anywhere.
    assert [r for r in _of(fsx_prod, "aws:eks/addon:Addon") if r["inputs"]["addonName"] == "aws-fsx-csi-driver"]
    associations = _of(fsx_prod, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert "fsx-csi-controller-sa" not in {a["inputs"]["serviceAccount"] for a in associations}
    policies = [r["inputs"]["policyArn"] for r in _of(fsx_prod, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")]
    assert policies and not [p for p in policies if "FSx" in p]


def test_the_vpc_cni_policy_is_on_its_own_role_in_the_program(prod):
    attachments = _of(prod, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    cni = [a for a in attachments if a["inputs"]["policyArn"].endswith("/AmazonEKS_CNI_Policy")]
    (role,) = [r for r in _of(prod, "aws:iam/role:Role") if r["name"].endswith("-vpc-cni-role")]
    assert [a["inputs"]["role"] for a in cni] == [role["name"]]
    (addon,) = [r for r in _of(prod, "aws:eks/addon:Addon") if r["inputs"]["addonName"] == "vpc-cni"]
    assert addon["inputs"]["podIdentityAssociations"] == [{"roleArn": placeholder("arn", role["name"]), "serviceAccount": "aws-node"}]
    # The add-on's association field is one EKS updates in place (UpdateAddon takes it), so a running stack's
    # vpc-cni add-on is updated, never replaced, by this change.
    eks = botocore.session.get_session().get_service_model("eks")
    assert "podIdentityAssociations" in eks.operation_model("UpdateAddon").input_shape.members


def test_giving_a_running_stack_an_admin_principal_replaces_nothing(prod, tmp_path):
    eks = botocore.session.get_session().get_service_model("eks")
    # Create-only in EKS, and so ForceNew in the provider: the program must keep it out of a running cluster's diff.
    assert "bootstrapClusterCreatorAdminPermissions" not in eks.shape_for("UpdateAccessConfigRequest").members
    assert BOOTSTRAP in FORCE_NEW[CLUSTER]

    head = synthesize(
        "prod",
        edited_project(tmp_path / "admins", "prod", [("    adminPrincipalArns: []", f"    adminPrincipalArns: [{ADMIN}]")]),
    )
    d = diff(prod, head)
    (cluster,) = [c for c in d.changed if c.type == CLUSTER]
    (field,) = [f for f in cluster.fields if f.path == f"inputs.{BOOTSTRAP}"]
    assert (field.old, field.new, field.ignored) == (True, False, True)
    assert not cluster.replaced
    assert not [c for c in d.changed if c.replaced]
    assert {r["inputs"]["principalArn"] for r in d.added if r["type"] == "aws:eks/accessEntry:AccessEntry"} == {ADMIN}
    assert not [r for r in d.removed]
    moved = [(c.type, c.name) for c in d.changed if c.type in (LAUNCH_TEMPLATE, NODE_GROUP) or c.rolls_nodes]
    moved += [(c.type, c.name, [f.path for f in c.fields]) for c in d.changed if c.type == K8S_PROVIDER and
              [f for f in c.fields if f.path.startswith("inputs.")]]  # fmt: skip
    assert not moved, moved
    assert not [c for c in d.callouts if c.level == "CAUTION"]
