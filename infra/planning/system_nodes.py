"""Do the system nodes hold what runs on them? The sum of the system pods' requests against the node group's allocatable.

Pure arithmetic (issue 20 item 7): the system node group (`gpu-serving:cluster` `systemInstanceType` x
`systemNodeCount`, on-demand AL2023) runs the operators, EKS's add-ons and, with `monitoring.mode:
in-cluster` or `amp`, kube-prometheus-stack (with `amp`, Prometheus in agent mode and no Alertmanager);
none of them may land on the GPU nodes (they do not tolerate the GPU taint). `fit()` sums the CPU and memory
requests of those pods (`system_pods`: the monitoring pods' from infra/planning/monitoring_pods.py, the table
the chart's values are built from, so the sum is what the pods carry; the pinned charts' defaults for the
operators; labelled ASSUMPTIONs for EKS's add-ons, whose manifests are not among the fixtures) and compares them with
the nodes' allocatable; `check()` refuses a node group they do not fit and names the smallest instance
type of the same family, and the node count, that would.

Allocatable (Kubernetes: capacity - kube-reserved - system-reserved - eviction threshold), as the AL2023
EKS AMI's nodeadm sets the kubelet (awslabs/amazon-eks-ami, commit 81fec2e895854f599974fe4d3d72f61c0a9aaffa,
nodeadm/internal/kubelet/config.go `withDefaultReservedResources`, `getMemoryMebibytesToReserve`,
`getCPUMillicoresToReserve`, the default `evictionHard`; eni_max_pods.go `calculateStandardMaxPods`):

- max pods = ENIs x (IPv4 addresses per ENI - 1) + 2 (the VPC CNI without prefix delegation);
- kube-reserved memory = 11 MiB x max pods + 255 MiB; CPU = 6% of the first core, 1% of the second,
  0.5% of the next two, 0.25% of the rest; no system-reserved;
- eviction: memory.available < 100Mi.
- capacity: the kernel's MemTotal, not the instance's nominal memory. ASSUMPTION: 94% of it
  (an m5.large's node reports about 7,750 MiB of its 8,192 MiB).

Besides requests, pods their charts leave without requests (EKS's aws-node, kube-proxy and Pod Identity
agent) still use memory: `fit()` also adds their expected working set (ASSUMPTION figures, `usage_mib`) and
checks that against allocatable too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from infra.errors import UserError
from infra.planning import monitoring_pods
from infra.planning.monitoring_sizing import Shape, sizing

# EC2 DescribeInstanceTypes, as moto 5.2.5 ships it (moto/ec2/resources/instance_types.json.gz; tests/test_system_nodes.py
# compares every row): vCPUs, memory MiB, maximum network interfaces, IPv4 addresses per interface.
INSTANCE_TYPES: dict[str, tuple[int, int, int, int]] = {
    f"{family}.{size}": row
    for family in ("m5", "m6i", "m7i")
    for size, row in {"large": (2, 8192, 3, 10), "xlarge": (4, 16384, 4, 15), "2xlarge": (8, 32768, 4, 15),
                      "4xlarge": (16, 65536, 8, 30)}.items()
}  # fmt: skip
SIZES = ("large", "xlarge", "2xlarge", "4xlarge")
MEMTOTAL_SHARE = 0.94  # ASSUMPTION: MemTotal over nominal memory (module doc)
EVICTION_HARD_MIB = 100
MAX_NODES = 10  # cluster.systemNodeCount's bound (infra/config/areas.py)


@dataclass(frozen=True)
class SystemPod:
    name: str
    cpu_m: int  # request, millicores
    memory_mib: int  # request
    source: str
    replicas: int = 1
    per_node: bool = False  # a DaemonSet: one on every system node
    usage_mib: int = 0  # expected working set when it requests less (ASSUMPTION where set)


PROMETHEUS_CPU_M = monitoring_pods.PROMETHEUS_CPU_M


@dataclass(frozen=True)
class SystemNodes:
    """The planner's input (`PlanRequest.system`): the system node group, the monitoring's retention (None:
    `monitoring.mode` off, no monitoring pods) and its mode (in-cluster, or amp: the agent, no Alertmanager)."""

    instance_type: str
    count: int
    retention_days: int | None = None
    monitoring: str = monitoring_pods.IN_CLUSTER


def request_for(system: SystemNodes, shape: Shape) -> SystemRequest:
    """The pods' inputs: Prometheus' memory from the stack's series estimate (monitoring_sizing.py)."""
    if system.retention_days is None:
        return SystemRequest(system.instance_type, system.count)
    return SystemRequest(system.instance_type, system.count, PROMETHEUS_CPU_M, sizing(shape, system.retention_days).memory_mib,
                         system.monitoring)  # fmt: skip


