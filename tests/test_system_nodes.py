"""The system node group against what runs on it (infra/planning/system_nodes.py, issue 20 item 7).

- The instance figures are EC2's (moto 5.2.5's DescribeInstanceTypes data); the pods' requests are the
  pinned charts' defaults where the module says so (tests/fixtures/upstream/) and the stack's own Prometheus
  request (infra/k8s/monitoring.py values, sized as components/stack.py sizes it).
- The sum follows the series estimate and the monitoring mode; retention moves the volume, not the memory.
- A node group too small for the sum is refused with the size that fits; prod's plan states its fit.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path

import moto
import pytest

from infra.config import load_stack_file
from infra.errors import UserError
from infra.k8s import monitoring as mon
from infra.planning import monitoring_pods as mp, system_nodes as sn
from infra.planning.monitoring_sizing import Shape, sizing
from infra.planning.plan import make_plan
from infra.preview.synth import synthesize
from tests.conftest import fixture_path
from tests.project_copy import edited_project
from tests.test_monitoring import _merged, chart_defaults
from tests import yaml_text

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def prod():
    config = load_stack_file("prod")
    return config, make_plan(config.plan_request())


def test_instance_figures_are_ec2s():
    data = json.loads(gzip.open(Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz").read())
    for name, (vcpus, memory, enis, ips) in sn.INSTANCE_TYPES.items():
        it = data[name]
        assert (it["VCpuInfo"]["DefaultVCpus"], it["MemoryInfo"]["SizeInMiB"]) == (vcpus, memory), name
        assert (it["NetworkInfo"]["MaximumNetworkInterfaces"], it["NetworkInfo"]["Ipv4AddressesPerInterface"]) == (enis, ips), name


def test_the_kubelet_reservations_follow_nodeadm():
    # eni-max-pods: m5.large 29, m5.xlarge 58, m5.4xlarge 234 (ENIs x (IPs - 1) + 2).
    assert [sn.max_pods(*sn.INSTANCE_TYPES[t][2:]) for t in ("m5.large", "m5.xlarge", "m5.4xlarge")] == [29, 58, 234]
    # 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% above.
    assert [sn.kube_reserved_cpu_m(v) for v in (1, 2, 4, 16)] == [60, 70, 80, 110]
    cpu, memory = sn.allocatable("m7i.xlarge")
    assert (cpu, memory) == (4000 - 80, int(16384 * sn.MEMTOTAL_SHARE) - (11 * 58 + 255) - 100)


def test_chart_figures_are_the_pinned_charts_defaults():
    pods = {p.name: p for p in sn.system_pods(sn.SystemRequest("m7i.xlarge", 2, 500, 1024))}
    gpu_op = yaml_text.safe_load(fixture_path("upstream", "gpu-operator-v26.7.0", "values.yaml").read_text())
    assert gpu_op["operator"]["resources"]["requests"] == {"cpu": f"{pods['gpu-operator'].cpu_m}m", "memory": f"{pods['gpu-operator'].memory_mib}Mi"}
    kuberay = yaml_text.safe_load(fixture_path("upstream", "kuberay-operator-1.7.0", "values.yaml").read_text())["resources"]
    assert "requests" not in kuberay  # limits only: Kubernetes copies them into the requests
    assert kuberay["limits"] == {"cpu": f"{pods['kuberay-operator'].cpu_m}m", "memory": f"{pods['kuberay-operator'].memory_mib}Mi"}
    nma = yaml_text.safe_load(fixture_path("eks-node-monitoring-agent-v1.7.0", "values.yaml").read_text())["nodeAgent"]["resources"]["requests"]
    assert nma == {"cpu": f"{pods['eks-node-monitoring-agent'].cpu_m}m", "memory": f"{pods['eks-node-monitoring-agent'].memory_mib}Mi"}
    # kube-prometheus-stack's own pods: the chart sets no requests (tests/test_monitoring.py: `resources: {}` at every
    # key); the stack's values set them and the plan sums the same (test_the_plan_sums_what_the_release_requests).
    assert all(pods[name].cpu_m > 0 and pods[name].memory_mib > 0
               for name in ("alertmanager", "prometheus-operator", "grafana", "kube-state-metrics", "node-exporter"))  # fmt: skip


# ---- the plan's monitoring pods are the synthesized release's requests ---------------------------------------

AMP = ("  gpu-serving:lifecycle:\n", "  gpu-serving:monitoring: {mode: amp}\n  gpu-serving:lifecycle:\n")
UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}


def _cpu_m(q: str) -> float:
    return float(q[:-1]) if q.endswith("m") else float(q) * 1000


def _mib(q: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", q).groups()
    return float(number) * UNITS[unit] / 2**20


def release_requests(values: dict, system_nodes: int) -> tuple[float, float]:
    """(CPU m, memory MiB) the release's pods request on the system nodes, read from its values as the pinned charts
    render them (infra/planning/monitoring_pods.py module doc): Prometheus and Alertmanager with the operator's config
    reloader, Grafana with a sidecar container per enabled sidecar, node exporter on every system node."""
    v = _merged(chart_defaults(), values)
    reloader = v["prometheusOperator"]["prometheusConfigReloader"]["resources"]
    pods = [[v["prometheus"]["prometheusSpec"]["resources"], reloader], [v["prometheusOperator"]["resources"]],
            [v["kube-state-metrics"]["resources"]]]  # fmt: skip
    if v["alertmanager"]["enabled"]:
        pods.append([v["alertmanager"]["alertmanagerSpec"]["resources"], reloader])
    g = v["grafana"]
    sidecars = [k for k in ("alerts", "dashboards", "datasources", "notifiers", "plugins") if g["sidecar"][k]["enabled"]]
    assert not any(g["sidecar"][k].get(f"init{k.capitalize()}") for k in sidecars)  # containers, not init containers
    pods.append([g["resources"]] + [g["sidecar"]["resources"]] * len(sidecars))
    pods += [[v["prometheus-node-exporter"]["resources"]]] * system_nodes
    containers = [c["requests"] for pod in pods for c in pod]
    return sum(_cpu_m(c["cpu"]) for c in containers), sum(_mib(c["memory"]) for c in containers)


def _release_values(doc: dict) -> dict:
    (release,) = [r for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release" and r["inputs"]["chart"] == "kube-prometheus-stack"]
    return release["inputs"]["values"]


@pytest.mark.parametrize("mode", ["in-cluster", "amp"])
def test_the_plan_sums_what_the_release_requests(mode, tmp_path):
    """The synthesized release's requests (prod, each mode) are what the plan adds to the system nodes for monitoring:
    the plan's sum with the mode less its sum with monitoring off."""
    doc = synthesize("prod", REPO if mode == "in-cluster" else edited_project(tmp_path / "p", "prod", [AMP]))
    plan = doc["outputs"]["plan"]
    fit, count = plan["system_nodes"], plan["system_nodes"]["count"]
    config = load_stack_file("prod")
    off = make_plan(config.plan_request().replace(system=sn.SystemNodes(fit["instance_type"], count))).system_nodes
    cpu, memory = release_requests(_release_values(doc), count)
    assert (fit["requests_cpu_m"] - off.requests_cpu_m, fit["requests_memory_mib"] - off.requests_memory_mib) == (cpu, memory)
    assert fit["fits"] and fit["expected_memory_mib"] - off.expected_memory_mib == memory  # no allowance above the requests
    assert fit["largest_pod"] == ("prometheus-agent" if mode == "amp" else "prometheus")


