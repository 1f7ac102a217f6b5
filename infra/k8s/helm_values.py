"""The Helm releases of the Kubernetes platform layer, as plain data.

Pure functions (no Pulumi, no Kubernetes calls): `components/operators.py` turns
them into `helm.v3.Release` resources, and `tests/test_operators.py` checks every
key path they set against the chart's own default values in
`tests/fixtures/upstream/<chart>-<version>/values.yaml`, so a misspelt key cannot
silently do nothing. The product never reads the fixtures at run time: what it
needs from a chart (the EFA plugin's supported-instance list) is copied here as
data, with its source.

Three charts, versions pinned (tests/fixtures/charts.yaml names each chart's source):

- NVIDIA GPU operator: the device plugin (`nvidia.com/gpu`), GPU feature
  discovery, DCGM exporter and validators on the GPU nodes. The EKS AL2023
  NVIDIA AMI already carries the driver and the container toolkit, so the
  operator installs neither.
- AWS EFA device plugin: advertises `vpc.amazonaws.com/efa` on the GPU nodes.
  It runs only on the instance types in its `supportedInstanceLabels` list
  (required node affinity on `node.kubernetes.io/instance-type`), so an
  instance type missing from that list is refused here rather than discovered
  as NCCL quietly using TCP.
- KubeRay operator: reconciles the serving RayCluster, watching only the serving
  namespace, with a Role there instead of a ClusterRole (`kuberay_operator_values`).

Placement: operators (Deployments) run on the system nodes
(`gpu-serving/role=system`); per-node agents (DaemonSets) tolerate the GPU
taint (both from infra/k8s/scheduling.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from infra.catalog.instances import InstanceType
from infra.k8s import dcgm_counters
from infra.k8s.scheduling import gpu_tolerations, system_node_selector
from infra.errors import UserError


@dataclass(frozen=True)
class Chart:
    release: str  # Helm release name (fixed, so `helm list` and object names are predictable)
    chart: str
    version: str
    repository: str
    namespace: str

    @property
    def upstream_folder(self) -> str:
        """The folder in tests/fixtures/upstream holding this chart's defaults (tests only)."""
        return f"{self.chart}-{self.version}"


# Repository, chart and version (the tests compare them with tests/fixtures/charts.yaml
# and with the Chart.yaml files copied from each chart into tests/fixtures/upstream).
GPU_OPERATOR = Chart("gpu-operator", "gpu-operator", "v26.7.0", "https://helm.ngc.nvidia.com/nvidia", "gpu-operator")
# kube-system, where AWS's examples install it (aws-ia/terraform-aws-eks-blueprints
# patterns/targeted-odcr/helm.tf, clowdhaus/aws-eks-efa-test helm.tf): a node-level
# agent next to the VPC CNI and kube-proxy, not an application.
EFA_DEVICE_PLUGIN = Chart(
    "aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", "v0.5.30", "https://aws.github.io/eks-charts", "kube-system"
)
KUBERAY_OPERATOR = Chart(
    "kuberay-operator", "kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/", "kuberay"
)
# The monitoring stack (components/monitoring.py; values in infra/k8s/monitoring.py).
KUBE_PROMETHEUS_STACK = Chart(
    "kube-prometheus-stack", "kube-prometheus-stack", "88.5.3", "https://prometheus-community.github.io/helm-charts", "monitoring"
)
OPERATOR_CHARTS: tuple[Chart, ...] = (GPU_OPERATOR, EFA_DEVICE_PLUGIN, KUBERAY_OPERATOR)  # components/operators.py
CHARTS: tuple[Chart, ...] = (*OPERATOR_CHARTS, KUBE_PROMETHEUS_STACK)

INSTANCE_TYPE_NODE_LABEL = "node.kubernetes.io/instance-type"

