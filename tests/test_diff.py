"""Diff of two syntheses (`infra.preview.diff`, `python -m infra diff`).

BASE and HEAD documents come from `synthesize()` of a small program whose
config decides what it declares (the same stack name both times, so URNs
match), or from editing a synthesized document.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.preview.diff import CLUSTER, EFS, FORCE_NEW, FSX_LUSTRE, LAUNCH_TEMPLATE, MISSING, NODE_GROUP, _short, diff, render_markdown
from infra.preview.synth import dump, synthesize
from tests.synthesized import repo_stack

PROGRAM = '''
import pulumi
import pulumi_aws as aws

cfg = pulumi.Config()
vpc = aws.ec2.Vpc(
    "vpc",
    cidr_block=cfg.get("cidr") or "10.0.0.0/16",
    opts=pulumi.ResourceOptions(protect=cfg.get_bool("protect") is not False),
)
subnets = [aws.ec2.Subnet(f"private-{z}", vpc_id=vpc.id, cidr_block=f"10.0.{i}.0/24", availability_zone=f"us-east-1{z}")
           for i, z in enumerate("ab")]
if cfg.get_bool("cluster") is not False:
    cluster = aws.eks.Cluster(
        "eks",
        name="demo",
        role_arn="arn:aws:iam::123456789012:role/cluster",
        version=cfg.get("k8s") or "1.33",
        vpc_config=aws.eks.ClusterVpcConfigArgs(subnet_ids=[s.id for s in subnets], endpoint_public_access=False),
    )
    cluster_name = cluster.name
else:
    cluster_name = "demo"
lt = aws.ec2.LaunchTemplate(
    "gpu-lt",
    metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(http_tokens="required"),
    block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
        device_name="/dev/xvda",
        ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(volume_size=cfg.get_int("rootGib") or 600, volume_type="gp3", encrypted="true"),
    )],
)
aws.eks.NodeGroup(
    "gpu",
    cluster_name=cluster_name,
    node_role_arn="arn:aws:iam::123456789012:role/node",
    subnet_ids=[subnets[0].id],
    ami_type=cfg.get("amiType") or "AL2023_x86_64_NVIDIA",
    instance_types=[cfg.get("instanceType") or "p5.48xlarge"],
    launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=lt.id, version="1"),
    scaling_config=aws.eks.NodeGroupScalingConfigArgs(desired_size=cfg.get_int("nodes") or 4, min_size=0, max_size=8),
    labels={"role": "gpu"},
)
if cfg.get_bool("legacy") is not False:
    aws.ec2.SecurityGroup("legacy", vpc_id=vpc.id, description="old rules")
if cfg.get_bool("weights"):
    aws.s3.BucketV2("weights")
pulumi.export("nodes", cfg.get_int("nodes") or 4)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("diffdemo")
    (root / "Pulumi.yaml").write_text("name: diff-demo\nruntime: python\n")
    (root / "__main__.py").write_text(textwrap.dedent(PROGRAM))
    return root


@pytest.fixture(scope="module")
def synth(project: Path):
    """synth(**config) -> the document of stack `pr` with that config."""
    cache: dict[str, dict] = {}

    def run(**config) -> dict:
        key = json.dumps(config, sort_keys=True)
        if key not in cache:
            lines = ["config:", "  aws:region: us-east-1"]
            lines += [f"  diff-demo:{k}: {json.dumps(v)}" for k, v in config.items()]
            (project / "Pulumi.pr.yaml").write_text("\n".join(lines) + "\n")
            cache[key] = synthesize("pr", project)
        return copy.deepcopy(cache[key])

    return run


def resource(doc: dict, name: str) -> dict:
    (found,) = [r for r in doc["resources"] if r["name"] == name]
    return found


# -- equal, added, removed, changed ----------------------------------------------


def test_identical_documents_have_no_changes(synth) -> None:
    base = synth()
    d = diff(base, synth())
    assert d.empty and d.unchanged == len(base["resources"])
    assert render_markdown(d) == "No changes."


def test_added_removed_and_changed_resources(synth) -> None:
    base = synth()
    head = synth(cidr="10.9.0.0/16", legacy=False, weights=True)
    d = diff(base, head)
    assert [r["name"] for r in d.added] == ["weights"]
    assert [r["name"] for r in d.removed] == ["legacy"]
    (vpc,) = [c for c in d.changed if c.name == "vpc"]
    (cidr,) = [f for f in vpc.fields if f.path == "inputs.cidrBlock"]
    assert (cidr.old, cidr.new) == ("10.0.0.0/16", "10.9.0.0/16")
    assert not vpc.replaced  # no provider schema read for VPCs: shown as an update

    md = render_markdown(d)
    assert "**1 to add, 1 to change, 1 to delete**" in md
    assert "#### Added (1)" in md and "`weights`" in md and "`aws:s3/bucketV2:BucketV2`" in md
    assert "#### Deleted (1)" in md and "`legacy`" in md
    assert "#### Changed (1)" in md
    assert '| `inputs.cidrBlock` | `"10.0.0.0/16"` | `"10.9.0.0/16"` |' in md
    assert "[!CAUTION]" not in md  # nothing replaced, nothing unprotected


def test_nested_paths_lists_and_long_values(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    ng = resource(head, "gpu")
    ng["inputs"]["labels"]["nvidia.com/gpu.present"] = "true"
    ng["inputs"]["instanceTypes"].append("p5e.48xlarge")
    ng["inputs"]["description"] = "x" * 500
    d = diff(base, head)
    (change,) = d.changed
    paths = {f.path: f for f in change.fields}
    assert paths['inputs.labels["nvidia.com/gpu.present"]'].new == "true"
    assert paths["inputs.instanceTypes[1]"].new == "p5e.48xlarge"
    assert paths["inputs.instanceTypes[1]"].forces_replacement
    md = render_markdown(d)
    assert '`inputs.labels["nvidia.com/gpu.present"]`' in md
    assert "*(absent)*" in md
    assert "x" * 200 not in md and "…" in md  # long values are shortened


def test_fields_appearing_on_an_empty_resource(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    resource(base, "legacy")["inputs"] = {}
    d = diff(base, head)
    (sg,) = d.changed
    assert {f.path for f in sg.fields} == {"inputs.description", "inputs.vpcId"}
    assert all(f.old is MISSING for f in sg.fields)


def test_outputs_are_compared(synth) -> None:
    d = diff(synth(), synth(nodes=2))
    assert [(f.path, f.old, f.new) for f in d.outputs] == [("nodes", 4, 2)]
    assert "#### Stack outputs (1 changed)" in render_markdown(d)


# -- replacements ------------------------------------------------------------------


def test_ami_type_change_replaces_the_node_group(synth) -> None:
    d = diff(synth(), synth(amiType="BOTTLEROCKET_x86_64_NVIDIA"))
    (ng,) = d.changed
    assert ng.type == NODE_GROUP and ng.replaced_by == ["amiType"]
    (f,) = ng.fields
    assert f.forces_replacement
    md = render_markdown(d)
    assert md.index("> [!CAUTION]") < md.index("**0 to add")
    assert "**Replaces EKS node group `gpu`**" in md
    assert '`amiType` `"AL2023_x86_64_NVIDIA"` → `"BOTTLEROCKET_x86_64_NVIDIA"`' in md
    assert "(1 replaced)" in md and "**replace**" in md


def test_instance_type_change_replaces_the_node_group(synth) -> None:
    d = diff(synth(), synth(instanceType="p5en.48xlarge"))
    (ng,) = d.changed
    assert ng.replaced_by == ["instanceTypes"]
    assert "**Replaces EKS node group `gpu`**" in render_markdown(d)


def test_scaling_the_node_group_is_not_a_replacement(synth) -> None:
    d = diff(synth(), synth(nodes=2))
    (ng,) = d.changed
    assert ng.name == "gpu" and not ng.replaced and not ng.rolls_nodes
    assert [(f.path, f.old, f.new) for f in ng.fields] == [("inputs.scalingConfig.desiredSize", 4, 2)]
    md = render_markdown(d)
    assert "[!CAUTION]" not in md and "[!WARNING]" not in md
    assert "forces replacement" not in md
    assert "**`gpu`** `aws:eks/nodeGroup:NodeGroup`: update" in md


def test_a_new_launch_template_version_rolls_the_nodes_that_use_it(synth) -> None:
    d = diff(synth(), synth(rootGib=800))
    (lt,) = d.changed
    assert lt.type == LAUNCH_TEMPLATE and not lt.replaced
    assert lt.rolls_nodes == ["blockDeviceMappings[0].ebs.volumeSize"]
    md = render_markdown(d)
    assert "> [!WARNING]" in md and "[!CAUTION]" not in md
    assert "**New version of** launch template `gpu-lt`" in md and "(`gpu`)" in md


def test_node_group_version_bump_rolls_nodes_without_replacement(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    resource(head, "gpu")["inputs"]["launchTemplate"]["version"] = "2"
    d = diff(base, head)
    (ng,) = d.changed
    assert not ng.replaced and ng.rolls_nodes == ["launchTemplate.version"]
    assert "**Rolls every node** of EKS node group `gpu`" in render_markdown(d)


def test_reordered_subnets_replace_nothing_and_ignore_changes_is_honoured(synth) -> None:
    base = synth()
    ng = resource(base, "gpu")
    ng["inputs"]["subnetIds"] = ["subnet-a", "subnet-b"]
    head = copy.deepcopy(base)
    resource(head, "gpu")["inputs"]["subnetIds"] = ["subnet-b", "subnet-a"]  # a Terraform set: same set
    (change,) = diff(base, head).changed
    assert not change.replaced and all(not f.forces_replacement for f in change.fields)

    head = copy.deepcopy(base)
    resource(head, "gpu")["inputs"]["amiType"] = "AL2023_x86_64_STANDARD"
    resource(head, "gpu")["options"]["ignore_changes"] = ["amiType"]
    d = diff(base, head)
    (change,) = d.changed
    assert not change.replaced
    (ami,) = [f for f in change.fields if f.path == "inputs.amiType"]
    assert ami.ignored and not ami.forces_replacement
    md = render_markdown(d)
    assert "*(ignored: ignoreChanges)*" in md and "[!CAUTION]" not in md


def test_replace_on_changes_counts_for_any_type(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    resource(head, "vpc")["inputs"]["cidrBlock"] = "10.1.0.0/16"
    resource(head, "vpc")["options"]["replace_on_changes"] = ["cidrBlock"]
    resource(base, "vpc")["options"]["replace_on_changes"] = ["cidrBlock"]
    (vpc,) = diff(base, head).changed
    assert vpc.replaced_by == ["cidrBlock"]


def test_cluster_fields_that_force_replacement(synth) -> None:
    base = synth()

    def changed(edit) -> list[str]:
        head = copy.deepcopy(base)
        edit(resource(head, "eks")["inputs"])
        (c,) = diff(base, head).changed
        return c.replaced_by

    assert changed(lambda i: i.update(roleArn="arn:aws:iam::123456789012:role/other")) == ["roleArn"]
    assert changed(lambda i: i.update(kubernetesNetworkConfig={"serviceIpv4Cidr": "172.20.0.0/16"})) == [
        "kubernetesNetworkConfig.serviceIpv4Cidr"
    ]
    # In place since TF provider v5.25.0: subnets, security groups, version, endpoint access.
    assert changed(lambda i: i["vpcConfig"]["subnetIds"].append("subnet-c")) == []
    assert changed(lambda i: i.update(version="1.34")) == []
    assert changed(lambda i: i["vpcConfig"].update(endpointPublicAccess=True)) == []

    head = copy.deepcopy(base)
    resource(head, "eks")["inputs"]["version"] = "1.34"
    assert "**Kubernetes upgrade** of EKS cluster `eks`" in render_markdown(diff(base, head))

    # Envelope encryption can be added in place but never removed.
    with_kms = copy.deepcopy(base)
    resource(with_kms, "eks")["inputs"]["encryptionConfig"] = {"provider": {"keyArn": "arn:kms"}, "resources": ["secrets"]}
    assert diff(base, with_kms).changed[0].replaced_by == []
    assert diff(with_kms, base).changed[0].replaced_by == ["encryptionConfig"]


def test_cluster_replacement_is_called_out_with_its_node_groups(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    resource(head, "eks")["inputs"]["name"] = "demo-2"
    md = render_markdown(diff(base, head))
    assert "**Replaces EKS cluster `eks`**" in md and "Node groups on it: `gpu`" in md


def test_a_new_key_on_the_weights_file_system_is_called_out_as_its_replacement(repo_root: Path) -> None:
    """EFS takes its KMS key at creation only: a stack made before the key was set replaces its weights."""
    head = repo_stack("prod")
    base = copy.deepcopy(head)
    efs = resource(base, "gpu-serving-prod-weights-efs")
    del efs["inputs"]["kmsKeyId"]
    (change,) = [c for c in diff(base, head).changed if c.name == "gpu-serving-prod-weights-efs"]
    assert change.replaced_by == ["kmsKeyId"]
    md = render_markdown(diff(base, head))
    assert "**Replaces EFS file system `gpu-serving-prod-weights-efs`**" in md and "staged into it again" in md
    assert "It is protected: `pulumi up` refuses to replace it" in md
    import pulumi_aws

    for token, fields in ((EFS, FORCE_NEW[EFS]), (FSX_LUSTRE, FORCE_NEW[FSX_LUSTRE])):
        cls = getattr(pulumi_aws.efs if token == EFS else pulumi_aws.fsx, token.rsplit(":", 1)[1])
        args = set(inspect.signature(cls._internal_init).parameters)
        assert {re.sub(r"(?<=[a-z])(?=[A-Z])", "_", f).lower() for f in fields} <= args, token


def test_a_smaller_lustre_file_system_is_its_replacement(synth) -> None:
    """FSx for Lustre replaces the file system when storage_capacity shrinks (or changes on SCRATCH_1): CustomizeDiff."""

    def with_lustre(capacity: int, deployment: str = "PERSISTENT_2") -> dict:
        doc = synth()
        doc["resources"].append({
            "urn": f"urn:pulumi:test::demo::{FSX_LUSTRE}::weights", "type": FSX_LUSTRE, "name": "weights", "custom": True,
            "inputs": {"deploymentType": deployment, "storageCapacity": capacity, "subnetIds": "subnet-1"}, "options": {},
        })  # fmt: skip
        return doc

    def replaced_by(base: dict, head: dict) -> list[str]:
        (change,) = [c for c in diff(base, head).changed if c.name == "weights"]
        return change.replaced_by

    assert replaced_by(with_lustre(4800), with_lustre(2400)) == ["storageCapacity"]
    assert replaced_by(with_lustre(2400), with_lustre(4800)) == []  # growing is an update in place
    assert replaced_by(with_lustre(1200, "SCRATCH_1"), with_lustre(2400, "SCRATCH_1")) == ["storageCapacity"]
    assert "**Replaces FSx for Lustre file system `weights`**" in render_markdown(diff(with_lustre(4800), with_lustre(2400)))


def test_removing_the_cluster_is_called_out(synth) -> None:
    d = diff(synth(), synth(cluster=False))
    assert [r["type"] for r in d.removed] == [CLUSTER]
    md = render_markdown(d)
    assert "> [!CAUTION]" in md
    assert "**Deletes EKS cluster `eks`**" in md


def test_removing_a_node_group_is_called_out(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    head["resources"] = [r for r in head["resources"] if r["name"] != "gpu"]
    assert "**Deletes EKS node group `gpu`**" in render_markdown(diff(base, head))


def test_protect_switched_off_is_called_out(synth) -> None:
    d = diff(synth(), synth(protect=False))
    (vpc,) = d.changed
    assert [(f.path, f.old, f.new) for f in vpc.fields] == [("options.protect", True, False)]
    md = render_markdown(d)
    assert "> [!CAUTION]" in md and "**Protection switched off** on resource `vpc`" in md
    # Switching it on is no alarm.
    assert "[!CAUTION]" not in render_markdown(diff(synth(protect=False), synth()))


def test_option_lists_change_item_by_item(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    vpc_urn = resource(head, "vpc")["urn"]
    resource(head, "legacy")["options"]["depends_on"] = [vpc_urn]
    resource(base, "legacy")["options"]["depends_on"] = [vpc_urn.replace("::vpc", "::old-vpc")]
    d = diff(base, head)
    (sg,) = d.changed
    assert [(f.path, f.old, f.new) for f in sg.fields] == [
        ("options.depends_on", vpc_urn.replace("::vpc", "::old-vpc"), MISSING),
        ("options.depends_on", MISSING, vpc_urn),
    ]
    long_urn = "urn:pulumi:prod::gpu-serving::gpu-serving:cluster:EksCluster$aws:iam/role:Role::gpu-serving-prod-node-role"
    shown = _short(long_urn)
    assert len(shown) == 80 and "…" in shown
    assert shown.startswith('"urn:pulumi:prod::') and shown.endswith('::gpu-serving-prod-node-role"')  # keeps its name


def test_a_move_through_an_alias_is_not_a_delete_and_create(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    ng = resource(head, "gpu")
    old_urn = ng["urn"]
    ng["name"] = "gpu-nodes"
    ng["urn"] = old_urn.rsplit("::", 1)[0] + "::gpu-nodes"
    ng["options"]["aliases"] = [old_urn]
    head["resources"].sort(key=lambda r: r["urn"])
    d = diff(base, head)
    assert not d.added and not d.removed
    (moved,) = d.changed
    assert moved.moved_from == old_urn and not moved.replaced


def test_references_to_a_renamed_resource_follow_its_alias(synth) -> None:
    """A rename with an alias is a move: what referred to it under the old name refers to the same resource."""
    base = synth()
    head = copy.deepcopy(base)
    lt = resource(head, "gpu-lt")
    old_urn = lt["urn"]
    lt["name"], lt["urn"] = "gpu-template", old_urn.rsplit("::", 1)[0] + "::gpu-template"
    lt["options"]["aliases"] = [old_urn]
    ng = resource(head, "gpu")
    assert ng["inputs"]["launchTemplate"]["id"] == "<id:gpu-lt>"
    ng["inputs"]["launchTemplate"]["id"] = "<id:gpu-template>"
    ng["options"]["depends_on"] = [lt["urn"] if u == old_urn else u for u in ng["options"]["depends_on"]]
    head["resources"].sort(key=lambda r: r["urn"])
    (moved,) = diff(base, head).changed
    assert moved.name == "gpu-template" and moved.moved_from == old_urn  # the node group: unchanged, not replaced
    # A reference to another resource than the one renamed is still a change.
    ng["inputs"]["launchTemplate"]["id"] = "<id:other>"
    (replaced,) = [c for c in diff(base, head).changed if c.name == "gpu"]
    assert replaced.replaced_by == ["launchTemplate.id"]


def test_force_new_lists_name_the_fields_of_the_issue() -> None:
    for field in ("subnetIds", "amiType", "capacityType", "instanceTypes", "diskSize", "nodeRoleArn", "remoteAccess"):
        assert field in FORCE_NEW[NODE_GROUP]
    assert "name" in FORCE_NEW[CLUSTER] and "roleArn" in FORCE_NEW[CLUSTER]
    assert "vpcConfig.subnetIds" not in FORCE_NEW[CLUSTER]
    assert "scalingConfig" not in " ".join(FORCE_NEW[NODE_GROUP])


def test_render_stays_within_a_comment(synth) -> None:
    base = synth()
    head = copy.deepcopy(base)
    for i in range(3000):
        head["resources"].append(
            {"type": "aws:ec2/eip:Eip", "name": f"eip-{i}", "urn": f"urn:pulumi:pr::diff-demo::aws:ec2/eip:Eip::eip-{i:05d}",
             "parent": "", "custom": True, "inputs": {"domain": "vpc"}, "options": {}}  # fmt: skip
        )
    md = render_markdown(diff(base, head))
    assert len(md) < 65_536 and "diff truncated" in md


# -- the command line ------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cli_prints_markdown(synth, tmp_path: Path, repo_root: Path) -> None:
    base, head = tmp_path / "base.json", tmp_path / "head.json"
    base.write_text(dump(synth()))
    head.write_text(dump(synth(amiType="BOTTLEROCKET_x86_64_NVIDIA")))
    done = run_cli("diff", str(base), str(head), cwd=repo_root)
    assert done.returncode == 0, done.stderr
    assert done.stdout == render_markdown(diff(synth(), synth(amiType="BOTTLEROCKET_x86_64_NVIDIA")))
    same = run_cli("diff", str(base), str(base), cwd=repo_root)
    assert (same.returncode, same.stdout) == (0, "No changes.\n")


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "no such file"),
        ("{not json", "not JSON (line 1, column 2"),
        ("[1, 2]", "not a synth document"),
        ('{"project": "x"}', "no 'resources' list"),
        ('{"resources": [{"name": "x"}]}', "resources[0] is not a resource"),
    ],
)
def test_cli_bad_file_is_one_line_and_exit_2(content, expected, synth, tmp_path: Path, repo_root: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(dump(synth()))
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    done = run_cli("diff", str(good), str(bad), cwd=repo_root)
    assert done.returncode == 2
    assert done.stdout == ""
    err = done.stderr.strip()
    assert "\n" not in err and err.startswith("error:") and expected in err, err
    assert "Traceback" not in done.stderr


# -- Capacity Block lifecycle on the real program --------------------------------------------------

BLOCK_A, BLOCK_B = "cr-0123456789abcdef0", "cr-0fedcba9876543210"


def _prod_variant(root: Path, capacity: str, extra_gpu: str = "") -> Path:
    """A copy of the project whose prod stack launches into `capacity` (the stack files' own lines edited)."""
    repo = Path(__file__).resolve().parent.parent
    root.mkdir(parents=True, exist_ok=True)
    for f in repo.iterdir():
        if f.name in ("venv", ".git") or f.name.startswith("Pulumi."):
            continue
        (root / f.name).symlink_to(f)
    (root / "Pulumi.yaml").symlink_to(repo / "Pulumi.yaml")
    text = (repo / "Pulumi.prod.yaml").read_text()
    assert "      type: on-demand" in text
    text = text.replace("      type: on-demand", capacity + extra_gpu)
    (root / "Pulumi.prod.yaml").write_text(text)
    return root


def _block(rid: str) -> str:
    return f"      type: capacity-block\n      reservationId: {rid}"


@pytest.fixture(scope="module")
def block_docs(tmp_path_factory) -> dict[str, dict]:
    base = tmp_path_factory.mktemp("blocks")
    release = "\n    amiReleaseVersion: 1.35.6-20260625"  # a within-block change that rolls the nodes
    return {
        "a": synthesize("prod", _prod_variant(base / "a", _block(BLOCK_A))),
        "b": synthesize("prod", _prod_variant(base / "b", _block(BLOCK_B))),
        "a-release": synthesize("prod", _prod_variant(base / "a2", _block(BLOCK_A), release)),
    }


def _gpu_groups(doc: dict) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == NODE_GROUP and "-gpu-ng" in r["name"]]


