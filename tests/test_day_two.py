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

import contextlib
from pathlib import Path

import pytest

from infra.aws import access, tags as stack_tags
from infra.preview.diff import LAUNCH_TEMPLATE, NODE_GROUP, diff
from infra.preview.synth import synthesize

REPO = Path(__file__).resolve().parent.parent
K8S_PROVIDER = "pulumi:providers:kubernetes"


def _variant(root: Path, stack: str, old: str, new: str) -> Path:
    """A copy of the project (links) whose stack file has `old` replaced by `new`."""
    root.mkdir(parents=True)
    for f in REPO.iterdir():
        if f.name in ("venv", ".git") or f.name.startswith("Pulumi."):
            continue
        (root / f.name).symlink_to(f)
    for f in REPO.glob("Pulumi.*yaml"):
        text = f.read_text()
        if f.name == f"Pulumi.{stack}.yaml":
            assert text.count(old) == 1, f"{old!r} is not one line of {f.name}"
            text = text.replace(old, new)
        (root / f.name).write_text(text)
    return root


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