# Chart aws-efa-k8s-device-plugin v0.5.30, values.yaml, `supportedInstanceLabels.values`
# (aws/eks-charts, stable/aws-efa-k8s-device-plugin; copied verbatim, 303 entries,
# sorted as upstream sorts them). The chart's DaemonSet requires node affinity
# `node.kubernetes.io/instance-type In <this list>` (templates/daemonset.yaml), so
# the plugin runs on these instance types and nowhere else. Update it together with
# EFA_DEVICE_PLUGIN.version; the tests compare it with the upstream file.
EFA_SUPPORTED_INSTANCE_TYPES: tuple[str, ...] = (
    "c5n.18xlarge", "c5n.9xlarge", "c5n.metal", "c6a.48xlarge", "c6a.metal",
    "c6gn.16xlarge", "c6i.32xlarge", "c6i.metal", "c6id.32xlarge", "c6id.metal",
    "c6in.32xlarge", "c6in.metal", "c7a.48xlarge", "c7a.metal-48xl", "c7g.16xlarge",
    "c7g.metal", "c7gd.16xlarge", "c7gd.metal", "c7gn.16xlarge", "c7gn.metal",
    "c7i.48xlarge", "c7i.metal-48xl", "c8a.48xlarge", "c8a.metal-48xl", "c8g.24xlarge",
    "c8g.48xlarge", "c8g.metal-24xl", "c8g.metal-48xl", "c8gb.16xlarge", "c8gb.24xlarge",
    "c8gb.48xlarge", "c8gb.metal-24xl", "c8gb.metal-48xl", "c8gd.24xlarge", "c8gd.48xlarge",
    "c8gd.metal-24xl", "c8gd.metal-48xl", "c8gn.16xlarge", "c8gn.24xlarge", "c8gn.48xlarge",
    "c8gn.metal-24xl", "c8gn.metal-48xl", "c8i.48xlarge", "c8i.96xlarge", "c8i.metal-48xl",
    "c8i.metal-96xl", "c8ib.48xlarge", "c8ib.96xlarge", "c8ib.metal-48xl", "c8ib.metal-96xl",
    "c8id.48xlarge", "c8id.96xlarge", "c8id.metal-48xl", "c8id.metal-96xl", "c8in.48xlarge",
    "c8in.96xlarge", "c8in.metal-48xl", "c8in.metal-96xl", "c9g.48xlarge", "c9g.metal-48xl",
    "c9gd.48xlarge", "c9gd.metal-48xl", "dl2q.24xlarge", "f2.48xlarge", "g4dn.12xlarge",
    "g4dn.16xlarge", "g4dn.8xlarge", "g4dn.metal", "g5.12xlarge", "g5.16xlarge",
    "g5.24xlarge", "g5.48xlarge", "g5.8xlarge", "g6.12xlarge", "g6.16xlarge",
    "g6.24xlarge", "g6.48xlarge", "g6.8xlarge", "g6e.12xlarge", "g6e.16xlarge",
    "g6e.24xlarge", "g6e.48xlarge", "g6e.8xlarge", "g7.12xlarge", "g7.24xlarge",
    "g7.48xlarge", "g7.8xlarge", "g7e.12xlarge", "g7e.24xlarge", "g7e.48xlarge",
    "g7e.8xlarge", "gr6.8xlarge", "hpc6a.48xlarge", "hpc6id.32xlarge", "hpc7a.12xlarge",
    "hpc7a.24xlarge", "hpc7a.48xlarge", "hpc7a.96xlarge", "hpc7g.16xlarge", "hpc7g.4xlarge",
    "hpc7g.8xlarge", "hpc8a.96xlarge", "i3en.12xlarge", "i3en.24xlarge", "i3en.metal",
    "i4g.16xlarge", "i4i.32xlarge", "i4i.metal", "i7i.24xlarge", "i7i.48xlarge",
    "i7i.metal-48xl", "i7ie.48xlarge", "i7ie.metal-48xl", "i8g.48xlarge", "i8g.metal-48xl",
    "i8ge.48xlarge", "i8ge.metal-48xl", "im4gn.16xlarge", "inf1.24xlarge", "m5dn.24xlarge",
    "m5dn.metal", "m5n.24xlarge", "m5n.metal", "m5zn.12xlarge", "m5zn.metal",
    "m6a.48xlarge", "m6a.metal", "m6i.32xlarge", "m6i.metal", "m6id.32xlarge",
    "m6id.metal", "m6idn.32xlarge", "m6idn.metal", "m6in.32xlarge", "m6in.metal",
    "m7a.48xlarge", "m7a.metal-48xl", "m7g.16xlarge", "m7g.metal", "m7gd.16xlarge",
    "m7gd.metal", "m7i.48xlarge", "m7i.metal-48xl", "m8a.48xlarge", "m8a.metal-48xl",
    "m8azn.24xlarge", "m8azn.metal-24xl", "m8g.24xlarge", "m8g.48xlarge", "m8g.metal-24xl",
    "m8g.metal-48xl", "m8gb.16xlarge", "m8gb.24xlarge", "m8gb.48xlarge", "m8gb.metal-24xl",
    "m8gb.metal-48xl", "m8gd.24xlarge", "m8gd.48xlarge", "m8gd.metal-24xl", "m8gd.metal-48xl",
    "m8gn.16xlarge", "m8gn.24xlarge", "m8gn.48xlarge", "m8gn.metal-24xl", "m8gn.metal-48xl",
    "m8i.48xlarge", "m8i.96xlarge", "m8i.metal-48xl", "m8i.metal-96xl", "m8ib.48xlarge",
    "m8ib.96xlarge", "m8ib.metal-48xl", "m8ib.metal-96xl", "m8id.48xlarge", "m8id.96xlarge",
    "m8id.metal-48xl", "m8id.metal-96xl", "m8idb.48xlarge", "m8idb.96xlarge", "m8idb.metal-48xl",
    "m8idb.metal-96xl", "m8idn.48xlarge", "m8idn.96xlarge", "m8idn.metal-48xl", "m8idn.metal-96xl",
    "m8in.48xlarge", "m8in.96xlarge", "m8in.metal-48xl", "m8in.metal-96xl", "m9g.48xlarge",
    "m9g.metal-48xl", "m9gd.48xlarge", "m9gd.metal-48xl", "p3dn.24xlarge", "p4d.24xlarge",
    "p4de.24xlarge", "p5.48xlarge", "p5.4xlarge", "p5e.48xlarge", "p5en.48xlarge",
    "p6-b200.48xlarge", "p6-b300.48xlarge", "p6e-gb200.36xlarge", "p6e-gb300.36xlarge", "r5dn.24xlarge",
    "r5dn.metal", "r5n.24xlarge", "r5n.metal", "r6a.48xlarge", "r6a.metal",
    "r6i.32xlarge", "r6i.metal", "r6id.32xlarge", "r6id.metal", "r6idn.32xlarge",
    "r6idn.metal", "r6in.32xlarge", "r6in.metal", "r7a.48xlarge", "r7a.metal-48xl",
    "r7g.16xlarge", "r7g.metal", "r7gd.16xlarge", "r7gd.metal", "r7i.48xlarge",
    "r7i.metal-48xl", "r7iz.32xlarge", "r7iz.metal-32xl", "r8a.48xlarge", "r8a.metal-48xl",
    "r8g.24xlarge", "r8g.48xlarge", "r8g.metal-24xl", "r8g.metal-48xl", "r8gb.16xlarge",
    "r8gb.24xlarge", "r8gb.48xlarge", "r8gb.metal-24xl", "r8gb.metal-48xl", "r8gd.24xlarge",
    "r8gd.48xlarge", "r8gd.metal-24xl", "r8gd.metal-48xl", "r8gn.16xlarge", "r8gn.24xlarge",
    "r8gn.48xlarge", "r8gn.metal-24xl", "r8gn.metal-48xl", "r8i.48xlarge", "r8i.96xlarge",
    "r8i.metal-48xl", "r8i.metal-96xl", "r8ib.48xlarge", "r8ib.96xlarge", "r8ib.metal-48xl",
    "r8ib.metal-96xl", "r8id.48xlarge", "r8id.96xlarge", "r8id.metal-48xl", "r8id.metal-96xl",
    "r8idb.48xlarge", "r8idb.96xlarge", "r8idb.metal-48xl", "r8idb.metal-96xl", "r8idn.48xlarge",
    "r8idn.96xlarge", "r8idn.metal-48xl", "r8idn.metal-96xl", "r8in.48xlarge", "r8in.96xlarge",
    "r8in.metal-48xl", "r8in.metal-96xl", "trn1.32xlarge", "trn1n.32xlarge", "trn2-ac.24xlarge",
    "trn2.3xlarge", "trn2.48xlarge", "trn2u-ac.24xlarge", "trn2u.48xlarge", "u7i-12tb.224xlarge",
    "u7i-6tb.112xlarge", "u7i-8tb.112xlarge", "u7in-16tb.224xlarge", "u7in-24tb.224xlarge", "u7in-32tb.224xlarge",
    "vt1.24xlarge", "x2idn.32xlarge", "x2idn.metal", "x2iedn.32xlarge", "x2iedn.metal",
    "x2iezn.12xlarge", "x2iezn.metal", "x8aedz.24xlarge", "x8aedz.metal-24xl", "x8g.24xlarge",
    "x8g.48xlarge", "x8g.metal-24xl", "x8g.metal-48xl", "x8i.48xlarge", "x8i.64xlarge",
    "x8i.96xlarge", "x8i.metal-48xl", "x8i.metal-96xl",
)