def test_a_new_capacity_block_is_a_new_node_group_created_before_the_old_one_goes(block_docs):
    d = diff(block_docs["a"], block_docs["b"])
    (old,) = [r for r in d.removed if r["type"] == NODE_GROUP]
    (new,) = [r for r in d.added if r["type"] == NODE_GROUP]
    assert old["name"] != new["name"] and old["parent"] == new["parent"]
    assert {r["type"] for r in d.removed} == {NODE_GROUP, LAUNCH_TEMPLATE}  # the block's group and its template
    assert {r["type"] for r in d.added} == {NODE_GROUP, LAUNCH_TEMPLATE}
    # No node group is updated in place, so EKS never updates a Capacity Block group above size 0.
    assert not [c for c in d.changed if c.type == NODE_GROUP and "-gpu-ng" in c.name]
    (lt,) = [r for r in d.added if r["type"] == LAUNCH_TEMPLATE]
    assert lt["inputs"]["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] == BLOCK_B
    assert new["inputs"]["launchTemplate"]["id"] == f"<id:{lt['name']}>"
    text = render_markdown(d)
    swap = next(c for c in d.callouts if c.text.startswith("**Swaps"))
    assert swap.level == "WARNING" and BLOCK_A in swap.text and BLOCK_B in swap.text
    assert "created first, then the old one is drained and deleted" in swap.text
    assert f"**Deletes EKS node group `{old['name']}`" not in text  # a swap, not a bare deletion


def test_a_change_within_a_block_replaces_its_group_deleting_the_old_one_first(block_docs):
    d = diff(block_docs["a"], block_docs["a-release"])
    assert not d.added and not d.removed
    (group,) = [c for c in d.changed if c.type == NODE_GROUP and "-gpu-ng" in c.name]
    assert group.replaced and group.replaced_by == ["releaseVersion"]
    (head,) = _gpu_groups(block_docs["a-release"])
    assert head["options"]["delete_before_replace"] is True
    (callout,) = [c for c in d.callouts if c.text.startswith(f"**Replaces EKS node group `{group.name}`")]
    assert "deleted **before** its replacement exists" in callout.text
    # EC2 frees a block's capacity only after cleaning up the terminated instances (EC2 User Guide).
    assert head["inputs"]["capacityType"] == "CAPACITY_BLOCK" and '"several minutes"' in callout.text
    assert not [c for c in d.callouts if c.text.startswith("**Rolls every node**") and group.name in c.text]


def test_an_on_demand_group_still_rolls_in_place(tmp_path):
    base = synthesize("prod", _prod_variant(tmp_path / "od", "      type: on-demand"))
    head = synthesize("prod", _prod_variant(tmp_path / "od2", "      type: on-demand", "\n    amiReleaseVersion: 1.35.6-20260625"))
    d = diff(base, head)
    (group,) = [c for c in d.changed if c.type == NODE_GROUP and "-gpu-ng" in c.name]
    assert not group.replaced and group.rolls_nodes == ["releaseVersion"]


def test_a_workload_change_calls_out_the_predicted_capacity(tmp_path):
    base_root = _prod_variant(tmp_path / "sharegpt", "      type: on-demand")
    head_root = _prod_variant(tmp_path / "long", "      type: on-demand")
    stack = head_root / "Pulumi.prod.yaml"
    text = stack.read_text()
    assert "      preset: sharegpt\n" in text
    # Long prompts: each request costs far more prefill, so fewer fit within the TTFT target.
    stack.write_text(text.replace("      preset: sharegpt\n", "      preset: null\n      inputTokens: 4000\n      outputTokens: 400\n"))
    base, head = synthesize("prod", base_root), synthesize("prod", head_root)
    d = diff(base, head)
    (callout,) = [c for c in d.callouts if "predicted performance changes" in c.text]
    old, new = base["outputs"]["slaCapacityConcurrency"], head["outputs"]["slaCapacityConcurrency"]
    assert new < old
    assert f"SLA capacity {old:,.0f} concurrent requests → {new:,.0f} concurrent requests ({(new - old) / old:+.0%})" in callout.text
    cost_old, cost_new = base["outputs"]["predictedCostPerMillionTokensUsd"], head["outputs"]["predictedCostPerMillionTokensUsd"]
    assert f"${cost_old:,.2f}" in callout.text and f"${cost_new:,.2f}" in callout.text
    # Worse by a quarter or more: a caution, at the top of the review comment.
    assert callout.level == "CAUTION" and (old - new) / old >= 0.25
    assert "predicted performance changes" in render_markdown(d)
    # The same config on both sides: nothing to call out.
    assert not [c for c in diff(base, copy.deepcopy(base)).callouts if "predicted" in c.text]
