"""The in-cluster monitoring stack (issue 20): config, chart values, monitors, policies, synthesis, day two.

Real data only: the kube-prometheus-stack 88.5.3 chart's values.yaml and its subcharts' (grafana 12.11.1,
kube-state-metrics 8.4.0, prometheus-node-exporter 4.56.1), the prometheus-operator CRDs it ships, its
Prometheus template (the default selectors), the GPU operator's values, the Kubernetes OpenAPI schemas
(kubernetes-validate) and the synthesized prod program.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from functools import lru_cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from components import monitoring as component
from infra.config import load_stack_file
from infra.config.monitoring import MonitoringConfig
from infra.errors import UserError
from infra.k8s import monitoring as mon
from infra.k8s.helm_values import GPU_OPERATOR, KUBE_PROMETHEUS_STACK, gpu_operator_values
from infra.k8s.monitoring_sizing import Shape, series, sizing
from infra.planning import monitoring_pods as mp, system_nodes as sn
from infra.preview.diff import LAUNCH_TEMPLATE, NODE_GROUP, diff
from infra.preview.synth import synthesize
from policies import network_policy as NP
from tests.project_copy import edited_project
from tests.test_operators import unknown_paths
from tests.test_rayspec import crd_errors
from tests import yaml_text
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / KUBE_PROMETHEUS_STACK.upstream_folder
K8S_PROVIDER = "pulumi:providers:kubernetes"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
RELEASE = "kubernetes:helm.sh/v3:Release"
OFF = ("  gpu-serving:lifecycle:\n", '  gpu-serving:monitoring:\n    mode: "off"\n  gpu-serving:lifecycle:\n')


@lru_cache(maxsize=None)
def _yaml(name: str):
    return yaml_text.safe_load((UPSTREAM / name).read_text())


def _merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def chart_defaults() -> dict:
    """kube-prometheus-stack's values.yaml with each subchart's own values.yaml under its key (Helm's merge)."""
    values = copy.deepcopy(_yaml("values.yaml"))
    for key, name in (("grafana", "grafana-values.yaml"), ("kube-state-metrics", "kube-state-metrics-values.yaml"),
                      ("prometheus-node-exporter", "prometheus-node-exporter-values.yaml")):
        values[key] = _merged(_yaml(name), values.get(key, {}))
    # values.yaml comments these out: `storageSpec: {}` then `#  volumeClaimTemplate: ...`; `# configSecret:`.
    values["prometheus"]["prometheusSpec"]["storageSpec"] = None
    return values


def crd_schema(name: str) -> dict:
    (version,) = [v for v in _yaml(name)["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


PROD_SIZING = sizing(Shape(gpu_nodes=4, gpus_per_node=8, vcpus_per_gpu_node=192, system_nodes=2, engines=1, ray_pods=4), 15)
# Free-form maps of ours (data, not chart keys): node selectors, resources, alertmanager's routing config.
FREE = {("prometheus", "prometheusSpec", "nodeSelector"), ("prometheus", "prometheusSpec", "resources"),
        ("prometheus", "prometheusSpec", "storageSpec"), ("alertmanager", "alertmanagerSpec", "nodeSelector"),
        ("alertmanager", "config", "route"), ("prometheusOperator", "nodeSelector"),
        ("prometheusOperator", "admissionWebhooks", "patch", "nodeSelector"), ("grafana", "nodeSelector"),
        ("kube-state-metrics", "nodeSelector")}  # fmt: skip
# Each pod's requests and limits (infra/planning/monitoring_pods.py): Kubernetes ResourceRequirements under keys the chart
# has as `resources: {}` (test_every_pod_carries_requests validates them against the Kubernetes schema).
RESOURCES = {("prometheus", "prometheusSpec", "resources"), ("alertmanager", "alertmanagerSpec", "resources"),
             ("prometheusOperator", "resources"), ("prometheusOperator", "prometheusConfigReloader", "resources"),
             ("grafana", "resources"), ("grafana", "sidecar", "resources"), ("kube-state-metrics", "resources"),
             ("prometheus-node-exporter", "resources")}  # fmt: skip
FREE |= RESOURCES


# ---- config --------------------------------------------------------------------------------------------------


def test_existing_stack_files_get_in_cluster_monitoring_by_default():
    for stack in ("prod", "test"):
        cfg = load_stack_file(stack)
        assert cfg.monitoring.mode == "in-cluster" and cfg.monitoring.retention_days == 15
        assert cfg.serving.monitoring == "annotations"  # untouched: the serving pods keep their annotations


@pytest.mark.parametrize(
    "area, message",
    [
        ("{mode: amp, alerts: {receiver: webhook}}",
         "gpu-serving:monitoring.alerts.receiver: 'webhook' is not available with mode amp: the workspace's alert manager "
         "sends only to Amazon SNS; set the receiver to sns"),
        ("{alerts: {receiver: sns}}", "gpu-serving:monitoring.alerts.receiver: 'sns' is the receiver of mode amp; with in-cluster, set it to webhook"),
        ("{alerts: {slaWindow: 10 minutes}}", "gpu-serving:monitoring.alerts.slaWindow: '10 minutes' is not a Prometheus duration"),
        ("{alerts: {slaFor: 30m1h}}", "gpu-serving:monitoring.alerts.slaFor: '30m1h' is not a Prometheus duration"),
        ("{alerts: {slaWindow: 0m}}", "gpu-serving:monitoring.alerts.slaWindow: '0m': the window must be longer than zero"),
        ("{mode: prometheus}", "gpu-serving:monitoring.mode = 'prometheus' is not allowed"),
        ("{retentionDays: 0}", "gpu-serving:monitoring.retentionDays = 0 is out of range"),
        ("{mode: off, alerts: {receiver: webhook}}", "monitoring.alerts.receiver: a receiver 'webhook' is set but monitoring is off"),
        ("{alerts: {receiver: webhook}}", "gpu-serving:alertWebhookUrl is not set"),
        ("{alerts: {reciever: none}}", "did you mean 'receiver'"),
    ],
)
def test_bad_monitoring_config_is_refused_with_the_key(tmp_path, area, message):
    root = edited_project(tmp_path / "p", "test", [("  gpu-serving:lifecycle:\n", f"  gpu-serving:monitoring: {area}\n  gpu-serving:lifecycle:\n")])
    with pytest.raises(UserError, match=re.escape(message)) as caught:
        load_stack_file("test", root)
    assert "\n" not in str(caught.value) and "Traceback" not in str(caught.value)  # one line, no stack trace


def test_a_webhook_receiver_with_its_secret_set_loads(tmp_path):
    root = edited_project(tmp_path / "p", "test", [("  gpu-serving:lifecycle:\n", "  gpu-serving:monitoring: {alerts: {receiver: webhook}}\n"
                                                   "  gpu-serving:alertWebhookUrl: {secure: AAABAExample}\n  gpu-serving:lifecycle:\n")])
    assert load_stack_file("test", root).monitoring.alerts.receiver == "webhook"


# ---- the chart's values --------------------------------------------------------------------------------------


@pytest.mark.parametrize("webhook", [None, component.WEBHOOK_SECRET])
def test_every_key_we_set_is_in_the_charts_defaults(webhook):
    ours = mon.kube_prometheus_stack_values(PROD_SIZING, 15, component.GRAFANA_ADMIN_SECRET, webhook)
    assert unknown_paths(ours, chart_defaults(), FREE) == []
    assert unknown_paths({"grafana": {"nodeSelektor": {}}}, chart_defaults(), FREE) == ["grafana.nodeSelektor: not in the chart's default values"]


def _at(values: dict, path: tuple[str, ...]):
    for key in path:
        values = values[key]
    return values


@pytest.mark.parametrize("amp", [False, True], ids=["in-cluster", "amp"])
def test_every_pod_carries_requests(amp):
    """The chart sets none but what we give Prometheus (`resources: {}` at every key); our values give every container
    CPU and memory requests and a memory limit, each a valid Kubernetes ResourceRequirements."""
    ours = mon.kube_prometheus_stack_values(PROD_SIZING, 15, component.GRAFANA_ADMIN_SECRET,
                                            amp=mon.AmpValues("https://w/api/v1/remote_write", "https://w/", "us-east-1") if amp else None)  # fmt: skip
    defaults, version = chart_defaults(), load_stack_file("prod").cluster.kubernetes_version + ".0"
    for path in sorted(RESOURCES):
        assert _at(defaults, path) == {}, path
        if amp and path[0] == "alertmanager":
            assert ours["alertmanager"] == {"enabled": False}  # no Alertmanager in agent mode
            continue
        resources = _at(ours, path)
        assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"memory"}, path
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}}  # fmt: skip
        kubernetes_validate.validate(pod, version, strict=True)


