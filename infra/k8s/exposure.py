"""How the serving RayCluster is reached and kept: its Service, disruption budget and monitoring.

- `service(spec)`: port 8000 on the head pod; ClusterIP, or an internal NLB.
- `pdb(spec)`: no voluntary disruption of any serving pod.
- `pod_monitor(spec)` (Prometheus operator) when `spec.monitoring` is
  "podmonitor"; otherwise the pods carry scrape annotations
  (infra/k8s/raycluster.py).
"""

from __future__ import annotations

from infra.k8s.serving_spec import (
    API_PORT,
    API_PORT_NAME,
    METRICS_PATH,
    PART_OF,
    RAY_CLUSTER_LABEL,
    RAY_METRICS_PORT_NAME,
    RAY_NODE_TYPE_LABEL,
    ServingSpec,
)

# Internal NLB. This stack installs no AWS Load Balancer Controller, so the
# Service is handled by the cloud provider's legacy service controller on EKS,
# which reads `aws-load-balancer-type: nlb` and `aws-load-balancer-internal`
# (kubernetes/cloud-provider-aws pkg/providers/v1/aws.go: ServiceAnnotationLoadBalancerType,
# ServiceAnnotationLoadBalancerInternal; ServiceAnnotationLoadBalancerAdditionalTags takes
# "Key1=Val1,Key2=Val2", which the AWS Load Balancer Controller reads too).
# `aws-load-balancer-scheme: internal` is what the AWS Load Balancer Controller
# reads (its NLB guide; it also defaults to internal since v2.2): with both, the
# load balancer is internal whichever controller takes the Service. No
# `loadBalancerClass`, so either may.
INTERNAL_NLB_ANNOTATIONS = {
    "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
}


def head_selector(spec: ServingSpec) -> dict[str, str]:
    return {RAY_CLUSTER_LABEL: spec.name, RAY_NODE_TYPE_LABEL: "head"}


def service(spec: ServingSpec) -> dict:
    """Port 8000 of the head pod: ClusterIP, or an internal NLB (`internal-lb`)."""
    metadata: dict = {"name": spec.service_name, "namespace": spec.namespace, "labels": dict(PART_OF)}
    body: dict = {
        "selector": head_selector(spec),
        "ports": [{"name": API_PORT_NAME, "port": API_PORT, "targetPort": API_PORT_NAME, "protocol": "TCP"}],
    }
    if spec.service_type == "internal-lb":
        metadata["annotations"] = dict(INTERNAL_NLB_ANNOTATIONS)
        if spec.load_balancer_tags:
            # The load balancer is made by Kubernetes, not Pulumi: without the stack's
            # tags the leak sweeper could not recognise it, and the VPC would not go.
            metadata["annotations"]["service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags"] = ",".join(
                f"{k}={v}" for k, v in sorted(spec.load_balancer_tags.items())
            )
        body["type"] = "LoadBalancer"
        # Only the named clients: the load balancer admits their ranges (for an NLB with instance targets the
        # ranges become rules of the nodes' security group: AWS re:Post, "restrict CIDR IP addresses for a
        # LoadBalancer type service in Amazon EKS"), and `Local` keeps their addresses (the node does not rewrite
        # the source to its own to forward to another node; Kubernetes docs, "Preserving the client source IP"),
        # so the API's NetworkPolicy can admit exactly those ranges too (network_policies.api_peers).
        body["externalTrafficPolicy"] = "Local"
        body["loadBalancerSourceRanges"] = sorted(spec.api_clients.cidrs)
    else:
        body["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body}


def pdb(spec: ServingSpec) -> dict:
    """No voluntary disruption of any serving pod.

    The engine is one TP x PP group over every pod: losing any pod (head or
    worker) kills it, so an eviction (node drain, EKS node group update) must
    wait for an operator; `maxUnavailable: 0` blocks it whatever the pod count.
    Pods that are not Ready may still be evicted (`AlwaysAllow`): the engine is
    already down then, and a broken pod must not block a drain forever. KubeRay
    deletes pods directly (not through eviction), so its Recreate upgrade is
    not blocked.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": dict(PART_OF)},
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {RAY_CLUSTER_LABEL: spec.name}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def pod_monitor(spec: ServingSpec) -> dict:
    """A PodMonitor (Prometheus operator) for vLLM's /metrics on the head and Ray's on every pod.

    Fields of the prometheus-operator's `monitoring.coreos.com/v1` PodMonitor
    (pkg/apis/monitoring/v1/podmonitor_types.go: selector, namespaceSelector.matchNames,
    podMetricsEndpoints[].port/path/interval; `port` names a container port).
    """
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": {**PART_OF, **dict(spec.monitor_labels)}},
        "spec": {
            "selector": {"matchLabels": {RAY_CLUSTER_LABEL: spec.name}},
            "namespaceSelector": {"matchNames": [spec.namespace]},
            "podMetricsEndpoints": [
                {"port": API_PORT_NAME, "path": METRICS_PATH, "interval": "30s"},  # vLLM (head only)
                {"port": RAY_METRICS_PORT_NAME, "path": METRICS_PATH, "interval": "30s"},  # Ray (every pod)
            ],
        },
    }
