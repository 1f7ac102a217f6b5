"""What each monitoring pod requests: one table for the chart's values (infra/k8s/monitoring.py) and the plan's system-node fit.

kube-prometheus-stack 88.5.3 leaves every pod but Prometheus without requests (its values.yaml and its
subcharts' `resources: {}`), so the scheduler would pack them blind and the plan could only guess their
working sets. The stack sets them from this table: `Container.resources()` is the values' `resources` map,
and `pods()` sums each pod's containers for infra/planning/system_nodes.py. tests/test_system_nodes.py
checks the plan's sum against the requests the synthesized release carries.

Containers per pod, as the pinned charts render them (templates at the chart tags: kube-prometheus-stack-88.5.3,
prometheus-community/helm-charts ea930ba; grafana-12.11.1, grafana-community/helm-charts 864f779):

- Prometheus (or, with `amp`, the agent): `prometheus` and the operator's `config-reloader` sidecar; its
  `init-config-reloader` init container has the reloader's resources, less than the pod's sum, so it adds nothing.
- Alertmanager (in-cluster only): `alertmanager` and `config-reloader`.
- The operator: one container (the admission webhook Deployment is off: values.yaml
  prometheusOperator.admissionWebhooks.deployment.enabled false).
- Grafana: `grafana` and one k8s-sidecar container per enabled sidecar: kube-prometheus-stack turns on the
  dashboards and datasources sidecars (values.yaml grafana.sidecar.*.enabled), both as containers, not init
  containers (grafana _pod.tpl: `sidecar.dashboards.enabled (not .initDashboards)`, likewise datasources);
  all sidecars share `sidecar.resources`. init-chown-data renders only with persistence, which is off.
- kube-state-metrics and node exporter: one container each (their kube-rbac-proxy is off by default).

The admission webhook's patch Jobs (Helm hooks at install and upgrade) run for seconds and hold no requests once
complete: they keep the chart's none, and the fit leaves them out.

Memory limits guard the node against a leak (the operator, Grafana and its sidecars, kube-state-metrics,
Alertmanager, node exporter, the reloader). No CPU limits besides: the scheduler places by requests, and
a throttled kube-state-metrics grows its queues and its memory (kube-state-metrics README, "Resource
recommendation").
"""

from __future__ import annotations

from dataclasses import dataclass

IN_CLUSTER, AMP = "in-cluster", "amp"  # gpu-serving:monitoring.mode (infra/config/monitoring.py) values that deploy pods


@dataclass(frozen=True)
class Container:
    cpu_m: int  # request, millicores
    memory_mib: int  # request
    limit_mib: int | None  # memory limit
    source: str

    def resources(self) -> dict:
        """The container's `resources` as Helm values take them."""
        out: dict = {"requests": {"cpu": f"{self.cpu_m}m", "memory": f"{self.memory_mib}Mi"}}
        if self.limit_mib is not None:
            out["limits"] = {"memory": f"{self.limit_mib}Mi"}
        return out


KUBE_PROMETHEUS = "prometheus-operator/kube-prometheus 4d719f1 jsonnet/kube-prometheus/components"