def test_the_chart_is_the_pinned_one_and_its_names_are_ours():
    meta = _yaml("Chart.yaml")
    assert (meta["name"], meta["version"]) == (KUBE_PROMETHEUS_STACK.chart, KUBE_PROMETHEUS_STACK.version)
    deps = {d["name"]: d.get("version") for d in meta["dependencies"]}
    assert (deps["kube-state-metrics"], deps["prometheus-node-exporter"], deps["grafana"]) == ("8.4.0", "4.56.1", "12.11.1")
    d = chart_defaults()
    # The Grafana sidecar's default label finds our dashboards; the admin Secret's keys are the chart's.
    assert (d["grafana"]["sidecar"]["dashboards"]["label"], d["grafana"]["sidecar"]["dashboards"]["labelValue"]) == (mon.DASHBOARD_LABEL, mon.DASHBOARD_LABEL_VALUE)
    assert (d["grafana"]["admin"]["userKey"], d["grafana"]["admin"]["passwordKey"]) == (mon.ADMIN_USER_KEY, mon.ADMIN_PASSWORD_KEY)
    assert d["prometheus"]["service"]["port"] == mon.PROMETHEUS_PORT and d["alertmanager"]["service"]["port"] == mon.ALERTMANAGER_PORT
    assert (d["grafana"]["service"]["port"], d["grafana"]["service"]["targetPort"]) == (mon.GRAFANA_PORT, mon.GRAFANA_LOCAL_PORT)
    assert d["prometheus-node-exporter"]["service"]["port"] == mon.NODE_EXPORTER_PORT and d["prometheus-node-exporter"]["hostNetwork"] is True
    # node exporter tolerates every NoSchedule taint, the GPU nodes' included.
    assert {"effect": "NoSchedule", "operator": "Exists"} in d["prometheus-node-exporter"]["tolerations"]


