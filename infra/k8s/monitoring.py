"""The in-cluster monitoring stack as plain data: kube-prometheus-stack's values and the monitoring namespace's policies.

Pure functions (no Pulumi): components/monitoring.py turns them into resources, and
tests/test_monitoring.py checks every key path set here against the chart's own defaults
(tests/fixtures/upstream/kube-prometheus-stack-88.5.3/: the chart's values.yaml and, for
the subcharts' own keys, grafana's, kube-state-metrics' and prometheus-node-exporter's).

Chart kube-prometheus-stack 88.5.3 (prometheus-operator v0.93.1; subcharts grafana 12.11.1,
kube-state-metrics 8.4.0, prometheus-node-exporter 4.56.1), release `kube-prometheus-stack`
in the `monitoring` namespace:

- Prometheus, Alertmanager, the operator, kube-state-metrics and Grafana on the system nodes
  (`gpu-serving/role=system`); node exporter on every node (its chart tolerates every
  NoSchedule taint, the GPU taint included, and runs in the host's network on 9100).
- Prometheus keeps `retentionDays` of samples on a gp3 volume sized with its memory from
  the stack's series estimate (infra/k8s/monitoring_sizing.py).
- Monitors and rules are selected by the chart's own default: the label
  `release: kube-prometheus-stack` (templates/prometheus/prometheus.yaml: with
  `*SelectorNilUsesHelmValues` true, the selector is `matchLabels: {release: <Release.Name>}`;
  the namespace selectors default to `{}`, every namespace). `MONITOR_LABELS` is that label:
  the serving PodMonitor, the DCGM exporter's ServiceMonitor and the stack's PrometheusRule
  carry it.
- The scrapers of control-plane components EKS does not expose to pods (controller manager,
  scheduler, etcd) are off, and so is kube-proxy's (it binds its metrics to 127.0.0.1 on EKS)
  and the API server's (tens of thousands of series the stack's dashboards and alerts do not
  read); the chart's default rules for them render only when they are on, so no alert waits
  on a target that cannot exist.
- Every pod carries CPU and memory requests, and memory limits, from infra/planning/monitoring_pods.py (the chart
  sets none but Prometheus'), the table the plan's system-node fit sums (infra/planning/system_nodes.py).
- Grafana's admin password comes from a Secret the stack makes (`grafana.admin.existingSecret`);
  the dashboards' ConfigMaps are found by the sidecar's default label `grafana_dashboard: "1"`.
- Alertmanager's webhook receiver reads its URL from a Secret file (`url_file`), mounted through
  `alertmanager.alertmanagerSpec.secrets` at /etc/alertmanager/secrets/<name>/<key>: the URL is
  never in Helm values.

With `mode: amp` (`amp_values`), the same release with three changes:

- Prometheus in agent mode (`prometheus.agentMode`: the chart renders a PrometheusAgent,
  monitoring.coreos.com/v1alpha1, instead of a Prometheus; templates/prometheus/prometheus.yaml):
  it scrapes the same monitors and remote-writes every sample to the workspace with SigV4
  (`remoteWrite[].sigv4.region`, the PrometheusAgent CRD), keeps only its write-ahead log on an
  emptyDir (no `storageSpec`: no volume, no StorageClass), evaluates no rules. Its pods are
  `app.kubernetes.io/name: prometheus-agent` (the chart's service.yaml selector in agent mode).
  The credentials come from EKS Pod Identity: Prometheus v3.14.0 (the chart's image,
  values.yaml prometheus.prometheusSpec.image.tag) signs with github.com/prometheus/sigv4
  v0.4.1, which loads the AWS SDK for Go v2's default chain (`config.LoadDefaultConfig`,
  sigv4.go), at github.com/aws/aws-sdk-go-v2/config v1.32.31 (Prometheus v3.14.0 go.mod); its
  container credentials provider takes Pod Identity's credentials from Go v2 release-2023-11-14
  on (EKS User Guide, "Use pod identity with the AWS SDK", pod-id-minimum-sdk.html).
- No Alertmanager, no chart default rules: the workspace evaluates the stack's rules and routes
  the alerts (components/monitoring.py), and the chart's own rules would go unevaluated.
- Grafana queries the workspace: the pinned Grafana is 13.2.0 (grafana chart 12.11.1's
  appVersion, grafana-community/helm-charts commit 864f779), whose core Prometheus data source
  no longer signs with SigV4 (Grafana docs, "Prometheus data source": "In Grafana 13, the core
  Prometheus data source no longer supports SigV4 (AWS) ... authentication"), so the data
  source is the Amazon Managed Service for Prometheus plugin (`AMP_PLUGIN`, pinned, installed
  at start through the chart's `plugins`, i.e. GF_PLUGINS_PREINSTALL_SYNC), with `sigV4AuthType:
  default` (the AWS SDK's default chain: Pod Identity; the plugin's docs/sources/configure.md,
  "Provision with a YAML file"), which grafana-aws-sdk allows by default (v1.5.1
  pkg/awsds/authSettings.go: allowed providers default, keys, credentials). The chart's default
  Prometheus data source (the agent has no query API) and its default dashboards (they read the
  chart's recording rules, which nothing evaluates here) are off; the stack's dashboards are
  given the plugin's data source type (`for_datasource_type`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from infra.k8s import network_policies as np_
from infra.k8s.helm_values import KUBE_PROMETHEUS_STACK
from infra.k8s.monitoring_sizing import Sizing
from infra.k8s.scheduling import system_node_selector
from infra.k8s.serving_spec import API_PORT, RAY_METRICS_PORT
from infra.planning import monitoring_pods as pods

NAMESPACE = KUBE_PROMETHEUS_STACK.namespace
RELEASE = KUBE_PROMETHEUS_STACK.release
MONITOR_LABELS: dict[str, str] = {"release": RELEASE}
DASHBOARD_LABEL = "grafana_dashboard"  # values.yaml grafana.sidecar.dashboards.label
DASHBOARD_LABEL_VALUE = "1"  # ... labelValue
STORAGE_CLASS = "gp3"
ADMIN_USER = "admin"
ADMIN_USER_KEY = "admin-user"  # values.yaml grafana.admin.userKey
ADMIN_PASSWORD_KEY = "admin-password"  # grafana.admin.passwordKey
WEBHOOK_URL_KEY = "url"

# Service names and ports, as the chart names them with this release name (kube-prometheus-stack.fullname is the
# release name when it contains the chart name; grafana's is `<release>-grafana`; values prometheus.service.port
# 9090, alertmanager.service.port 9093, grafana's service.port 80 to targetPort 3000).
PROMETHEUS_SERVICE = f"{RELEASE}-prometheus"
PROMETHEUS_PORT = 9090
ALERTMANAGER_SERVICE = f"{RELEASE}-alertmanager"
ALERTMANAGER_PORT = 9093
GRAFANA_SERVICE = f"{RELEASE}-grafana"
GRAFANA_PORT = 80
GRAFANA_LOCAL_PORT = 3000

# Pods of the namespace, by the labels the chart and the operator give them.
PROMETHEUS_PODS = {"app.kubernetes.io/name": "prometheus"}  # the operator's StatefulSet pods
PROMETHEUS_AGENT_PODS = {"app.kubernetes.io/name": "prometheus-agent"}  # agent mode (module doc)
GRAFANA_PODS = {"app.kubernetes.io/name": "grafana"}  # the grafana chart's selector labels
ALERTMANAGER_PODS = {"app.kubernetes.io/name": "alertmanager"}
OPERATOR_PODS = {"app": f"{RELEASE}-operator"}  # templates/prometheus-operator/deployment.yaml selector
OPERATOR_WEBHOOK_PORT = 10250  # prometheusOperator.tls.internalPort: the admission webhook and metrics
NODE_EXPORTER_PORT = 9100  # prometheus-node-exporter service.port, in the host's network
KUBELET_PORT = 10250
COREDNS_METRICS_PORT = 9153  # coreDns.service.port
# Scrape targets outside the namespace: the serving pods (vLLM 8000 and Ray 8080) and the operators' namespaces, whose
# metrics ports the caller gives (components/operators.py METRICS_TARGETS: the DCGM exporter's 9400, the operators' 8080).


# Service accounts, named explicitly (prometheus.serviceAccount.name, grafana's serviceAccount.name; the defaults
# `<fullname>-prometheus` and `<fullname>-grafana` are the same names): EKS Pod Identity associates a role with them.
PROMETHEUS_SERVICE_ACCOUNT = f"{RELEASE}-prometheus"
GRAFANA_SERVICE_ACCOUNT = f"{RELEASE}-grafana"
# grafana/grafana-amazonprometheus-datasource, tag v3.2.0 (src/plugin.json id; grafanaDependency ">=12.2.5-0" admits
# Grafana 13.2.0), as `<id>@<version>` (the grafana chart's values.yaml, `plugins`).
AMP_PLUGIN = "grafana-amazonprometheus-datasource"
AMP_PLUGIN_VERSION = "3.2.0"
AMP_DATASOURCE_UID = "amp"


@dataclass(frozen=True)
class AmpValues:
    """What the release needs of the workspace (`remote_write_url` and `query_url` may be Outputs)."""

    remote_write_url: Any
    query_url: Any  # the workspace's prometheus_endpoint
    region: str


def port_forward(service: str, local: int, remote: int) -> str:
    return f"kubectl -n {NAMESPACE} port-forward svc/{service} {local}:{remote}"


def alertmanager_config(webhook_secret: Optional[str]) -> dict[str, Any]:
    """The parts of values.yaml's `alertmanager.config` the stack changes (Helm merges maps, replaces lists)."""
    if webhook_secret is None:
        return {}
    url_file = f"/etc/alertmanager/secrets/{webhook_secret}/{WEBHOOK_URL_KEY}"
    return {
        "route": {
            "group_by": ["namespace", "alertname"],
            "receiver": "webhook",
            # The chart's own: Watchdog (always firing, a dead man's switch) goes nowhere.
            "routes": [{"receiver": "null", "matchers": ['alertname = "Watchdog"']}],
        },
        "receivers": [{"name": "null"}, {"name": "webhook", "webhook_configs": [{"url_file": url_file, "send_resolved": True}]}],
    }


