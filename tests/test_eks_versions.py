"""Kubernetes versions, add-on pins and AMI releases (infra/catalog/eks_versions.py), and what the stacks take.

The calendar follows the EKS rule it comes from (14 months of standard support,
12 more of extended); the default version is a pure function of the day, which
the tests freeze; every add-on the cluster installs has a pinned version per
usable Kubernetes version, named as EKS names add-ons; and the prod and test
syntheses, on the frozen day, run a version in standard support, pin every
add-on and the AMI release, and give the GPU instances the stack's tags.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import botocore.session
import pytest

from components.cluster import addon_names, parse_addon_version
from infra.catalog import eks_versions as ev
from infra.config import from_mapping, load_stack_file, read_stack_file
from infra.errors import UserError
from infra.preview.synth import synthesize
from tests import yaml_text

FROZEN = dt.date(2026, 12, 3)
ADDON = "aws:eks/addon:Addon"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
CLUSTER = "aws:eks/cluster:Cluster"


def _months(a: dt.date, b: dt.date) -> int:
    return (b.year - a.year) * 12 + b.month - a.month


def test_calendar_follows_the_eks_support_rule():
    for v, r in ev.RELEASES.items():
        assert re.fullmatch(r"1\.\d{2}", v) and r.version == v
        # Standard support 14 months from the EKS release (within days: the calendar's rounding), extended 12 more.
        assert _months(r.released, r.end_of_standard) == 14, v
        assert _months(r.end_of_standard, r.end_of_extended) == 12 and r.end_of_standard.day == r.end_of_extended.day, v
    versions = sorted(ev.RELEASES, key=lambda v: tuple(map(int, v.split("."))))
    releases = [ev.RELEASES[v].released for v in versions]
    assert releases == sorted(releases)  # a newer minor version is never released earlier


def test_the_issues_facts_hold():
    # 1.33 has been in extended support since 2026-07-29; 1.34's standard support ended the day before the frozen date.
    assert ev.RELEASES["1.33"].end_of_standard == dt.date(2026, 7, 29)
    assert ev.RELEASES["1.33"].in_extended_support(FROZEN) and not ev.RELEASES["1.33"].in_standard_support(FROZEN)
    assert ev.RELEASES["1.34"].in_extended_support(FROZEN)
    assert ev.RELEASES["1.35"].in_standard_support(FROZEN)


@pytest.mark.parametrize(
    "day, expected",
    [
        (dt.date(2026, 12, 3), "1.35"),  # 1.36 is released but has no complete add-on row yet
        (dt.date(2026, 7, 1), "1.35"),
        (dt.date(2026, 1, 27), "1.34"),  # the day before 1.35's EKS release
        (dt.date(2025, 9, 1), "1.33"),
        (dt.date(2027, 4, 1), "1.35"),  # the table has nothing newer in standard support: its newest, pre-flight says why
    ],
)
def test_default_version_is_a_function_of_the_day(day, expected):
    assert ev.default_version(day) == expected
    assert ev.default_version(day) in ev.supported_versions()


def test_every_usable_version_pins_every_addon_the_cluster_installs(fixture_file):
    known = {a["name"] for a in yaml_text.safe_load(fixture_file("eks_addons.yaml").read_text())["addons"]}
    known.add(yaml_text.safe_load(fixture_file("eks-node-monitoring-agent-v1.7.0", "Chart.yaml").read_text())["name"])  # test_cluster
    installed = set(addon_names(enable_fsx_csi=True))
    assert installed == set(ev.PINNED_ADDONS) and installed <= known
    assert ev.supported_versions() == ("1.33", "1.34", "1.35")
    for v in ev.supported_versions():
        pins = ev.ADDON_VERSIONS[v]
        assert set(pins) == installed, v
        for name, pin in pins.items():
            parse_addon_version(pin.version)
            assert pin.source, (v, name)
            # Every pin says where it comes from: a guide table, a DescribeAddonVersions record for this
            # very Kubernetes version, or an ASSUMPTION that pre-flight's DescribeAddonVersions check confirms.
            assert (pin.source.startswith(("EKS User Guide", "ASSUMPTION"))
                    or pin.source.startswith(f"DescribeAddonVersions for Kubernetes {v},")), (v, name, pin.source)  # fmt: skip
            if name == "kube-proxy":  # kube-proxy follows the Kubernetes minor version
                assert pin.version.startswith(f"v{v}."), (v, pin.version)
        assert parse_addon_version(pins["vpc-cni"].version) >= (1, 18, 4)  # efa-only interfaces
    assert "1.36" in ev.RELEASES and "1.36" not in ev.supported_versions()


def test_every_assumed_pin_says_what_was_searched():
    # The pins no record shows offered for their Kubernetes version: each says so and what was searched
    # (ev._SEARCHED); a pin leaves this set only with a source, one joins it only on purpose.
    assumed = {(v, name) for v, pins in ev.ADDON_VERSIONS.items() for name, pin in pins.items()
               if pin.source.startswith("ASSUMPTION")}  # fmt: skip
    assert assumed == {
        *((v, a) for v in ("1.33", "1.34") for a in ("aws-efs-csi-driver", "aws-ebs-csi-driver", "eks-node-monitoring-agent")),
        *((v, "aws-fsx-csi-driver") for v in ("1.33", "1.34", "1.35")),
    }
    for v, name in assumed:
        source = ev.ADDON_VERSIONS[v][name].source
        assert source.endswith(ev._SEARCHED) and "ASSUMPTION" not in source[len("ASSUMPTION"):], (v, name)
    for v, pins in ev.ADDON_VERSIONS.items():
        for name, pin in pins.items():
            if (v, name) not in assumed:
                assert "searched" not in pin.source and "ASSUMPTION" not in pin.source, (v, name)


def test_addon_and_release_fields_are_the_eks_apis():
    eks = botocore.session.get_session().get_service_model("eks")
    assert {"addonName", "addonVersion"} <= set(eks.operation_model("CreateAddon").input_shape.members)
    assert {"releaseVersion", "version", "nodeRepairConfig"} <= set(eks.operation_model("CreateNodegroup").input_shape.members)
    assert {"addonName", "kubernetesVersion"} <= set(eks.operation_model("DescribeAddonVersions").input_shape.members)


def test_ami_releases_belong_to_their_kubernetes_version():
    for v, release in ev.AL2023_RELEASES.items():
        m = re.fullmatch(r"(\d+\.\d+)\.\d+-(\d{8})", release)
        assert m and m.group(1) == v, release
        assert dt.date(int(m.group(2)[:4]), int(m.group(2)[4:6]), int(m.group(2)[6:])) <= FROZEN


def test_config_takes_only_usable_versions():
    cfg = load_stack_file("test")
    assert cfg.cluster.kubernetes_version is None and cfg.kubernetes_version(FROZEN) == "1.35"
    assert cfg.ami_release_version(FROZEN) == "1.35.6-20260714"
    assert load_stack_file("prod").kubernetes_version(FROZEN) == "1.35"
    areas = {k.split(":", 1)[1]: v for k, v in read_stack_file("test").items() if k.startswith("gpu-serving:")}
    for version, why in (("1.36", "not pinned"), ("1.29", "not pinned"), ("1.99", "no such version")):
        bad = {**areas, "cluster": {**areas.get("cluster", {}), "kubernetesVersion": version}}
        with pytest.raises(UserError) as info:
            from_mapping("test", bad, source="Pulumi.test.yaml")
        assert f"gpu-serving:cluster.kubernetesVersion: '{version}' cannot be deployed" in str(info.value)
        assert why in str(info.value) and "1.33, 1.34, 1.35" in str(info.value)


# --- the stacks on the frozen day ----------------------------------------------------------------


@pytest.fixture(scope="module")
def synths():
    mp = pytest.MonkeyPatch()
    mp.setattr(ev, "today", lambda: FROZEN)
    try:
        yield {stack: synthesize(stack) for stack in ("prod", "test")}
    finally:
        mp.undo()


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_the_synth_runs_a_version_in_standard_support_with_everything_pinned(synths, stack):
    doc = synths[stack]
    (cluster,) = [r for r in doc["resources"] if r["type"] == CLUSTER]
    version = cluster["inputs"]["version"]
    assert ev.RELEASES[version].in_standard_support(FROZEN), version
    addons = [r["inputs"] for r in doc["resources"] if r["type"] == ADDON]
    assert addons and {a["addonName"]: a.get("addonVersion") for a in addons} == {
        a["addonName"]: ev.ADDON_VERSIONS[version][a["addonName"]].version for a in addons
    }
    groups = [r["inputs"] for r in doc["resources"] if r["type"] == NODE_GROUP]
    assert len(groups) == 2 and all(g["releaseVersion"] == ev.AL2023_RELEASES[version] for g in groups)
    assert all(g.get("version", version) == version for g in groups)


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_the_gpu_launch_template_gives_instances_the_stacks_lasting_tags(synths, stack):
    doc = synths[stack]
    (provider,) = [r for r in doc["resources"] if r["type"] == "pulumi:providers:aws"]
    default_tags = provider["inputs"]["defaultTags"]
    default_tags = json.loads(default_tags) if isinstance(default_tags, str) else default_tags  # providers take JSON
    stack_tags = default_tags["tags"]
    expected = {"project", "stack", "owner", "lifecycle"} | ({"expires-at"} if stack == "test" else set())
    assert set(stack_tags) == expected
    (lt,) = [r for r in doc["resources"] if r["type"] == LAUNCH_TEMPLATE and r["name"].endswith("-gpu-lt")]
    specs = {s["resourceType"]: s["tags"] for s in lt["inputs"]["tagSpecifications"]}
    assert set(specs) == {"instance", "volume", "network-interface"}
    for kind, tags in specs.items():
        # Only the tags that last as long as the stack: a change to these would roll every GPU node.
        assert {k: v for k, v in tags.items() if k != "Name"} == {k: stack_tags[k] for k in ("project", "stack")}, kind
        assert tags["Name"] == f"gpu-serving-{stack}-gpu"
