"""The Helm releases of the platform layer: values checked against the charts, and the Operators component.

Three kinds of check:

1. Every key path our values set exists in the chart's own default values
   (`tests/fixtures/upstream/<chart>-<version>/values.yaml`), with a value of the
   same kind, so a misspelt or misplaced key fails here instead of being
   silently ignored by Helm. Only the contents of *free-form* subtrees are
   exempt (FREE_FORM below): maps whose keys are data, not chart settings.
   Lists are leaves: Helm replaces a list wholesale, and the items are
   Kubernetes objects (tolerations, env vars), checked instead against the
   Kubernetes schema with kubernetes-validate (strict).
2. What the settings mean: driver and toolkit off, DCGM exporter on, MOFED off,
   tolerations exactly the GPU taint, operators on the system nodes, the EFA
   plugin's supported-instance list.
3. The `Operators` component under the recording engine: the Release resources'
   chart, version and repository (tests/fixtures/charts.yaml and the upstream folders),
   namespaces, options, and the values reaching the Release inputs.

The recording engine turns integers into floats, so numbers compare numerically.
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pulumi
import pulumi_kubernetes as k8s
import pytest

from components.operators import (
    NAMESPACE_LABELS,
    RELEASE_OPTIONS,
    TYPE,
    Operators,
    OperatorsArgs,
    release_depends_on,
    release_values,
)
from infra.catalog.instances import INSTANCE_TYPES, get_instance_type
from infra.config import load_stack_file
from infra.k8s.scheduling import gpu_labels, gpu_tolerations, system_labels, system_node_selector
from infra.errors import UserError
from infra.k8s.helm_values import (
    CHARTS,
    OPERATOR_CHARTS,
    EFA_DEVICE_PLUGIN,
    EFA_SUPPORTED_INSTANCE_TYPES,
    GPU_OPERATOR,
    INSTANCE_TYPE_NODE_LABEL,
    KUBERAY_OPERATOR,
    Chart,
    check_efa_supported,
    efa_device_plugin_values,
    efa_plugin_needed,
    gpu_operator_values,
    kuberay_operator_values,
    kuberay_watch_namespaces,
)
from infra.preview.recording import Recording, record
from tests import yaml_text

REPO = Path(__file__).resolve().parents[1]
RELEASE = "kubernetes:helm.sh/v3:Release"
NAMESPACE = "kubernetes:core/v1:Namespace"
SERVING = ("gpu-serving",)  # the namespace KubeRay watches in these tests (the stacks' serving namespace)
EFA_TYPES = ("p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p6-b200.48xlarge")

# Subtrees whose *contents* are data rather than chart settings, by chart. The
# subtree's own key must still exist in the chart's defaults (and be a map there);
# only the keys inside it are not looked up.
#   operator.nodeSelector / nodeSelector: node label -> value, any label may be used
#   (the defaults hold `kubernetes.io/os: linux` or nothing, so our
#   `gpu-serving/role` key is not among them by nature).
# Lists (tolerations, env, supportedInstanceLabels.keys/values) need no entry: the
# checker treats every list as a leaf (Helm replaces lists, it does not merge them)
# and test_list_items_are_valid_kubernetes_objects checks their items.
FREE_FORM: dict[str, set[tuple[str, ...]]] = {
    GPU_OPERATOR.chart: {("operator", "nodeSelector")},
    EFA_DEVICE_PLUGIN.chart: set(),
    KUBERAY_OPERATOR.chart: {("nodeSelector",)},
}

# Keys a chart documents in its values.yaml only as a commented-out example (no default), by chart:
# the example, uncommented, is the key's default for the checker (so its kind is checked too).
#   kuberay-operator `# watchNamespace:` / `#   - n1` / `#   - n2`: a list of namespace names.
COMMENTED_KEYS: dict[str, tuple[str, ...]] = {KUBERAY_OPERATOR.chart: ("watchNamespace",)}
# The same one level down (parent, key): gpu-operator `dcgmExporter:` ... `  # config:` / `    # name: ...` /
# `    # create: true` / `    # data: |-` (the DCGM exporter's counters file, infra/k8s/dcgm_counters.py).
COMMENTED_NESTED_KEYS: dict[str, tuple[tuple[str, str], ...]] = {GPU_OPERATOR.chart: (("dcgmExporter", "config"),)}


def commented_default(text: str, key: str) -> Any:
    """The value of a top-level key that values.yaml shows only commented out (`# key:` and its indented lines)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.fullmatch(rf"#\s?{re.escape(key)}:.*", line)), None)
    if start is None:
        raise AssertionError(f"values.yaml has no commented-out {key!r}")
    block = [lines[start][1:].lstrip()]
    for line in lines[start + 1 :]:
        if not re.match(r"#\s{2,}\S", line):
            break
        block.append(line[1:].removeprefix(" "))
    return yaml_text.safe_load("\n".join(block))[key]