# The operator's own defaults for the reloader (prometheus-operator v0.93.0 cmd/operator/main.go defaultReloaderCPU
# "10m", defaultReloaderMemory "50Mi", requests and limits: pkg/operator/config.go DefaultConfig). The chart
# overrides them with 0 (none) unless prometheusConfigReloader.resources says otherwise (templates/
# prometheus-operator/deployment.yaml: `--config-reloader-cpu-request={{ ... | default 0 }}`): set here to the
# operator's defaults, without the CPU limit.
CONFIG_RELOADER = Container(10, 50, 50, "prometheus-operator v0.93.0 defaults (config-reloader)")
# kube-prometheus' figures, and the chart's own commented example (values.yaml prometheusOperator.resources:
# requests 100m/100Mi, limits 200m/200Mi).
OPERATOR = Container(100, 100, 200, f"{KUBE_PROMETHEUS}/prometheus-operator.libsonnet; the chart's commented example")
ALERTMANAGER = Container(4, 100, 100, f"{KUBE_PROMETHEUS}/alertmanager.libsonnet (requests 4m/100Mi, limit 100Mi)")
# CPU: kube-prometheus' grafana.libsonnet (100m). Memory: Grafana's "Install Grafana" page, "Hardware
# recommendations": minimum recommended memory 512 MB. ASSUMPTION: the limit at twice that; the grafana chart
# sets GOMEMLIMIT to the limit (grafana 12.11.1 _pod.tpl, `resourceFieldRef: limits.memory`), so Go's collector
# presses only near it, and the AMP plugin (mode amp) runs as a separate process outside that budget: headroom.
GRAFANA = Container(100, 512, 1024, "Grafana docs' minimum memory; kube-prometheus' CPU")
# ASSUMPTION: the grafana chart's commented example (sidecar.resources: requests 50m/50Mi, limits 100m/100Mi) with
# its limit as the request: k8s-sidecar 2.10.1 is a Python process holding a cluster-wide ConfigMap watch; the
# limit at twice that.
GRAFANA_SIDECAR = Container(50, 100, 200, "grafana 12.11.1 values.yaml sidecar.resources example (ASSUMPTION: doubled)")
GRAFANA_SIDECARS = 2  # dashboards and datasources (module doc)
# kube-state-metrics README, "Resource recommendation": "as a general rule, you should allocate 250MiB memory,
# 0.1 cores"; its memory scales with the cluster's objects. ASSUMPTION: the limit at about twice that (this
# stack's cluster holds tens of nodes and a few hundred pods, well inside the rule), no CPU limit (the README).
KUBE_STATE_METRICS = Container(100, 250, 512, "kube-state-metrics README, Resource recommendation")
NODE_EXPORTER = Container(102, 180, 180, f"{KUBE_PROMETHEUS}/node-exporter.libsonnet (requests 102m/180Mi, limit 180Mi)")
PROMETHEUS_CPU_M = 500  # ASSUMPTION: half a core for scrapes, rule evaluation and compaction (memory: monitoring_sizing.py)


@dataclass(frozen=True)
class Pod:
    name: str
    cpu_m: int  # the pod's requests: the sum of its containers'
    memory_mib: int
    source: str
    per_node: bool = False  # a DaemonSet (node exporter: every node)


def _pod(name: str, containers: list[Container], per_node: bool = False) -> Pod:
    return Pod(name, sum(c.cpu_m for c in containers), sum(c.memory_mib for c in containers),
               "; ".join(dict.fromkeys(c.source for c in containers)), per_node)  # fmt: skip


def pods(mode: str, prometheus_memory_mib: int) -> list[Pod]:
    """The monitoring pods of `mode` (in-cluster or amp) on the system nodes, with their requests."""
    if mode not in (IN_CLUSTER, AMP):
        raise ValueError(f"monitoring mode {mode!r} deploys no pods")
    prometheus = Container(PROMETHEUS_CPU_M, prometheus_memory_mib, 2 * prometheus_memory_mib, "the series estimate")
    out = [_pod("prometheus-agent" if mode == AMP else "prometheus", [prometheus, CONFIG_RELOADER])]
    if mode == IN_CLUSTER:  # amp: the workspace's alert manager
        out.append(_pod("alertmanager", [ALERTMANAGER, CONFIG_RELOADER]))
    out += [
        _pod("prometheus-operator", [OPERATOR]),
        _pod("grafana", [GRAFANA] + [GRAFANA_SIDECAR] * GRAFANA_SIDECARS),
        _pod("kube-state-metrics", [KUBE_STATE_METRICS]),
        _pod("node-exporter", [NODE_EXPORTER], per_node=True),
    ]
    return out
