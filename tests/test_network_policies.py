"""The stack's NetworkPolicies, evaluated: who may open which port of whom.

`policies/network_policy.py` evaluates NetworkPolicy semantics (selectors,
peers, ports, policy types, both directions); its own tests come first, on
small hand-written policies, each pinned against the rule of the API it
implements. Then the policies the stack renders (the builders of
`infra/k8s/network_policies.py`, and the prod synthesis itself) are evaluated
for the pods the stack runs, labelled as their templates (and KubeRay) label
them: a pod of another namespace is refused on Ray's ports and on the API
port unless listed, the RayCluster's own pods reach each other on every port,
the benchmark reaches the API, the staging Job reaches HTTPS outside the VPC
and nothing else. The operators' namespaces (gpu-operator, kuberay) deny by
default too; their pods, labelled as the pinned charts label them, reach the
API server's ClusterIP and DNS only, and their metrics ports open to the
configured metrics clients only.
"""

from __future__ import annotations

import pytest

from infra.k8s import checks, exposure, network_policies as builders, raycluster, serving_spec
from infra.k8s.serving_spec import Clients
from policies import network_policy as NP
from infra.config import load_stack_file
from tests.test_rayspec import make_spec, stack_plan
from tests import yaml_text
from tests.synthesized import repo_stack

NS = "gpu-serving"
RAY_PORTS = (serving_spec.GCS_PORT, serving_spec.DASHBOARD_PORT, serving_spec.CLIENT_PORT)
VPC_ADDRESS = "10.0.37.5"  # in prod's VPC, 10.0.0.0/16
PUBLIC_ADDRESS = "198.51.100.7"


def netpol(name, namespace=NS, selector=None, types=None, ingress=None, egress=None) -> dict:
    spec: dict = {"podSelector": selector or {}}
    if types is not None:
        spec["policyTypes"] = types
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


A = NP.pod(NS, {"app": "a"})
B = NP.pod(NS, {"app": "b"}, ports={"http": 8000})
OTHER = NP.pod("elsewhere", {"app": "a"})


# --- the evaluator -------------------------------------------------------------------------------


def test_a_pod_no_policy_selects_accepts_and_opens_everything():
    assert NP.allowed([], A, B, 6379)
    unrelated = netpol("only-c", selector={"matchLabels": {"app": "c"}}, types=["Ingress", "Egress"], ingress=[], egress=[])
    assert NP.allowed([unrelated], A, B, 6379)


def test_a_policy_applies_to_its_own_namespace_only():
    deny = netpol("deny", namespace="elsewhere", types=["Ingress"], ingress=[])
    assert NP.allowed([deny], A, B, 80)
    assert not NP.allowed([deny], A, OTHER, 80)


def test_isolation_without_a_matching_rule_denies_and_rules_are_a_union():
    deny_in = netpol("deny", types=["Ingress"], ingress=[])
    assert not NP.allowed([deny_in], A, B, 80)
    allow_a = netpol("from-a", selector={"matchLabels": {"app": "b"}}, ingress=[{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}])
    assert NP.allowed([deny_in, allow_a], A, B, 80)
    assert not NP.allowed([deny_in, allow_a], OTHER, B, 80)  # a podSelector alone means the policy's namespace


def test_policy_types_default_to_ingress_and_egress_when_it_has_egress_rules():
    ingress_only = netpol("in", ingress=[])
    assert NP.policy_types(ingress_only) == ["Ingress"]
    assert NP.allowed([ingress_only], B, OTHER, 80)  # egress not isolated
    with_egress = netpol("both", ingress=[], egress=[{"to": [{"podSelector": {"matchLabels": {"app": "b"}}}]}])
    assert NP.policy_types(with_egress) == ["Ingress", "Egress"]
    assert NP.allowed([with_egress], A, B, 80) is False  # B's ingress is isolated with no rule
    assert not NP.egress_allowed([with_egress], A, OTHER, 80) and NP.egress_allowed([with_egress], A, B, 80)
    # The API server adds Egress for a non-empty egress list only: an empty one isolates nothing outgoing.
    empty_egress = netpol("empty", ingress=[], egress=[])
    assert NP.policy_types(empty_egress) == ["Ingress"]
    assert NP.egress_allowed([empty_egress], B, OTHER, 80)
    assert NP.policy_types(netpol("deny-out", types=["Egress"], egress=[])) == ["Egress"]


