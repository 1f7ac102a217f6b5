"""GPU faults reach node auto repair: the EKS node monitoring agent add-on, configured to run on the GPU nodes.

Checked against the agent's own chart and the add-on's configuration schema at
the pinned release (tests/fixtures/eks-node-monitoring-agent-v1.7.0, copied from
aws/eks-node-monitoring-agent at tag v1.7.0), and against the synthesized prod
and test stacks' GPU node groups (their taints, instance types, repair config).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema
import pytest

from infra.catalog.eks import ADDONS_AFTER_NODES, NODE_MONITORING_ADDON
from infra.catalog.eks_versions import ADDON_VERSIONS, supported_versions
from infra.k8s.helm_values import gpu_operator_values
from tests import yaml_text
from tests.synthesized import repo_stack

AGENT = Path(__file__).parent / "fixtures" / "eks-node-monitoring-agent-v1.7.0"
ADDON = "aws:eks/addon:Addon"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
# EKS API taint effects -> Kubernetes (botocore eks TaintEffect; core/v1 Taint.effect).
EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@functools.lru_cache(maxsize=None)
def synth(stack: str) -> dict:
    return repo_stack(stack)


def resources(doc: dict, token: str) -> list[dict]:
    return [r["inputs"] for r in doc["resources"] if r["type"] == token]


def agent_config(doc: dict) -> dict:
    (addon,) = [a for a in resources(doc, ADDON) if a["addonName"] == NODE_MONITORING_ADDON]
    return json.loads(addon["configurationValues"])


def gpu_groups(doc: dict) -> list[dict]:
    return [g for g in resources(doc, NODE_GROUP) if g.get("taints")]


def instance_types(doc: dict, group: dict) -> set[str]:
    """The group's instance types: its own list, or its launch template's type."""
    if group.get("instanceTypes"):
        return set(group["instanceTypes"])
    template = next(r for r in doc["resources"] if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate"
                    and group["launchTemplate"]["id"] == f"<id:{r['name']}>")  # fmt: skip
    return {template["inputs"]["instanceType"]}


def chart_values() -> dict:
    return yaml_text.safe_load((AGENT / "values.yaml").read_text())


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Kubernetes' rule (core/v1 Toleration): an empty key with Exists tolerates everything; else key, effect
    (empty: any) and value (Equal) must match."""
    for t in tolerations:
        op = t.get("operator", "Equal")
        if not t.get("key") and op == "Exists":
            return True
        if t.get("key") != taint["key"] or t.get("effect") not in (None, "", EFFECTS[taint["effect"]]):
            continue
        if op == "Exists" or t.get("value") == taint["value"]:
            return True
    return False


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_the_configuration_is_one_the_addon_accepts(stack):
    schema = json.loads((AGENT / "configuration.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(agent_config(synth(stack)))
    # The schema is strict (additionalProperties false): a key the add-on does not know is refused, as EKS would.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({"dcgmAgent": {"hostNetwork": True}})


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_both_daemonsets_run_on_the_gpu_nodes(stack):
    doc = synth(stack)
    groups = gpu_groups(doc)
    assert groups, "a GPU node group with taints"
    dcgm = agent_config(doc)["dcgmAgent"]["tolerations"]
    defaults = chart_values()
    dcgm_types = defaults["dcgmAgent"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]  # fmt: skip
    assert dcgm_types["key"] == "node.kubernetes.io/instance-type" and dcgm_types["operator"] == "In"
    for group in groups:
        for taint in group["taints"]:
            # The agent tolerates everything by default; the DCGM host engine it reads GPU health from does not,
            # and without our configuration would never run on a tainted GPU node.
            assert tolerates(defaults["nodeAgent"]["tolerations"], taint)
            assert not tolerates(defaults["dcgmAgent"]["tolerations"] or [], taint)
            assert tolerates(dcgm, taint), (taint, dcgm)
        # ... and its node affinity lists the instance type.
        assert instance_types(doc, group) <= set(dcgm_types["values"])
        # Auto repair acts on what the agent reports.
        assert group["nodeRepairConfig"]["enabled"] is True


def test_no_second_host_engine_asks_for_the_same_host_port():
    """The agent's dcgm-server binds hostPort 5555; the GPU operator's standalone DCGM (same port) stays off."""
    template = (AGENT / "dcgm-daemonset.yaml").read_text()
    assert "hostPort: 5555" in template
    assert gpu_operator_values()["dcgm"] == {"enabled": False}


def test_the_addon_is_pinned_for_every_version_and_waits_for_nodes():
    chart = yaml_text.safe_load((AGENT / "Chart.yaml").read_text())
    assert chart["name"] == NODE_MONITORING_ADDON  # the add-on carries its chart's name
    assert NODE_MONITORING_ADDON in ADDONS_AFTER_NODES
    for version in supported_versions():
        pin = ADDON_VERSIONS[version][NODE_MONITORING_ADDON]
        # The add-on image the chart release pins, so the schema above is the one of the version installed.
        assert pin.version == chart_values()["nodeAgent"]["image"]["tag"] and pin.version.startswith(f"v{chart['version']}-")
    for stack in ("prod", "test"):
        (addon,) = [a for a in resources(synth(stack), ADDON) if a["addonName"] == NODE_MONITORING_ADDON]
        assert addon["addonVersion"] in {ADDON_VERSIONS[v][NODE_MONITORING_ADDON].version for v in supported_versions()}