def test_prometheus_is_the_stacks_request(prod):
    import components.stack as stack

    config, plan = prod
    values = mon.kube_prometheus_stack_values(sizing(stack.prometheus_shape(config, plan), config.monitoring.retention_days), 15, "g")
    requests = values["prometheus"]["prometheusSpec"]["resources"]["requests"]
    req = plan.system_request
    assert requests == {"cpu": f"{req.prometheus_cpu_m}m", "memory": f"{req.prometheus_memory_mib}Mi"}


def test_the_sum_follows_the_series_and_the_mode(prod):
    _config, plan = prod
    base = plan.system_nodes
    bigger = dataclasses.replace(plan, nodes=plan.nodes * 4).system_nodes  # four times the GPU nodes: more series
    assert bigger.requests_memory_mib > base.requests_memory_mib and bigger.largest_pod == "prometheus"
    system = plan.request.system
    longer = dataclasses.replace(plan, request=plan.request.replace(system=dataclasses.replace(system, retention_days=90)))
    assert longer.system_nodes.requests_memory_mib == base.requests_memory_mib  # retention sizes the volume, not the memory
    off = dataclasses.replace(plan, request=plan.request.replace(system=dataclasses.replace(system, retention_days=None)))
    monitoring = sum(p.memory_mib * (base.count if p.per_node else 1) for p in mp.pods("in-cluster", plan.system_request.prometheus_memory_mib))
    assert off.system_nodes.requests_memory_mib == base.requests_memory_mib - monitoring
    amp = dataclasses.replace(plan, request=plan.request.replace(system=dataclasses.replace(system, monitoring="amp")))
    assert off.system_nodes.requests_memory_mib < amp.system_nodes.requests_memory_mib < base.requests_memory_mib  # no Alertmanager
    shape = Shape(gpu_nodes=4, gpus_per_node=8, vcpus_per_gpu_node=192, system_nodes=2, engines=1, ray_pods=4)
    assert sn.request_for(sn.SystemNodes("m7i.xlarge", 2, 15), shape).prometheus_memory_mib == sizing(shape, 15).memory_mib