@dataclass(frozen=True)
class SystemRequest:
    """The system node group and what the monitoring adds to it (None: monitoring off)."""

    instance_type: str
    count: int
    prometheus_cpu_m: int | None = None
    prometheus_memory_mib: int | None = None
    monitoring: str = monitoring_pods.IN_CLUSTER  # in-cluster or amp, when prometheus_memory_mib is set


@dataclass(frozen=True)
class Fit:
    instance_type: str
    count: int
    allocatable_cpu_m: int  # one node
    allocatable_memory_mib: int
    requests_cpu_m: int  # all system pods
    requests_memory_mib: int
    expected_memory_mib: int  # requests, or the expected working set where larger
    largest_pod: str
    largest_pod_memory_mib: int
    fits: bool
    reason: str

    def to_json_dict(self) -> dict:
        return dict(self.__dict__)


def max_pods(enis: int, ips_per_eni: int) -> int:
    return enis * (ips_per_eni - 1) + 2


def kube_reserved_cpu_m(vcpus: int) -> int:
    total, reserved = vcpus * 1000, 0
    for start, end, per_10k in ((0, 1000, 600), (1000, 2000, 100), (2000, 4000, 50), (4000, total, 25)):
        if total > start:
            reserved += (min(total, end) - start) * per_10k // 10_000
    return reserved


def allocatable(instance_type: str) -> tuple[int, int]:
    """(CPU millicores, memory MiB) a node of `instance_type` offers pods."""
    vcpus, memory, enis, ips = INSTANCE_TYPES[instance_type]
    reserved = 11 * max_pods(enis, ips) + 255
    return vcpus * 1000 - kube_reserved_cpu_m(vcpus), math.floor(memory * MEMTOTAL_SHARE) - reserved - EVICTION_HARD_MIB


def system_pods(req: SystemRequest) -> list[SystemPod]:
    """What runs on the system nodes, with its requests (module doc; each figure's source in `source`)."""
    gpu_op, kuberay, kps = "gpu-operator v26.7.0 values.yaml", "kuberay-operator 1.7.0 values.yaml", "kube-prometheus-stack 88.5.3"
    pods = [
        SystemPod("coredns", 100, 70, "ASSUMPTION: the EKS CoreDNS add-on's requests", replicas=2),
        SystemPod("aws-node", 25, 0, "ASSUMPTION: the VPC CNI add-on's cpu request", per_node=True, usage_mib=60),
        SystemPod("kube-proxy", 100, 0, "ASSUMPTION: the kube-proxy add-on's cpu request", per_node=True, usage_mib=30),
        SystemPod("eks-pod-identity-agent", 0, 0, "ASSUMPTION: no requests", per_node=True, usage_mib=20),
        SystemPod("ebs-csi-node", 10, 40, "ASSUMPTION: aws-ebs-csi-driver's node requests", per_node=True),
        SystemPod("ebs-csi-controller", 60, 240, "ASSUMPTION: aws-ebs-csi-driver's controller, six containers", replicas=2),
        SystemPod("efs-csi-node", 10, 40, "ASSUMPTION: aws-efs-csi-driver's node requests", per_node=True),
        SystemPod("efs-csi-controller", 10, 40, "ASSUMPTION: aws-efs-csi-driver's controller", replicas=2),
        SystemPod("eks-node-monitoring-agent", 10, 30, "eks-node-monitoring-agent v1.7.0 values.yaml nodeAgent.resources",
                  per_node=True),
        SystemPod("gpu-operator", 200, 100, f"{gpu_op} operator.resources.requests"),
        SystemPod("nfd-master", 100, 128, "ASSUMPTION: node-feature-discovery 0.19.0's master requests"),
        SystemPod("nfd-gc", 10, 128, "ASSUMPTION: node-feature-discovery 0.19.0's gc requests"),
        SystemPod("nfd-worker", 5, 64, "ASSUMPTION: node-feature-discovery 0.19.0's worker requests", per_node=True),
        # Only limits: Kubernetes makes the requests equal to them.
        SystemPod("kuberay-operator", 100, 512, f"{kuberay} resources.limits (requests default to limits)"),
    ]  # fmt: skip
    if req.prometheus_memory_mib is not None:
        # kube-prometheus-stack's pods, as its values set them (infra/k8s/monitoring.py, from this table).
        pods += [SystemPod(p.name, p.cpu_m, p.memory_mib, f"{kps}: {p.source}", per_node=p.per_node)
                 for p in monitoring_pods.pods(req.monitoring, req.prometheus_memory_mib)]  # fmt: skip
    return pods