# The control-plane components the chart scrapes by default: not reachable from pods on EKS (module doc);
# their default rules go with them. The same in both modes.
NOT_ON_EKS: dict[str, Any] = {
    "kubeControllerManager": {"enabled": False},
    "kubeScheduler": {"enabled": False},
    "kubeEtcd": {"enabled": False},
    "kubeProxy": {"enabled": False},
    "kubeApiServer": {"enabled": False},
}


def kube_prometheus_stack_values(
    sizing: Sizing,
    retention_days: int,
    grafana_admin_secret: str,
    webhook_secret: Optional[str] = None,
    storage_class: str = STORAGE_CLASS,
    amp: Optional[AmpValues] = None,
) -> dict[str, Any]:
    """Values of the kube-prometheus-stack release (chart 88.5.3); with `amp`, those of `amp_values`."""
    if amp is not None:
        return amp_values(sizing, grafana_admin_secret, amp)
    system = system_node_selector()
    alertmanager_spec: dict[str, Any] = {"nodeSelector": system, "resources": pods.ALERTMANAGER.resources()}
    if webhook_secret is not None:
        alertmanager_spec["secrets"] = [webhook_secret]
    return {
        **NOT_ON_EKS,
        "prometheusOperator": _operator(system),
        "prometheus": {
            "prometheusSpec": {
                "nodeSelector": system,
                "retention": f"{retention_days}d",
                "retentionSize": f"{sizing.retention_size_gib}GiB",
                "resources": _resources(sizing),
                "storageSpec": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "storageClassName": storage_class,
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": f"{sizing.storage_gib}Gi"}},
                        }
                    }
                },
            }
        },
        "alertmanager": {"alertmanagerSpec": alertmanager_spec, **({"config": alertmanager_config(webhook_secret)} if webhook_secret else {})},
        "grafana": {
            **_grafana(system),
            "admin": {"existingSecret": grafana_admin_secret, "userKey": ADMIN_USER_KEY, "passwordKey": ADMIN_PASSWORD_KEY},
        },
        "kube-state-metrics": {"nodeSelector": system, "resources": pods.KUBE_STATE_METRICS.resources()},
        "prometheus-node-exporter": {"resources": pods.NODE_EXPORTER.resources()},
    }


