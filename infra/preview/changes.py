"""Common changes to a running stack and what each does: docs/operating.md's "Changing a running stack".

Each `Change` is an edit of a stack file's own lines (base and head), what the diff tool
(`infra.preview.diff`) reports for it, summarised by `effects`, and what that means for
serving. `tests/test_changes.py` synthesizes both sides of every row and checks the diff
reports exactly the row's effects, and that docs/operating.md's table is `table_markdown()`: the
table cannot drift from what `python -m infra diff` shows in a pull request.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.preview.diff import (
    CLUSTER,
    EFS,
    FSX_LUSTRE,
    LAUNCH_TEMPLATE,
    NODE_GROUP,
    Diff,
    node_group_swaps,
)
from infra.preview.outage import RAYCLUSTER, SUSPEND_KEY, is_gpu_group
from infra.preview.markers import placeholder

Edit = tuple[str, str]  # (a line of the stack file, what it becomes)

K8S_PROVIDER = "pulumi:providers:kubernetes"
JOB = "kubernetes:batch/v1:Job"

# What the diff reports, in the words of the table (the order is the table's).
ROLLS_GPU = "rolls the GPU nodes"
REPLACES_GPU = "replaces the GPU node group"
SWAPS_GPU = "swaps the GPU node group"
ROLLS_SYSTEM = "rolls the system nodes"
UPGRADES_K8S = "upgrades the control plane"
RESTARTS_SERVING = "recreates the serving pods"
STAGES_AGAIN = "stages the weights again"
NEW_FILE_SYSTEM = "a new weights file system"
DELETES_PROTECTED = "deletes a protected resource"
PREDICTION = "changes the predicted capacity"
REPLACES_PROVIDER = "replaces the Kubernetes provider"
EFFECTS = (UPGRADES_K8S, ROLLS_GPU, REPLACES_GPU, SWAPS_GPU, ROLLS_SYSTEM, RESTARTS_SERVING, STAGES_AGAIN,
           NEW_FILE_SYSTEM, DELETES_PROTECTED, PREDICTION, REPLACES_PROVIDER)  # fmt: skip


def effects(d: Diff, head: dict) -> tuple[str, ...]:
    """What a diff (to the synth document `head`) does to a running stack, as the table names it (in EFFECTS order)."""
    found: set[str] = set()
    head_by_urn = {r["urn"]: r for r in head["resources"]}
    for c in d.changed:
        if c.type == NODE_GROUP:
            gpu = is_gpu_group(head_by_urn.get(c.urn))
            if c.replaced:
                found.add(REPLACES_GPU if gpu else "replaces the system node group")
            elif c.rolls_nodes:
                found.add(ROLLS_GPU if gpu else ROLLS_SYSTEM)
        elif c.type == CLUSTER and any(f.path == "inputs.version" for f in c.fields):
            found.add(UPGRADES_K8S)
        elif c.type == RAYCLUSTER and any(f.path.startswith("inputs.spec") for f in c.fields):
            found.add(RESTARTS_SERVING)
        elif c.type in (EFS, FSX_LUSTRE) and c.replaced:
            found.add(NEW_FILE_SYSTEM)
        elif c.type == LAUNCH_TEMPLATE and c.rolls_nodes and any(is_gpu_group(g) for g in _users(c.urn, head)):
            found.add(ROLLS_GPU)  # a new template version the GPU node group follows
        elif c.type == JOB and "staging" in c.name and any(f.path == "inputs.metadata.name" for f in c.fields):
            found.add(STAGES_AGAIN)  # a new Job (a Job's name and template are immutable)
        elif c.type == K8S_PROVIDER and any(f.path.startswith("inputs.") for f in c.fields):
            found.add(REPLACES_PROVIDER)  # its kubeconfig (a depends_on change replaces nothing)
    if any(is_gpu_group(new) for _, new in node_group_swaps(d)):
        found.add(SWAPS_GPU)
    if any(r["type"] in (EFS, FSX_LUSTRE) for r in d.added):
        found.add(NEW_FILE_SYSTEM)
    if any(r["type"] == JOB and "staging" in r["name"] for r in d.added):
        found.add(STAGES_AGAIN)
    if any((r.get("options") or {}).get("protect") for r in d.removed):
        found.add(DELETES_PROTECTED)
    if any("predicted performance changes" in c.text for c in d.callouts):
        found.add(PREDICTION)
    return tuple(e for e in EFFECTS if e in found) + tuple(sorted(found - set(EFFECTS)))


def _users(template_urn: str, doc: dict) -> list[dict]:
    """The node groups that launch from a launch template (their `launchTemplate.id` is its id)."""
    lt = next((r for r in doc["resources"] if r["urn"] == template_urn), None)
    ids = {placeholder("id", lt["name"]), template_urn} if lt else set()
    return [r for r in doc["resources"] if r["type"] == NODE_GROUP and ((r.get("inputs") or {}).get("launchTemplate") or {}).get("id") in ids]


@dataclass(frozen=True)
class Change:
    name: str
    stack: str  # the stack file both sides edit
    how: str  # the edit, as the table shows it
    head: tuple[Edit, ...]  # edits that make the head (after)
    expected: tuple[str, ...]  # effects(diff(base, head)), in EFFECTS order
    serving: str  # what it means for serving
    base: tuple[Edit, ...] = ()  # edits that make the base (before), when the stack file is not it


SUSPEND_FIRST = (f"down: suspend first (`{SUSPEND_KEY}: true`, `pulumi up`), make the change, then resume; "
                 "the diff names the outage's length")  # fmt: skip
BLOCK_A, BLOCK_B = "cr-0123456789abcdef0", "cr-0fedcba9876543210"
ON_DEMAND = "      type: on-demand"


def _block(rid: str) -> Edit:
    return ON_DEMAND, f"      type: capacity-block\n      reservationId: {rid}"


def _monitoring(mode: str) -> Edit:
    """`gpu-serving:monitoring.mode` set in a stack file that leaves it at its default, in-cluster."""
    return "  gpu-serving:lifecycle:\n", f'  gpu-serving:monitoring:\n    mode: "{mode}"\n  gpu-serving:lifecycle:\n'


# The in-cluster Prometheus' claim: the operator's volumeClaimTemplate `prometheus-<name>-db` (prometheus-operator v0.93.0
# pkg/prometheus/common.go VolumeName) of StatefulSet `prometheus-<name>`, ordinal 0, for the chart's Prometheus
# `kube-prometheus-stack-prometheus`; the StatefulSet controller labels a claim with the set's selector, which holds
# `operator.prometheus.io/name: <name>` (pkg/prometheus/server/operator.go makeSelectorLabels).
PROMETHEUS_CLAIMS = "kubectl -n monitoring delete pvc -l operator.prometheus.io/name=kube-prometheus-stack-prometheus"


CHANGES: tuple[Change, ...] = (
    Change("owner tag", "prod", "`lifecycle.owner`",
           (("    owner: ml-platform\n", "    owner: inference-team\n"),), (),
           "none: tags are updated in place; launch templates carry only project and stack"),
    Change("expiry", "test", "`lifecycle.expiresAt`",
           (('expiresAt: "2026-12-31T23:00:00Z"', 'expiresAt: "2027-01-02T09:00:00Z"'),), (),
           "none"),
    Change("AMI release", "prod", "`gpu.amiReleaseVersion`",
           (("    amiType: AL2023_x86_64_NVIDIA\n", "    amiType: AL2023_x86_64_NVIDIA\n    amiReleaseVersion: 1.35.6-20260625\n"),),
           (ROLLS_GPU, ROLLS_SYSTEM), "the system nodes follow the same release; " + SUSPEND_FIRST),
    Change("Kubernetes version", "prod", "`cluster.kubernetesVersion` 1.34 → 1.35",
           (('    kubernetesVersion: "1.34"', '    kubernetesVersion: "1.35"'),), (UPGRADES_K8S, ROLLS_GPU, ROLLS_SYSTEM),
           "control plane in place, then every node rolls: " + SUSPEND_FIRST,
           base=(('    kubernetesVersion: "1.35"', '    kubernetesVersion: "1.34"'),)),
    Change("instance type", "prod", "`gpu.instanceType` p5 → p5en",
           (("    instanceType: p5.48xlarge\n", "    instanceType: p5en.48xlarge\n"),),
           (ROLLS_GPU, RESTARTS_SERVING, PREDICTION),
           "a new plan (layout, arguments) on new nodes: " + SUSPEND_FIRST),
    Change("node count", "prod", "`gpu.nodes` 4 → 2",
           (("    nodes: 4\n", "    nodes: 2\n"),), (RESTARTS_SERVING, PREDICTION),
           "the engine restarts on the new layout (KubeRay recreates every pod): down for the plan's cold start"),
    Change("model", "prod", "`model.name`",
           (("    name: deepseek-v4-pro\n", "    name: deepseek-v4-flash\n"),), (RESTARTS_SERVING, STAGES_AGAIN, PREDICTION),
           "the engine restarts at once and waits for the new checkpoint: down until it is staged (hours for "
           "hundreds of GB) and its cold start ends; for less, run the new model as another stack first"),
    # A new vLLM release is first a new flag reference and accounting (bin/vllm-flag-reference): the stack
    # plans only for releases it has one of. What the running stack sees is a new serving image.
    Change("serving image (a vLLM build)", "prod", "`serving.image`",
           (("    coldStartTargetSeconds: 750\n",
             # By digest, as production requires (an illustrative one: the edit, not a real image).
             "    coldStartTargetSeconds: 750\n    image: 123456789012.dkr.ecr.us-east-1.amazonaws.com/vllm:0.34.0-patched"
             "@sha256:" + "1" * 64 + "\n"),),
           (RESTARTS_SERVING,),
           "the engine restarts on the new image: down for the plan's cold start"),
    Change("Capacity Block swap", "prod", "`gpu.capacity.reservationId`",
           ((f"reservationId: {BLOCK_A}", f"reservationId: {BLOCK_B}"),), (SWAPS_GPU,),
           "the new block's nodes come up first, then the old group is drained and deleted: " + SUSPEND_FIRST,
           base=(_block(BLOCK_A),)),
    Change("storage type", "prod", "`storage.type` efs → fsx",
           (("    fsxCsi: false\n", "    fsxCsi: true\n"),
            ("    owner: ml-platform\n", "    owner: ml-platform\n  gpu-serving:storage:\n    type: fsx\n")),
           (STAGES_AGAIN, NEW_FILE_SYSTEM, DELETES_PROTECTED),
           "refused while the EFS file system is protected (production); unprotected, the weights are staged "
           "into the new one (a new staging Job) and the engine reads them from its next restart"),
    # Day two of issue 20's monitoring: what each switch leaves of the old Prometheus (tests/test_changes.py checks
    # that no node, provider or serving pod moves, and what is removed).
    Change("monitoring to AMP", "prod", "`monitoring.mode` in-cluster → amp",
           (_monitoring("amp"),), (),
           "none: no node rolls, the serving pods stay; the release is upgraded in place (Prometheus becomes an agent "
           "writing to the new workspace; Alertmanager, the PrometheusRule and the gp3 StorageClass go). The old "
           "samples are not copied, and their volume stays: neither Helm nor the operator deletes a StatefulSet's "
           f"claim (`{PROMETHEUS_CLAIMS}` deletes it and, by the class's Delete policy, its EBS volume)"),
    Change("monitoring off", "prod", "`monitoring.mode` in-cluster → off",
           (_monitoring("off"),), (),
           "none: no node rolls, the serving pods stay (only the RayCluster's `dependsOn` and the GPU operator's "
           "DCGM ServiceMonitor change); the release, the monitors and the `monitoring` namespace go, and with the "
           "namespace the Prometheus volume's claim and its EBS volume (the samples are lost). The chart's "
           "monitoring.coreos.com CRDs stay (Helm never deletes a chart's CRDs)"),
)  # fmt: skip


def table_markdown() -> str:
    """The table of common changes (docs/operating.md)."""
    rows = ["| change | edit | what `python -m infra diff` reports | serving |", "|---|---|---|---|"]
    for c in CHANGES:
        rows.append(f"| {c.name} | {c.how} ({c.stack}) | {', '.join(c.expected) or 'nothing replaced or rolled'} | {c.serving} |")
    return "\n".join(rows) + "\n"
