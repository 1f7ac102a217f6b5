"""The Kubernetes platform operators: NVIDIA GPU operator, EFA device plugin, KubeRay.

One `Operators` component (`gpu-serving:k8s:Operators`) creates:

- the namespaces `gpu-operator` (labelled for privileged pods: the operator's
  DaemonSets mount host paths and run privileged) and `kuberay`; the EFA device
  plugin goes into `kube-system`, where AWS's examples install it;
- in each namespace it creates, before the release that runs pods there, the
  NetworkPolicies of infra/k8s/network_policies.py (`operator_namespace_policies`,
  "The operators' namespaces"): deny by default, DNS, the API server (the
  `kubernetes` Service's ClusterIP, from `kubernetes_service_cidr`, the
  cluster's service CIDR) and each component's metrics port for
  `metrics_clients` (`METRICS_TARGETS`). kube-system gets none: it is EKS's
  namespace, not the stack's. Without `kubernetes_service_cidr` (a caller that
  cannot know it) no policy is made: a default deny without the API server
  would stop every operator. On a running stack the policies are new objects
  and the releases only gain a dependency (no upgrade): the operators keep
  running and lose only what the policies do not allow, which they do not
  use. If the API server rule were ever wrong for a cluster, the operators'
  logs would show API timeouts and the next release upgrade would time out in
  Helm's wait; `kubectl -n <namespace> delete networkpolicy default-deny`
  restores them while it is looked into (the next `pulumi up` puts it back);
- one `helm.v3.Release` per chart, chart, version and repository pinned in
  `infra/k8s/helm_values.py` (CHARTS; sources in tests/fixtures/charts.yaml), values from the pure
  functions there:
  - gpu-operator (driver and toolkit off on the EKS NVIDIA AMI, DCGM exporter
    on, MOFED injection off, operands tolerate the GPU taint);
  - aws-efa-k8s-device-plugin, only when the GPU instance type has EFA
    interfaces; an EFA instance type the chart does not list is refused with a
    UserError during preview (`infra.helm_values.check_efa_supported`);
  - kuberay-operator, watching only the namespaces in `kuberay_watch_namespaces` (the
    serving namespace): a Role and RoleBinding there, no ClusterRole, `--watch-namespace`
    (infra/k8s/helm_values.py `kuberay_operator_values` cites the chart's templates). The
    chart creates those RoleBindings in the watched namespaces, so the release depends on
    their Namespace resources (`kuberay_watch_namespace_resources`; `release_depends_on`):
    created after them, uninstalled before them.

The Kubernetes provider comes from the caller (`opts.providers` or
`opts.provider`) and reaches every child through `parent=self`.

`releases` (every Release) and `kuberay` (the KubeRay release) are exposed for
`depends_on`: a RayCluster that depends on the KubeRay release is deleted while
the operator still runs, so its finalizers are honoured and its namespace does
not hang in Terminating.

How each release is installed and upgraded (`RELEASE_OPTIONS`, see there):
Helm's own wait is on, with a per-chart timeout; no `atomic`, so a failed
install stays in the cluster to be inspected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, TypeVar

import pulumi
import pulumi_kubernetes as k8s

from infra.catalog.instances import InstanceType
from infra.k8s import network_policies
from infra.k8s.network_policies import MetricsTarget
from infra.k8s.serving_spec import Clients
from infra.k8s.helm_values import (
    EFA_DEVICE_PLUGIN,
    GPU_OPERATOR,
    KUBERAY_OPERATOR,
    Chart,
    check_efa_supported,
    efa_device_plugin_values,
    efa_plugin_needed,
    gpu_operator_values,
    kuberay_operator_values,
    kuberay_watch_namespaces,
)

TYPE = "gpu-serving:k8s:Operators"

# Namespaces this component creates (kube-system exists in every cluster).
PRIVILEGED_NAMESPACE_LABELS = {
    # Pod Security Admission: the GPU operator's operands are privileged, host-path
    # DaemonSets. EKS enforces no PSA level by default; the label keeps them
    # admitted if a cluster default is ever tightened (NVIDIA's install guide labels
    # the namespace the same way).
    "pod-security.kubernetes.io/enforce": "privileged",
}
NAMESPACE_LABELS: dict[str, dict[str, str]] = {
    GPU_OPERATOR.namespace: PRIVILEGED_NAMESPACE_LABELS,
    KUBERAY_OPERATOR.namespace: {},
}
SYSTEM_NAMESPACES = ("kube-system",)

# Who serves metrics where, in the namespaces this component creates: each component's pods
# (their labels, as the pinned chart sets them) and metrics port(s). Sources, at the pinned versions:
# - the GPU operator: `app: gpu-operator`, container port `metrics` 8080
#   (NVIDIA/gpu-operator v26.7.0, deployments/gpu-operator/templates/operator.yaml);
# - the DCGM exporter the operator runs: `app: nvidia-dcgm-exporter`, port `metrics` 9400
#   (assets/state-dcgm-exporter/0800_daemonset.yaml, DCGM_EXPORTER_LISTEN ":9400"); the chart's own
#   optional policy (templates/networkpolicy.yaml, later releases) selects the same label;
# - NFD master, worker and gc: `app.kubernetes.io/name: node-feature-discovery` (the subchart's
#   selectorLabels), port `http` 8080 for metrics and healthz (charts/node-feature-discovery 0.19.0,
#   values `master.port`, `worker.port`, `gc.port`);
# - KubeRay: `app.kubernetes.io/name: kuberay-operator`, port `http` 8080 serving /metrics
#   (ray-project/kuberay v1.7.0, helm-chart/kuberay-operator/templates/deployment.yaml; the vendored
#   values' `service.port` 8080).
# The node status exporter (port 8000) and the standalone DCGM (5555) are off (helm_values.py).
METRICS_TARGETS: dict[str, tuple[MetricsTarget, ...]] = {
    GPU_OPERATOR.namespace: (
        MetricsTarget("gpu-operator", {"app": "gpu-operator"}, (8080,)),
        MetricsTarget("dcgm-exporter", {"app": "nvidia-dcgm-exporter"}, (9400,)),
        MetricsTarget("node-feature-discovery", {"app.kubernetes.io/name": "node-feature-discovery"}, (8080,)),
    ),
    KUBERAY_OPERATOR.namespace: (MetricsTarget("kuberay-operator", {"app.kubernetes.io/name": "kuberay-operator"}, (8080,)),),
}


@dataclass(frozen=True)
class ReleaseOptions:
    """How Helm installs and upgrades one release."""

    timeout: int  # seconds, for each Kubernetes operation Helm waits on
    skip_await: bool = False
    # atomic purges a failed install (and rolls back a failed upgrade). Off: a release
    # that times out then leaves nothing behind but Helm's opaque "context deadline
    # exceeded" (pulumi-kubernetes issue tracker); kept, its pods and events say why
    # (kubectl describe), and the next `pulumi up` upgrades the failed release in place.
    atomic: bool = False
    # Same reason: resources a failed upgrade created stay for inspection; the next
    # upgrade adopts them (they are in the failed revision's manifest).
    cleanup_on_fail: bool = False
    # Helm keeps one Secret per revision; ten are enough to roll back by hand.
    max_history: int = 10


RELEASE_OPTIONS: dict[str, ReleaseOptions] = {
    # Helm waits for the operator Deployment, the NFD master/gc Deployments and the
    # NFD worker DaemonSet on every node, GPU nodes included (images from nvcr.io,
    # and a pre-upgrade hook Job that applies the CRDs). The operands the operator
    # creates itself (device plugin, DCGM exporter) are not Helm's: the serving
    # pods' GPU requests and the post-deploy checks are what proves them.
    GPU_OPERATOR.release: ReleaseOptions(timeout=900),
    # One small DaemonSet; waiting proves it is running on every GPU node (where it
    # cannot run, e.g. a missing toleration, the timeout fails `pulumi up` instead of
    # NCCL falling back to TCP later). With no GPU node yet the wait ends at once.
    EFA_DEVICE_PLUGIN.release: ReleaseOptions(timeout=300),
    # The operator Deployment and its CRDs; waiting means the operator runs before
    # the serving layer (depends_on) creates the RayCluster.
    KUBERAY_OPERATOR.release: ReleaseOptions(timeout=300),
}


@dataclass(frozen=True)
class OperatorsArgs:
    instance_type: InstanceType  # the GPU nodes' instance type (decides the EFA plugin)
    # The namespaces KubeRay watches (the serving namespace; at least one): there only it reconciles
    # RayClusters and holds a Role. Names, so the release's values are plain data a preview shows.
    kuberay_watch_namespaces: Sequence[str]
    # The Namespace resources of those namespaces that the stack creates: the KubeRay release waits for
    # them (the chart puts its Role and RoleBinding in each) and is uninstalled before them.
    kuberay_watch_namespace_resources: Sequence[pulumi.Resource] = ()
    dcgm_service_monitor: bool = False  # a ServiceMonitor for the DCGM exporter (needs the Prometheus operator CRDs)
    # Labels on that ServiceMonitor: those the stack's Prometheus selects by (infra/k8s/monitoring.py MONITOR_LABELS).
    dcgm_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    # The cluster's service CIDR (EKS: kubernetes_network_config.service_ipv4_cidr): the API server's ClusterIP
    # for the namespaces' NetworkPolicies. None: no NetworkPolicy in the operators' namespaces (module doc).
    kubernetes_service_cidr: Optional[pulumi.Input[str]] = None
    # Who may scrape the operators' metrics ports (gpu-serving:serving.metricsClients); none by default.
    metrics_clients: Clients = Clients()


def namespace_policies(namespace: str, api_server_cidr: pulumi.Input[str], metrics_clients: Clients) -> list[dict]:
    """The NetworkPolicies of one namespace this component creates (infra/k8s/network_policies.py)."""
    return network_policies.operator_namespace_policies(
        namespace,
        api_server_cidrs=[api_server_cidr],
        metrics_targets=METRICS_TARGETS.get(namespace, ()),
        metrics_clients=metrics_clients,
    )


def release_values(args: OperatorsArgs) -> dict[str, dict[str, Any]]:
    """The values of each release this component installs, by release name."""
    values = {
        GPU_OPERATOR.release: gpu_operator_values(
            dcgm_service_monitor=args.dcgm_service_monitor, monitor_labels=dict(args.dcgm_monitor_labels)
        )
    }
    if efa_plugin_needed(args.instance_type):
        values[EFA_DEVICE_PLUGIN.release] = efa_device_plugin_values(args.instance_type)
    values[KUBERAY_OPERATOR.release] = kuberay_operator_values(args.kuberay_watch_namespaces)
    return values


R = TypeVar("R")


def release_depends_on(chart: Chart, namespace_policies: dict[str, Sequence[R]], kuberay_watched: Sequence[R]) -> list[R]:
    """What a release waits for, besides its own namespace (an input): the NetworkPolicies of that namespace,
    and for KubeRay the namespaces it watches, where its chart creates a Role and RoleBinding (Helm's
    install fails on a namespace that does not exist yet; on destroy the release goes first, so the
    operator keeps its rights there while the RayCluster's finalizers are removed)."""
    deps = list(namespace_policies.get(chart.namespace, ()))
    if chart.release == KUBERAY_OPERATOR.release:
        for ns in kuberay_watched:
            if ns not in deps:
                deps.append(ns)
    return deps


class Operators(pulumi.ComponentResource):
    """GPU operator, EFA device plugin (when the instance type has EFA) and KubeRay operator."""

    releases: list[k8s.helm.v3.Release]
    kuberay: k8s.helm.v3.Release
    gpu_operator: k8s.helm.v3.Release
    efa_device_plugin: Optional[k8s.helm.v3.Release]

    def __init__(self, name: str, args: OperatorsArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TYPE, name, None, opts)
        # Fails the preview, with the reason, before anything is created.
        check_efa_supported(args.instance_type)
        kuberay_watch_namespaces(args.kuberay_watch_namespaces)
        values = release_values(args)
        self._kuberay_watched = list(args.kuberay_watch_namespace_resources)
        child = pulumi.ResourceOptions(parent=self)

        self.namespaces: dict[str, k8s.core.v1.Namespace] = {
            ns: k8s.core.v1.Namespace(
                f"{name}-ns-{ns}",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=ns, labels=dict(labels) or None),
                opts=child,
            )
            for ns, labels in NAMESPACE_LABELS.items()
        }

        # Each namespace's NetworkPolicies, before the release that runs pods in it (module doc).
        self.network_policies: dict[str, list[k8s.networking.v1.NetworkPolicy]] = {}
        if args.kubernetes_service_cidr is not None:
            api_server = pulumi.Output.from_input(args.kubernetes_service_cidr).apply(network_policies.kubernetes_service_ip)
            for ns, namespace in self.namespaces.items():
                self.network_policies[ns] = [
                    k8s.networking.v1.NetworkPolicy(
                        f"{name}-np-{ns}-{np['metadata']['name']}",
                        metadata=np["metadata"],
                        spec=np["spec"],
                        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[namespace])),
                    )
                    for np in namespace_policies(ns, api_server, args.metrics_clients)
                ]

        self.gpu_operator = self._release(name, GPU_OPERATOR, values[GPU_OPERATOR.release], child)
        self.efa_device_plugin = (
            self._release(name, EFA_DEVICE_PLUGIN, values[EFA_DEVICE_PLUGIN.release], child)
            if EFA_DEVICE_PLUGIN.release in values
            else None
        )
        self.kuberay = self._release(name, KUBERAY_OPERATOR, values[KUBERAY_OPERATOR.release], child)
        self.releases = [r for r in (self.gpu_operator, self.efa_device_plugin, self.kuberay) if r is not None]

        self.register_outputs(
            {
                "gpu_operator_status": self.gpu_operator.status,
                "efa_device_plugin_status": self.efa_device_plugin.status if self.efa_device_plugin else None,
                "kuberay_status": self.kuberay.status,
            }
        )

    def _namespace(self, chart: Chart) -> pulumi.Input[str]:
        """The release's namespace: through the Namespace resource when we create it (an ordering edge)."""
        ns = self.namespaces.get(chart.namespace)
        return ns.metadata.name if ns is not None else chart.namespace

    def _release(
        self, name: str, chart: Chart, values: dict[str, Any], child: pulumi.ResourceOptions
    ) -> k8s.helm.v3.Release:
        o = RELEASE_OPTIONS[chart.release]
        return k8s.helm.v3.Release(
            f"{name}-{chart.release}",
            # A fixed release name: `helm list` and the objects the chart names after
            # the release stay the same across stacks and replacements.
            name=chart.release,
            chart=chart.chart,
            version=chart.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repository),
            namespace=self._namespace(chart),
            values=values,
            atomic=o.atomic,
            cleanup_on_fail=o.cleanup_on_fail,
            timeout=o.timeout,
            skip_await=o.skip_await,
            max_history=o.max_history,
            opts=pulumi.ResourceOptions.merge(
                child,
                # The release name is fixed, so a replacement (e.g. a new namespace) must
                # uninstall the old release before installing the new one. Its pods start
                # under their namespace's NetworkPolicies (and Helm's wait then proves them).
                pulumi.ResourceOptions(
                    delete_before_replace=True,
                    depends_on=release_depends_on(chart, self.network_policies, self._kuberay_watched),
                ),
            ),
        )
