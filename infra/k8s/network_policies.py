"""The stack's NetworkPolicies: deny by default, then exactly the connections each pod needs.

Pure builders of `networking.k8s.io/v1` NetworkPolicy manifests. `namespace_policies`
are the serving namespace's own (stack.py creates them with the namespace, before any pod);
`serving_policies(spec)` belong to the serving layer (components/serving.py);
`staging_policy(...)` to the weight storage (components/storage.py);
`operator_namespace_policies(...)` to the namespaces the operators are installed
into (components/operators.py; "The operators' namespaces" below).

- `default-deny`: every pod of the namespace, ingress and egress, no rule: a
  pod receives and opens only what a policy below allows.
- `allow-dns`: every pod may ask the cluster's DNS (CoreDNS, the pods labelled
  `k8s-app: kube-dns` in kube-system) on UDP and TCP 53.
- `<name>-ray`: the RayCluster's pods (`ray.io/cluster: <name>`, the label
  KubeRay puts on each of them and lets no template override,
  ray-operator/controllers/ray/common/pod.go, `labelPod`) accept from and open
  to each other on every port, and nothing else. Ray uses fixed ports (GCS
  6379, dashboard 8265, client server 10001, metrics 8080, dashboard agent
  52365) and many it picks at start (raylet, object manager, workers, the
  runtime-env and dashboard agents' gRPC); NCCL's bootstrap and its socket
  fallback are TCP between the same pods on ports it picks. NCCL's data over
  EFA does not cross the pod network at all: it goes through the EFA devices
  the device plugin mounts, not the pod's `eth0`, the only interface the VPC
  CNI filters (EKS user guide, "Kubernetes network policies", Considerations).
- `<name>-api`: the head's port 8000 (the OpenAI-compatible API) accepts the
  benchmark Job's pods, the namespaces and CIDRs of `spec.api_clients`, and,
  with an internal load balancer, the VPC's CIDR (an NLB preserves the
  client's address; the in-tree controller's instance targets arrive through
  a NodePort, from a node's or a client's address in the VPC). With VPC CNI
  pods have VPC addresses too, so with `internal-lb` any pod of the cluster
  reaches port 8000 (and only that port) through that rule.
- `<name>-metrics`: ports 8000 (vLLM's /metrics) and 8080 (Ray's) accept the
  namespaces and CIDRs of `spec.metrics_clients` (a Prometheus); none by
  default.
- `<name>-dashboard`: only when `spec.dashboard_clients` names some: the head's
  8265 (dashboard and job API, then bound to the pod's address) accepts them.
  Otherwise the dashboard listens on the head pod's loopback and no policy
  opens it.
- `<name>-efa-check`: the EFA check's pods accept from and open to each other on
  every port (torchrun's rendezvous on 29500, NCCL's bootstrap).
- `<name>-benchmark`: the benchmark's pods may open the head's port 8000.
- `<pvc>-staging`: the weight-staging pods may open HTTPS (443) anywhere but
  the VPC (the Hugging Face hub and its CDN; S3, whose gateway endpoint
  still answers on S3's public addresses), and with an S3 source the EKS Pod
  Identity agent (169.254.170.23, TCP 80) for credentials.

Services. The VPC CNI filters the packets a pod sends before kube-proxy
rewrites a Service's ClusterIP to a pod's address, so its controller adds a
Service's ClusterIP to an egress rule only when the Service's selector is
exactly the rule's `podSelector` and the Service's port is the container's
(amazon-network-policy-controller-k8s, `pkg/resolvers/endpoints.go`; EKS user
guide, Considerations). Hence the benchmark's egress selects the head with the
API Service's own selector (`exposure.head_selector`), and `allow-dns` CoreDNS
with the kube-dns Service's (`k8s-app: kube-dns`). The controller also skips a
Service whose named targetPort resolves to a container port the rule does not
allow (`hasTargetPortBypass`): the API Service's `http` is the head's 8000,
which the benchmark's rule allows. The workers reach the head
through KubeRay's head Service, which KubeRay 1.7.0 makes headless
(ray-operator/controllers/ray/common/service.go, `BuildServiceForHeadPod`,
unless ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE is set): its name resolves to the head
pod's address, which the Ray policy admits.

What needs no rule: kubelet probes and anything else from the pod's own node
(Kubernetes docs, "Network Policies": traffic to and from the node where a
pod runs is always allowed); the weights' file system, which the CSI node
plugin mounts on the node, in the host's network namespace (the EFS CSI
driver's node DaemonSet runs with `hostNetwork: true`; Lustre is a kernel
client of the node), so no pod opens an NFS or Lustre connection. The
serving pods need nothing outside the cluster: the weights are local
(`HF_HUB_OFFLINE=1`) and usage reporting is off.

The operators' namespaces (`gpu-operator` and `kuberay`, which
components/operators.py creates; the EFA device plugin goes into
`kube-system`, which is EKS's: CoreDNS, the VPC CNI, kube-proxy, the pod
identity agent and the CSI drivers run there with needs the stack does not
own, and the plugin's DaemonSet asks the kubelet for nothing over the pod
network, so no policy is put there). Each gets the same `default-deny` and
`allow-dns`, and:

- `allow-api-server`: every pod may open TCP 443 to the Kubernetes API
  server, as the pods see it: the `kubernetes` Service's ClusterIP, the first
  address of the cluster's service CIDR (`kubernetes_service_ip`; the
  operators' in-cluster clients dial `KUBERNETES_SERVICE_HOST`, that
  address). The rule names the ClusterIP, not the control plane's ENIs behind
  it: the VPC CNI's eBPF filter sees a pod's packet before kube-proxy rewrites
  the Service address ("Services" below; the controller adds Services'
  ClusterIPs to rules "to handle eBPF probe limitations post-DNAT",
  amazon-network-policy-controller-k8s pkg/resolvers/endpoints.go; an AWS
  maintainer reads a DENY logged against a service-range address as the
  policy's missing service range, aws/aws-network-policy-agent issue #549;
  otterize/intents-operator pull request #488 logs the same for a ClusterIP).
  Every operator and operand there talks to the API server and to
  nothing else in or outside the cluster: the GPU operator, NFD's master,
  worker and garbage collector (node-feature-discovery chart v0.19.0,
  vendored in gpu-operator v26.7.0: their own optional policies allow only
  DNS and the API server), GPU feature discovery, the MIG manager and the
  validator (which creates its check pods through the API), the CRD upgrade
  hook; KubeRay's RayCluster controller calls no Ray dashboard (only its
  RayJob and RayService controllers do, ray-operator/controllers/ray/utils/
  dashboardclient, v1.7.0), and the serving namespace admits no one on Ray's
  ports anyway. Neither chart installs an admission webhook at the pinned
  versions, so nothing calls into these namespaces.
- `<component>-metrics`: only when `metrics_clients` names some (the
  stack passes `gpu-serving:serving.metricsClients`, the Prometheus the
  serving metrics go to): each component's metrics port accepts them. The
  ports and the pods' labels are the charts' own, at the pinned versions
  (components/operators.py, `METRICS_TARGETS`): the GPU operator's
  `metrics` 8080 (deployments/gpu-operator/templates/operator.yaml,
  v26.7.0), the DCGM exporter's 9400
  (assets/state-dcgm-exporter/0800_daemonset.yaml, `DCGM_EXPORTER_LISTEN`),
  NFD's `http` 8080 (metrics and healthz, charts/node-feature-discovery
  values `master.port`, `worker.port`, `gc.port`), KubeRay's `http` 8080
  (helm-chart/kuberay-operator/templates/deployment.yaml, v1.7.0). None of
  these pods runs in the host's network (the vendored gpu-operator values set
  `hostNetwork: false` on every operand), so the policies do apply to them;
  their probes come from the kubelet, on the pod's own node (always allowed).

Enforcement is the VPC CNI's network policy agent (`enableNetworkPolicy` in
the vpc-cni add-on's configuration, components/cluster.py). These objects do
not depend on it: without it they are accepted and have no effect.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from infra.k8s import checks, exposure
from infra.k8s.serving_spec import (
    API_PORT,
    DASHBOARD_PORT,
    DNS_PORT,
    PART_OF,
    RAY_CLUSTER_LABEL,
    RAY_METRICS_PORT,
    Clients,
    ServingSpec,
)

API_VERSION = "networking.k8s.io/v1"
# Set on every namespace by the API server (Kubernetes docs, "Well-Known Labels, Annotations and Taints").
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DNS_NAMESPACE = "kube-system"
DNS_POD_LABELS = {"k8s-app": "kube-dns"}  # CoreDNS on EKS (the coredns add-on keeps kube-dns's label)
HTTPS_PORT = 443
# EKS Pod Identity agent (EKS user guide, "Learn how EKS Pod Identity grants pods access to AWS services").
POD_IDENTITY_AGENT = "169.254.170.23/32"
POD_IDENTITY_PORT = 80
ANYWHERE = "0.0.0.0/0"
DEFAULT_DENY = "default-deny"
ALLOW_DNS = "allow-dns"
ALLOW_API_SERVER = "allow-api-server"
# The `kubernetes` Service's port (the API server, as pods reach it).
API_SERVER_PORT = 443


def policy(name: str, namespace: str, pod_selector: Mapping[str, str], *, ingress=None, egress=None, labels=None) -> dict:
    """A NetworkPolicy; `policyTypes` name exactly the directions given (a given, empty list denies that direction)."""
    spec: dict = {"podSelector": {"matchLabels": dict(pod_selector)} if pod_selector else {}, "policyTypes": []}
    if ingress is not None:
        spec["policyTypes"].append("Ingress")
        spec["ingress"] = list(ingress)
    if egress is not None:
        spec["policyTypes"].append("Egress")
        spec["egress"] = list(egress)
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or PART_OF)},
        "spec": spec,
    }


def tcp(*ports: int) -> list[dict]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def pods(labels: Mapping[str, str]) -> dict:
    """A peer: the pods of the policy's namespace with these labels."""
    return {"podSelector": {"matchLabels": dict(labels)}}


