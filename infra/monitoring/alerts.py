"""The serving cluster's alerts: the `spec.groups` of a PrometheusRule, made from the stack's config and plan.

`prometheus_rule_groups(spec)` returns the groups (monitoring.coreos.com/v1
PrometheusRule `spec.groups`, the same shape as the `groups` of a Prometheus rule
file); `rule_file(spec)` is that as the YAML promtool reads. `AlertSpec.from_stack`
builds the spec from the stack config and the plan's `Deployment`, so a changed SLA
in `gpu-serving:serving.sla` changes the rules.

Alerts (each with a `severity` label and `summary`, `description` and `runbook`
annotations, the runbook naming the first command to run):

- `ServingTtftP99AboveSla`, `ServingTpotP99AboveSla` (and `ServingItlP99AboveSla`
  when the SLA names an ITL): `histogram_quantile(0.99, ...)` over the `rate` of
  vLLM 0.34's `vllm:time_to_first_token_seconds`,
  `vllm:request_time_per_output_token_seconds` (per request, what the SLA and the
  benchmark Job's TPOT mean) and `vllm:inter_token_latency_seconds` buckets
  (vllm/v1/metrics/loggers.py, labels `model_name` and `engine`) over the burn
  window, above the SLA for `burn_for`: the config's `gpu-serving:monitoring.alerts`
  `slaWindow` and `slaFor` (infra/config/monitoring.py). Defaults: a 10m window (20 scrapes at the
  PodMonitor's 30 s interval, and at the SLA capacity thousands of requests, enough
  for a p99 that one slow request does not make) held for 10m (so 10 to 20 minutes
  of a p99 above the promise pages, and a burst of long prompts, or a prefix cache
  warming after a restart, does not). vLLM's default buckets have 0.25 s for TTFT
  but nothing between 0.025 and 0.05 s for TPOT (vllm/v1/metrics/buckets.py): a
  40 ms TPOT threshold is judged on the linear interpolation inside that bucket.
- `ServingKvCacheFull`: `vllm:kv_cache_usage_perc` (1 = full) above 0.95 while
  `vllm:num_requests_waiting` > 0, per engine, for `saturation_for` (10m).
- `ServingPreemptions`: `rate(vllm:num_preemptions_total[5m]) > 0` for
  `saturation_for`: preemptions in every 5-minute window for 10 minutes, not one.
- `ServingEngineDown`: the vLLM scrape target is down (`up == 0`) or its series are
  gone (`absent(vllm:num_requests_running)`), for the plan's cold start (the
  config's `coldStartTargetSeconds`, rounded up to minutes): a restarting engine is
  expected to be down that long, and pages only when it stays down longer.
- `RayGpusBelowPlan`: Ray's logical GPUs, `sum(ray_resources{Name="GPU"})` over the
  cluster's pods (the raylet's metric, summed over `State` as Ray's own dashboard
  does: ray/dashboard/modules/metrics/dashboards/default_dashboard_panels.py,
  "Logical GPUs Usage"), below the plan's node count x GPUs per node, for the cold
  start; no series counts as 0.
- `GpuXidError`: dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` (the last XID of a GPU,
  in its default counters) above 0.
- `GpuNodeNotReady`: kube-state-metrics' `kube_node_status_condition{condition=
  "Ready",status="true"} == 0` (false or unknown) on a node whose
  `kube_node_status_capacity{resource="nvidia_com_gpu"}` is above 0, for 5m.
- `GpuNodeEfaDevicesMissing` (EFA instance types only: `efa_devices`, the plan's EFA
  interfaces per node, which the launch template attaches every one of): a GPU node
  whose kernel shows fewer EFA devices than that for 10m. node exporter's infiniband
  collector exports one `node_infiniband_info` a device under /sys/class/infiniband
  (tests/fixtures/metrics/efa/README.md: the only EFA series it has; the GPU
  dashboard's EFA row counts the same). Its targets carry the node exporter pod's
  `namespace` and `pod`, not the node's name, so the count is joined to
  kube-state-metrics' `kube_pod_info` (whose own `namespace`, `pod` and `node` labels
  the chart's kube-state-metrics ServiceMonitor keeps: `honorLabels: true`), as the
  chart's own node recording rules join them; that works in both modes (amp's workspace
  has no chart rules). A GPU node with no device at all has no series: it counts as 0.

The scrape labels are those of the serving PodMonitor (infra/k8s/exposure.py
`pod_monitor`): the prometheus-operator sets `job` to `<namespace>/<PodMonitor
name>` and `endpoint` to the port's name; `namespace` and `pod` come from the pod.

EPLB balancedness: vLLM 0.34 computes it (vllm/distributed/eplb/eplb_state.py,
`_maybe_log_balancedness`, avg / max tokens per expert-parallel rank) only into a log
line, with `--eplb-config '{"log_balancedness": true}'`; no metric carries it
(no Gauge, Counter or Histogram in vllm/distributed/eplb/), so no alert or panel
can show it. With expert parallel, read it in the head's log.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from infra.errors import UserError

_DURATION = re.compile(r"^((\d+(ms|[smhdwy]))+|0)$")
PREEMPTION_WINDOW = "5m"
VLLM_PORT_NAME = "http"  # infra/k8s/serving_spec.py API_PORT_NAME: the head's API and /metrics


@dataclass(frozen=True)
class AlertSpec:
    namespace: str  # the serving namespace
    raycluster: str  # the RayCluster's name (its PodMonitor has the same)
    served_model_name: str  # vLLM's `model_name` label: --served-model-name
    ttft_p99_s: float  # the SLA, seconds
    tpot_p99_s: float
    gpus: int  # the plan's Ray GPUs: nodes x GPUs per node
    nodes: int
    itl_p99_s: Optional[float] = None
    burn_window: str = "10m"
    burn_for: str = "10m"
    saturation_for: str = "10m"
    engine_down_for: str = "15m"
    node_not_ready_for: str = "5m"
    kv_cache_threshold: float = 0.95
    efa_devices: int = 0  # EFA interfaces per GPU node (the plan's; 0: an instance type without EFA, no EFA alert)
    efa_missing_for: str = "10m"

    def __post_init__(self) -> None:
        for key in ("burn_window", "burn_for", "saturation_for", "engine_down_for", "node_not_ready_for", "efa_missing_for"):
            if not _DURATION.match(getattr(self, key)):
                raise UserError(f"alert {key} {getattr(self, key)!r} is not a Prometheus duration such as 10m")
        for key in ("ttft_p99_s", "tpot_p99_s", "itl_p99_s"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise UserError(f"alert threshold {key} must be positive, got {value}")
        if not 0 < self.kv_cache_threshold <= 1:
            raise UserError(f"KV-cache threshold must be in (0, 1], got {self.kv_cache_threshold}")
        if self.gpus < 1 or self.nodes < 1:
            raise UserError(f"the plan's GPUs and nodes must be at least 1, got {self.gpus} and {self.nodes}")

    @classmethod
    def from_stack(cls, config: Any, deployment: Any, *, raycluster: str = "vllm", **overrides: Any) -> "AlertSpec":
        """From a StackConfig (infra/config) and the plan's Deployment (infra/planning/contract.py)."""
        serving = config.serving
        sla = serving.sla
        kwargs: dict[str, Any] = {
            "namespace": serving.namespace,
            "raycluster": raycluster,
            "served_model_name": deployment.serve.checkpoint,
            "ttft_p99_s": sla.ttft_p99_ms / 1000,
            "tpot_p99_s": sla.tpot_p99_ms / 1000,
            "itl_p99_s": None if sla.itl_p99_ms is None else sla.itl_p99_ms / 1000,
            "gpus": deployment.total_gpus,
            "nodes": deployment.nodes.count,
            "efa_devices": deployment.nodes.efa_interfaces,
            "engine_down_for": f"{max(1, math.ceil(serving.cold_start_target_seconds / 60))}m",
            "burn_window": config.monitoring.alerts.sla_window,
            "burn_for": config.monitoring.alerts.sla_for,
        }
        return cls(**{**kwargs, **overrides})

    # --- selectors ---------------------------------------------------------------
    @property
    def job(self) -> str:
        return f"{self.namespace}/{self.raycluster}"

    @property
    def vllm(self) -> str:
        return f"namespace={_q(self.namespace)}, model_name={_q(self.served_model_name)}"

    @property
    def ray(self) -> str:
        return f"namespace={_q(self.namespace)}, job={_q(self.job)}"

    @property
    def head_logs(self) -> str:
        return f"kubectl -n {self.namespace} logs -l ray.io/cluster={self.raycluster},ray.io/node-type=head --tail=300"


