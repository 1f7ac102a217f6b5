"""The table of common changes (docs/operating.md) matches what the diff tool reports for each.

Every row of `infra.preview.changes.CHANGES` is synthesized before and after its edit (the
real program, the stack file's own lines edited) and diffed; the effects the diff reports
must be the row's, and docs/operating.md must carry the table those rows render.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.preview.changes import CHANGES, K8S_PROVIDER, RESTARTS_SERVING, SWAPS_GPU, ROLLS_GPU, effects, table_markdown
from infra.preview.diff import LAUNCH_TEMPLATE, NODE_GROUP, diff, render_markdown
from infra.preview.outage import RAYCLUSTER
from infra.preview.synth import synthesize
from tests.project_copy import edited_project
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def diffs(tmp_path_factory) -> dict:
    out, docs = {}, {}
    for c in CHANGES:
        root = tmp_path_factory.mktemp(c.name.replace(" ", "-"))

        def synth(edits, side):
            key = (c.stack, edits)
            if key not in docs:
                docs[key] = synthesize(c.stack, edited_project(root / side, c.stack, edits)) if edits else repo_stack(c.stack)
            return docs[key]

        base = synth(c.base, "base")
        head = synth(c.base + c.head, "head")
        out[c.name] = (diff(base, head), base, head)
    return out


@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_each_change_does_what_the_table_says(change, diffs):
    d, _, head = diffs[change.name]
    assert d.changed or d.added or d.removed, "the edit changed nothing"
    assert effects(d, head) == change.expected


@pytest.mark.parametrize("change", [c for c in CHANGES if ROLLS_GPU in c.expected or SWAPS_GPU in c.expected], ids=lambda c: c.name)
def test_a_gpu_roll_names_the_outage_its_length_and_the_procedure(change, diffs):
    d, _, head = diffs[change.name]
    cold = head["outputs"]["plan"]["startup"]["cold_start_s"]
    text = render_markdown(d)
    assert "**Serving goes down** for about" in text and f"cold start of {cold:,.0f} s" in text
    assert "gpu-serving:serving.suspended: true" in text and "PodEvictionFailure" in text


@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_a_change_that_recreates_the_serving_pods_says_so_and_for_how_long(change, diffs):
    """KubeRay's Recreate strategy deletes every serving pod when the RayCluster's spec hash changes: the
    review comment says so, with the plan's cold start, exactly for the rows whose effects include it."""
    d, _, head = diffs[change.name]
    text = render_markdown(d)
    recreates = [c for c in d.callouts if c.text.startswith("**Recreates every serving pod**")]
    assert bool(recreates) == (RESTARTS_SERVING in change.expected)
    if recreates:
        cold = head["outputs"]["plan"]["startup"]["cold_start_s"]
        assert f"**serving goes down** for about {round(cold / 60)} minutes (the plan's cold start of {cold:,.0f} s)" in text
        assert "upgradeStrategy: Recreate" in text


def test_scaling_a_worker_group_or_suspending_recreates_nothing(diffs):
    """What KubeRay leaves out of its spec hash (replicas, minReplicas, maxReplicas, workersToDelete; utils/util.go
    GenerateHashWithoutReplicasAndWorkersToDelete) and a suspend (the procedure itself) are not called out."""
    import copy

    from infra.preview.outage import recreates_serving

    _, base, _ = diffs[CHANGES[0].name]
    assert not recreates_serving(["inputs.spec.workerGroupSpecs[0].replicas", "inputs.spec.workerGroupSpecs[0].maxReplicas",
                                  "inputs.spec.workerGroupSpecs[0].scaleStrategy.workersToDelete[0]", "inputs.spec.suspend"], base, base)  # fmt: skip
    assert recreates_serving(["inputs.spec.workerGroupSpecs[0].template.spec.containers[0].image"], base, base)
    suspended = copy.deepcopy(base)
    for r in suspended["resources"]:
        if r["type"] == RAYCLUSTER:
            r["inputs"]["spec"]["suspend"] = True
    assert not recreates_serving(["inputs.spec.headGroupSpec.template.spec.containers[0].args[3]"], base, suspended)