def client_peers(clients: Clients) -> list[dict]:
    """Peers for configured clients: every pod of each namespace, and each CIDR."""
    peers: list[dict] = []
    if clients.namespaces:
        peers.append(
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": sorted(clients.namespaces)}]
                }
            }
        )
    peers += [{"ipBlock": {"cidr": c}} for c in clients.cidrs]
    return peers


# --- the namespace ---------------------------------------------------------------------


def default_deny(namespace: str) -> dict:
    return policy(DEFAULT_DENY, namespace, {}, ingress=[], egress=[])


def allow_dns(namespace: str) -> dict:
    to = [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: DNS_NAMESPACE}}, "podSelector": {"matchLabels": dict(DNS_POD_LABELS)}}]
    ports = [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]
    return policy(ALLOW_DNS, namespace, {}, egress=[{"to": to, "ports": ports}])


def namespace_policies(namespace: str) -> list[dict]:
    return [default_deny(namespace), allow_dns(namespace)]


# --- the serving layer -----------------------------------------------------------------


def cluster_labels(spec: ServingSpec) -> dict[str, str]:
    return {RAY_CLUSTER_LABEL: spec.name}


def head_labels(spec: ServingSpec) -> dict[str, str]:
    """The head pod: exactly the API Service's selector (module doc, "Services")."""
    return exposure.head_selector(spec)