# ---- NVIDIA GPU operator -----------------------------------------------------------


def gpu_operator_values(dcgm_service_monitor: bool = False, monitor_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Values of the gpu-operator release (chart v26.7.0).

    `dcgm_service_monitor`: create the DCGM exporter's ServiceMonitor (needs the
    Prometheus operator's CRDs in the cluster; off otherwise), with `monitor_labels`
    (the labels the stack's Prometheus selects ServiceMonitors by; values.yaml
    `dcgmExporter.serviceMonitor.additionalLabels: {}`).
    """
    service_monitor: dict[str, Any] = {"enabled": bool(dcgm_service_monitor)}
    if dcgm_service_monitor and monitor_labels:
        service_monitor["additionalLabels"] = dict(monitor_labels)
    return {
        # The EKS AL2023 NVIDIA AMI ships the NVIDIA driver (EKS User Guide,
        # "Use EKS-optimized accelerated AMIs"): a driver container would fight
        # the host's kernel modules.
        "driver": {"enabled": False},
        # ... and the NVIDIA container toolkit, with containerd already set up for
        # it: the toolkit DaemonSet would rewrite the host's containerd config.
        "toolkit": {"enabled": False},
        "devicePlugin": {
            # The device plugin's env list (the chart passes it to the
            # ClusterPolicy's devicePlugin.env, which the operator puts on the
            # plugin container). MOFED injection off: k8s-device-plugin v0.19.0
            # to v0.19.2 enabled it by default (NVIDIA/k8s-device-plugin#1550,
            # reverted in #1837 for v0.19.3), and since NVIDIA/gpu-operator#2525
            # (June 2026) the operator's device-plugin entrypoint turns it on when
            # the `nvidia_fs` module is loaded, but only if MOFED_ENABLED is not
            # set already. With it on, every GPU container gets all
            # /dev/infiniband/uverbs* devices, which belong to the EFA device
            # plugin, and NCCL sees NICs it was not allocated
            # (NVIDIA/k8s-device-plugin#1692). Set
            # explicitly, so no default can turn it on.
            "env": [{"name": "MOFED_ENABLED", "value": "false"}],
        },
        # The operator's standalone DCGM host engine stays off (the chart's default, stated because it must
        # hold): its DaemonSet binds hostPort 5555, as does the EKS node monitoring agent's `dcgm-server`
        # (components/cluster.py, ADDON_CONFIGURATION), and two pods asking for one host port never share a
        # node. The exporter keeps its embedded engine. ASSUMPTION: health and field watches work from both
        # engines; the profiling fields (DCGM_FI_PROF_*) are exclusive to one engine per GPU
        # (aws/eks-node-monitoring-agent#256), so the exporter may report them empty on GPU nodes.
        "dcgm": {"enabled": False},
        "dcgmExporter": {
            # GPU metrics (utilisation, memory, XID errors, NVLink) for Prometheus.
            "enabled": True,
            # The chart defaults this to true; a ServiceMonitor without the
            # Prometheus operator's CRD is an error, so only when asked.
            "serviceMonitor": service_monitor,
            # dcgm-exporter's default counters plus the NVLink error counters, in a ConfigMap the
            # chart creates (infra/k8s/dcgm_counters.py; values.yaml's commented `config` example).
            "config": {"name": dcgm_counters.CONFIG_MAP, "create": True, "data": dcgm_counters.COUNTERS},
        },
        # Every operand DaemonSet (device plugin, GFD, DCGM exporter, validator,
        # MIG manager) takes these tolerations; the chart's default is
        # `nvidia.com/gpu Exists`, replaced with exactly our taint so the
        # operands schedule on the GPU nodes whatever the chart default becomes.
        "daemonsets": {"tolerations": gpu_tolerations()},
        # The operator schedules its operands on nodes NFD labels
        # `feature.node.kubernetes.io/pci-10de.present=true`; EKS runs no NFD, so
        # the chart's own NFD (default on, stated here because it is required).
        "nfd": {"enabled": True},
        "node-feature-discovery": {
            # The NFD worker must label the GPU nodes, so it must tolerate their
            # taint (the subchart's default also tolerates the control-plane
            # taint, which EKS nodes never carry). NFD master and gc are
            # Deployments without GPU tolerations: they can only land on the
            # untainted system nodes (their nodeSelector is not among the
            # defaults of this chart, so it is not set here).
            "worker": {"tolerations": gpu_tolerations()},
        },
        # The operator Deployment on the system nodes: it must not take the GPU
        # nodes' CPU or be evicted with them. kubernetes.io/os is the chart default,
        # restated because this map is ours now.
        "operator": {"nodeSelector": {"kubernetes.io/os": "linux", **system_node_selector()}},
    }


# ---- AWS EFA device plugin -----------------------------------------------------------


def efa_plugin_needed(itype: InstanceType) -> bool:
    """An instance type without EFA interfaces (g6e.xlarge, g5.xlarge) needs no EFA plugin."""
    return itype.max_efa_interfaces > 0


def check_efa_supported(itype: InstanceType) -> None:
    """Refuse an EFA instance type that the pinned EFA plugin chart would not run on."""
    if efa_plugin_needed(itype) and itype.name not in EFA_SUPPORTED_INSTANCE_TYPES:
        raise UserError(
            f"instance type {itype.name} has {itype.max_efa_interfaces} EFA interfaces, but the EFA device "
            f"plugin chart {EFA_DEVICE_PLUGIN.chart} {EFA_DEVICE_PLUGIN.version} does not list it in "
            f"supportedInstanceLabels: the EFA device plugin would run on zero nodes and NCCL would silently "
            f"fall back to TCP. Choose an instance type the chart supports, or move to a chart version that "
            f"lists {itype.name} (update EFA_DEVICE_PLUGIN and EFA_SUPPORTED_INSTANCE_TYPES in infra/k8s/helm_values.py)."
        )


def efa_device_plugin_values(itype: InstanceType) -> dict[str, Any]:
    """Values of the aws-efa-k8s-device-plugin release (chart v0.5.30) for GPU nodes of `itype`."""
    if not efa_plugin_needed(itype):
        raise UserError(f"instance type {itype.name} has no EFA interfaces: no EFA device plugin is needed")
    check_efa_supported(itype)
    return {
        # The chart's default is no tolerations (its values.yaml): without this the
        # plugin never runs on the tainted GPU nodes and no pod can request
        # vpc.amazonaws.com/efa. (The chart adds CriticalAddonsOnly itself.)
        "tolerations": gpu_tolerations(),
        # The chart's own list, pinned: the plugin's node affinity is
        # `node.kubernetes.io/instance-type In values`; check_efa_supported has
        # made sure the GPU nodes' type is in it.
        "supportedInstanceLabels": {
            "keys": [INSTANCE_TYPE_NODE_LABEL],
            "values": list(EFA_SUPPORTED_INSTANCE_TYPES),
        },
    }


# ---- KubeRay operator ------------------------------------------------------------------

# A Kubernetes namespace name (DNS-1123 label): the chart joins the list with "," into one
# `--watch-namespace` flag, so a name must not hold a comma (none can).
_NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def kuberay_watch_namespaces(namespaces: Sequence[str]) -> tuple[str, ...]:
    """The namespaces KubeRay watches: at least one, each a valid namespace name, each once (order kept)."""
    out = tuple(dict.fromkeys(namespaces))
    if not out:
        raise UserError("KubeRay must watch at least one namespace (the serving namespace): none given")
    bad = [n for n in out if not _NAMESPACE_NAME.match(n)]
    if bad:
        raise UserError(f"KubeRay watch namespaces {bad} are not Kubernetes namespace names (RFC 1123 labels)")
    if KUBERAY_OPERATOR.namespace in out:
        raise UserError(
            f"KubeRay's own namespace {KUBERAY_OPERATOR.namespace!r} runs no RayCluster: it must not be watched "
            "(the operator would get its Pod/Secret/Role rights there too)"
        )
    return out


def kuberay_operator_values(watch_namespaces: Sequence[str]) -> dict[str, Any]:
    """Values of the kuberay-operator release (chart 1.7.0): placement, and the namespaces it may act in.

    The chart's defaults otherwise (one replica, leader election, CPU 100m and memory
    512Mi limits, sized by KubeRay for about 500 Ray pods) fit one RayCluster of a few pods.

    Namespaced, not cluster-wide (issue 19 item 4). Files of ray-project/kuberay tag v1.7.0,
    helm-chart/kuberay-operator/ (copied in tests/fixtures/kuberay-operator-1.7.0-templates/):
    - templates/role.yaml, rolebinding.yaml and the six ray_*_{editor,viewer}_role.yaml render
      only `if and .Values.rbacEnable (not .Values.singleNamespaceInstall)`: with
      singleNamespaceInstall no ClusterRole (Pods, Secrets, Roles in every namespace) and no
      ClusterRoleBinding is installed, nor the end users' editor/viewer ClusterRoles;
    - templates/multiple_namespaces_role.yaml and multiple_namespaces_rolebinding.yaml render
      `if and .Values.rbacEnable .Values.singleNamespaceInstall .Values.crNamespacedRbacEnable`,
      one Role (the same rules as the ClusterRole, `role.consistentRules` in _helpers.tpl) and
      one RoleBinding to the operator's ServiceAccount `range` over `watchNamespace` (default:
      the release namespace), each in that namespace. So each watched namespace must exist
      before the release (components/operators.py makes the release depend on it);
    - templates/deployment.yaml passes `--watch-namespace <watchNamespace joined by ",">`
      (or the release namespace when singleNamespaceInstall and no watchNamespace), and the
      operator's manager caches and reconciles only there (ray-operator/main.go,
      cache.Options.DefaultNamespaces);
    - templates/leader_election_role.yaml and leader_election_role_binding.yaml render on
      rbacEnable alone: a Role for configmaps, events and coordination.k8s.io leases in the
      release namespace, where the operator keeps its leader-election lease (main.go: the pod's
      namespace unless --leader-election-namespace);
    - the CRDs are in the chart's crds/ folder, not templated: Helm installs them on the first
      install whatever the values, and never upgrades or deletes them (Helm's chart best
      practices, "Custom Resource Definitions": "There is no support at this time for upgrading
      or deleting CRDs using Helm"); values.yaml on singleNamespaceInstall: "this excludes the
      CRDs, which can only be installed at the cluster scope".
    """
    return {
        # On the system nodes: the operator must keep running while GPU nodes are
        # replaced or drained (it recreates Ray pods), and must not take GPU nodes' CPU.
        "nodeSelector": system_node_selector(),
        # values.yaml `rbacEnable: true` (a bool): the chart's default, restated because the
        # namespaced Roles below render only with it (false: no RBAC at all, not even leader election).
        "rbacEnable": True,
        # values.yaml `singleNamespaceInstall: false` (a bool): Role/RoleBinding instead of
        # ClusterRole/ClusterRoleBinding (templates/role.yaml, rolebinding.yaml, multiple_namespaces_*.yaml).
        "singleNamespaceInstall": True,
        # values.yaml `crNamespacedRbacEnable: true` (a bool): the chart's default, restated: with it
        # off the chart would make no Role in the watched namespaces and the operator could do nothing there.
        "crNamespacedRbacEnable": True,
        # values.yaml, commented out: `# watchNamespace:` / `#   - n1` / `#   - n2` (a list of names):
        # the --watch-namespace flag (templates/deployment.yaml) and a Role per entry
        # (templates/multiple_namespaces_role.yaml).
        "watchNamespace": list(kuberay_watch_namespaces(watch_namespaces)),
    }