def _resources(sizing: Sizing) -> dict[str, Any]:
    """Prometheus' container (infra/planning/monitoring_pods.py): the series estimate's memory, the limit at twice it
    before the kernel stops it (a query over the whole retention can spike)."""
    return pods.Container(pods.PROMETHEUS_CPU_M, sizing.memory_mib, 2 * sizing.memory_mib, "").resources()


def _operator(system: Mapping[str, str]) -> dict[str, Any]:
    """The operator on the system nodes with its requests, and the config reloader's it gives every Prometheus and
    Alertmanager pod (infra/planning/monitoring_pods.py)."""
    return {
        "nodeSelector": system,
        "resources": pods.OPERATOR.resources(),
        "prometheusConfigReloader": {"resources": pods.CONFIG_RELOADER.resources()},
        "admissionWebhooks": {"patch": {"nodeSelector": system}},
    }


def _grafana(system: Mapping[str, str]) -> dict[str, Any]:
    """Grafana on the system nodes with its requests, and its sidecars' (one `sidecar.resources` for all of them)."""
    return {"nodeSelector": system, "resources": pods.GRAFANA.resources(), "sidecar": {"resources": pods.GRAFANA_SIDECAR.resources()}}


def amp_values(sizing: Sizing, grafana_admin_secret: str, amp: AmpValues) -> dict[str, Any]:
    """Values of the release in `amp` mode (module doc): agent, remote write with SigV4, Grafana on the workspace."""
    system = system_node_selector()
    return {
        **NOT_ON_EKS,
        "defaultRules": {"create": False},
        "prometheusOperator": _operator(system),
        "prometheus": {
            "agentMode": True,
            "serviceAccount": {"name": PROMETHEUS_SERVICE_ACCOUNT},
            "prometheusSpec": {
                "nodeSelector": system,
                # ASSUMPTION: the agent holds the active series in memory as the server's head block does (its
                # write-ahead log replays into the same structures); no published ratio says how much less it
                # needs, so it keeps the server's estimate (infra/k8s/monitoring_sizing.py).
                "resources": _resources(sizing),
                "remoteWrite": [{"url": amp.remote_write_url, "sigv4": {"region": amp.region}}],
            },
        },
        "alertmanager": {"enabled": False},
        "grafana": {
            **_grafana(system),
            "admin": {"existingSecret": grafana_admin_secret, "userKey": ADMIN_USER_KEY, "passwordKey": ADMIN_PASSWORD_KEY},
            "serviceAccount": {"name": GRAFANA_SERVICE_ACCOUNT},
            "plugins": [f"{AMP_PLUGIN}@{AMP_PLUGIN_VERSION}"],
            # Grafana hands this to plugins as AWS_SIGV4_AUTH_ENABLED (grafana-aws-sdk v1.5.1 pkg/awsds/
            # authSettings.go, ReadSigV4Settings); the pinned plugin signs regardless (its pkg/datasource.go adds
            # awsauth.NewSigV4Middleware unconditionally), AWS's Grafana guide sets it (AMP User Guide, "Set up
            # Grafana open source or Grafana Enterprise": `sigv4_auth_enabled = true`): on, so neither refuses.
            "grafana.ini": {"auth": {"sigv4_auth_enabled": True}},
            "defaultDashboardsEnabled": False,
            "sidecar": {**_grafana(system)["sidecar"], "datasources": {"defaultDatasourceEnabled": False, "alertmanager": {"enabled": False}}},
            "additionalDataSources": [
                {
                    "name": "Amazon Managed Service for Prometheus",
                    "type": AMP_PLUGIN,
                    "uid": AMP_DATASOURCE_UID,
                    "url": amp.query_url,
                    "access": "proxy",
                    "isDefault": True,
                    "editable": False,
                    "jsonData": {"sigV4Auth": True, "sigV4AuthType": "default", "sigV4Region": amp.region,
                                 "sigv4Service": "aps", "httpMethod": "POST"},  # fmt: skip
                }
            ],
        },
        "kube-state-metrics": {"nodeSelector": system, "resources": pods.KUBE_STATE_METRICS.resources()},
        "prometheus-node-exporter": {"resources": pods.NODE_EXPORTER.resources()},
    }