def test_a_too_small_node_group_is_refused_with_the_size_that_fits():
    shape = Shape(gpu_nodes=40, gpus_per_node=8, vcpus_per_gpu_node=192, system_nodes=1, engines=40, ray_pods=40)
    req = sn.request_for(sn.SystemNodes("m7i.large", 1, 15), shape)
    assert not sn.fit(req).fits
    better = sn.smallest_fitting(req)
    assert better is not None and better.count == 1 and sn.fit(better).fits
    assert sn.INSTANCE_TYPES[better.instance_type][1] > sn.INSTANCE_TYPES["m7i.large"][1]
    with pytest.raises(UserError, match=rf"too small: .*set cluster.systemInstanceType {better.instance_type} with systemNodeCount 1"):
        sn.check(req)


def test_the_plan_refuses_an_unknown_or_too_small_system_type(prod):
    config, _plan = prod
    req = config.plan_request()
    with pytest.raises(UserError, match="systemInstanceType 't3.nano'"):
        make_plan(req.replace(system=sn.SystemNodes("t3.nano", 2, 15)))


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_the_stacks_fit_their_system_nodes_in_each_mode(stack):
    config = load_stack_file(stack)
    req = config.plan_request()
    for mode in ("in-cluster", "amp"):
        fit = make_plan(req.replace(system=dataclasses.replace(req.system, monitoring=mode))).system_nodes
        assert fit.fits and fit.requests_cpu_m <= fit.count * fit.allocatable_cpu_m, (stack, mode)


def test_prod_plan_states_the_fit(prod):
    config, plan = prod
    fit = plan.to_json_dict()["system_nodes"]
    assert (fit["instance_type"], fit["count"]) == (config.cluster.system_instance_type, config.cluster.system_node_count)
    assert fit["fits"] and fit["largest_pod"] == "prometheus"
    assert fit["requests_memory_mib"] <= fit["expected_memory_mib"] <= fit["count"] * fit["allocatable_memory_mib"]


# ---- the fit's edges, its search and its messages (independent arithmetic; fit() as the oracle of the search) ----

FAMILY_SIZES = sorted((t for t in sn.INSTANCE_TYPES if t.startswith("m7i.")), key=lambda t: sn.INSTANCE_TYPES[t][1])


# Prometheus' pod less Prometheus itself: the operator's config-reloader sidecar (monitoring_pods.py).
SIDECARS_MIB = next(p.memory_mib for p in mp.pods("in-cluster", 0) if p.name == "prometheus")


def _daemonsets_mib(req: sn.SystemRequest) -> int:
    """What one node's DaemonSets hold: each one's request or, where larger, its expected working set."""
    return sum(max(p.memory_mib, p.usage_mib) for p in sn.system_pods(req) if p.per_node)


