"""Changes to a running stack: what an edit does to what is already deployed.

Each test synthesizes the real program before and after one edit (the stack file's
own lines, or a constant the program reads) and diffs the two (`infra.preview.diff`,
what a pull request's comment shows). What must not move:

- the Kubernetes provider: pulumi-kubernetes replaces a provider whose kubeconfig
  cluster changes, and a replaced provider replaces everything it manages (Helm
  releases, the weights volume and claim, the RayCluster);
- the launch templates and node groups on tag edits: a new template version rolls
  every node of the groups that follow it (EKS UpdateNodegroupVersion).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.aws import access, tags as stack_tags
from infra.preview.diff import LAUNCH_TEMPLATE, NODE_GROUP, diff
from tests.project_copy import edited_project
from infra.preview.synth import synthesize

REPO = Path(__file__).resolve().parent.parent
K8S_PROVIDER = "pulumi:providers:kubernetes"


def _variant(root: Path, stack: str, old: str, new: str) -> Path:
    """A copy of the project (links) whose stack file has `old` replaced by `new`."""
    return edited_project(root, stack, [(old, new)])


@pytest.fixture(scope="module")
def prod() -> dict:
    return synthesize("prod", REPO)


@pytest.fixture(scope="module")
def test_stack() -> dict:
    return synthesize("test", REPO)


def _untouched(d, types: tuple[str, ...]) -> None:
    moved = [(c.type, c.name, [f.path for f in c.fields]) for c in d.changed if c.type in types]
    moved += [(r["type"], r["name"], "added") for r in d.added if r["type"] in types]
    moved += [(r["type"], r["name"], "removed") for r in d.removed if r["type"] in types]
    assert not moved, moved


def test_an_owner_edit_moves_no_node_and_keeps_the_kubernetes_provider(prod, tmp_path):
    head = synthesize("prod", _variant(tmp_path / "owner", "prod", "    owner: ml-platform\n", "    owner: inference-team\n"))
    d = diff(prod, head)
    assert d.changed, "the owner tag changed nowhere: the test edits nothing"
    _untouched(d, (K8S_PROVIDER, LAUNCH_TEMPLATE, NODE_GROUP))
    assert not [c for c in d.callouts if c.level == "CAUTION"]


def test_an_expiry_edit_moves_no_node_and_keeps_the_kubernetes_provider(test_stack, tmp_path):
    head = synthesize(
        "test", _variant(tmp_path / "ttl", "test", 'expiresAt: "2026-12-31T23:00:00Z"', 'expiresAt: "2027-01-02T09:00:00Z"')
    )
    d = diff(test_stack, head)
    assert d.changed
    _untouched(d, (K8S_PROVIDER, LAUNCH_TEMPLATE, NODE_GROUP))


def test_a_new_stack_tag_moves_no_node(prod, monkeypatch):
    # A tag the project adds to every resource later (the provider's default tags).
    real = stack_tags.default_tags
    import components.stack as program

    monkeypatch.setattr(program, "default_tags", lambda **kw: {**real(**kw), "cost-center": "ml-4711"})
    d = diff(prod, synthesize("prod", REPO))
    (provider,) = [c for c in d.changed if c.type == "pulumi:providers:aws"]
    assert any("cost-center" in f.path or "cost-center" in str(f.new) for f in provider.fields)
    _untouched(d, (K8S_PROVIDER, LAUNCH_TEMPLATE, NODE_GROUP))


def test_a_new_bastion_keeps_the_kubernetes_provider(prod, monkeypatch):
    # Another image for the bastion: a new template version, so a new bastion instance (a new id).
    monkeypatch.setattr(access, "BASTION_IMAGE", "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-6.12-x86_64")
    d = diff(prod, synthesize("prod", REPO))
    (template,) = [c for c in d.changed if c.type == LAUNCH_TEMPLATE]
    assert template.name.endswith("-bastion-lt") and template.rolls_nodes == ["imageId"]
    _untouched(d, (K8S_PROVIDER, NODE_GROUP))
    # The synth writes the provider's kubeconfig as a secret, so this diff cannot see into it: that nothing
    # in it names the bastion is tests/test_access.py::test_the_kubeconfig_outlives_the_bastion.


# -- a production stack destroyed and created again ------------------------------------------------

LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


def _log_groups(doc: dict) -> dict[str, dict]:
    return {r["inputs"]["name"]: r for r in doc["resources"] if r["type"] == LOG_GROUP}


def test_a_recreated_production_stack_adopts_the_log_groups_it_kept(prod, monkeypatch):
    from infra.preview import recording

    kept = _log_groups(prod)
    # What prod keeps on destroy, by fixed names: EKS's control-plane group and the VPC's flow logs.
    assert set(kept) == {"/aws/eks/gpu-serving-prod/cluster", "/aws/vpc/gpu-serving-prod/flow-logs"}
    assert all(r["options"]["retain_on_delete"] and "import" not in r["options"] for r in kept.values())

    # After `pulumi destroy`, both are still in the account: DescribeLogGroups by prefix finds them.
    asked: list[str] = []

    def found(args: dict) -> dict:
        asked.append(args["logGroupNamePrefix"])
        names = [n for n in kept if n.startswith(args["logGroupNamePrefix"])]
        return {"arns": [f"arn:aws:logs:us-east-1:123456789012:log-group:{n}" for n in names], "logGroupNames": names, "id": "x"}

    monkeypatch.setitem(recording.CALL_RESULTS, "aws:cloudwatch/getLogGroups:getLogGroups", found)
    again = _log_groups(synthesize("prod", REPO))
    assert sorted(asked) == sorted(kept)
    for name, r in again.items():
        assert r["options"]["import"] == name  # a log group's id is its name: adopted, not created
        assert r["options"]["protect"] and r["options"]["retain_on_delete"]
    d = diff(prod, synthesize("prod", REPO))
    imports = [f for c in d.changed for f in c.fields if f.path == "options.import"]
    assert sorted(f.new for f in imports) == sorted(kept)  # a reviewer sees the adoption


def test_a_non_production_stack_never_imports(test_stack, monkeypatch):
    from infra.preview import recording

    names = list(_log_groups(test_stack))
    assert names, "the test stack has log groups"
    monkeypatch.setitem(
        recording.CALL_RESULTS, "aws:cloudwatch/getLogGroups:getLogGroups", lambda a: {"arns": [], "logGroupNames": names, "id": "x"}
    )
    assert all("import" not in r["options"] for r in _log_groups(synthesize("test", REPO)).values())


def test_gpu_nodes_wait_for_and_outlive_the_node_roles_policies_and_the_addons_a_node_needs(prod):
    # The pulumi-aws and Terraform node group examples: without the worker and CNI policies a node never
    # joins, and if they go first on destroy the CNI's network interfaces block the VPC's deletion.
    from components.cluster import ADDONS_BEFORE_NODES

    by_urn = {r["urn"]: r for r in prod["resources"]}
    groups = {r["name"]: r for r in prod["resources"] if r["type"] == NODE_GROUP}
    gpu = next(r for n, r in groups.items() if n.endswith("-gpu-ng"))
    waits = {by_urn[u]["type"]: set() for u in gpu["options"]["depends_on"]}
    for u in gpu["options"]["depends_on"]:
        waits[by_urn[u]["type"]].add(by_urn[u]["inputs"].get("addonName") or by_urn[u]["inputs"].get("policyArn"))
    policies = {r["inputs"]["policyArn"] for r in prod["resources"]
                if r["type"] == "aws:iam/rolePolicyAttachment:RolePolicyAttachment" and "-node-" in r["name"]}  # fmt: skip
    assert {p.rsplit("/", 1)[-1] for p in policies} >= {"AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy"}
    assert waits["aws:iam/rolePolicyAttachment:RolePolicyAttachment"] == policies
    assert waits["aws:eks/addon:Addon"] == set(ADDONS_BEFORE_NODES)
