"""How big the in-cluster Prometheus must be: series, memory and volume, from the stack's shape.

Pure arithmetic on the plan's node and GPU counts (no Pulumi). The per-source figures are
estimates with their reasons; the totals are what `components/monitoring.py` requests.

Series per source (active series, at the chart's 30 s scrape interval):

- vLLM 0.34 (`/metrics` on the head, per engine): about 20 histograms (TTFT, ITL, TPOT,
  end-to-end, queue, prefill, decode, inference time, prompt and generation tokens,
  iteration tokens, ...), each 20-30 buckets plus sum and count, and about 40 gauges and
  counters, each with `model_name` and `engine` labels: ~1,000; estimated 1,500 with headroom.
- Ray (every Ray pod's metrics agent on 8080): per-process CPU and memory of every worker
  and component (`ray_component_*`), the object store, GCS and raylet internals: ~1,500 a pod.
- DCGM exporter: its default counters file enables about 30 fields per GPU (clocks,
  utilisation, framebuffer, power, temperature, XID, NVLink, PCIe): 40 a GPU with headroom.
- node exporter: about 800 a node plus about 10 a vCPU (`node_cpu_seconds_total`'s eight
  modes, frequencies, softnet): a p5.48xlarge (192 vCPUs) about 2,700.
- kubelet and cAdvisor: about 1,500 of the kubelet's own a node and about 60 a container.
- kube-state-metrics: about 1,000, plus 300 a node and 40 a pod.
- the monitoring stack itself (Prometheus, Alertmanager, Grafana, the operator, CoreDNS): 4,000.

The sum is multiplied by 1.5 for churn (restarted pods keep their old series in the head
block for up to two hours).

Memory: about 8 KiB per active series (the head block's series, postings and chunks are
some 3-4 KiB a series; Go's garbage collector lets the heap grow to twice the live set),
plus 512 MiB for queries, rule evaluation and the WAL replay at start.

Volume (Prometheus docs, "Storage", "Operational aspects": needed_disk_space =
retention_time_seconds * ingested_samples_per_second * bytes_per_sample, with 1-2 bytes
per sample): 2 bytes a sample, times 1.5 for the WAL, the head block and a compaction's
temporary copy, rounded up to 10 GiB, at least 20 GiB. Prometheus' `retentionSize` is set
to 85% of the volume, so when the estimate is low the oldest blocks go instead of the disk
filling up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCRAPE_INTERVAL_S = 30  # the prometheus-operator's default scrapeInterval (the chart leaves it unset)
VLLM_SERIES_PER_ENGINE = 1_500
RAY_SERIES_PER_POD = 1_500
DCGM_SERIES_PER_GPU = 40
NODE_EXPORTER_SERIES_PER_NODE = 800
NODE_EXPORTER_SERIES_PER_VCPU = 10
KUBELET_SERIES_PER_NODE = 1_500
CADVISOR_SERIES_PER_CONTAINER = 60
KSM_SERIES_BASE = 1_000
KSM_SERIES_PER_NODE = 300
KSM_SERIES_PER_POD = 40
SELF_SERIES = 4_000
CHURN = 1.5
# Pods a node runs besides the serving pod: the DaemonSets (aws-node, kube-proxy, pod identity agent,
# EFS CSI node, node monitoring agent, NFD worker, device plugins, GPU feature discovery, DCGM exporter,
# validator, node exporter) on a GPU node; on a system node those plus the operators, CoreDNS and monitoring.
PODS_PER_GPU_NODE = 13
PODS_PER_SYSTEM_NODE = 15
CONTAINERS_PER_POD = 2
BYTES_PER_SERIES = 8 * 1024
BASE_MEMORY_MIB = 512
BYTES_PER_SAMPLE = 2
STORAGE_OVERHEAD = 1.5
STORAGE_STEP_GIB = 10
MIN_STORAGE_GIB = 20
RETENTION_SIZE_SHARE = 0.85
SYSTEM_NODE_VCPUS = 4  # m7i.xlarge, the default system instance type


@dataclass(frozen=True)
class Shape:
    """What the series count depends on."""

    gpu_nodes: int
    gpus_per_node: int
    vcpus_per_gpu_node: int
    system_nodes: int
    engines: int  # vLLM engines (data-parallel ranks): each exports its own set
    ray_pods: int


@dataclass(frozen=True)
class Sizing:
    series: int  # active series, churn included
    memory_mib: int  # Prometheus' memory request
    storage_gib: int  # its volume
    retention_size_gib: int  # Prometheus' retentionSize

    @property
    def samples_per_second(self) -> float:
        return self.series / SCRAPE_INTERVAL_S


def series(shape: Shape) -> dict[str, int]:
    """Active series by source, before churn."""
    pods = shape.gpu_nodes * PODS_PER_GPU_NODE + shape.ray_pods + shape.system_nodes * PODS_PER_SYSTEM_NODE
    nodes = shape.gpu_nodes + shape.system_nodes
    return {
        "vllm": shape.engines * VLLM_SERIES_PER_ENGINE,
        "ray": shape.ray_pods * RAY_SERIES_PER_POD,
        "dcgm": shape.gpu_nodes * shape.gpus_per_node * DCGM_SERIES_PER_GPU,
        "node-exporter": nodes * NODE_EXPORTER_SERIES_PER_NODE
        + NODE_EXPORTER_SERIES_PER_VCPU * (shape.gpu_nodes * shape.vcpus_per_gpu_node + shape.system_nodes * SYSTEM_NODE_VCPUS),
        "kubelet": nodes * KUBELET_SERIES_PER_NODE + pods * CONTAINERS_PER_POD * CADVISOR_SERIES_PER_CONTAINER,
        "kube-state-metrics": KSM_SERIES_BASE + nodes * KSM_SERIES_PER_NODE + pods * KSM_SERIES_PER_POD,
        "monitoring": SELF_SERIES,
    }


def sizing(shape: Shape, retention_days: int) -> Sizing:
    if retention_days < 1:
        raise ValueError("retention must be at least one day")
    total = math.ceil(sum(series(shape).values()) * CHURN)
    memory = BASE_MEMORY_MIB + math.ceil(total * BYTES_PER_SERIES / 2**20)
    memory = math.ceil(memory / 256) * 256
    tsdb = total / SCRAPE_INTERVAL_S * 86_400 * retention_days * BYTES_PER_SAMPLE * STORAGE_OVERHEAD / 2**30
    storage = max(MIN_STORAGE_GIB, math.ceil(tsdb / STORAGE_STEP_GIB) * STORAGE_STEP_GIB)
    return Sizing(total, memory, storage, math.floor(storage * RETENTION_SIZE_SHARE))