def commented_nested_default(text: str, parent: str, key: str) -> Any:
    """The value of `parent.key` that values.yaml shows only commented out under the top-level `parent:`."""
    lines = text.splitlines()
    start = lines.index(f"{parent}:") + 1
    for i in range(start, len(lines)):
        if lines[i][:1] not in ("", " ", "#"):
            break  # the next top-level key
        if m := re.fullmatch(rf"(\s+)#\s?{re.escape(key)}:.*", lines[i]):
            indent = m.group(1)
            block = [re.sub(r"#\s?", "", lines[i], count=1)]
            for line in lines[i + 1 :]:
                if not re.match(rf"{indent}\s+#", line):
                    break
                block.append(re.sub(r"# ?", "", line, count=1))
            return yaml_text.safe_load("\n".join(block))[key]
    raise AssertionError(f"values.yaml has no commented-out {parent}.{key}")


def values_of(chart: Chart) -> dict[str, Any]:
    """Our values for `chart` (the EFA plugin's for p5.48xlarge)."""
    if chart is GPU_OPERATOR:
        return gpu_operator_values(dcgm_service_monitor=True)
    if chart is EFA_DEVICE_PLUGIN:
        return efa_device_plugin_values(get_instance_type("p5.48xlarge"))
    if chart is KUBERAY_OPERATOR:
        return kuberay_operator_values(SERVING)
    raise AssertionError(chart)


# ---- the key-path checker ---------------------------------------------------------------


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def unknown_paths(ours: dict, defaults: dict, free_form: set[tuple[str, ...]], path: tuple[str, ...] = ()) -> list[str]:
    """Where `ours` sets a key the chart's defaults do not have, or a value of another kind.

    A default of null accepts any value (the chart declares the key without a type).
    """
    problems = []
    for key, value in ours.items():
        here = (*path, key)
        dotted = ".".join(here)
        if not isinstance(defaults, dict) or key not in defaults:
            problems.append(f"{dotted}: not in the chart's default values")
            continue
        default = defaults[key]
        if default is not None and _kind(value) != _kind(default):
            problems.append(f"{dotted}: we set a {_kind(value)}, the chart's default is a {_kind(default)}")
            continue
        if here in free_form:
            continue  # the map's contents are data
        if isinstance(value, dict) and isinstance(default, dict):
            problems += unknown_paths(value, default, free_form, here)
    return problems


@lru_cache(maxsize=None)
def _upstream_values(path: Path) -> dict:
    return yaml_text.safe_load(path.read_text())


@pytest.fixture(scope="module")
def chart_defaults(fixture_file):
    """The chart's default values, with its commented-out keys (COMMENTED_KEYS) as their examples."""

    def defaults(chart: Chart) -> dict:
        path = fixture_file("upstream", chart.upstream_folder, "values.yaml")
        values = dict(_upstream_values(path))
        for key in COMMENTED_KEYS.get(chart.chart, ()):
            assert key not in values, f"{key} has a default now: drop it from COMMENTED_KEYS"
            values[key] = commented_default(path.read_text(), key)
        for parent, key in COMMENTED_NESTED_KEYS.get(chart.chart, ()):
            assert key not in values[parent], f"{parent}.{key} has a default now: drop it from COMMENTED_NESTED_KEYS"
            values[parent] = {**values[parent], key: commented_nested_default(path.read_text(), parent, key)}
        return values

    return defaults