def test_monitors_and_rules_carry_the_label_the_charts_prometheus_selects():
    template = (UPSTREAM / "prometheus.yaml.gotmpl").read_text()
    d = chart_defaults()["prometheus"]["prometheusSpec"]
    for kind in ("serviceMonitor", "podMonitor", "rule"):
        assert d[f"{kind}SelectorNilUsesHelmValues"] is True and d[f"{kind}Selector"] == {}
        assert re.search(rf"{kind}Selector:\n    matchLabels:\n      release: {{{{ \$\.Release\.Name \| quote }}}}", template), kind
        assert f"{kind}NamespaceSelector: {{}}" in template  # every namespace
    assert mon.MONITOR_LABELS == {"release": KUBE_PROMETHEUS_STACK.release}


def test_the_dcgm_service_monitor_carries_the_label():
    values = gpu_operator_values(dcgm_service_monitor=True, monitor_labels=mon.MONITOR_LABELS)
    defaults = yaml_text.safe_load((REPO / "tests/fixtures/upstream" / GPU_OPERATOR.upstream_folder / "values.yaml").read_text())
    assert defaults["dcgmExporter"]["serviceMonitor"]["additionalLabels"] == {}
    assert values["dcgmExporter"]["serviceMonitor"] == {"enabled": True, "additionalLabels": mon.MONITOR_LABELS}


def test_prods_prometheus_is_sized_from_its_series():
    """The estimate, stated: about 76k active series with churn for 4 x p5.48xlarge and 2 system nodes."""
    s = PROD_SIZING
    assert 40_000 < s.series < 80_000
    assert s.memory_mib == 1280 and s.storage_gib == 20 and s.retention_size_gib == 17
    longer = sizing(Shape(4, 8, 192, 2, 1, 4), 90)
    assert longer.storage_gib > s.storage_gib and longer.memory_mib == s.memory_mib
    assert longer.storage_gib * 2**30 > longer.samples_per_second * 86_400 * 90 * 2  # the docs' formula, 2 B a sample