def _q(value: str) -> str:
    """A PromQL string literal (Go's escapes, which JSON's are a subset of)."""
    return json.dumps(value)


def _num(value: float) -> str:
    return repr(float(value)).removesuffix(".0") if float(value).is_integer() else repr(float(value))


def _rule(name: str, expr: str, for_: str, severity: str, summary: str, description: str, runbook: str) -> dict:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description, "runbook": runbook},
    }


def _p99(spec: AlertSpec, histogram: str) -> str:
    return (f"histogram_quantile(0.99, sum by (namespace, model_name, le) "
            f"(rate({histogram}_bucket{{{spec.vllm}}}[{spec.burn_window}])))")  # fmt: skip


def _sla_rules(spec: AlertSpec) -> list[dict]:
    targets = [("Ttft", "time to first token", "vllm:time_to_first_token_seconds", spec.ttft_p99_s, "ttftP99Ms"),
               ("Tpot", "time per output token", "vllm:request_time_per_output_token_seconds", spec.tpot_p99_s, "tpotP99Ms")]  # fmt: skip
    if spec.itl_p99_s is not None:
        targets.append(("Itl", "inter-token latency", "vllm:inter_token_latency_seconds", spec.itl_p99_s, "itlP99Ms"))
    out = []
    for short, what, histogram, threshold, key in targets:
        out.append(_rule(
            f"Serving{short}P99AboveSla",
            f"{_p99(spec, histogram)} > {_num(threshold)}",
            spec.burn_for,
            "critical",
            f"p99 {what} of {spec.served_model_name} above the SLA's {_num(threshold * 1000)} ms",
            f"Over the last {spec.burn_window}, the 99th percentile {what} of the requests served in {spec.namespace} "
            f"has stayed above {_num(threshold)} s (gpu-serving:serving.sla.{key}) for {spec.burn_for}: the endpoint "
            "breaks its latency promise. Usual causes: more load than the plan's SLA capacity (requests waiting, KV "
            "cache full, preemptions), long prompts beyond the workload the plan assumed, or a slow rank or link.",
            f"{spec.head_logs} (the engine's periodic stats: running, waiting, KV-cache usage); then compare "
            "vllm:num_requests_waiting and the request rate with the plan's SLA capacity (`bin/plan`).",
        ))  # fmt: skip
    return out