def test_commented_keys_are_read_from_the_charts_text(chart_defaults):
    # values.yaml (kuberay-operator 1.7.0): "# watchNamespace:\n#   - n1\n#   - n2".
    assert chart_defaults(KUBERAY_OPERATOR)["watchNamespace"] == ["n1", "n2"]
    assert unknown_paths({"watchNamespace": "gpu-serving"}, chart_defaults(KUBERAY_OPERATOR), set()) == [
        "watchNamespace: we set a string, the chart's default is a list"
    ]
    assert commented_default("a: 1\n# b:\n#   - x\n#c: 2\n", "b") == ["x"]
    with pytest.raises(AssertionError, match="no commented-out 'c'"):
        commented_default("a: 1\n", "c")
    # gpu-operator v26.7.0: `dcgmExporter.config`, a map of a name, a create switch and the counters file's text.
    config = chart_defaults(GPU_OPERATOR)["dcgmExporter"]["config"]
    assert (config["name"], config["create"]) == ("custom-dcgm-exporter-metrics", True)
    assert config["data"].startswith("Format\n")
    assert unknown_paths({"dcgmExporter": {"config": {"create": "true"}}}, chart_defaults(GPU_OPERATOR), set()) == [
        "dcgmExporter.config.create: we set a string, the chart's default is a bool"
    ]


@pytest.mark.parametrize("chart", OPERATOR_CHARTS, ids=lambda c: c.chart)  # kube-prometheus-stack: test_monitoring
def test_every_key_we_set_is_in_the_charts_defaults(chart, chart_defaults):
    defaults = chart_defaults(chart)
    assert unknown_paths(values_of(chart), defaults, FREE_FORM[chart.chart]) == []
    # Every free-form subtree we declare is a map in the chart's defaults, and one we set.
    for subtree in FREE_FORM[chart.chart]:
        node: Any = defaults
        for key in subtree:
            node = node[key]
        assert isinstance(node, dict), subtree


def test_the_checker_catches_typos(chart_defaults):
    """Negative examples against the same checker and the real gpu-operator defaults."""
    defaults = chart_defaults(GPU_OPERATOR)
    free = FREE_FORM[GPU_OPERATOR.chart]
    # A misspelt leaf deep in the tree (`enable` for `enabled`): Helm would ignore it.
    assert unknown_paths({"dcgmExporter": {"serviceMonitor": {"enable": True}}}, defaults, free) == [
        "dcgmExporter.serviceMonitor.enable: not in the chart's default values"
    ]
    # A misspelt top-level key, and the MOFED switch put under the wrong component.
    assert unknown_paths({"devicePlugins": {"env": []}}, defaults, free) == ["devicePlugins: not in the chart's default values"]
    assert unknown_paths({"toolkit": {"env": [], "mofed": False}}, defaults, free) == [
        "toolkit.mofed: not in the chart's default values"
    ]
    # A string where the chart has a boolean ("false" is truthy in a Helm template).
    assert unknown_paths({"driver": {"enabled": "false"}}, defaults, free) == [
        "driver.enabled: we set a string, the chart's default is a bool"
    ]
    # A map where the chart has a list (tolerations are a list of objects).
    assert unknown_paths({"daemonsets": {"tolerations": {"key": "x"}}}, defaults, free) == [
        "daemonsets.tolerations: we set a map, the chart's default is a list"
    ]
    # Keys inside a free-form map are data, any label is fine ...
    assert unknown_paths({"operator": {"nodeSelector": {"any.example/label": "x"}}}, defaults, free) == []
    # ... but the same map outside the free-form set is checked key by key.
    assert unknown_paths({"operator": {"nodeSelector": {"any.example/label": "x"}}}, defaults, set()) == [
        "operator.nodeSelector.any.example/label: not in the chart's default values"
    ]