def test_a_roll_with_serving_already_suspended_does_not_stall(tmp_path):
    suspended = ("    coldStartTargetSeconds: 750\n", "    coldStartTargetSeconds: 750\n    suspended: true\n")
    release = ("    amiType: AL2023_x86_64_NVIDIA\n", "    amiType: AL2023_x86_64_NVIDIA\n    amiReleaseVersion: 1.35.6-20260625\n")
    base = synthesize("prod", edited_project(tmp_path / "a", "prod", (suspended,)))
    head = synthesize("prod", edited_project(tmp_path / "b", "prod", (suspended, release)))
    (raycluster,) = [r for r in base["resources"] if r["type"] == "kubernetes:ray.io/v1:RayCluster"]
    assert raycluster["inputs"]["spec"]["suspend"] is True  # KubeRay deletes the pods and keeps the cluster
    assert not [r for r in base["resources"] if r["type"] == "kubernetes:batch/v1:Job" and "benchmark" in r["name"]]
    d = diff(base, head)
    (roll,) = [c for c in d.callouts if c.text.startswith("**Rolls every node**") and "-gpu" in c.text]
    assert roll.level == "WARNING" and "Serving is suspended" in roll.text and "PodEvictionFailure" not in roll.text


def test_the_readme_carries_the_table():
    assert table_markdown() in (REPO / "docs" / "operating.md").read_text(), "docs/operating.md's change table is stale: run `python -m infra docs`"


# ---- day two of the monitoring: switching a running prod's monitoring.mode --------------------------------------

RELEASE, KPS = "kubernetes:helm.sh/v3:Release", "gpu-serving-prod-monitoring-kube-prometheus-stack"


def _monitoring_diff(diffs, name):
    d, base, head = diffs[name]
    moved = [(c.type, c.name) for c in d.changed if c.type in (NODE_GROUP, LAUNCH_TEMPLATE, K8S_PROVIDER) or c.replaced]
    moved += [(r["type"], r["name"]) for r in (*d.added, *d.removed) if r["type"] in (NODE_GROUP, LAUNCH_TEMPLATE, K8S_PROVIDER, RAYCLUSTER)]
    assert moved == []  # no node rolls, no provider, nothing replaced
    # The serving pods: the RayCluster's spec (its pod templates, annotations included) is the same on both sides.
    (rc_base,) = [r for r in base["resources"] if r["type"] == RAYCLUSTER]
    (rc_head,) = [r for r in head["resources"] if r["type"] == RAYCLUSTER]
    assert rc_base["inputs"] == rc_head["inputs"]
    return d


def test_monitoring_to_amp_upgrades_the_release_in_place_and_keeps_the_serving_pods(diffs):
    d = _monitoring_diff(diffs, "monitoring to AMP")
    (release,) = [c for c in d.changed if c.type == RELEASE]
    assert release.name == KPS and not release.replaced
    assert {(r["type"], r["name"]) for r in d.removed} == {
        ("kubernetes:monitoring.coreos.com/v1:PrometheusRule", "gpu-serving-prod-monitoring-rules"),
        ("kubernetes:storage.k8s.io/v1:StorageClass", "gpu-serving-prod-monitoring-storage-class")}  # fmt: skip
    assert "aws:amp/workspace:Workspace" in {r["type"] for r in d.added}
    # The namespace stays, so the old Prometheus' claim does too (the table's row says how to delete it).
    assert not [r for r in d.removed if r["type"] == "kubernetes:core/v1:Namespace"]
    assert not [c for c in d.changed if c.type == RAYCLUSTER]


def test_monitoring_off_deletes_the_namespace_and_keeps_the_serving_pods(diffs):
    d = _monitoring_diff(diffs, "monitoring off")
    removed = {r["type"] for r in d.removed}
    assert {RELEASE, "kubernetes:core/v1:Namespace", "kubernetes:storage.k8s.io/v1:StorageClass"} <= removed
    (rc,) = [c for c in d.changed if c.type == RAYCLUSTER]
    assert {f.path for f in rc.fields} == {"options.depends_on"}  # it no longer waits for the vllm-metrics policy
    inputs = {c.name for c in d.changed if any(f.path.startswith("inputs.") for f in c.fields)}
    assert inputs == {"gpu-serving-prod-operators-gpu-operator"}  # DCGM's ServiceMonitor off; nothing else in place