def _engine_rules(spec: AlertSpec) -> list[dict]:
    by = "namespace, model_name, engine"
    return [
        _rule(
            "ServingKvCacheFull",
            f"max by ({by}) (vllm:kv_cache_usage_perc{{{spec.vllm}}}) > {_num(spec.kv_cache_threshold)}\n"
            f"and on ({by})\nmax by ({by}) (vllm:num_requests_waiting{{{spec.vllm}}}) > 0",
            spec.saturation_for,
            "warning",
            f"KV cache of {spec.served_model_name} above {_num(spec.kv_cache_threshold * 100)}% with requests waiting",
            f"Engine {{{{ $labels.engine }}}} in {spec.namespace} has used more than "
            f"{_num(spec.kv_cache_threshold * 100)}% of its KV cache with requests queued for {spec.saturation_for}: "
            "it admits no more sequences, queueing adds to the time to first token, and preemptions follow.",
            f"{spec.head_logs} (look for 'KV cache usage' and preemption warnings); the plan's maxNumSeqs and KV "
            "admission are in `bin/plan`: more load than the SLA capacity needs more nodes or a shorter maxModelLen.",
        ),
        _rule(
            "ServingPreemptions",
            f"sum by (namespace, model_name) (rate(vllm:num_preemptions_total{{{spec.vllm}}}[{PREEMPTION_WINDOW}])) > 0",
            spec.saturation_for,
            "warning",
            f"vLLM keeps preempting requests of {spec.served_model_name}",
            f"The engines in {spec.namespace} have preempted requests in every {PREEMPTION_WINDOW} window for "
            f"{spec.saturation_for}: the KV cache runs out, preempted requests are recomputed, and latency rises.",
            f"{spec.head_logs} | grep -i preempt; then check ServingKvCacheFull and the load against `bin/plan`.",
        ),
        _rule(
            "ServingEngineDown",
            f"up{{namespace={_q(spec.namespace)}, job={_q(spec.job)}, endpoint={_q(VLLM_PORT_NAME)}}} == 0\n"
            f"or\nabsent(vllm:num_requests_running{{{spec.vllm}}})",
            spec.engine_down_for,
            "critical",
            f"the vLLM engine serving {spec.served_model_name} is down",
            f"Prometheus cannot scrape vLLM's /metrics on the head of RayCluster {spec.raycluster} in "
            f"{spec.namespace}, or its series are gone, for {spec.engine_down_for} (longer than the planned cold "
            "start): the endpoint serves nothing.",
            f"kubectl -n {spec.namespace} get pods -l ray.io/cluster={spec.raycluster} -o wide; then "
            f"{spec.head_logs} --previous (an engine that died: CUDA, NCCL timeout, out of memory).",
        ),
    ]


