"""The in-cluster monitoring stack (`gpu-serving:monitoring` mode `in-cluster`, issue 20).

One `Monitoring` component (`gpu-serving:k8s:Monitoring`) creates, in this order:

- the `monitoring` namespace (labelled privileged for Pod Security admission: node exporter
  runs in the host's network and PID namespaces with host paths mounted);
- its NetworkPolicies (infra/k8s/monitoring.py `namespace_policies`: deny by default, DNS,
  the API server, the namespace's pods with each other, Prometheus to its scrape targets,
  the API server to the operator's admission webhook, Alertmanager to a webhook receiver);
- Grafana's admin credentials: a `random.RandomPassword` (kept in the state as a secret,
  exported as the secret output `grafanaAdminPassword`) in a Secret the chart reads
  (`grafana.admin.existingSecret`), so the password is never in Helm values;
- with a webhook receiver, a Secret holding its URL (the secret config `alertWebhookUrl`),
  which Alertmanager reads as a file (`url_file`);
- the `gp3` StorageClass Prometheus' volume claims (EBS CSI, encrypted, bound where the pod
  lands). The EBS CSI driver itself is the cluster's add-on (components/cluster.py), not this component's;
- the kube-prometheus-stack release (infra/k8s/helm_values.py KUBE_PROMETHEUS_STACK, values
  from infra/k8s/monitoring.py), after all of the above;
- a PrometheusRule with `rule_groups` and one ConfigMap a Grafana dashboard (`dashboards`),
  both after the release (its CRDs, its Grafana sidecar), when given.

`release` is exposed for `depends_on`: whatever creates a PodMonitor or ServiceMonitor (the
serving layer, the GPU operator's DCGM ServiceMonitor) waits for the release's CRDs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.k8s import monitoring as mon, network_policies
from infra.k8s.helm_values import KUBE_PROMETHEUS_STACK
from infra.k8s.monitoring_sizing import Sizing

TYPE = "gpu-serving:k8s:Monitoring"
GRAFANA_ADMIN_SECRET = "grafana-admin"
WEBHOOK_SECRET = "alertmanager-webhook"
RULE_NAME = "gpu-serving"
PASSWORD_LENGTH = 32
NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "privileged"}
# Helm waits for the operator, Grafana and kube-state-metrics Deployments and the node exporter DaemonSet on every
# node (GPU nodes included); Prometheus and Alertmanager are the operator's StatefulSets, not Helm's, so a volume
# that takes long to bind does not hold `pulumi up`.
RELEASE_TIMEOUT_S = 600


@dataclass(frozen=True)
class MonitoringArgs:
    sizing: Sizing
    retention_days: int
    serving_namespace: str
    operator_ports: Mapping[str, Sequence[int]]  # the operators' namespaces -> their metrics ports (METRICS_TARGETS)
    # The cluster's service CIDR (the API server's ClusterIP for the NetworkPolicies) and the nodes' CIDR (the VPC's;
    # None when the stack does not own the VPC: the node ports are then open to anywhere, module doc of monitoring.py).
    kubernetes_service_cidr: pulumi.Input[str]
    node_cidr: Optional[str] = None
    webhook_url: Optional[pulumi.Input[str]] = None  # a secret Output
    rule_groups: Sequence[Mapping[str, Any]] = ()
    dashboards: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def storage_class() -> dict:
    """gp3 through the EBS CSI driver: encrypted, bound in the zone the pod is scheduled in, expandable."""
    return {
        "metadata": {"name": mon.STORAGE_CLASS},
        "provisioner": "ebs.csi.aws.com",
        "parameters": {"type": "gp3", "encrypted": "true"},
        "reclaim_policy": "Delete",
        "volume_binding_mode": "WaitForFirstConsumer",
        "allow_volume_expansion": True,
    }


def prometheus_rule(groups: Sequence[Mapping[str, Any]]) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RULE_NAME, "namespace": mon.NAMESPACE, "labels": dict(mon.MONITOR_LABELS)},
        "spec": {"groups": [dict(g) for g in groups]},
    }


def dashboard_config_map(file_name: str, dashboard: Mapping[str, Any]) -> dict:
    """One dashboard (`serving.json`) in a ConfigMap the Grafana sidecar provisions (its default label)."""
    stem = file_name.removesuffix(".json")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"dashboard-{stem}", "namespace": mon.NAMESPACE, "labels": {mon.DASHBOARD_LABEL: mon.DASHBOARD_LABEL_VALUE}},
        "data": {file_name: json.dumps(dashboard, indent=2, sort_keys=True)},
    }


class Monitoring(pulumi.ComponentResource):
    """kube-prometheus-stack in the `monitoring` namespace, its policies, credentials, rules and dashboards."""

    release: k8s.helm.v3.Release
    pod_monitor: Optional[k8s.apiextensions.CustomResource] = None  # the serving PodMonitor, when stack.py makes it here

    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ns = mon.NAMESPACE
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=ns, labels=dict(NAMESPACE_LABELS)), opts=child
        )
        in_ns = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.namespace]))
        api_server = pulumi.Output.from_input(args.kubernetes_service_cidr).apply(network_policies.kubernetes_service_ip)
        self.network_policies = [
            k8s.networking.v1.NetworkPolicy(f"{name}-np-{p['metadata']['name']}", metadata=p["metadata"], spec=p["spec"], opts=in_ns)
            for p in mon.namespace_policies(
                api_server_cidrs=[api_server],
                node_cidr=args.node_cidr,
                serving_namespace=args.serving_namespace,
                operator_ports=dict(args.operator_ports),
                webhook=args.webhook_url is not None,
            )
        ]

        # Made once per stack: nothing in its inputs changes, so it never rotates by accident.
        password = random.RandomPassword(f"{name}-grafana-admin", length=PASSWORD_LENGTH, special=False, opts=child)
        self.grafana_admin_password = pulumi.Output.secret(password.result)
        admin = k8s.core.v1.Secret(
            f"{name}-grafana-admin",
            metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": ns},
            type="Opaque",
            string_data={mon.ADMIN_USER_KEY: mon.ADMIN_USER, mon.ADMIN_PASSWORD_KEY: self.grafana_admin_password},
            opts=in_ns,
        )
        before_release: list[pulumi.Resource] = [self.namespace, *self.network_policies, admin]
        webhook_secret = None
        if args.webhook_url is not None:
            webhook_secret = WEBHOOK_SECRET
            before_release.append(
                k8s.core.v1.Secret(
                    f"{name}-alertmanager-webhook",
                    metadata={"name": WEBHOOK_SECRET, "namespace": ns},
                    type="Opaque",
                    string_data={mon.WEBHOOK_URL_KEY: pulumi.Output.secret(args.webhook_url)},
                    opts=in_ns,
                )
            )
        sc = storage_class()
        before_release.append(
            k8s.storage.v1.StorageClass(
                f"{name}-storage-class",
                metadata=sc["metadata"],
                provisioner=sc["provisioner"],
                parameters=sc["parameters"],
                reclaim_policy=sc["reclaim_policy"],
                volume_binding_mode=sc["volume_binding_mode"],
                allow_volume_expansion=sc["allow_volume_expansion"],
                opts=child,
            )
        )
        values = mon.kube_prometheus_stack_values(args.sizing, args.retention_days, GRAFANA_ADMIN_SECRET, webhook_secret)
        chart = KUBE_PROMETHEUS_STACK
        self.release = k8s.helm.v3.Release(
            f"{name}-{chart.release}",
            name=chart.release,
            chart=chart.chart,
            version=chart.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repository),
            namespace=self.namespace.metadata.name,
            values=values,
            atomic=False,
            cleanup_on_fail=False,
            timeout=RELEASE_TIMEOUT_S,
            max_history=10,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=before_release, delete_before_replace=True)
            ),
        )
        after_release = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.release]))
        self.rule = None
        if args.rule_groups:
            rule = prometheus_rule(args.rule_groups)
            self.rule = k8s.apiextensions.CustomResource(
                f"{name}-rules", api_version=rule["apiVersion"], kind=rule["kind"], metadata=rule["metadata"],
                spec=rule["spec"], opts=after_release,
            )  # fmt: skip
        self.dashboards = [
            k8s.core.v1.ConfigMap(f"{name}-{cm['metadata']['name']}", metadata=cm["metadata"], data=cm["data"], opts=after_release)
            for cm in (dashboard_config_map(k, d) for k, d in sorted(args.dashboards.items()))
        ]

        self.grafana_service = pulumi.Output.from_input(mon.GRAFANA_SERVICE)
        self.prometheus_service = pulumi.Output.from_input(mon.PROMETHEUS_SERVICE)
        self.grafana_port_forward = mon.port_forward(mon.GRAFANA_SERVICE, mon.GRAFANA_LOCAL_PORT, mon.GRAFANA_PORT)
        self.prometheus_port_forward = mon.port_forward(mon.PROMETHEUS_SERVICE, mon.PROMETHEUS_PORT, mon.PROMETHEUS_PORT)
        self.register_outputs(
            {
                "release_status": self.release.status,
                "grafana_service": self.grafana_service,
                "prometheus_service": self.prometheus_service,
                "grafana_admin_password": self.grafana_admin_password,
            }
        )