def fit(req: SystemRequest) -> Fit:
    if req.instance_type not in INSTANCE_TYPES:
        raise UserError(f"cluster.systemInstanceType {req.instance_type!r}: the plan knows the system node sizes of "
                        f"{', '.join(INSTANCE_TYPES)}; pick one of them")  # fmt: skip
    cpu, memory = allocatable(req.instance_type)
    pods = system_pods(req)
    n = lambda p: p.replicas * (req.count if p.per_node else 1)  # noqa: E731
    req_cpu = sum(n(p) * p.cpu_m for p in pods)
    req_mem = sum(n(p) * p.memory_mib for p in pods)
    expected = sum(n(p) * max(p.memory_mib, p.usage_mib) for p in pods)
    per_node = sum(max(p.memory_mib, p.usage_mib) for p in pods if p.per_node)
    largest = max((p for p in pods if not p.per_node), key=lambda p: p.memory_mib)
    reasons = []
    if largest.memory_mib + per_node > memory:
        reasons.append(f"{largest.name} requests {largest.memory_mib:,} MiB; a node offers {memory - per_node:,} MiB "
                       "besides its DaemonSets")  # fmt: skip
    if req_cpu > cpu * req.count:
        reasons.append(f"the system pods request {req_cpu:,}m CPU of {cpu * req.count:,}m")
    if expected > memory * req.count:
        reasons.append(f"the system pods need about {expected:,} MiB of {memory * req.count:,} MiB")
    return Fit(req.instance_type, req.count, cpu, memory, req_cpu, req_mem, expected, largest.name, largest.memory_mib,
               not reasons, "; ".join(reasons))  # fmt: skip


def smallest_fitting(req: SystemRequest) -> SystemRequest | None:
    """The smallest size of the same family at the same count that fits, else the fewest nodes of the given size."""
    family = req.instance_type.split(".")[0]
    for size in SIZES:
        bigger = replace(req, instance_type=f"{family}.{size}")
        if f"{family}.{size}" in INSTANCE_TYPES and fit(bigger).fits:
            return bigger
    for count in range(req.count + 1, MAX_NODES + 1):
        more = replace(req, count=count)
        if fit(more).fits:
            return more
    return None


def check(req: SystemRequest) -> Fit:
    """The fit, or a UserError naming what would fit."""
    result = fit(req)
    if result.fits:
        return result
    better = smallest_fitting(req)
    hint = (f"set cluster.systemInstanceType {better.instance_type} with systemNodeCount {better.count}" if better
            else "shorten monitoring.retentionDays or use a larger family")  # fmt: skip
    raise UserError(f"the system node group ({req.count} x {req.instance_type}) is too small: {result.reason}; {hint}")