def test_memtotal_is_what_a_node_reports():
    """The module doc's observation: an m5.large's node reports about 7,750 MiB of MemTotal; allocatable is that less
    nodeadm's kube-reserved (11 MiB x 29 pods + 255 MiB) and the 100 MiB eviction threshold."""
    memtotal = sn.allocatable("m5.large")[1] + 11 * 29 + 255 + 100
    assert memtotal == pytest.approx(7750, rel=0.01)


def test_daemonsets_are_counted_on_every_node_and_deployments_by_replicas():
    """Which pods are DaemonSets: the EKS add-ons aws-node, kube-proxy and the Pod Identity agent; the CSI drivers' node
    plugins (their charts' `node` DaemonSets); NFD's worker; the node monitoring agent and node exporter (their
    DaemonSet manifests among the fixtures). Deployments: CoreDNS at EKS's two replicas, the EBS and EFS controllers at
    their charts' replicaCount 2, the rest single (gpu-operator values: nfd gc.replicaCount 1)."""
    for name in ("eks-node-monitoring-agent-v1.7.0/daemonset.yaml", "metrics/efa/prometheus-node-exporter-4.56.1-daemonset.yaml"):
        assert "kind: DaemonSet" in fixture_path(*name.split("/")).read_text()
    gpu_op = yaml_text.safe_load(fixture_path("upstream", "gpu-operator-v26.7.0", "values.yaml").read_text())
    assert gpu_op["node-feature-discovery"]["gc"]["replicaCount"] == 1
    pods = sn.system_pods(sn.SystemRequest("m7i.xlarge", 3, 500, 1024))
    assert {p.name for p in pods if p.per_node} == {"aws-node", "kube-proxy", "eks-pod-identity-agent", "ebs-csi-node", "efs-csi-node",
                                                    "eks-node-monitoring-agent", "nfd-worker", "node-exporter"}  # fmt: skip
    assert {p.name: p.replicas for p in pods if p.replicas != 1} == {"coredns": 2, "ebs-csi-controller": 2, "efs-csi-controller": 2}
    # Three nodes against two: the requests grow by one of each DaemonSet, nothing else.
    two, three = (sn.fit(sn.SystemRequest("m7i.xlarge", n, 500, 1024)) for n in (2, 3))
    assert three.requests_cpu_m - two.requests_cpu_m == sum(p.cpu_m for p in pods if p.per_node)
    assert three.requests_memory_mib - two.requests_memory_mib == sum(p.memory_mib for p in pods if p.per_node)


def test_the_search_names_the_smallest_size_that_fits():
    """For Prometheus memories from 1 to 60 GiB on one m7i.large: the size proposed is the first of the family, by
    EC2 memory, whose fit holds; each larger size is the answer somewhere along the way."""
    answers = set()
    for gib in range(1, 61):
        req = sn.SystemRequest("m7i.large", 1, 500, gib * 1024)
        if sn.fit(req).fits:
            continue
        first = next((t for t in FAMILY_SIZES if sn.fit(dataclasses.replace(req, instance_type=t)).fits), None)
        better = sn.smallest_fitting(req)
        assert (better.instance_type if better else None) == first, gib
        assert better is None or better.count == 1
        answers.add(first)
    assert answers == {"m7i.xlarge", "m7i.2xlarge", "m7i.4xlarge", None}


def test_a_prometheus_no_node_of_the_family_holds_is_refused_without_a_size():
    req = sn.SystemRequest("m7i.xlarge", 2, 500, sn.allocatable("m7i.4xlarge")[1] + 1)
    assert sn.smallest_fitting(req) is None
    with pytest.raises(UserError) as caught:
        sn.check(req)
    message = str(caught.value)
    assert message.startswith("the system node group (2 x m7i.xlarge) is too small: prometheus requests ")
    assert message.endswith("; shorten monitoring.retentionDays or use a larger family")
    # The search's bound on the count is the config's.
    config_bound = next(m.le for m in type(load_stack_file("prod").cluster).model_fields["system_node_count"].metadata if hasattr(m, "le"))
    assert sn.MAX_NODES == config_bound