def test_list_items_are_valid_kubernetes_objects():
    """Tolerations, env vars and node selectors, in a Pod, against the cluster's Kubernetes schema (strict)."""
    version = load_stack_file("prod", REPO).cluster.kubernetes_version + ".0"
    gpu_op = gpu_operator_values()
    efa = efa_device_plugin_values(get_instance_type("p5.48xlarge"))
    kuberay = kuberay_operator_values(SERVING)
    tolerations = [
        *gpu_op["daemonsets"]["tolerations"],
        *gpu_op["node-feature-discovery"]["worker"]["tolerations"],
        *efa["tolerations"],
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": "In", "values": efa["supportedInstanceLabels"]["values"]}]}
                    for key in efa["supportedInstanceLabels"]["keys"]
                ]
            }
        }
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "values-check"},
        "spec": {
            "nodeSelector": {**gpu_op["operator"]["nodeSelector"], **kuberay["nodeSelector"]},
            "tolerations": tolerations,
            "affinity": affinity,
            "containers": [{"name": "c", "image": "busybox", "env": gpu_op["devicePlugin"]["env"]}],
        },
    }
    kubernetes_validate.validate(pod, version, strict=True)


# ---- what the settings mean ---------------------------------------------------------------


def test_gpu_operator_values():
    v = gpu_operator_values()
    assert v["driver"]["enabled"] is False
    assert v["toolkit"]["enabled"] is False
    assert v["dcgmExporter"]["enabled"] is True
    assert v["dcgmExporter"]["serviceMonitor"]["enabled"] is False
    assert gpu_operator_values(dcgm_service_monitor=True)["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    # MOFED off, as a string (an EnvVar value), once.
    assert [e for e in v["devicePlugin"]["env"] if e["name"] == "MOFED_ENABLED"] == [{"name": "MOFED_ENABLED", "value": "false"}]
    # Every operand DaemonSet and the NFD worker tolerate exactly the GPU taint.
    assert v["daemonsets"]["tolerations"] == gpu_tolerations()
    assert v["node-feature-discovery"]["worker"]["tolerations"] == gpu_tolerations()
    assert v["nfd"]["enabled"] is True
    # The operator itself on the system nodes.
    assert v["operator"]["nodeSelector"].items() >= system_node_selector().items()
    assert v["operator"]["nodeSelector"]["kubernetes.io/os"] == "linux"


def test_operators_go_to_the_system_nodes_not_the_gpu_nodes():
    gpu = gpu_labels(get_instance_type("p5.48xlarge"))
    for selector in (gpu_operator_values()["operator"]["nodeSelector"], kuberay_operator_values(SERVING)["nodeSelector"]):
        assert selector.items() >= system_labels().items()
        assert not selector.items() <= gpu.items()  # a GPU node does not match


def test_defaults_would_not_have_done_it(chart_defaults):
    """The settings change something: each differs from the chart default (or the default is missing)."""
    gpu = chart_defaults(GPU_OPERATOR)
    assert gpu["driver"]["enabled"] is True and gpu["toolkit"]["enabled"] is True
    assert gpu["dcgmExporter"]["serviceMonitor"]["enabled"] is True  # would need the Prometheus operator
    assert gpu["devicePlugin"]["env"] == []
    efa = chart_defaults(EFA_DEVICE_PLUGIN)
    assert efa["tolerations"] == []  # the chart's values.yaml: no default tolerations
    kuberay = _upstream_values(REPO / "tests/fixtures/upstream" / KUBERAY_OPERATOR.upstream_folder / "values.yaml")
    assert kuberay["nodeSelector"] == {}
    # Cluster-wide by default: ClusterRole, no --watch-namespace (tests/test_kuberay_namespaced.py renders both).
    assert kuberay["singleNamespaceInstall"] is False and "watchNamespace" not in kuberay


# ---- KubeRay: the namespaces it watches -------------------------------------------------------


def test_kuberay_watches_exactly_the_given_namespaces():
    v = kuberay_operator_values(SERVING)
    assert v["watchNamespace"] == ["gpu-serving"]
    assert v["singleNamespaceInstall"] is True and v["rbacEnable"] is True and v["crNamespacedRbacEnable"] is True
    assert kuberay_operator_values(("a", "b", "a"))["watchNamespace"] == ["a", "b"]  # each once, order kept


@pytest.mark.parametrize(
    "namespaces, message",
    [((), "at least one"), (("Gpu_Serving",), "not Kubernetes namespace names"), (("a,b",), "not Kubernetes namespace names"),
     (("gpu-serving", KUBERAY_OPERATOR.namespace), "own namespace")],
)  # fmt: skip
def test_kuberay_watch_namespaces_are_refused_when_wrong(namespaces, message):
    for call in (kuberay_watch_namespaces, kuberay_operator_values):
        with pytest.raises(UserError, match=message):
            call(namespaces)


# ---- the EFA device plugin -----------------------------------------------------------------


def test_supported_list_is_the_charts_own(chart_defaults):
    upstream = chart_defaults(EFA_DEVICE_PLUGIN)["supportedInstanceLabels"]
    assert list(EFA_SUPPORTED_INSTANCE_TYPES) == upstream["values"]
    assert [INSTANCE_TYPE_NODE_LABEL] == upstream["keys"]


@pytest.mark.parametrize("name", EFA_TYPES)
def test_efa_instance_types_are_supported(name, chart_defaults):
    itype = get_instance_type(name)
    assert efa_plugin_needed(itype)
    assert name in chart_defaults(EFA_DEVICE_PLUGIN)["supportedInstanceLabels"]["values"]
    v = efa_device_plugin_values(itype)
    assert name in v["supportedInstanceLabels"]["values"]
    assert v["supportedInstanceLabels"]["keys"] == ["node.kubernetes.io/instance-type"]
    assert v["tolerations"] == gpu_tolerations()


def test_every_efa_type_in_the_catalog_is_supported():
    for itype in INSTANCE_TYPES.values():
        if efa_plugin_needed(itype):
            check_efa_supported(itype)


def test_unsupported_efa_instance_type_is_refused():
    made_up = dataclasses.replace(get_instance_type("p5.48xlarge"), name="p9z.96xlarge")
    assert efa_plugin_needed(made_up)
    for call in (check_efa_supported, efa_device_plugin_values):
        with pytest.raises(UserError) as err:
            call(made_up)
        message = str(err.value)
        assert "p9z.96xlarge" in message
        assert f"aws-efa-k8s-device-plugin {EFA_DEVICE_PLUGIN.version}" in message
        assert "zero nodes" in message and "fall back to TCP" in message


def test_instance_without_efa_needs_no_plugin():
    for name in ("g6e.xlarge", "g5.xlarge"):
        itype = get_instance_type(name)
        assert not efa_plugin_needed(itype)
        check_efa_supported(itype)  # nothing to refuse
        with pytest.raises(UserError, match="no EFA"):
            efa_device_plugin_values(itype)


# ---- charts: the chart table and the upstream copies ------------------------------------------


def _known_charts(fixture_file) -> dict[str, tuple[str, str]]:
    """chart -> (repository, version) from tests/fixtures/charts.yaml (each entry with its source)."""
    doc = yaml_text.safe_load(fixture_file("charts.yaml").read_text())
    return {c["chart"]: (c["repository"], c["version"]) for c in doc["charts"]}


def test_charts_match_facts_and_upstream(fixture_file):
    known = _known_charts(fixture_file)
    assert {c.chart: (c.repository, c.version) for c in CHARTS} == known
    for chart in CHARTS:
        folder = fixture_file("upstream", chart.upstream_folder)
        assert folder.is_dir(), f"no upstream copy for {chart.chart} {chart.version}: {folder}"
        chart_yaml = folder / "Chart.yaml"
        if chart_yaml.exists():  # the gpu-operator copy has values.yaml only: its folder name is the version
            meta = yaml_text.safe_load(chart_yaml.read_text())
            assert (meta["name"], str(meta["version"])) == (chart.chart, chart.version)
    assert len({c.release for c in CHARTS}) == len(CHARTS)


# ---- the component under the recording engine ------------------------------------------------------


def _record(args: OperatorsArgs) -> Recording:
    def program():
        provider = k8s.Provider("k8s", kubeconfig="{}")
        Operators("gpu-serving-prod", args, opts=pulumi.ResourceOptions(providers={"kubernetes": provider}))

    return record(program)


@pytest.fixture(scope="module")
def p5() -> Recording:
    return _record(OperatorsArgs(instance_type=get_instance_type("p5.48xlarge"), kuberay_watch_namespaces=SERVING, dcgm_service_monitor=True))


def _releases(rec: Recording) -> dict[str, Any]:
    return {r.inputs["chart"]: r for r in rec.of_type(RELEASE)}


def test_releases_pin_chart_version_and_repository(p5, fixture_file):
    known = _known_charts(fixture_file)
    releases = _releases(p5)
    assert set(releases) == {c.chart for c in OPERATOR_CHARTS} <= set(known)
    for chart in OPERATOR_CHARTS:
        r = releases[chart.chart]
        assert (r.inputs["repositoryOpts"]["repo"], r.inputs["version"]) == known[chart.chart]
        assert r.inputs["name"] == chart.release
        assert r.inputs["namespace"] == chart.namespace


def test_release_options(p5):
    for chart in OPERATOR_CHARTS:
        r = _releases(p5)[chart.chart]
        o = RELEASE_OPTIONS[chart.release]
        assert r.inputs["atomic"] is False and r.inputs["cleanupOnFail"] is False
        assert r.inputs["skipAwait"] is False
        assert r.inputs["timeout"] == o.timeout and o.timeout >= 300
        assert r.inputs["maxHistory"] == o.max_history
        # Fixed release names: a replacement must uninstall first.
        assert r.options["delete_before_replace"] is True
        # The caller's provider, inherited through parent=self.
        assert r.options["provider"] == "k8s"
        assert r.parent == p5.one(TYPE).urn


def test_values_reach_the_releases(p5):
    releases = _releases(p5)
    expected = release_values(
        OperatorsArgs(instance_type=get_instance_type("p5.48xlarge"), kuberay_watch_namespaces=SERVING, dcgm_service_monitor=True)
    )
    assert set(expected) == {c.release for c in OPERATOR_CHARTS}
    for chart in OPERATOR_CHARTS:
        assert releases[chart.chart].inputs["values"] == expected[chart.release]
    gpu = releases[GPU_OPERATOR.chart].inputs["values"]
    assert gpu["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    assert gpu["driver"]["enabled"] is False and gpu["toolkit"]["enabled"] is False
    assert gpu["devicePlugin"]["env"] == [{"name": "MOFED_ENABLED", "value": "false"}]
    assert releases[EFA_DEVICE_PLUGIN.chart].inputs["values"]["tolerations"] == gpu_tolerations()
    assert releases[KUBERAY_OPERATOR.chart].inputs["values"]["watchNamespace"] == ["gpu-serving"]


def test_namespaces(p5):
    namespaces = {r.inputs["metadata"]["name"]: r for r in p5.of_type(NAMESPACE)}
    assert set(namespaces) == set(NAMESPACE_LABELS) == {"gpu-operator", "kuberay"}
    assert namespaces["gpu-operator"].inputs["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "privileged"}
    version = load_stack_file("prod", REPO).cluster.kubernetes_version + ".0"
    for ns in namespaces.values():
        assert ns.options["provider"] == "k8s" and ns.parent == p5.one(TYPE).urn
        kubernetes_validate.validate(ns.inputs, version, strict=True)
    # A release into a namespace we create waits for it (and is deleted before it).
    releases = _releases(p5)
    for chart in (GPU_OPERATOR, KUBERAY_OPERATOR):
        assert releases[chart.chart].options["depends_on"] == [namespaces[chart.namespace].urn]
    assert EFA_DEVICE_PLUGIN.namespace == "kube-system" and releases[EFA_DEVICE_PLUGIN.chart].options["depends_on"] == []


def test_no_efa_plugin_without_efa():
    rec = _record(OperatorsArgs(instance_type=get_instance_type("g6e.xlarge"), kuberay_watch_namespaces=SERVING))
    assert set(_releases(rec)) == {GPU_OPERATOR.chart, KUBERAY_OPERATOR.chart}
    assert _releases(rec)[GPU_OPERATOR.chart].inputs["values"]["dcgmExporter"]["serviceMonitor"]["enabled"] is False


def test_unsupported_efa_type_fails_the_program():
    made_up = dataclasses.replace(get_instance_type("p5en.48xlarge"), name="p9z.96xlarge")
    kept = Recording()
    with pytest.raises(UserError, match=re.escape("p9z.96xlarge")):
        record(lambda: Operators("x", OperatorsArgs(instance_type=made_up, kuberay_watch_namespaces=SERVING)), into=kept)
    assert kept.of_type(RELEASE) == []  # refused before any release is declared


def test_component_exposes_releases_and_kuberay():
    seen: dict[str, Any] = {}

    def program():
        provider = k8s.Provider("k8s", kubeconfig="{}")
        ops = Operators(
            "ops",
            OperatorsArgs(instance_type=get_instance_type("p5.48xlarge"), kuberay_watch_namespaces=SERVING),
            opts=pulumi.ResourceOptions(providers={"kubernetes": provider}),
        )
        seen["ops"] = ops

    record(program)
    ops = seen["ops"]
    assert len(ops.releases) == 3 and ops.kuberay in ops.releases
    assert ops.releases == [ops.gpu_operator, ops.efa_device_plugin, ops.kuberay]
    assert all(isinstance(r, k8s.helm.v3.Release) for r in ops.releases)


# ---- KubeRay's release waits for the namespaces it watches -------------------------------------------


def test_release_depends_on_is_the_namespace_policies_and_for_kuberay_the_watched_namespaces():
    policies = {GPU_OPERATOR.namespace: ["gpu-np"], KUBERAY_OPERATOR.namespace: ["kuberay-np-1", "kuberay-np-2"]}
    assert release_depends_on(GPU_OPERATOR, policies, ["serving-ns"]) == ["gpu-np"]
    assert release_depends_on(EFA_DEVICE_PLUGIN, policies, ["serving-ns"]) == []
    assert release_depends_on(KUBERAY_OPERATOR, policies, ["serving-ns"]) == ["kuberay-np-1", "kuberay-np-2", "serving-ns"]
    assert release_depends_on(KUBERAY_OPERATOR, {}, ["serving-ns", "serving-ns"]) == ["serving-ns"]
    assert release_depends_on(KUBERAY_OPERATOR, {}, []) == []


def test_the_kuberay_release_waits_for_the_watched_namespace_resource():
    seen: dict[str, Any] = {}

    def program():
        provider = k8s.Provider("k8s", kubeconfig="{}")
        serving = k8s.core.v1.Namespace("serving", metadata={"name": "gpu-serving"}, opts=pulumi.ResourceOptions(provider=provider))
        seen["ops"] = Operators(
            "ops",
            OperatorsArgs(
                instance_type=get_instance_type("p5.48xlarge"),
                kuberay_watch_namespaces=SERVING,
                kuberay_watch_namespace_resources=[serving],
                kubernetes_service_cidr="172.20.0.0/16",
            ),
            opts=pulumi.ResourceOptions(providers={"kubernetes": provider}),
        )

    rec = record(program)
    serving_urn = next(r.urn for r in rec.of_type(NAMESPACE) if r.inputs["metadata"]["name"] == "gpu-serving")
    releases = _releases(rec)
    kuberay_deps = releases[KUBERAY_OPERATOR.chart].options["depends_on"]
    assert serving_urn in kuberay_deps
    # ... after its own namespace's NetworkPolicies, as before.
    policies = {r.urn for r in rec.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy") if r.inputs["metadata"]["namespace"] == "kuberay"}
    assert policies and policies <= set(kuberay_deps)
    # The other releases do not wait for the serving namespace.
    for chart in (GPU_OPERATOR, EFA_DEVICE_PLUGIN):
        assert serving_urn not in releases[chart.chart].options["depends_on"]