def for_datasource_type(dashboard: Mapping[str, Any], plugin: str, core: str = "prometheus") -> dict[str, Any]:
    """`dashboard` with every data source reference of type `core` (and the `datasource` variable that lists
    them) of type `plugin` instead: the stack's dashboards, made for Prometheus, on the AMP plugin's data source."""

    def walk(node: Any, key: str = "") -> Any:
        if isinstance(node, dict):
            out = {k: walk(v, k) for k, v in node.items()}
            if key == "datasource" and out.get("type") == core:
                out["type"] = plugin
            if out.get("type") == "datasource" and out.get("query") == core:  # the templating variable
                out["query"] = plugin
            return out
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        return node

    return walk(dict(dashboard))


# ---- the monitoring namespace's NetworkPolicies --------------------------------------------------------------


def _in_namespaces(namespace: str, labels: Optional[Mapping[str, str]] = None) -> dict:
    peer: dict = {"namespaceSelector": {"matchLabels": {np_.NAMESPACE_NAME_LABEL: namespace}}}
    if labels:
        peer["podSelector"] = {"matchLabels": dict(labels)}
    return peer


def scrape_targets(serving_namespace: str, operator_ports: Mapping[str, Sequence[int]]) -> list[tuple[dict, list[int]]]:
    """(peer, ports) Prometheus scrapes outside its namespace, besides the nodes; `operator_ports`: namespace ->
    the metrics ports of what runs there."""
    out = [(_in_namespaces(serving_namespace), [API_PORT, RAY_METRICS_PORT])]
    for ns, ports in operator_ports.items():
        out.append((_in_namespaces(ns), sorted(set(ports))))
    out.append((_in_namespaces(np_.DNS_NAMESPACE, np_.DNS_POD_LABELS), [COREDNS_METRICS_PORT]))
    return out