def _cluster_rules(spec: AlertSpec) -> list[dict]:
    per_node = spec.gpus // spec.nodes
    return [
        _rule(
            "RayGpusBelowPlan",
            f'(sum(ray_resources{{Name="GPU", {spec.ray}}}) or vector(0)) < {spec.gpus}',
            spec.engine_down_for,
            "critical",
            f"Ray in {spec.namespace} has fewer GPUs than the plan's {spec.gpus}",
            f"RayCluster {spec.raycluster} has registered fewer than the plan's {spec.gpus} GPUs ({spec.nodes} nodes "
            f"x {per_node}) for {spec.engine_down_for}: a worker pod is missing or its GPUs are not visible, and vLLM's "
            "placement group, which needs them all, cannot start.",
            f"kubectl -n {spec.namespace} get pods -l ray.io/cluster={spec.raycluster} -o wide; then "
            f"kubectl -n {spec.namespace} exec <head pod> -- ray status (which nodes and GPUs joined).",
        ),
        _rule(
            "GpuXidError",
            "DCGM_FI_DEV_XID_ERRORS > 0",
            "0m",
            "critical",
            "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) reported an XID error",
            "DCGM reports XID {{ $value }} as the last error of GPU {{ $labels.gpu }} ({{ $labels.UUID }}, scraped "
            "from {{ $labels.instance }}). XIDs 48, 63, 64, 74, 79, 94, 95 and 119 mean a GPU, its memory or its "
            "NVLink failed: the engine on that node will stall or crash, and the node needs draining and a reset.",
            "kubectl get pods -A -o wide | grep dcgm (the node of {{ $labels.instance }}); then kubectl debug "
            "node/<node> -it --image=busybox -- chroot /host dmesg | grep -i xid, and look the code up in NVIDIA's "
            "XID catalogue.",
        ),
        _rule(
            "GpuNodeNotReady",
            'kube_node_status_condition{condition="Ready", status="true"} == 0\n'
            'and on (node)\nkube_node_status_capacity{resource="nvidia_com_gpu"} > 0',
            spec.node_not_ready_for,
            "critical",
            "GPU node {{ $labels.node }} is NotReady",
            f"GPU node {{{{ $labels.node }}}} has not been Ready for {spec.node_not_ready_for}: its Ray worker is gone "
            f"or going, and the serving cluster has fewer than the plan's {spec.nodes} nodes.",
            "kubectl describe node {{ $labels.node }} (Conditions and Events: kubelet, memory or disk pressure, "
            "network); then kubectl get pods -A -o wide --field-selector spec.nodeName={{ $labels.node }}.",
        ),
    ]


# A GPU node's name for node exporter's series: its target's pod, joined to kube-state-metrics' kube_pod_info (module doc).
NODE_OF_POD = 'max by (namespace, pod, node) (kube_pod_info{node!=""})'
GPU_NODES = 'max by (node) (kube_node_status_capacity{resource="nvidia_com_gpu"}) > 0'


def efa_devices_by_node() -> str:
    """EFA devices each node's kernel shows (node exporter's `node_infiniband_info`), by node name."""
    return f"count by (node) (node_infiniband_info * on (namespace, pod) group_left (node) {NODE_OF_POD})"


def _efa_rules(spec: AlertSpec) -> list[dict]:
    if not spec.efa_devices:
        return []
    n = spec.efa_devices
    return [_rule(
        "GpuNodeEfaDevicesMissing",
        f"({efa_devices_by_node()}\nor\n0 * ({GPU_NODES}))\n< {n}\nand on (node)\n{GPU_NODES}",
        spec.efa_missing_for,
        "warning",
        f"GPU node {{{{ $labels.node }}}} shows fewer than its {n} EFA devices",
        f"The kernel of GPU node {{{{ $labels.node }}}} has shown {{{{ $value }}}} EFA devices under /sys/class/infiniband "
        f"for {spec.efa_missing_for}, not the {n} its instance type has and the launch template attaches: an interface "
        "failed to attach, or the EFA driver did not load for it. NCCL then runs its collectives on fewer rails or, "
        "with none, falls back to TCP sockets: cross-node all-reduce slows many times over and the engine on that "
        "node drags every rank with it (TPOT rises), or a collective times out.",
        f"kubectl get node {{{{ $labels.node }}}} -o jsonpath='{{.status.allocatable.vpc\\.amazonaws\\.com/efa}}' "
        f"(the EFA device plugin's count, {n} when healthy); then kubectl debug node/{{{{ $labels.node }}}} -it "
        "--image=busybox -- ls /host/sys/class/infiniband; a node short of devices does not heal by itself: replace "
        "it (kubectl drain {{ $labels.node }} --ignore-daemonsets --delete-emptydir-data, then terminate its instance; "
        "the node group launches another).",
    )]  # fmt: skip


def prometheus_rule_groups(spec: AlertSpec) -> list[dict]:
    """The PrometheusRule's `spec.groups` (module doc)."""
    return [
        {"name": "gpu-serving.sla", "rules": _sla_rules(spec)},
        {"name": "gpu-serving.engine", "rules": _engine_rules(spec)},
        {"name": "gpu-serving.cluster", "rules": _cluster_rules(spec) + _efa_rules(spec)},
    ]


def rule_file(spec: AlertSpec) -> str:
    """A Prometheus rule file of the same groups, for `promtool check rules` and `promtool test rules`."""
    return yaml.safe_dump({"groups": prometheus_rule_groups(spec)}, sort_keys=False, width=1000)