def test_within_a_peer_selectors_are_anded_across_peers_ored():
    anded = netpol("and", selector={"matchLabels": {"app": "b"}}, ingress=[{"from": [
        {"namespaceSelector": {"matchLabels": {"team": "x"}}, "podSelector": {"matchLabels": {"app": "a"}}}]}])  # fmt: skip
    ored = netpol("or", selector={"matchLabels": {"app": "b"}}, ingress=[{"from": [
        {"namespaceSelector": {"matchLabels": {"team": "x"}}}, {"podSelector": {"matchLabels": {"app": "a"}}}]}])  # fmt: skip
    team_x_a = NP.pod("x-ns", {"app": "a"}, namespace_labels={"team": "x"})
    team_x_z = NP.pod("x-ns", {"app": "z"}, namespace_labels={"team": "x"})
    assert NP.allowed([anded], team_x_a, B, 80) and not NP.allowed([anded], team_x_z, B, 80)
    assert not NP.allowed([anded], A, B, 80)  # app=a, but not in a team-x namespace
    assert NP.allowed([ored], team_x_z, B, 80) and NP.allowed([ored], A, B, 80)
    assert not NP.allowed([ored], OTHER, B, 80)


def test_match_expressions_and_the_namespace_name_label():
    by_name = netpol("names", selector={"matchLabels": {"app": "b"}}, ingress=[{"from": [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["elsewhere"]}]}}]}])  # fmt: skip
    assert NP.allowed([by_name], OTHER, B, 80) and not NP.allowed([by_name], A, B, 80)
    assert NP.selects({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["x"]}]}, {"t": "y"})
    assert not NP.selects({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {})
    assert NP.selects({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, {})
    assert NP.selects({}, {"anything": "x"})


def test_ip_blocks_and_their_exceptions():
    blocks = netpol("ips", selector={"matchLabels": {"app": "b"}}, ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.37.0/24"]}}]}])
    assert NP.allowed([blocks], NP.address("10.0.1.1"), B, 80)
    assert not NP.allowed([blocks], NP.address(VPC_ADDRESS), B, 80)
    assert not NP.allowed([blocks], NP.address(PUBLIC_ADDRESS), B, 80)
    assert not NP.allowed([blocks], A, B, 80)  # a pod without an address in the block


def test_ports_numbers_names_ranges_and_protocols():
    ports = netpol("ports", selector={"matchLabels": {"app": "b"}}, ingress=[{"ports": [
        {"port": "http"}, {"protocol": "TCP", "port": 9000, "endPort": 9010}, {"protocol": "UDP", "port": 53}]}])  # fmt: skip
    assert NP.allowed([ports], OTHER, B, 8000)  # the destination's port named http
    assert NP.allowed([ports], OTHER, B, 9005) and not NP.allowed([ports], OTHER, B, 9011)
    assert NP.allowed([ports], OTHER, B, 53, "UDP") and not NP.allowed([ports], OTHER, B, 53, "TCP")
    all_udp = netpol("udp", selector={"matchLabels": {"app": "b"}}, ingress=[{"ports": [{"protocol": "UDP"}]}])
    assert NP.allowed([all_udp], OTHER, B, 4242, "UDP") and not NP.allowed([all_udp], OTHER, B, 4242)


def test_a_connection_needs_the_sources_egress_and_the_destinations_ingress():
    b_accepts_a = netpol("b-in", selector={"matchLabels": {"app": "b"}}, ingress=[{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}])
    a_opens_nothing = netpol("a-out", selector={"matchLabels": {"app": "a"}}, types=["Egress"], egress=[])
    assert NP.allowed([b_accepts_a], A, B, 80)
    assert not NP.allowed([b_accepts_a, a_opens_nothing], A, B, 80)
    assert NP.allowed([a_opens_nothing], NP.address(PUBLIC_ADDRESS), B, 80)  # an outside address has no policy of its own


def test_default_deny_is_recognised_only_when_it_denies_everything():
    assert NP.denies_all(builders.default_deny(NS))
    assert not NP.denies_all(netpol("in-only", types=["Ingress"], ingress=[]))
    assert not NP.denies_all(netpol("some", selector={"matchLabels": {"a": "b"}}, types=["Ingress", "Egress"], ingress=[], egress=[]))
    assert not NP.denies_all(netpol("rules", types=["Ingress", "Egress"], ingress=[{}], egress=[]))


# --- the rendered policies ------------------------------------------------------------------------


def pods_of(spec) -> dict[str, NP.Endpoint]:
    """The stack's pods as the evaluator sees them: labels from the rendered templates (plus what KubeRay adds)."""
    rc = raycluster.raycluster(spec)
    head = rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    out = {"head": NP.pod(NS, {**head, "ray.io/group": "headgroup"}, ports={"http": serving_spec.API_PORT})}
    for i, g in enumerate(rc["spec"].get("workerGroupSpecs", [])):
        out[f"worker{i}"] = NP.pod(NS, {**g["template"]["metadata"]["labels"], "ray.io/group": g["groupName"]})
        out[f"worker{i}b"] = NP.pod(NS, {**g["template"]["metadata"]["labels"], "ray.io/group": g["groupName"]})  # a second replica
    out["benchmark"] = NP.pod(NS, checks.benchmark_job(spec)["spec"]["template"]["metadata"]["labels"])
    efa = checks.efa_check_job(spec)["spec"]["template"]["metadata"]["labels"]
    out["efa0"], out["efa1"] = NP.pod(NS, efa), NP.pod(NS, efa)
    out["staging"] = NP.pod(NS, STAGING_LABELS)
    out["coredns"] = NP.pod("kube-system", {"k8s-app": "kube-dns"})
    out["stranger"] = NP.pod(NS, {"app.kubernetes.io/part-of": "gpu-serving"})  # same namespace, not the RayCluster's
    out["elsewhere"] = NP.pod("apps", {"app": "client"})
    out["monitoring"] = NP.pod("monitoring", {"app": "prometheus"})
    out["public"], out["vpc"] = NP.address(PUBLIC_ADDRESS), NP.address(VPC_ADDRESS)
    return out


STAGING_LABELS = {"app.kubernetes.io/name": "model-weights", "app.kubernetes.io/part-of": "gpu-serving", "app.kubernetes.io/component": "weight-staging"}


def rendered(spec, *, staging_source="hf") -> list[dict]:
    return [
        *builders.namespace_policies(NS),
        *builders.serving_policies(spec),
        builders.staging_policy("model-weights-staging", NS, STAGING_LABELS, vpc_cidr=spec.vpc_cidr, pod_identity=staging_source == "s3"),
    ]


@pytest.fixture(scope="module")
def prod():
    spec = make_spec(stack_plan("prod"), efa_check=True, benchmark=True)
    return rendered(spec), pods_of(spec)


def test_another_namespaces_pod_is_refused_on_rays_ports_and_the_api(prod):
    policies, p = prod
    for port in (*RAY_PORTS, serving_spec.API_PORT, serving_spec.RAY_METRICS_PORT, serving_spec.DASHBOARD_AGENT_PORT):
        for who in ("elsewhere", "stranger", "staging", "public", "vpc", "monitoring"):
            assert not NP.allowed(policies, p[who], p["head"], port), (who, port)
            assert not NP.allowed(policies, p[who], p["worker0"], port), (who, port)


def test_the_rayclusters_own_pods_reach_each_other_on_every_port(prod):
    policies, p = prod
    pods = ["head", "worker0", "worker0b"]
    for src in pods:
        for dst in pods:
            for port in (*RAY_PORTS, serving_spec.DASHBOARD_AGENT_PORT, 41234, 65000):  # fixed ports, raylet/NCCL picks
                assert NP.allowed(policies, p[src], p[dst], port), (src, dst, port)


def test_the_benchmark_reaches_the_api_and_nothing_else(prod):
    policies, p = prod
    assert NP.allowed(policies, p["benchmark"], p["head"], serving_spec.API_PORT)
    assert not NP.allowed(policies, p["benchmark"], p["worker0"], serving_spec.API_PORT)  # workers serve no API
    for port in RAY_PORTS:
        assert not NP.allowed(policies, p["benchmark"], p["head"], port)
    assert not NP.allowed(policies, p["benchmark"], p["public"], 443)


def test_the_efa_check_pods_reach_each_other_only(prod):
    policies, p = prod
    for port in (serving_spec.RDZV_PORT, 41234):
        assert NP.allowed(policies, p["efa0"], p["efa1"], port) and NP.allowed(policies, p["efa1"], p["efa0"], port)
    assert not NP.allowed(policies, p["head"], p["efa0"], serving_spec.RDZV_PORT)
    assert not NP.allowed(policies, p["efa0"], p["head"], serving_spec.GCS_PORT)


def test_every_pod_resolves_names_and_nothing_else_leaves_the_cluster(prod):
    policies, p = prod
    for who in ("head", "worker0", "benchmark", "efa0", "staging"):
        assert NP.allowed(policies, p[who], p["coredns"], 53, "UDP") and NP.allowed(policies, p[who], p["coredns"], 53, "TCP")
        assert not NP.allowed(policies, p[who], p["coredns"], 8080)
        assert not NP.allowed(policies, p[who], p["elsewhere"], 53, "UDP")
    for who in ("head", "worker0", "benchmark", "efa0"):
        assert not NP.allowed(policies, p[who], p["public"], 443)


def test_the_staging_job_reaches_https_outside_the_vpc_only(prod):
    policies, p = prod
    assert NP.allowed(policies, p["staging"], p["public"], 443)
    assert not NP.allowed(policies, p["staging"], p["vpc"], 443)  # the VPC (and the pods in it) is excepted
    assert not NP.allowed(policies, p["staging"], p["public"], 80)
    assert not NP.allowed(policies, p["staging"], p["head"], 443)
    assert not NP.allowed(policies, p["staging"], NP.address("169.254.170.23"), 80)  # hf: no Pod Identity
    s3 = rendered(make_spec(stack_plan("prod")), staging_source="s3")
    assert NP.allowed(s3, p["staging"], NP.address("169.254.170.23"), 80)
    assert not NP.allowed(s3, p["staging"], NP.address("169.254.169.254"), 80)  # never the instance's metadata


def test_the_default_deny_is_what_keeps_unselected_directions_shut(prod):
    policies, p = prod
    assert not NP.allowed(policies, p["elsewhere"], p["staging"], 8080)
    without = [np for np in policies if np["metadata"]["name"] != builders.DEFAULT_DENY]
    assert NP.allowed(without, p["elsewhere"], p["staging"], 8080)  # the staging policy isolates egress only
    assert NP.allowed(without, p["elsewhere"], p["benchmark"], 8080)


def test_configured_clients_reach_their_port_and_no_other():
    spec = make_spec(
        stack_plan("prod"),
        api_clients=Clients(namespaces=("apps",), cidrs=("192.0.2.0/24",)),
        metrics_clients=Clients(namespaces=("monitoring",)),
    )
    policies, p = rendered(spec), pods_of(spec)
    assert NP.allowed(policies, p["elsewhere"], p["head"], serving_spec.API_PORT)  # namespace apps is listed
    assert NP.allowed(policies, NP.address("192.0.2.9"), p["head"], serving_spec.API_PORT)
    assert not NP.allowed(policies, NP.address("192.0.3.9"), p["head"], serving_spec.API_PORT)
    assert NP.allowed(policies, p["monitoring"], p["worker0"], serving_spec.RAY_METRICS_PORT)
    assert NP.allowed(policies, p["monitoring"], p["head"], serving_spec.API_PORT)  # vLLM's /metrics is on the API port
    for who in ("elsewhere", "monitoring"):
        for port in RAY_PORTS:
            assert not NP.allowed(policies, p[who], p["head"], port), (who, port)


def test_the_dashboard_is_closed_unless_clients_are_named():
    closed = make_spec(stack_plan("prod"))
    assert raycluster.head_ray_start_params(closed)["dashboard-host"] == "127.0.0.1"
    assert "vllm-dashboard" not in builders.names(builders.serving_policies(closed))
    opened = make_spec(stack_plan("prod"), dashboard_clients=Clients(cidrs=("10.30.0.0/24",)))
    assert raycluster.head_ray_start_params(opened)["dashboard-host"] == "0.0.0.0"
    policies, p = rendered(opened), pods_of(opened)
    assert NP.allowed(policies, NP.address("10.30.0.4"), p["head"], serving_spec.DASHBOARD_PORT)
    assert not NP.allowed(policies, NP.address("10.30.0.4"), p["head"], serving_spec.GCS_PORT)
    assert not NP.allowed(policies, p["elsewhere"], p["head"], serving_spec.DASHBOARD_PORT)


def test_an_internal_load_balancer_admits_its_named_clients_not_the_vpc():
    """The clients' addresses reach the pod (externalTrafficPolicy Local): the API admits their CIDRs, and
    neither the rest of the VPC (every node and pod in it) nor anything public."""
    spec = make_spec(stack_plan("prod"), service_type="internal-lb", api_clients=Clients(cidrs=("10.8.0.0/16",)))
    policies, p = rendered(spec), pods_of(spec)
    assert NP.allowed(policies, NP.address("10.8.1.1"), p["head"], serving_spec.API_PORT)
    assert not NP.allowed(policies, p["vpc"], p["head"], serving_spec.API_PORT)
    assert not NP.allowed(policies, p["public"], p["head"], serving_spec.API_PORT)
    for port in RAY_PORTS:
        assert not NP.allowed(policies, NP.address("10.8.1.1"), p["head"], port)


def test_an_internal_lb_needs_the_clients_cidrs():
    from infra.errors import UserError

    for vpc in (None, "10.0.0.0/16"):
        with pytest.raises(UserError, match="apiClients.cidrs"):
            make_spec(stack_plan("prod"), service_type="internal-lb", vpc_cidr=vpc)


def test_egress_through_a_service_selects_exactly_the_services_pods():
    """The VPC CNI's controller adds a Service's ClusterIP to an egress rule only when the rule's podSelector is the
    Service's selector, exactly, and the ports agree: the benchmark calls the API Service, every pod CoreDNS's."""
    spec = make_spec(stack_plan("prod"), benchmark=True)
    svc = exposure.service(spec)
    (bench,) = [p for p in builders.serving_policies(spec) if p["metadata"]["name"] == "vllm-benchmark"]
    (rule,) = bench["spec"]["egress"]
    assert rule["to"] == [{"podSelector": {"matchLabels": svc["spec"]["selector"]}}]
    (port,) = svc["spec"]["ports"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port["port"]}] and port["targetPort"] == serving_spec.API_PORT_NAME
    head = raycluster.head_pod_template(spec)["spec"]["containers"][0]
    assert {"name": port["targetPort"], "containerPort": port["port"], "protocol": "TCP"} in head["ports"]
    (dns,) = builders.allow_dns(NS)["spec"]["egress"]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}  # the kube-dns Service's selector


def test_the_templates_carry_the_labels_the_policies_select():
    """What KubeRay puts on the pods (ray.io/cluster, ray.io/node-type) is in the templates as rendered, so a
    selector that matches a template matches the pod; KubeRay lets no template change those two labels."""
    spec = make_spec(stack_plan("prod"))
    rc = raycluster.raycluster(spec)
    assert rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]["ray.io/cluster"] == spec.name == rc["metadata"]["name"]
    assert rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]["ray.io/node-type"] == "head"
    for g in rc["spec"]["workerGroupSpecs"]:
        assert g["template"]["metadata"]["labels"]["ray.io/node-type"] == "worker"