def ray_policy(spec: ServingSpec) -> dict:
    """The RayCluster's pods with each other, every port, both ways; nothing else."""
    peer = pods(cluster_labels(spec))
    return policy(f"{spec.name}-ray", spec.namespace, cluster_labels(spec), ingress=[{"from": [peer]}], egress=[{"to": [peer]}])


def api_peers(spec: ServingSpec) -> list[dict]:
    peers = [pods(checks.benchmark_selector(spec))] if spec.benchmark else []
    # With an internal load balancer the clients' own addresses arrive (exposure.service: externalTrafficPolicy
    # Local), so the named CIDRs are the whole list: never the VPC as such (every node and pod is in it).
    peers += client_peers(spec.api_clients)
    return peers


def serving_policies(spec: ServingSpec) -> list[dict]:
    """Every NetworkPolicy of the serving layer for `spec` (module doc)."""
    out = [ray_policy(spec)]
    if peers := api_peers(spec):
        out.append(policy(f"{spec.name}-api", spec.namespace, head_labels(spec), ingress=[{"from": peers, "ports": tcp(API_PORT)}]))
    if peers := client_peers(spec.metrics_clients):
        out.append(
            policy(f"{spec.name}-metrics", spec.namespace, cluster_labels(spec), ingress=[{"from": peers, "ports": tcp(API_PORT, RAY_METRICS_PORT)}])
        )
    if peers := client_peers(spec.dashboard_clients):
        out.append(policy(f"{spec.name}-dashboard", spec.namespace, head_labels(spec), ingress=[{"from": peers, "ports": tcp(DASHBOARD_PORT)}]))
    if spec.efa_check:
        selector = checks.efa_check_selector(spec)
        peer = pods(selector)
        out.append(policy(checks.efa_check_name(spec), spec.namespace, selector, ingress=[{"from": [peer]}], egress=[{"to": [peer]}]))
    if spec.benchmark:
        out.append(
            policy(
                checks.benchmark_name(spec),
                spec.namespace,
                checks.benchmark_selector(spec),
                egress=[{"to": [pods(head_labels(spec))], "ports": tcp(API_PORT)}],
            )
        )
    return out