def namespace_policies(
    *,
    api_server_cidrs: Sequence[Any],
    node_cidr: Optional[str],
    serving_namespace: str,
    operator_ports: Mapping[str, Sequence[int]],
    webhook: bool,
    amp: bool = False,
) -> list[dict]:
    """The monitoring namespace's NetworkPolicies (deny by default, then what each pod needs).

    - `default-deny`, `allow-dns`, `allow-api-server` (infra/k8s/network_policies.py): every pod here talks to
      the API server (the operator, Prometheus' service discovery, kube-state-metrics, Grafana's sidecars).
    - `monitoring-internal`: the namespace's pods with each other (Grafana to Prometheus 9090 and Alertmanager
      9093, Prometheus to Alertmanager and to every exporter here, Alertmanager's cluster port).
    - `prometheus-scrape`: Prometheus to the scrape targets elsewhere: the serving pods' 8000 and 8080, the
      operators' metrics ports (DCGM 9400, 8080), CoreDNS's 9153, and on the nodes (`node_cidr`: the VPC's, or
      anywhere when the VPC is not the stack's) node exporter's 9100 (host network) and the kubelet's 10250.
    - `operator-webhook`: the API server calls the operator's admission webhook on 10250, from the control
      plane's interfaces in the VPC (`node_cidr`; anywhere when unknown).
    - `alertmanager-webhook` (a webhook receiver only): Alertmanager to HTTPS (443) outside the VPC.

    With `amp`, Prometheus is the agent (`PROMETHEUS_AGENT_PODS`) and two more: `prometheus-remote-write` (the
    agent to HTTPS outside the VPC, the workspace's endpoint, and to the EKS Pod Identity agent for its
    credentials) and `grafana-amp` (Grafana the same: the workspace's query endpoint and, at start, grafana.com
    for the pinned plugin).
    """
    ns = NAMESPACE
    nodes = {"ipBlock": {"cidr": node_cidr or np_.ANYWHERE}}
    here = {"podSelector": {}}
    out = np_.operator_namespace_policies(ns, api_server_cidrs=api_server_cidrs)
    out.append(np_.policy("monitoring-internal", ns, {}, ingress=[{"from": [here]}], egress=[{"to": [here]}]))
    egress = [{"to": [peer], "ports": np_.tcp(*ports)} for peer, ports in scrape_targets(serving_namespace, operator_ports)]
    egress.append({"to": [nodes], "ports": np_.tcp(NODE_EXPORTER_PORT, KUBELET_PORT)})
    prometheus = PROMETHEUS_AGENT_PODS if amp else PROMETHEUS_PODS
    out.append(np_.policy("prometheus-scrape", ns, prometheus, egress=egress))
    out.append(np_.policy("operator-webhook", ns, OPERATOR_PODS, ingress=[{"from": [nodes], "ports": np_.tcp(OPERATOR_WEBHOOK_PORT)}]))
    if webhook:
        out.append(np_.policy("alertmanager-webhook", ns, ALERTMANAGER_PODS, egress=[_https_out(node_cidr)]))
    if amp:
        credentials = {"to": [{"ipBlock": {"cidr": np_.POD_IDENTITY_AGENT}}], "ports": np_.tcp(np_.POD_IDENTITY_PORT)}
        out.append(np_.policy("prometheus-remote-write", ns, PROMETHEUS_AGENT_PODS, egress=[_https_out(node_cidr), credentials]))
        out.append(np_.policy("grafana-amp", ns, GRAFANA_PODS, egress=[_https_out(node_cidr), credentials]))
    return out


def _https_out(node_cidr: Optional[str]) -> dict:
    """Egress to HTTPS (443) outside the VPC (anywhere when the VPC is not the stack's)."""
    block: dict = {"cidr": np_.ANYWHERE}
    if node_cidr:
        block["except"] = [node_cidr]
    return {"to": [{"ipBlock": block}], "ports": np_.tcp(np_.HTTPS_PORT)}