SIZING_BASE = Shape(gpu_nodes=4, gpus_per_node=8, vcpus_per_gpu_node=192, system_nodes=2, engines=1, ray_pods=4)


def _grown(**more) -> dict[str, int]:
    """Each source's series with the base shape grown by `more`, less the base shape's."""
    base, grown = series(SIZING_BASE), series(dataclasses.replace(SIZING_BASE, **{k: getattr(SIZING_BASE, k) + v for k, v in more.items()}))
    assert grown.keys() == base.keys()
    return {k: grown[k] - base[k] for k in base}


def test_each_source_grows_with_what_it_counts():
    """The module doc's rates, within 10% (they are estimates; the test holds their shape, not their last digit):
    vLLM about 1,500 an engine, Ray about 1,500 a pod, DCGM about 40 a GPU, node exporter about 800 a node plus 10 a
    vCPU (a p5.48xlarge about 2,700; a system node, an m7i.xlarge of 4 vCPUs by EC2's figures, about 840), the kubelet
    about 1,500 a node plus 60 a container, kube-state-metrics 300 a node and 40 a pod; nothing else moves."""
    assert set(series(SIZING_BASE)) == {"vllm", "ray", "dcgm", "node-exporter", "kubelet", "kube-state-metrics", "monitoring"}
    near = lambda got, want: want * 0.9 <= got <= want * 1.1  # noqa: E731
    engine = _grown(engines=1)
    assert near(engine.pop("vllm"), 1500) and not any(engine.values())
    gpu = _grown(gpus_per_node=1)  # one more GPU on each of the 4 GPU nodes
    assert near(gpu.pop("dcgm"), 4 * 40) and not any(gpu.values())
    vcpu = _grown(vcpus_per_gpu_node=1)
    assert near(vcpu.pop("node-exporter"), 4 * 10) and not any(vcpu.values())
    ray = _grown(ray_pods=1)
    assert near(ray.pop("ray"), 1500) and near(ray.pop("kube-state-metrics"), 40)
    assert ray.pop("kubelet") % 60 == 0 and not any(ray.values())  # cAdvisor: 60 a container of the new pod
    gpu_node = _grown(gpu_nodes=1)
    assert near(gpu_node.pop("dcgm"), 8 * 40) and near(gpu_node.pop("node-exporter"), 2700)
    assert gpu_node.pop("kubelet") > 1500 and gpu_node.pop("kube-state-metrics") > 300 and not any(gpu_node.values())
    assert sn.INSTANCE_TYPES["m7i.xlarge"][0] == 4
    system = _grown(system_nodes=1)
    assert near(system.pop("node-exporter") - 800, 10 * 4)  # its vCPUs' share, beyond the per-node 800
    assert system.pop("kubelet") > 1500 and system.pop("kube-state-metrics") > 300 and not any(system.values())


def test_the_total_is_the_sum_with_churn_and_prods_is_about_76k():
    """x1.5 for churn (module doc); docs/operating.md: prod's estimate is about 76k series with churn."""
    for shape in (SIZING_BASE, dataclasses.replace(SIZING_BASE, gpu_nodes=40, ray_pods=40, engines=5)):
        assert sizing(shape, 15).series == math.ceil(1.5 * sum(series(shape).values()))
    assert sizing(SIZING_BASE, 15).series == pytest.approx(76_000, rel=0.01)