# --- weight staging ----------------------------------------------------------------------


def staging_policy(
    name: str,
    namespace: str,
    pod_labels: Mapping[str, str],
    *,
    vpc_cidr: Optional[str],
    pod_identity: bool,
    labels: Optional[Mapping[str, str]] = None,
) -> dict:
    """The staging pods' egress: HTTPS outside the VPC (the hub, S3), and the Pod Identity agent for an S3 source."""
    block: dict = {"cidr": ANYWHERE}
    if vpc_cidr:
        block["except"] = [vpc_cidr]
    egress = [{"to": [{"ipBlock": block}], "ports": tcp(HTTPS_PORT)}]
    if pod_identity:
        egress.append({"to": [{"ipBlock": {"cidr": POD_IDENTITY_AGENT}}], "ports": tcp(POD_IDENTITY_PORT)})
    return policy(name, namespace, pod_labels, egress=egress, labels=labels)


# --- the operators' namespaces ------------------------------------------------------------


def kubernetes_service_ip(service_cidr: str) -> str:
    """The `kubernetes` Service's ClusterIP: the first address of the service CIDR, as a /32 (or /128).

    kube-apiserver takes it for itself, whatever the range ("Select the first valid IP from
    ServiceClusterIPRange to use as the GenericAPIServer service IP":
    `utilnet.GetIndexedIP(&serviceClusterIPRange, 1)`, kubernetes `ServiceIPRange`).
    """
    net = ipaddress.ip_network(service_cidr, strict=True)
    return f"{net[1]}/{net.max_prefixlen}"


def allow_api_server(namespace: str, api_server_cidrs: Sequence[Any]) -> dict:
    """Every pod of the namespace may open TCP 443 to the API server's address(es) (strings or Outputs)."""
    to = [{"ipBlock": {"cidr": cidr}} for cidr in api_server_cidrs]
    return policy(ALLOW_API_SERVER, namespace, {}, egress=[{"to": to, "ports": tcp(API_SERVER_PORT)}])


@dataclass(frozen=True)
class MetricsTarget:
    """A component's pods (their labels, as its chart sets them) and the port(s) they serve metrics on."""

    name: str
    selector: Mapping[str, str]
    ports: tuple[int, ...]


def metrics_policy(namespace: str, target: MetricsTarget, clients: Clients) -> Optional[dict]:
    """The component's metrics ports open to the configured clients; None when there are none."""
    peers = client_peers(clients)
    if not peers:
        return None
    return policy(f"{target.name}-metrics", namespace, target.selector, ingress=[{"from": peers, "ports": tcp(*target.ports)}])


def operator_namespace_policies(
    namespace: str, *, api_server_cidrs: Sequence[Any], metrics_targets: Sequence[MetricsTarget] = (), metrics_clients: Clients = Clients()
) -> list[dict]:
    """An operator namespace's policies: deny by default, DNS, the API server, metrics for the clients (module doc)."""
    if not api_server_cidrs:
        raise ValueError(f"namespace {namespace}: the API server's address is needed (every operator there talks to it)")
    out = [default_deny(namespace), allow_dns(namespace), allow_api_server(namespace, api_server_cidrs)]
    out += [p for t in metrics_targets if (p := metrics_policy(namespace, t, metrics_clients)) is not None]
    return out


def names(policies: Iterable[dict]) -> list[str]:
    return [p["metadata"]["name"] for p in policies]