# --- the synthesis -----------------------------------------------------------------------------------


def test_the_prod_synthesis_refuses_outsiders_and_admits_the_raycluster():
    """The objects the prod program really declares, not the builders: default deny, DNS, Ray, staging."""
    doc = repo_stack("prod")
    nps = [
        {"metadata": {"namespace": r["inputs"]["metadata"]["namespace"], "name": r["inputs"]["metadata"]["name"]}, "spec": r["inputs"]["spec"]}
        for r in doc["resources"]
        if r["type"] == "kubernetes:networking.k8s.io/v1:NetworkPolicy"
    ]
    # vllm-metrics: prod runs the in-cluster monitoring, whose Prometheus it admits (tests/test_monitoring.py).
    assert {n["metadata"]["name"] for n in nps if n["metadata"]["namespace"] == NS} == {"default-deny", "allow-dns", "vllm-ray", "model-weights-staging", "vllm-metrics"}
    (rc,) = [r for r in doc["resources"] if r["type"] == "kubernetes:ray.io/v1:RayCluster"]
    head = NP.pod(NS, rc["inputs"]["spec"]["headGroupSpec"]["template"]["metadata"]["labels"])
    workers = [NP.pod(NS, g["template"]["metadata"]["labels"]) for g in rc["inputs"]["spec"]["workerGroupSpecs"]]
    (job,) = [r for r in doc["resources"] if r["type"] == "kubernetes:batch/v1:Job"]
    staging = NP.pod(NS, job["inputs"]["spec"]["template"]["metadata"]["labels"])
    outsiders = [NP.pod("default", {}), NP.pod("kube-system", {"k8s-app": "kube-dns"}), staging, NP.address(VPC_ADDRESS)]
    for port in (*RAY_PORTS, serving_spec.API_PORT):
        for who in outsiders:
            assert not NP.allowed(nps, who, head, port), (who, port)
        for w in workers:
            assert NP.allowed(nps, w, head, port) and NP.allowed(nps, head, w, port)
    assert NP.allowed(nps, staging, NP.address(PUBLIC_ADDRESS), 443)
    assert rc["inputs"]["spec"]["authOptions"] == {"mode": "token"}
    assert rc["inputs"]["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"


# --- the operators' namespaces ---------------------------------------------------------------------

from pathlib import Path  # noqa: E402

import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402

from components import operators  # noqa: E402
from infra.k8s.helm_values import EFA_DEVICE_PLUGIN, GPU_OPERATOR, KUBERAY_OPERATOR  # noqa: E402

UPSTREAM = Path(__file__).resolve().parent / "fixtures" / "upstream"
API_CLUSTER_IP = "172.20.0.1"  # the recording engine's service CIDR, 172.20.0.0/16 (infra/preview/recording.py)
API_SERVER = NP.address(API_CLUSTER_IP)
# The operators' pods as the pinned charts label them (components/operators.py, METRICS_TARGETS, for the sources).
OPERATOR_PODS = {
    "gpu-operator": NP.pod("gpu-operator", {"app": "gpu-operator", "app.kubernetes.io/component": "gpu-operator"}, ports={"metrics": 8080}),
    "dcgm-exporter": NP.pod("gpu-operator", {"app": "nvidia-dcgm-exporter"}, ports={"metrics": 9400}),
    "nfd-master": NP.pod("gpu-operator", {"app.kubernetes.io/name": "node-feature-discovery", "role": "master"}, ports={"http": 8080}),
    "nfd-worker": NP.pod("gpu-operator", {"app.kubernetes.io/name": "node-feature-discovery", "role": "worker"}, ports={"http": 8080}),
    "device-plugin": NP.pod("gpu-operator", {"app": "nvidia-device-plugin-daemonset"}),
    "validator": NP.pod("gpu-operator", {"app": "nvidia-operator-validator"}),
    "kuberay-operator": NP.pod("kuberay", {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/component": "kuberay-operator"}, ports={"http": 8080}),
}
METRICS_PORTS = {"gpu-operator": 8080, "dcgm-exporter": 9400, "nfd-master": 8080, "nfd-worker": 8080, "kuberay-operator": 8080}


def operator_policies(metrics_clients: Clients = Clients()) -> list[dict]:
    return [
        p
        for ns in operators.NAMESPACE_LABELS
        for p in operators.namespace_policies(ns, builders.kubernetes_service_ip("172.20.0.0/16"), metrics_clients)
    ]


def test_the_api_servers_cluster_ip_is_the_first_address_of_the_service_cidr():
    assert builders.kubernetes_service_ip("172.20.0.0/16") == "172.20.0.1/32"
    assert builders.kubernetes_service_ip("10.100.0.0/16") == "10.100.0.1/32"
    assert builders.kubernetes_service_ip("fd12:3456:789a::/108") == "fd12:3456:789a::1/128"
    with pytest.raises(ValueError):
        builders.kubernetes_service_ip("172.20.0.1/16")  # not a network address
    with pytest.raises(ValueError, match="API server"):
        builders.operator_namespace_policies("kuberay", api_server_cidrs=[])


def test_operator_namespaces_deny_by_default_and_reach_the_api_server_and_dns_only():
    policies = operator_policies()
    for ns in ("gpu-operator", "kuberay"):
        mine = [p for p in policies if p["metadata"]["namespace"] == ns]
        assert builders.names(mine) == ["default-deny", "allow-dns", "allow-api-server"]
        assert any(NP.denies_all(p) for p in mine)
    coredns, public = NP.pod("kube-system", {"k8s-app": "kube-dns"}), NP.address(PUBLIC_ADDRESS)
    head = NP.pod(NS, {"ray.io/cluster": "vllm", "ray.io/node-type": "head"})
    for who, pod in OPERATOR_PODS.items():
        assert NP.allowed(policies, pod, API_SERVER, 443), who
        assert NP.allowed(policies, pod, coredns, 53, "UDP") and NP.allowed(policies, pod, coredns, 53, "TCP"), who
        assert not NP.allowed(policies, pod, API_SERVER, 80) and not NP.allowed(policies, pod, API_SERVER, 6443), who
        assert not NP.allowed(policies, pod, public, 443), who  # nothing leaves the cluster
        assert not NP.allowed(policies, pod, NP.address(VPC_ADDRESS), 443), who  # not the VPC (a node, the mount target)
        assert not NP.allowed(policies, pod, NP.address("169.254.169.254"), 80), who  # nor the instance's metadata
        assert not NP.allowed(policies, pod, NP.address("10.0.128.10"), 2049), who  # nor NFS
        for other in OPERATOR_PODS.values():
            if other is not pod:
                assert not NP.allowed(policies, pod, other, 8080), (who, other)
    # With the serving namespace's own policies, the operators reach no Ray port (KubeRay's RayCluster controller calls none).
    spec = make_spec(stack_plan("prod"))
    everything = [*policies, *rendered(spec)]
    for port in RAY_PORTS:
        assert not NP.allowed(everything, OPERATOR_PODS["kuberay-operator"], head, port)


def test_operator_metrics_open_to_the_configured_clients_only():
    closed = operator_policies()
    monitoring, elsewhere = NP.pod("monitoring", {"app": "prometheus"}), NP.pod("apps", {"app": "client"})
    for who, port in METRICS_PORTS.items():
        assert not NP.allowed(closed, monitoring, OPERATOR_PODS[who], port), who  # none by default
    opened = operator_policies(Clients(namespaces=("monitoring",), cidrs=("10.9.0.0/24",)))
    assert sorted(p["metadata"]["name"] for p in opened if p["metadata"]["name"].endswith("-metrics")) == [
        "dcgm-exporter-metrics", "gpu-operator-metrics", "kuberay-operator-metrics", "node-feature-discovery-metrics"]  # fmt: skip
    for who, port in METRICS_PORTS.items():
        pod = OPERATOR_PODS[who]
        assert NP.allowed(opened, monitoring, pod, port) and NP.allowed(opened, NP.address("10.9.0.7"), pod, port), who
        assert not NP.allowed(opened, elsewhere, pod, port), who
        assert not NP.allowed(opened, monitoring, pod, 9999), who
    assert not NP.allowed(opened, monitoring, OPERATOR_PODS["gpu-operator"], 9400)  # each component its own port
    assert not NP.allowed(opened, monitoring, OPERATOR_PODS["device-plugin"], 8080)  # serves no metrics


def test_the_metrics_targets_are_the_pinned_charts():
    """What the vendored chart values say: KubeRay's metrics Service port, and that no gpu-operator operand runs in the
    host's network (a NetworkPolicy would not apply to it)."""
    kuberay = yaml_text.safe_load((UPSTREAM / KUBERAY_OPERATOR.upstream_folder / "values.yaml").read_text())
    (target,) = operators.METRICS_TARGETS[KUBERAY_OPERATOR.namespace]
    assert target.ports == (kuberay["service"]["port"],) and kuberay["metrics"]["enabled"] is True
    assert kuberay["nameOverride"] == target.selector["app.kubernetes.io/name"]
    gpu = yaml_text.safe_load((UPSTREAM / GPU_OPERATOR.upstream_folder / "values.yaml").read_text())
    host_network = {k: v["hostNetwork"] for k, v in gpu.items() if isinstance(v, dict) and "hostNetwork" in v}
    assert host_network and not any(host_network.values()), host_network
    assert gpu["nodeStatusExporter"]["enabled"] is False and gpu["dcgm"]["enabled"] is False  # ports 8000, 5555: not served
    assert set(operators.METRICS_TARGETS) == set(operators.NAMESPACE_LABELS)
    # kube-system is EKS's (module doc): the stack puts no policy there, whatever the EFA plugin.
    assert EFA_DEVICE_PLUGIN.namespace not in operators.NAMESPACE_LABELS


def test_the_prod_synthesis_puts_them_in_place_before_the_releases():
    doc = repo_stack("prod")
    nps = [r for r in doc["resources"] if r["type"] == "kubernetes:networking.k8s.io/v1:NetworkPolicy"]
    by_ns: dict[str, set] = {}
    for r in nps:
        by_ns.setdefault(r["inputs"]["metadata"]["namespace"], set()).add(r["inputs"]["metadata"]["name"])
    # The *-metrics policies admit prod's in-cluster Prometheus (gpu-serving:monitoring, tests/test_monitoring.py).
    assert by_ns["gpu-operator"] == {"default-deny", "allow-dns", "allow-api-server", "gpu-operator-metrics", "dcgm-exporter-metrics", "node-feature-discovery-metrics"}
    assert by_ns["kuberay"] == {"default-deny", "allow-dns", "allow-api-server", "kuberay-operator-metrics"}
    assert "kube-system" not in by_ns
    api = [r for r in nps if r["inputs"]["metadata"]["name"] == "allow-api-server"]
    for r in api:
        assert r["inputs"]["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": f"{API_CLUSTER_IP}/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}]
    version = load_stack_file("prod").cluster.kubernetes_version + ".0"
    for r in nps:
        kubernetes_validate.validate({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **r["inputs"]}, version, strict=True)
    releases = {r["inputs"]["name"]: r for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"}
    urns = {r["urn"]: r for r in nps}
    for chart in (GPU_OPERATOR, KUBERAY_OPERATOR):
        needs = {urns[u]["inputs"]["metadata"]["name"] for u in releases[chart.release]["options"]["depends_on"] if u in urns}
        assert needs == by_ns[chart.namespace], chart.release