def test_the_largest_pod_must_fit_one_node_beside_its_daemonsets():
    """A pod runs on one node: Prometheus (with its reloader sidecar) fits when it and one node's DaemonSets are within
    that node's allocatable (equal is enough: the scheduler refuses only a request above what is free), however many
    nodes the group has."""
    memory = sn.allocatable("m7i.large")[1]
    daemonsets = _daemonsets_mib(sn.SystemRequest("m7i.large", 3, 500, 1024))
    room = memory - daemonsets - SIDECARS_MIB  # for Prometheus itself
    exact = sn.fit(sn.SystemRequest("m7i.large", 3, 500, room))
    assert exact.fits and exact.largest_pod == "prometheus", exact.reason
    over = sn.fit(sn.SystemRequest("m7i.large", 3, 500, room + 1))
    assert not over.fits
    assert over.reason == f"prometheus requests {memory - daemonsets + 1:,} MiB; a node offers {memory - daemonsets:,} MiB besides its DaemonSets"


def test_the_groups_memory_fills_up_to_its_allocatable():
    """The expected use may add up to the nodes' allocatable, not one MiB more; the refusal names the group's total
    (node allocatable x count); on two nodes more than one node's worth fits, each pod on some node."""
    memory = sn.allocatable("m7i.xlarge")[1]
    others_mib = sn.fit(sn.SystemRequest("m7i.xlarge", 1, 500, 0)).expected_memory_mib
    assert sn.fit(sn.SystemRequest("m7i.xlarge", 1, 500, memory - others_mib)).fits
    over = sn.fit(sn.SystemRequest("m7i.xlarge", 1, 500, memory - others_mib + 1))
    assert over.reason == f"the system pods need about {memory + 1:,} MiB of {memory:,} MiB"
    daemonsets = _daemonsets_mib(sn.SystemRequest("m7i.xlarge", 2, 500, 1024))
    two = sn.fit(sn.SystemRequest("m7i.xlarge", 2, 500, memory - daemonsets - SIDECARS_MIB))
    assert memory < two.expected_memory_mib <= 2 * memory and two.fits, two.reason


def test_one_small_node_is_short_of_cpu_and_every_reason_is_named():
    """One m7i.large: 2 vCPUs less nodeadm's 70m hold less than the system pods' CPU requests (summed here over the
    pods and their replicas); with a Prometheus twice the node's memory, all three reasons are named, in turn."""
    cpu, memory = sn.allocatable("m7i.large")
    assert cpu == 2000 - 70
    req = sn.SystemRequest("m7i.large", 1, 500, 2 * memory)
    wanted = sum(p.cpu_m * p.replicas for p in sn.system_pods(req))
    assert wanted > cpu
    daemonsets = _daemonsets_mib(req)
    reason = sn.fit(req).reason
    assert reason.startswith(f"prometheus requests {2 * memory + SIDECARS_MIB:,} MiB; a node offers {memory - daemonsets:,} MiB "
                             f"besides its DaemonSets; the system pods request {wanted:,}m CPU of {cpu:,}m; "
                             "the system pods need about ")  # fmt: skip
    assert reason.endswith(f" MiB of {memory:,} MiB")


def test_a_too_small_group_is_told_the_size_that_fits():
    req = sn.SystemRequest("m7i.large", 1, 500, 8 * 1024)
    with pytest.raises(UserError) as caught:
        sn.check(req)
    assert str(caught.value).startswith("the system node group (1 x m7i.large) is too small: ")
    assert str(caught.value).endswith("; set cluster.systemInstanceType m7i.xlarge with systemNodeCount 1")


def test_an_unknown_type_is_refused_naming_the_known_ones():
    with pytest.raises(UserError) as caught:
        sn.fit(sn.SystemRequest("t3.nano", 2))
    known = re.fullmatch(r"cluster\.systemInstanceType 't3\.nano': the plan knows the system node sizes of (.*); pick one of them",
                         str(caught.value))  # fmt: skip
    assert known and known.group(1).split(", ") == list(sn.INSTANCE_TYPES)