def test_memory_and_volume_cover_the_documented_estimates():
    """Memory: 8 KiB a series plus 512 MiB, rounded up to whole 256 MiB. Volume (Prometheus docs, "Operational
    aspects": retention seconds x samples per second x 2 bytes, the samples at the operator's default 30 s scrape
    interval, PrometheusAgent CRD `scrapeInterval` default), times 1.5, rounded up to 10 GiB, at least 20 GiB;
    retentionSize 85% of it, in whole GiB. A day is the shortest retention the config allows."""
    crd = _yaml("crd-prometheusagents.yaml")
    (version,) = crd["spec"]["versions"]
    interval = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["scrapeInterval"]["default"]
    assert interval == "30s"
    assert next(m.ge for m in MonitoringConfig.model_fields["retention_days"].metadata if hasattr(m, "ge")) == 1
    for gpu_nodes in range(1, 65, 3):
        shape = dataclasses.replace(SIZING_BASE, gpu_nodes=gpu_nodes, ray_pods=gpu_nodes, engines=max(1, gpu_nodes // 4))
        for days in (1, 15, 90, 365):
            s = sizing(shape, days)
            assert s.samples_per_second == s.series / 30
            estimate_mib = 512 + s.series * 8 * 1024 / 2**20
            assert s.memory_mib % 256 == 0 and estimate_mib <= s.memory_mib < estimate_mib + 256, (gpu_nodes, days)
            needed_gib = days * 86_400 * (s.series / 30) * 2 * 1.5 / 2**30
            assert s.storage_gib % 10 == 0, (gpu_nodes, days)
            assert s.storage_gib == 20 if needed_gib <= 20 else needed_gib <= s.storage_gib < needed_gib + 10, (gpu_nodes, days)
            assert s.retention_size_gib == int(s.storage_gib * 0.85)
    with pytest.raises(ValueError):
        sizing(SIZING_BASE, 0)


def _commented_example(text: str, after: str) -> dict:
    """The commented-out `resources` example right below the first `resources: {}` after the line `after` (values.yaml
    keeps its examples as comments: `resources: {}` then `# limits: ...`)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line == after)
    at = next(i for i in range(start, len(lines)) if lines[i].strip() == "resources: {}")
    block = []
    for line in lines[at + 1:]:
        if not line.lstrip().startswith("#"):
            break
        block.append(line.split("#", 1)[1][1:])
    return yaml_text.safe_load("\n".join(block))


def _number(quantity: str) -> int:
    """A CPU (`100m`) or memory (`100Mi`) quantity's number."""
    return int(re.fullmatch(r"([0-9]+)(m|Mi)", quantity).group(1))


def test_the_monitoring_pods_requests_are_their_sources():
    """Each figure from where monitoring_pods.py says it is from: the pinned charts' commented examples (fixtures), the
    prometheus-operator's reloader defaults (cmd/operator/main.go defaultReloaderCPU "10m", defaultReloaderMemory
    "50Mi", requests and limits alike), kube-prometheus' components (alertmanager.libsonnet requests 4m/100Mi, limit
    100Mi; node-exporter.libsonnet requests 102m/180Mi, memory limit 180Mi; grafana.libsonnet's 100m CPU), the
    kube-state-metrics README (250MiB, 0.1 cores) and Grafana's minimum recommended memory (512 MB)."""
    operator = _commented_example((UPSTREAM / "values.yaml").read_text(), "prometheusOperator:")
    assert mp.OPERATOR.resources() == {"requests": operator["requests"], "limits": {"memory": operator["limits"]["memory"]}}
    sidecar = _commented_example((UPSTREAM / "grafana-values.yaml").read_text(), "sidecar:")
    # The sidecar: the example's CPU request, its memory limit as the request, the limit at twice that (module doc).
    assert mp.GRAFANA_SIDECAR.cpu_m == _number(sidecar["requests"]["cpu"])
    assert mp.GRAFANA_SIDECAR.memory_mib == _number(sidecar["limits"]["memory"]) and mp.GRAFANA_SIDECAR.limit_mib == 2 * mp.GRAFANA_SIDECAR.memory_mib
    assert mp.CONFIG_RELOADER.resources() == {"requests": {"cpu": "10m", "memory": "50Mi"}, "limits": {"memory": "50Mi"}}
    assert mp.ALERTMANAGER.resources() == {"requests": {"cpu": "4m", "memory": "100Mi"}, "limits": {"memory": "100Mi"}}
    assert mp.NODE_EXPORTER.resources() == {"requests": {"cpu": "102m", "memory": "180Mi"}, "limits": {"memory": "180Mi"}}
    assert (mp.KUBE_STATE_METRICS.cpu_m, mp.KUBE_STATE_METRICS.memory_mib) == (100, 250)
    assert mp.GRAFANA.memory_mib * 2**20 >= 512 * 10**6 and mp.GRAFANA.memory_mib == 512
    assert mp.GRAFANA.cpu_m == 100  # kube-prometheus grafana.libsonnet: requests cpu '100m'
    # Kubernetes refuses a container whose memory request exceeds its limit.
    for c in (mp.CONFIG_RELOADER, mp.OPERATOR, mp.ALERTMANAGER, mp.GRAFANA, mp.GRAFANA_SIDECAR, mp.KUBE_STATE_METRICS, mp.NODE_EXPORTER):
        assert c.limit_mib >= c.memory_mib, c


def test_the_monitoring_pods_sum_their_containers():
    """Pod requests as the pinned charts render the containers (monitoring_pods.py module doc): Prometheus and
    Alertmanager with the reloader, Grafana with its dashboards and datasources sidecars (the chart's values turn on
    exactly those two), node exporter a DaemonSet; amp runs the agent and no Alertmanager."""
    sidecars = [k for k in ("alerts", "dashboards", "datasources", "notifiers", "plugins") if chart_defaults()["grafana"]["sidecar"][k]["enabled"]]
    assert sidecars == ["dashboards", "datasources"]
    reloader = (10, 50)  # the operator's defaults (above)
    want = {
        "prometheus": (mp.PROMETHEUS_CPU_M + reloader[0], 1024 + reloader[1], False),
        "alertmanager": (4 + reloader[0], 100 + reloader[1], False),
        "prometheus-operator": (100, 100, False),
        "grafana": (mp.GRAFANA.cpu_m + len(sidecars) * mp.GRAFANA_SIDECAR.cpu_m,
                    mp.GRAFANA.memory_mib + len(sidecars) * mp.GRAFANA_SIDECAR.memory_mib, False),
        "kube-state-metrics": (100, 250, False),
        "node-exporter": (102, 180, True),
    }  # fmt: skip
    got = {p.name: (p.cpu_m, p.memory_mib, p.per_node) for p in mp.pods("in-cluster", 1024)}
    assert got == want
    amp = {p.name: (p.cpu_m, p.memory_mib, p.per_node) for p in mp.pods("amp", 1024)}
    assert amp == {("prometheus-agent" if k == "prometheus" else k): v for k, v in want.items() if k != "alertmanager"}
    with pytest.raises(ValueError, match="monitoring mode 'off' deploys no pods"):
        mp.pods("off", 1024)


# ---- the synthesized prod ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prod() -> dict:
    return repo_stack("prod")


@pytest.fixture(scope="module")
def prod_off(tmp_path_factory) -> dict:
    return synthesize("prod", edited_project(tmp_path_factory.mktemp("off") / "p", "prod", [OFF]))


def _of(doc: dict, type_: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == type_]


def _custom(doc: dict, kind: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"].endswith(f":{kind}") and r["type"].startswith("kubernetes:monitoring.coreos.com")]


def test_prod_holds_the_pinned_release_on_the_system_nodes(prod):
    (release,) = [r for r in _of(prod, RELEASE) if r["inputs"]["chart"] == KUBE_PROMETHEUS_STACK.chart]
    i = release["inputs"]
    assert (i["version"], i["repositoryOpts"]["repo"], i["namespace"], i["name"]) == (
        KUBE_PROMETHEUS_STACK.version, KUBE_PROMETHEUS_STACK.repository, mon.NAMESPACE, KUBE_PROMETHEUS_STACK.release)
    spec = i["values"]["prometheus"]["prometheusSpec"]
    assert spec["nodeSelector"] == {"gpu-serving/role": "system"} and spec["retention"] == "15d"
    assert spec["storageSpec"]["volumeClaimTemplate"]["spec"]["storageClassName"] == "gp3"
    assert unknown_paths(i["values"], chart_defaults(), FREE) == []
    assert "adminPassword" not in i["values"]["grafana"]  # the password is in a Secret, not in Helm values


def test_prods_monitors_and_rules_are_valid_against_the_crds(prod):
    (pm,) = _custom(prod, "PodMonitor")
    manifest = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", **pm["inputs"]}
    assert crd_errors(crd_schema("crd-podmonitors.yaml"), manifest) == []
    assert pm["inputs"]["metadata"]["labels"]["release"] == KUBE_PROMETHEUS_STACK.release
    assert {e["port"] for e in pm["inputs"]["spec"]["podMetricsEndpoints"]} == {"http", "metrics"}
    (rule,) = _custom(prod, "PrometheusRule")
    manifest = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", **rule["inputs"]}
    assert crd_errors(crd_schema("crd-prometheusrules.yaml"), manifest) == []
    assert rule["inputs"]["metadata"]["labels"] == mon.MONITOR_LABELS and rule["inputs"]["spec"]["groups"]
    # The DCGM exporter's ServiceMonitor is the GPU operator's (its ClusterPolicy): on, with the label.
    (gpu,) = [r for r in _of(prod, RELEASE) if r["inputs"]["chart"] == GPU_OPERATOR.chart]
    assert gpu["inputs"]["values"]["dcgmExporter"]["serviceMonitor"] == {"enabled": True, "additionalLabels": mon.MONITOR_LABELS}
    # A ServiceMonitor of the shape the GPU operator makes validates against the CRD the chart installs.
    sm = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
          "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "labels": mon.MONITOR_LABELS},
          "spec": {"selector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}}, "namespaceSelector": {"matchNames": ["gpu-operator"]},
                   "endpoints": [{"port": "gpu-metrics", "path": "/metrics", "interval": "15s", "honorLabels": False}]}}  # fmt: skip
    assert crd_errors(crd_schema("crd-servicemonitors.yaml"), sm) == []
    assert crd_errors(crd_schema("crd-podmonitors.yaml"), {**manifest, "kind": "PodMonitor", "spec": {"podMetricsEndpoints": [{"prot": 1}]}})


def test_prods_dashboards_are_config_maps_the_sidecar_finds(prod):
    cms = [r for r in _of(prod, "kubernetes:core/v1:ConfigMap") if r["inputs"]["metadata"].get("namespace") == mon.NAMESPACE]
    assert {r["inputs"]["metadata"]["name"] for r in cms} == {"dashboard-serving", "dashboard-plan-vs-reality", "dashboard-gpus", "dashboard-cluster"}
    version = load_stack_file("prod").cluster.kubernetes_version + ".0"
    for r in cms:
        assert r["inputs"]["metadata"]["labels"] == {mon.DASHBOARD_LABEL: mon.DASHBOARD_LABEL_VALUE}
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", **r["inputs"]}, version, strict=True)
        (body,) = r["inputs"]["data"].values()
        assert yaml_text.safe_load(body)["title"]


def test_prods_outputs_reach_grafana_and_prometheus(prod):
    out = prod["outputs"]
    assert out["grafanaPortForward"] == "kubectl -n monitoring port-forward svc/kube-prometheus-stack-grafana 3000:80"
    assert out["prometheusPortForward"] == "kubectl -n monitoring port-forward svc/kube-prometheus-stack-prometheus 9090:9090"
    assert out["grafanaAdminPassword"] == {"<secret>": True}  # a secret output, as apiKey
    (password,) = [r for r in prod["resources"] if r["type"] == "random:index/randomPassword:RandomPassword" and "grafana" in r["name"]]
    assert password["inputs"]["length"] >= 32
    (admin,) = [r for r in _of(prod, "kubernetes:core/v1:Secret") if r["inputs"]["metadata"]["name"] == component.GRAFANA_ADMIN_SECRET]
    assert admin["inputs"]["stringData"] == {"<secret>": True} or "admin-password" not in str(admin["inputs"]["stringData"])


def test_the_monitoring_prometheus_reaches_the_metrics_ports_and_no_one_else_does(prod):
    nps = [{"metadata": r["inputs"]["metadata"], "spec": r["inputs"]["spec"]} for r in _of(prod, "kubernetes:networking.k8s.io/v1:NetworkPolicy")]
    version = load_stack_file("prod").cluster.kubernetes_version + ".0"
    for p in nps:
        kubernetes_validate.validate({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **p}, version, strict=True)
    prometheus = NP.pod(mon.NAMESPACE, mon.PROMETHEUS_PODS)
    grafana = NP.pod(mon.NAMESPACE, {"app.kubernetes.io/name": "grafana"})
    (rc,) = _of(prod, RAYCLUSTER)
    head = NP.pod("gpu-serving", rc["inputs"]["spec"]["headGroupSpec"]["template"]["metadata"]["labels"])
    worker = NP.pod("gpu-serving", rc["inputs"]["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"])
    dcgm = NP.pod("gpu-operator", {"app": "nvidia-dcgm-exporter"})
    for src, dst, port in ((prometheus, head, 8000), (prometheus, head, 8080), (prometheus, worker, 8080), (prometheus, dcgm, 9400),
                           (grafana, prometheus, 9090), (prometheus, NP.address("10.0.1.10"), 9100)):  # fmt: skip
        assert NP.allowed(nps, src, dst, port), (src, dst, port)
    for src, dst, port in ((grafana, head, 8000), (prometheus, head, 6379), (NP.pod("default", {}), prometheus, 9090),
                           (NP.pod("gpu-serving", {}), grafana, 3000), (prometheus, NP.address("1.1.1.1"), 443)):  # fmt: skip
        assert not NP.allowed(nps, src, dst, port), (src, dst, port)


def test_a_changed_sla_changes_the_rule(tmp_path):
    head = synthesize("prod", edited_project(tmp_path / "sla", "prod", [("      ttftP99Ms: 250\n", "      ttftP99Ms: 400\n")]))
    (rule,) = _custom(head, "PrometheusRule")
    exprs = " ".join(r["expr"] for g in rule["inputs"]["spec"]["groups"] for r in g["rules"])
    assert "> 0.4" in exprs and "> 0.25" not in exprs


# ---- off, and day two --------------------------------------------------------------------------------------


def test_off_leaves_none_of_it(prod_off):
    assert not [r for r in _of(prod_off, RELEASE) if r["inputs"]["chart"] == KUBE_PROMETHEUS_STACK.chart]
    assert not [r for r in prod_off["resources"] if r["type"].startswith("kubernetes:monitoring.coreos.com")]
    assert not [r for r in prod_off["resources"] if (r.get("inputs") or {}).get("metadata", {}).get("namespace") == mon.NAMESPACE]
    assert not [r for r in prod_off["resources"] if r["type"].startswith("gpu-serving:k8s:Monitoring")]
    assert not {"grafanaService", "grafanaAdminPassword", "prometheusService", "ampWorkspaceId", "alertTopicArn"} & set(prod_off["outputs"])
    # Nor any of amp's: no workspace, rules, topic or Pod Identity role in the monitoring namespace.
    assert not [r for r in prod_off["resources"] if r["type"].startswith(("aws:amp/", "aws:sns/"))]
    assert not [r for r in prod_off["resources"] if (r.get("inputs") or {}).get("namespace") == mon.NAMESPACE]
    names = {r["inputs"]["metadata"]["name"] for r in _of(prod_off, "kubernetes:networking.k8s.io/v1:NetworkPolicy")}
    assert not {n for n in names if n.endswith("-metrics")}  # prod names no other metricsClients


def test_adding_monitoring_to_a_running_prod_touches_no_node_provider_or_raycluster(prod_off, prod):
    d = diff(prod_off, prod)
    moved = [(c.type, c.name) for c in d.changed if c.type in (K8S_PROVIDER, LAUNCH_TEMPLATE, NODE_GROUP)]
    # The RayCluster: no input changes (its pods keep their annotations, KubeRay recreates nothing); it only
    # waits for the new vllm-metrics NetworkPolicy (a dependency, not an update).
    (rc,) = [c for c in d.changed if c.type == RAYCLUSTER]
    assert {f.path for f in rc.fields} == {"options.depends_on"} and all("NetworkPolicy" in str(f.new) for f in rc.fields)
    moved += [(r["type"], r["name"]) for r in (*d.added, *d.removed) if r["type"] in (K8S_PROVIDER, LAUNCH_TEMPLATE, NODE_GROUP, RAYCLUSTER)]
    assert moved == []
    assert not d.removed and not [c for c in d.changed if c.replaced]
    # What changes in place: the GPU operator's values (DCGM's ServiceMonitor on, with the label); nothing else.
    inputs = {(c.type, c.name) for c in d.changed if any(f.path.startswith("inputs.") for f in c.fields)}
    assert inputs == {(RELEASE, "gpu-serving-prod-operators-gpu-operator")}
    added = {r["type"] for r in d.added}
    assert RELEASE in added and "kubernetes:monitoring.coreos.com/v1:PodMonitor" in added
