"""Grafana dashboards of the serving stack (issue 20, item 3): JSON models by file name.

`dashboards(spec)` returns `serving.json`, `plan-vs-reality.json`, `gpus.json` and
`cluster.json`, each a classic Grafana dashboard model (Grafana's dashboard schema,
`schemaVersion` 41) with the Prometheus data source as the template variable
`datasource` and the stack's names (namespace, served model, RayCluster) as hidden
constant variables, so a provisioned copy needs no editing. Every figure that comes
from the stack (the SLA from `gpu-serving:serving.sla`; capacity, throughput,
workload, knobs from the plan; the GPU's peaks from infra/catalog/gpus.py) is a
threshold line or a constant in a query, taken from `DashboardSpec`, which
`dashboard_spec_from(cfg, plan)` fills in.

Metric names are the pinned exporters' (tests/test_dashboards.py checks every one
against tests/fixtures/metrics/dashboards/):
- vLLM 0.34.0 on the head's `/metrics` (labels `model_name`, `engine`); the estimated
  FLOPs and bytes counters (`vllm:estimated_*_per_gpu_total`) move only with
  `--enable-mfu-metrics` (`ObservabilityConfig.enable_mfu_metrics`; without it they are
  exported at 0, v1/metrics/loggers.py `PrometheusStatLogger` builds perf.py's
  `PerfMetricsProm` whatever the flag), which the plan passes only where vLLM's estimator
  measures the model as served (infra/planning/serving.py `mfu_metrics_gap`): elsewhere the
  roofline row says why instead of drawing them; the speculative decoding counters exist
  only with a `--speculative-config`;
- dcgm-exporter 4.6.0-4.8.3 (what the GPU operator v26.7.0 runs) with the stack's
  counters file (infra/k8s/dcgm_counters.py): its default counters plus the NVLink
  error counters the default file leaves commented out (`nvlink_error_counters`);
- node_exporter 1.12.1 (kube-prometheus-stack 88.5.3's prometheus-node-exporter 4.56.1, on
  every node) with its `infiniband` collector, which sees each EFA device under
  /sys/class/infiniband: `node_infiniband_info` counts them. Its traffic and error
  counters are not there for EFA: EFA has no PMA `counters` directory, and the EFA
  driver's `hw_counters` (tx_bytes, rdma_read_bytes, retrans_pkts, ...) are names
  prometheus/procfs v0.21.1 does not read (tests/fixtures/metrics/efa/README.md);
- Ray 2.60.0 on every Ray pod (`ray_resources`, `ray_node_cpu_count`);
- kube-state-metrics (`kube_node_status_condition`, `kube_node_status_capacity`,
  `kube_pod_container_status_restarts_total`) and Prometheus's own `up`.

Series are selected by the target labels the serving PodMonitor gives them: `namespace`
(the pod's) and `job` (`<namespace>/<RayCluster>`, the PodMonitor's name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.planning.serving import mfu_metrics_gap
from infra.planning.sla_search import perf_setup

SCHEMA_VERSION = 41  # Grafana 11.6 / 12.0's dashboard JSON model; newer Grafana migrates it on load
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
KV_CACHE_FULL = 0.95  # issue 20's alert level: KV cache above 95% with requests waiting
# Legend for DCGM series: the node label is `Hostname` up to dcgm-exporter 4.5.3-4.8.2 and
# `hostname` after (NVIDIA/dcgm-exporter#655); a missing label renders empty in Grafana.
GPU_LEGEND = "{{Hostname}}{{hostname}} GPU {{gpu}}"
UID_PREFIX = "gpu-serving-"


@dataclass(frozen=True)
class DashboardSpec:
    """The stack's names and figures the dashboards draw; seconds, tokens, FLOP/s, bytes/s."""

    namespace: str
    ray_cluster: str  # the RayCluster's name (its pods' name prefix)
    served_model_name: str  # vLLM's `model_name` label (`--served-model-name`)
    ttft_p99_s: float  # the SLA (gpu-serving:serving.sla)
    tpot_p99_s: float
    itl_p99_s: float | None  # None: ITL is not part of the SLA
    gpu_name: str
    gpu_count: int
    nodes: int
    peak_flops: tuple[tuple[str, float], ...]  # (dtype, dense FLOP/s per GPU), e.g. ("BF16", 989.5e12)
    hbm_bytes_per_s: float  # per GPU
    max_num_seqs: int = 0  # the plan's --max-num-seqs (0: unknown)
    gpu_memory_utilization: float = 0.0  # the plan's --gpu-memory-utilization (0: unknown)
    # The plan's prediction at its SLA capacity; None: the plan has none (no SLA, or it misses).
    predicted_concurrency: int | None = None
    predicted_requests_per_s: float | None = None  # the highest Poisson rate within the SLA
    predicted_output_tokens_per_s: float | None = None
    predicted_input_tokens_per_s: float | None = None
    predicted_ttft_p99_s: float | None = None
    predicted_tpot_p99_s: float | None = None
    # The workload the plan predicts for (gpu-serving:serving.workload).
    workload_input_tokens: float | None = None
    workload_output_tokens: float | None = None
    workload_prefix_cache_hit_rate: float = 0.0
    speculative_tokens: int = 0  # MTP draft tokens per step (0: off)
    predicted_acceptance_rate: float | None = None  # the draft acceptance the plan assumes
    mfu_metrics: bool = False  # vLLM runs with --enable-mfu-metrics (the estimated FLOPs / bytes counters)
    mfu_gap: str = ""  # why not (infra/planning/serving.py mfu_metrics_gap), shown in place of the roofline panels
    pipeline_parallel: int = 1  # the plan's --pipeline-parallel-size (vLLM's per-GPU estimate averages the stages)
    nvlink_error_counters: bool = False  # dcgm-exporter runs a counters file with the NVLink error fields
    efa_devices_per_node: int = 0  # EFA interfaces of each GPU node (the instance type's maximum; 0: no EFA)


def dashboard_spec_from(cfg: Any, plan: Any, *, ray_cluster: str = "vllm", nvlink_error_counters: bool = True) -> DashboardSpec:
    """The spec of a stack: names and the SLA from its config (`infra.config.StackConfig`),
    figures from its plan (`infra.planning.Plan`). `ray_cluster`: the serving RayCluster's
    name (`ServingSpec.name`, "vllm" unless the program names it otherwise).
    `nvlink_error_counters`: the GPU operator's DCGM exporter runs the stack's counters file
    with the NVLink error fields (infra/k8s/helm_values.py `DCGM_COUNTERS`, always set)."""
    sla, gpu = cfg.serving.sla, plan.instance.gpu
    cap = plan.performance
    at = cap.at if cap is not None and cap.concurrency else None
    workload = plan.request.workload
    peaks = [("BF16", gpu.bf16_dense_tflops), ("FP8", gpu.fp8_dense_tflops), ("FP4", gpu.fp4_dense_tflops)]
    k = plan.knobs.num_speculative_tokens
    acceptance = perf_setup(plan.model, plan.instance, plan.evaluation).serving.acceptance_rate if k else None
    return DashboardSpec(
        namespace=cfg.serving.namespace,
        ray_cluster=ray_cluster,
        served_model_name=plan.checkpoint or plan.model.name,
        ttft_p99_s=sla.ttft_p99_ms / 1000,
        tpot_p99_s=sla.tpot_p99_ms / 1000,
        itl_p99_s=sla.itl_p99_ms / 1000 if sla.itl_p99_ms is not None else None,
        gpu_name=gpu.name,
        gpu_count=plan.nodes * plan.instance.gpu_count,
        nodes=plan.nodes,
        peak_flops=tuple((name, tflops * 1e12) for name, tflops in peaks if tflops),
        hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        max_num_seqs=plan.max_num_seqs,
        gpu_memory_utilization=plan.knobs.gpu_memory_utilization,
        predicted_concurrency=cap.concurrency if at else None,
        predicted_requests_per_s=cap.requests_per_s if at else None,
        predicted_output_tokens_per_s=at.output_tokens_per_s if at else None,
        predicted_input_tokens_per_s=at.input_tokens_per_s if at else None,
        predicted_ttft_p99_s=at.ttft_p99_ms / 1000 if at else None,
        predicted_tpot_p99_s=at.tpot_p99_ms / 1000 if at else None,
        workload_input_tokens=workload.input_tokens if workload else None,
        workload_output_tokens=workload.output_tokens if workload else None,
        workload_prefix_cache_hit_rate=workload.prefix_cache_hit_rate if workload else 0.0,
        speculative_tokens=k,
        predicted_acceptance_rate=acceptance,
        mfu_metrics=(mfu := "--enable-mfu-metrics" in plan.serving_args),
        mfu_gap="" if mfu else (mfu_metrics_gap(plan.model, speculative=bool(k), dp=plan.evaluation.layout.dp)
                                or "the stack's serving arguments do not pass `--enable-mfu-metrics`"),
        pipeline_parallel=plan.evaluation.layout.pp,
        nvlink_error_counters=nvlink_error_counters,
        efa_devices_per_node=plan.instance.max_efa_interfaces,
    )


# --- Panels ---------------------------------------------------------------------------


def _target(expr: str, legend: str = "", ref: int = 0) -> dict:
    return {"refId": chr(ord("A") + ref), "datasource": dict(DATASOURCE), "expr": expr, "legendFormat": legend,
            "range": True, "instant": False, "editorMode": "code"}  # fmt: skip


def _targets(queries: list[tuple[str, str]]) -> list[dict]:
    return [_target(expr, legend, i) for i, (expr, legend) in enumerate(queries)]


def _thresholds(lines: list[tuple[float, str]], base: str = "green") -> dict:
    """Threshold steps, drawn as lines on a time series; `lines`: (value, colour)."""
    steps: list[dict] = [{"color": base, "value": None}]
    steps += [{"color": color, "value": value} for value, color in sorted(lines)]
    return {"mode": "absolute", "steps": steps}


def timeseries(title: str, queries: list[tuple[str, str]], *, unit: str, description: str,
               lines: list[tuple[float, str]] = (), minimum: float | None = 0, w: int = 12) -> dict:  # fmt: skip
    """A time series; `lines`: constants drawn as dashed threshold lines (value, colour)."""
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                   "spanNulls": False, "thresholdsStyle": {"mode": "dashed" if lines else "off"}},  # fmt: skip
        "thresholds": _thresholds(list(lines)),
    }
    if minimum is not None:
        defaults["min"] = minimum
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": dict(DATASOURCE),
        "targets": _targets(queries), "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "gridPos": {"w": w, "h": 8},
    }  # fmt: skip


def stat(title: str, expr: str, *, unit: str, description: str, steps: list[tuple[float, str]] = (),
         base: str = "green", w: int = 6) -> dict:  # fmt: skip
    """A single figure, coloured by `steps` (value, colour) above `base`."""
    return {
        "type": "stat", "title": title, "description": description, "datasource": dict(DATASOURCE),
        "targets": [_target(expr)],
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": _thresholds(list(steps), base)}, "overrides": []},
        "options": {"graphMode": "area", "colorMode": "value", "justifyMode": "auto", "textMode": "auto",
                    "wideLayout": True, "showPercentChange": False, "percentChangeColorMode": "standard",
                    "orientation": "auto", "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
        "gridPos": {"w": w, "h": 4},
    }  # fmt: skip


def text(title: str, content: str, *, w: int = 24, h: int = 6) -> dict:
    return {"type": "text", "title": title, "options": {"mode": "markdown", "content": content}, "gridPos": {"w": w, "h": h}}


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def _layout(panels: list[dict]) -> list[dict]:
    """Ids and grid positions, left to right and top to bottom; a row starts a new line."""
    x = y = line_h = 0
    for i, panel in enumerate(panels, start=1):
        w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
        if panel["type"] == "row" or x + w > 24:
            x, y, line_h = 0, y + line_h, 0
        panel["id"] = i
        panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x, line_h = x + w, max(line_h, h)
        if panel["type"] == "row":
            x, y, line_h = 0, y + h, 0
    return panels


def _constant(name: str, value: str, label: str) -> dict:
    return {"type": "constant", "name": name, "label": label, "hide": 2, "query": value, "skipUrlSync": True,
            "current": {"text": value, "value": value}, "options": [{"text": value, "value": value, "selected": True}]}  # fmt: skip


def _dashboard(uid: str, title: str, description: str, spec: DashboardSpec, panels: list[dict]) -> dict:
    variables = [
        {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus", "hide": 0,
         "refresh": 1, "regex": "", "multi": False, "includeAll": False, "options": []},
        _constant("namespace", spec.namespace, "Serving namespace"),
        _constant("model_name", spec.served_model_name, "Served model"),
        _constant("ray_cluster", spec.ray_cluster, "RayCluster"),
    ]  # fmt: skip
    return {
        "uid": UID_PREFIX + uid, "title": title, "description": description,
        "tags": ["gpu-serving", "vllm"], "timezone": "browser", "editable": True, "graphTooltip": 1,
        "time": {"from": "now-3h", "to": "now"}, "refresh": "30s", "schemaVersion": SCHEMA_VERSION, "version": 1,
        "templating": {"list": variables},
        "annotations": {"list": [{"builtIn": 1, "name": "Annotations & Alerts", "enable": True, "hide": True,
                                  "iconColor": "rgba(0, 211, 255, 1)", "type": "dashboard",
                                  "datasource": {"type": "grafana", "uid": "-- Grafana --"}}]},
        "links": [{"title": "GPU serving", "type": "dashboards", "tags": ["gpu-serving"], "asDropdown": True,
                   "icon": "external link", "includeVars": False, "keepTime": True, "targetBlank": False,
                   "tooltip": "", "url": ""}],
        "panels": _layout(panels),
    }  # fmt: skip


# --- Queries --------------------------------------------------------------------------

VLLM = '{namespace="$namespace", model_name="$model_name"}'
# Ray's series: the serving PodMonitor (infra/k8s/exposure.py, named after the RayCluster) scrapes every Ray pod,
# so the Prometheus operator gives them job `<namespace>/<RayCluster>`, as the alerts select them.
RAY_LABELS = 'namespace="$namespace", job="$namespace/$ray_cluster"'
RAY = "{" + RAY_LABELS + "}"


def _rate(metric: str, selector: str = VLLM) -> str:
    return f"sum(rate({metric}{selector}[{RATE}]))"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{VLLM}[{RATE}])))"


def _mean(histogram: str) -> str:
    return f"{_rate(histogram + '_sum')} / {_rate(histogram + '_count')}"


PREFIX_HIT_RATE = f"{_rate('vllm:prefix_cache_hits_total')} / {_rate('vllm:prefix_cache_queries_total')}"
ACCEPTANCE = f"{_rate('vllm:spec_decode_num_accepted_tokens_total')} / {_rate('vllm:spec_decode_num_draft_tokens_total')}"
OUTPUT_TPS = _rate("vllm:generation_tokens_total")
INPUT_TPS = _rate("vllm:prompt_tokens_total")
REQUESTS = _rate("vllm:request_success_total")
IN_ENGINE = f"sum(vllm:num_requests_running{VLLM}) + sum(vllm:num_requests_waiting{VLLM})"
FLOPS = f"avg(rate(vllm:estimated_flops_per_gpu_total{VLLM}[{RATE}]))"
BYTES = (f"avg(rate(vllm:estimated_read_bytes_per_gpu_total{VLLM}[{RATE}]))"
         f" + avg(rate(vllm:estimated_write_bytes_per_gpu_total{VLLM}[{RATE}]))")  # fmt: skip


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:,.1f} ms"


def _latency(title: str, histogram: str, sla: float | None, what: str, predicted: float | None = None) -> dict:
    lines = [(sla, "red")] if sla is not None else []
    if predicted is not None:
        lines.append((predicted, "blue"))
    said = f"SLA p99 {_ms(sla)} (red line)" if sla is not None else "not part of the SLA"
    if predicted is not None:
        said += f"; the plan predicts p99 {_ms(predicted)} at its SLA capacity (blue line)"
    return timeseries(
        title, [(_quantile(0.5, histogram), "p50"), (_quantile(0.99, histogram), "p99")], unit="s", lines=lines,
        description=f"{what} (`{histogram}`, vLLM's histogram; quantiles interpolate within its buckets). {said}.",
    )  # fmt: skip


# --- Dashboards -----------------------------------------------------------------------


def serving(spec: DashboardSpec) -> dict:
    ttft_p99, tpot_p99 = _quantile(0.99, "vllm:time_to_first_token_seconds"), _quantile(0.99, "vllm:request_time_per_output_token_seconds")
    panels = [
        stat("TTFT p99", ttft_p99, unit="s", steps=[(spec.ttft_p99_s, "red")],
             description=f"p99 time to first token; red above the SLA, {_ms(spec.ttft_p99_s)}."),
        stat("TPOT p99", tpot_p99, unit="s", steps=[(spec.tpot_p99_s, "red")],
             description=f"p99 time per output token; red above the SLA, {_ms(spec.tpot_p99_s)}."),
        stat("Requests in the engine", IN_ENGINE, unit="short", description="Running plus waiting requests.",
             steps=[(spec.max_num_seqs, "orange")] if spec.max_num_seqs else []),
        stat("KV cache", f"max(vllm:kv_cache_usage_perc{VLLM})", unit="percentunit", steps=[(KV_CACHE_FULL, "red")],
             description=f"Share of the KV-cache blocks in use; red above {KV_CACHE_FULL:.0%}."),
        row("Traffic"),
        timeseries("Requests finished /s", [(f"sum by (finished_reason) (rate(vllm:request_success_total{VLLM}[{RATE}]))",
                                             "{{finished_reason}}")], unit="reqps",
                   description="Requests vLLM finished, by why (`stop`, `length`, `abort`, ...): `vllm:request_success_total`."),
        timeseries("Tokens /s", [(INPUT_TPS, "in (prompt)"), (OUTPUT_TPS, "out (generated)")], unit="short",
                   description="Prompt tokens prefilled (`vllm:prompt_tokens_total`) and tokens generated "
                               "(`vllm:generation_tokens_total`) per second."),
        timeseries("Running and waiting", [(f"sum(vllm:num_requests_running{VLLM})", "running"),
                                           (f"sum(vllm:num_requests_waiting{VLLM})", "waiting (queue)")],
                   unit="short", lines=[(spec.max_num_seqs, "orange")] if spec.max_num_seqs else [],
                   description=f"Requests in the running batch and in the queue. The plan's --max-num-seqs is "
                               f"{spec.max_num_seqs} (orange line): running never passes it; past it requests wait."),
        timeseries("Preemptions /s", [(_rate("vllm:num_preemptions_total"), "preemptions")], unit="short",
                   description="Requests preempted for lack of KV-cache blocks (`vllm:num_preemptions_total`); "
                               "each is recomputed later, which costs TTFT and throughput."),
        row("Latency against the SLA"),
        _latency("Time to first token", "vllm:time_to_first_token_seconds", spec.ttft_p99_s, "Time to first token"),
        _latency("Time per output token", "vllm:request_time_per_output_token_seconds", spec.tpot_p99_s,
                 "Time per output token, per request"),
        _latency("Inter-token latency", "vllm:inter_token_latency_seconds", spec.itl_p99_s,
                 "Time between two tokens of a stream"),
        _latency("Queue time", "vllm:request_queue_time_seconds", None, "Time a request waited before it ran"),
        row("KV cache"),
        timeseries("KV-cache usage", [(f"max by (engine) (vllm:kv_cache_usage_perc{VLLM})", "engine {{engine}}")],
                   unit="percentunit", lines=[(KV_CACHE_FULL, "red")], w=8,
                   description=f"`vllm:kv_cache_usage_perc`; above {KV_CACHE_FULL:.0%} with requests waiting the "
                               "engine is KV-bound (the alert fires then)."),
        timeseries("Prefix-cache hit rate", [(PREFIX_HIT_RATE, "hit rate")], unit="percentunit", w=8,
                   description="Prompt tokens found in the prefix cache over prompt tokens looked up "
                               "(`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`)."),
    ]  # fmt: skip
    if spec.speculative_tokens:
        panels.append(timeseries(
            "Draft acceptance", [(ACCEPTANCE, "accepted / drafted")], unit="percentunit", w=8,
            description=f"{spec.speculative_tokens} MTP draft token(s) a step: accepted over drafted "
                        "(`vllm:spec_decode_num_accepted_tokens_total` / `vllm:spec_decode_num_draft_tokens_total`).",
        ))  # fmt: skip
    return _dashboard("serving", "GPU serving: vLLM", "Traffic, latency against the SLA and the KV cache of the "
                      f"served model {spec.served_model_name}.", spec, panels)  # fmt: skip


def _plan_table(spec: DashboardSpec) -> str:
    def fig(v: float | None, fmt: str = ",.1f") -> str:
        return "n/a" if v is None else format(v, fmt)

    peaks = ", ".join(f"{name} {flops / 1e12:,.1f} TFLOP/s" for name, flops in spec.peak_flops)
    rows = [
        ("SLA", f"TTFT p99 {_ms(spec.ttft_p99_s)}, TPOT p99 {_ms(spec.tpot_p99_s)}, ITL p99 {_ms(spec.itl_p99_s)}"),
        ("SLA capacity (concurrent requests)", fig(spec.predicted_concurrency, ",")),
        ("Requests /s within the SLA (Poisson)", fig(spec.predicted_requests_per_s, ",.2f")),
        ("Output tokens /s at the capacity", fig(spec.predicted_output_tokens_per_s)),
        ("Input tokens /s at the capacity", fig(spec.predicted_input_tokens_per_s)),
        ("TTFT / TPOT p99 at the capacity", f"{_ms(spec.predicted_ttft_p99_s)} / {_ms(spec.predicted_tpot_p99_s)}"),
        ("Workload (mean tokens in / out, prefix cached)", f"{fig(spec.workload_input_tokens, ',.0f')} / "
         f"{fig(spec.workload_output_tokens, ',.0f')}, {spec.workload_prefix_cache_hit_rate:.0%}"),
        ("--max-num-seqs", f"{spec.max_num_seqs:,}"),
        ("GPUs", f"{spec.gpu_count} x {spec.gpu_name} on {spec.nodes} nodes; {peaks}; HBM "
                 f"{spec.hbm_bytes_per_s / 1e12:,.2f} TB/s"),
    ]  # fmt: skip
    if spec.speculative_tokens:
        rows.append(("Draft acceptance assumed", fig(spec.predicted_acceptance_rate, ".0%")))
    return "The plan's prediction (`bin/plan`) beside what the cluster does; dashed lines are the plan's figures.\n\n" + \
        "| figure | plan |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)  # fmt: skip


def _versus(title: str, expr: str, legend: str, predicted: float | None, *, unit: str, what: str, w: int = 12) -> dict:
    said = "the plan has no figure for it" if predicted is None else f"the plan: {predicted:,.4g} (blue line)"
    return timeseries(title, [(expr, legend)], unit=unit, w=w, lines=[(predicted, "blue")] if predicted is not None else [],
                      description=f"{what}; {said}.")  # fmt: skip


def plan_vs_reality(spec: DashboardSpec) -> dict:
    panels = [
        text("The plan", _plan_table(spec), h=9),
        row("Load and throughput"),
    ]
    if spec.predicted_output_tokens_per_s:
        panels += [
            stat("Output tokens /s, share of the plan", f"{OUTPUT_TPS} / {spec.predicted_output_tokens_per_s!r}",
                 unit="percentunit", base="blue", steps=[(1.0, "green")], w=12,
                 description="Generated tokens per second over the plan's prediction at its SLA capacity; near 100% "
                             "at full load while the SLA holds means the plan was right."),
            stat("Requests in the engine, share of the SLA capacity", f"({IN_ENGINE}) / {spec.predicted_concurrency!r}",
                 unit="percentunit", base="blue", steps=[(1.0, "orange")], w=12,
                 description="Past 100% the plan expects the SLA to break."),
        ]  # fmt: skip
    panels += [
        _versus("Requests in the engine", IN_ENGINE, "running + waiting", spec.predicted_concurrency, unit="short",
                what="Concurrent requests against the plan's SLA capacity"),
        _versus("Requests /s", REQUESTS, "finished /s", spec.predicted_requests_per_s, unit="reqps",
                what="Finished requests per second against the highest Poisson rate the plan predicts within the SLA"),
        _versus("Output tokens /s", OUTPUT_TPS, "generated /s", spec.predicted_output_tokens_per_s, unit="short",
                what="Generated tokens per second against the plan's throughput at its SLA capacity"),
        _versus("Input tokens /s", INPUT_TPS, "prefilled /s", spec.predicted_input_tokens_per_s, unit="short",
                what="Prompt tokens per second against the plan's at its SLA capacity"),
        row("Latency: plan and SLA"),
        _latency("TTFT", "vllm:time_to_first_token_seconds", spec.ttft_p99_s, "Time to first token",
                 spec.predicted_ttft_p99_s),
        _latency("TPOT", "vllm:request_time_per_output_token_seconds", spec.tpot_p99_s, "Time per output token",
                 spec.predicted_tpot_p99_s),
        row("Workload: is the traffic the one the plan assumed?"),
        _versus("Prompt tokens per request", _mean("vllm:request_prompt_tokens"), "mean", spec.workload_input_tokens,
                unit="short", w=8, what="Mean prompt length (`vllm:request_prompt_tokens`) against the workload's"),
        _versus("Output tokens per request", _mean("vllm:request_generation_tokens"), "mean",
                spec.workload_output_tokens, unit="short", w=8,
                what="Mean generated length (`vllm:request_generation_tokens`) against the workload's"),
        _versus("Prefix-cache hit rate", PREFIX_HIT_RATE, "hit rate", spec.workload_prefix_cache_hit_rate,
                unit="percentunit", w=8, what="Prompt tokens found in the prefix cache against the workload's share"),
    ]  # fmt: skip
    if spec.speculative_tokens:
        panels.append(_versus("Draft acceptance", ACCEPTANCE, "accepted / drafted", spec.predicted_acceptance_rate,
                              unit="percentunit", what="MTP draft tokens accepted, against the rate the plan assumes"))
    panels += _roofline(spec)
    return _dashboard("plan-vs-reality", "GPU serving: plan against reality",
                      "The plan's predicted SLA capacity, throughput and workload beside the live figures.", spec, panels)


def _roofline(spec: DashboardSpec) -> list[dict]:
    """Achieved FLOP/s and bytes/s per GPU from vLLM's estimated counters against the peaks, when vLLM runs with
    --enable-mfu-metrics; otherwise one text panel saying why it does not (the counters would read 0)."""
    title = f"Roofline: achieved per GPU against the {spec.gpu_name}'s peaks"
    if not spec.mfu_metrics:
        why = spec.mfu_gap or "the stack's serving arguments do not pass `--enable-mfu-metrics`"
        return [row(title), text("Roofline: not measured for this model", (
            "vLLM runs without `--enable-mfu-metrics`, so this row draws no achieved FLOPs or bytes: "
            f"{why}.\n\nWithout the flag vLLM 0.34.0 still exports `vllm:estimated_flops_per_gpu_total`, "
            "`vllm:estimated_read_bytes_per_gpu_total` and `vllm:estimated_write_bytes_per_gpu_total` (v1/metrics/"
            "loggers.py builds their counters whatever the flag); they stay at 0 and are not a measurement. The "
            "plan passes the flag where vLLM's estimator does measure the model as served "
            "(infra/planning/serving.py, `mfu_metrics_gap`)."), h=5)]  # fmt: skip
    top_peak = max(spec.peak_flops, key=lambda p: p[1])
    how = (" vLLM's closed-form estimate per scheduled step (v1/metrics/perf.py): per GPU is the average pipeline "
           f"stage (layers / {spec.pipeline_parallel}), with the LM head billed to every GPU.")  # fmt: skip
    return [
        row(title),
        timeseries("FLOP/s per GPU", [(FLOPS, "achieved (vLLM's estimate)")], unit="flops",
                   lines=[(flops, color) for (_, flops), color in zip(spec.peak_flops, ("orange", "red", "purple"))],
                   description="vLLM's estimate of the FLOPs its steps did, per GPU (`vllm:estimated_flops_per_gpu_total`), "
                               "against the dense peaks: " + ", ".join(f"{n} {f / 1e12:,.1f} TFLOP/s" for n, f in spec.peak_flops)
                               + "." + how),
        timeseries("Memory bytes/s per GPU", [(BYTES, "achieved (vLLM's estimate, read + write)")], unit="Bps",
                   lines=[(spec.hbm_bytes_per_s, "red")],
                   description="vLLM's estimate of the bytes its steps read and wrote, per GPU "
                               "(`vllm:estimated_read_bytes_per_gpu_total` + `..._write_...`), against the HBM bandwidth, "
                               f"{spec.hbm_bytes_per_s / 1e12:,.2f} TB/s." + how),
        stat(f"FLOPs utilisation ({top_peak[0]} peak)", f"{FLOPS} / {top_peak[1]!r}", unit="percentunit", w=12,
             description=f"Achieved FLOP/s over the {top_peak[0]} dense peak." + how),
        stat("HBM bandwidth utilisation", f"({BYTES}) / {spec.hbm_bytes_per_s!r}", unit="percentunit", w=12,
             description="Achieved bytes/s over the HBM bandwidth; decode is bound here." + how),
    ]  # fmt: skip


def _gpu(title: str, expr: str, *, unit: str, description: str, lines: list[tuple[float, str]] = (), w: int = 12) -> dict:
    return timeseries(title, [(expr, GPU_LEGEND)], unit=unit, description=description, lines=lines, w=w)


NVLINK_ERRORS = (
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "CRC flit errors"),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "CRC data errors"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "replays"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "recoveries"),
)


def gpus(spec: DashboardSpec) -> dict:
    panels = [
        stat("GPUs reporting", "count(DCGM_FI_DEV_GPU_UTIL)", unit="short", base="red", steps=[(spec.gpu_count, "green")],
             description=f"GPUs the DCGM exporter reports; the plan runs {spec.gpu_count}.", w=8),
        stat("GPUs with an XID error", "count(DCGM_FI_DEV_XID_ERRORS > 0) or vector(0)", unit="short",
             steps=[(1, "red")], w=8,
             description="GPUs whose last XID error (`DCGM_FI_DEV_XID_ERRORS`) is not 0; see the XID panel for the code."),
        stat("Mean GPU utilisation", "avg(DCGM_FI_DEV_GPU_UTIL)", unit="percent", w=8,
             description="`DCGM_FI_DEV_GPU_UTIL`: time a kernel ran, not how much of the GPU it used."),
        row("Load"),
        _gpu("GPU utilisation", "DCGM_FI_DEV_GPU_UTIL", unit="percent",
             description="Share of time a kernel ran on each GPU (`DCGM_FI_DEV_GPU_UTIL`)."),
        _gpu("Tensor pipe active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", unit="percentunit",
             description="Share of cycles the tensor pipe was busy (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`). A profiling field: "
                         "one DCGM engine per GPU holds them, so it may be empty where the EKS node monitoring agent's holds it."),
        _gpu("Memory used", "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", unit="percentunit",
             lines=[(spec.gpu_memory_utilization, "orange")] if spec.gpu_memory_utilization else [],
             description=f"Framebuffer used over used + free. vLLM takes --gpu-memory-utilization "
                         f"{spec.gpu_memory_utilization:g} of each GPU (orange line) at start-up and holds it."),
        _gpu("DRAM active", "DCGM_FI_PROF_DRAM_ACTIVE", unit="percentunit",
             description="Share of cycles the memory interface was busy (`DCGM_FI_PROF_DRAM_ACTIVE`, a profiling field)."),
        row("Power and heat"),
        _gpu("Power", "DCGM_FI_DEV_POWER_USAGE", unit="watt", description="Board power draw (`DCGM_FI_DEV_POWER_USAGE`)."),
        timeseries("Temperature", [("DCGM_FI_DEV_GPU_TEMP", "GPU " + GPU_LEGEND), ("DCGM_FI_DEV_MEMORY_TEMP", "HBM " + GPU_LEGEND)],
                   unit="celsius", description="GPU and memory temperature (`DCGM_FI_DEV_GPU_TEMP`, `DCGM_FI_DEV_MEMORY_TEMP`)."),
        row("Errors"),
        _gpu("XID errors", "DCGM_FI_DEV_XID_ERRORS > 0", unit="none", w=8,
             description="The last XID error code of each GPU that has one (`DCGM_FI_DEV_XID_ERRORS`); 79 (fallen off "
                         "the bus), 48 / 63 / 64 / 94 / 95 (ECC) and 74 (NVLink) need the node drained."),
        timeseries("Memory errors", [("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS > 0", "remapped rows " + GPU_LEGEND),
                                     ("DCGM_FI_DEV_ROW_REMAP_FAILURE > 0", "remap failed " + GPU_LEGEND),
                                     (f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[{RATE}]) > 0", "PCIe replays/s " + GPU_LEGEND)],
                   unit="short", w=8, description="HBM rows remapped for uncorrectable errors, a failed remap (the GPU "
                   "needs a reset or replacing) and PCIe replays; nothing drawn is good."),
        _gpu("NVLink traffic", f"rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[{RATE}])", unit="short", w=8,
             description="Rate of DCGM's NVLink bandwidth counter over all links (`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`); "
                         "tensor-parallel all-reduces run over it."),
    ]  # fmt: skip
    if spec.nvlink_error_counters:
        panels.append(timeseries("NVLink errors", [(f"sum by (Hostname, hostname, gpu) (rate({m}[{RATE}])) > 0", f"{what} {GPU_LEGEND}")
                                                   for m, what in NVLINK_ERRORS], unit="short", w=24,
                                 description="NVLink CRC errors, replays and recoveries per second; nothing drawn is good."))  # fmt: skip
    else:
        panels.append(text("NVLink errors", "dcgm-exporter's default counters file leaves the NVLink error counters out "
                           "(" + ", ".join(f"`{m}`" for m, _ in NVLINK_ERRORS) + "). A counters file with them "
                           "(the GPU operator's `dcgmExporter.config.name`) turns this panel into their rates; "
                           "until then XID 74 in the XID panel is the NVLink error that shows.", h=4))  # fmt: skip
    panels += _efa(spec)
    return _dashboard("gpus", "GPU serving: GPUs (DCGM)", "Utilisation, memory, power, temperature and errors of every "
                      "GPU, from the GPU operator's DCGM exporter, and the EFA devices node exporter sees.", spec, panels)  # fmt: skip


# node_exporter's infiniband collector: one `node_infiniband_info` series per device under /sys/class/infiniband (every EFA
# interface is one, rdmap*), labelled with the node exporter target's `instance` (the node's IP and port 9100).
EFA_DEVICES = "count by (instance) (node_infiniband_info)"
# Reading the EFA driver's own counters on a node by hand (they are in no exporter the stack runs; module doc).
EFA_HW_COUNTERS_COMMAND = ("kubectl debug node/<node> -it --image=busybox -- "
                           "grep . /host/sys/class/infiniband/*/ports/1/hw_counters/*")  # fmt: skip


def _efa(spec: DashboardSpec) -> list[dict]:
    """The EFA row: the devices node exporter sees per GPU node against the instance type's, and why the traffic
    and error counters are not drawn."""
    if not spec.efa_devices_per_node:
        return []
    n = spec.efa_devices_per_node
    return [
        row("EFA (node exporter)"),
        stat("GPU nodes with every EFA device", f"count({EFA_DEVICES} >= {n}) or vector(0)", unit="short", base="red",
             steps=[(spec.nodes, "green")], w=8,
             description=f"Nodes whose /sys/class/infiniband holds all {n} EFA devices of the instance type "
                         f"(`node_infiniband_info`, node exporter's infiniband collector); the plan runs {spec.nodes}. "
                         "A node short of devices (driver not loaded, a device gone) runs NCCL on fewer rails or on TCP."),
        timeseries("EFA devices per node", [(EFA_DEVICES, "{{instance}}")], unit="short", lines=[(n, "blue")], w=16,
                   description=f"EFA devices each node's kernel shows (`node_infiniband_info`); blue: the instance "
                               f"type's {n}. Only nodes with EFA devices appear."),
        text("EFA traffic and errors", "Not exported by any exporter the stack runs. The EFA driver keeps per-port "
             "counters in `/sys/class/infiniband/<device>/ports/1/hw_counters/` (`tx_bytes`, `rx_bytes`, "
             "`rdma_read_bytes`, `rdma_write_bytes`, `rx_drops`, `retrans_pkts`, `retrans_timeout_events`, "
             "`unresponsive_remote_events`, `impaired_remote_conn_events`, ...), but node exporter 1.12.1 reads only "
             "the InfiniBand PMA `counters` (EFA has none) and the mlx5 `hw_counters` names. On a node: "
             f"`{EFA_HW_COUNTERS_COMMAND}`. The EKS node monitoring agent (v1.7.0) watches the retransmit and error "
             "counters and raises a Warning event `EFAErrorMetric` on the node when one jumps: "
             "`kubectl get events -A --field-selector reason=EFAErrorMetric`.", h=5),
    ]  # fmt: skip


GPU_NODES_READY = ('count(kube_node_status_capacity{resource="nvidia_com_gpu"} > 0 and on (node) '
                   '(kube_node_status_condition{condition="Ready", status="true"} == 1)) or vector(0)')  # fmt: skip
RAY_NODES = f"count(count by (ip) (ray_node_cpu_count{RAY})) or vector(0)"
RAY_GPUS = f'sum(ray_resources{{Name="GPU", {RAY_LABELS}}}) or vector(0)'


def cluster(spec: DashboardSpec) -> dict:
    panels = [
        stat("GPU nodes Ready", GPU_NODES_READY, unit="short", base="red", steps=[(spec.nodes, "green")],
             description=f"Nodes with `nvidia.com/gpu` capacity whose Ready condition is true (kube-state-metrics); "
                         f"the plan runs {spec.nodes}."),
        stat("Ray nodes joined", RAY_NODES, unit="short", base="red", steps=[(spec.nodes, "green")],
             description=f"Ray nodes of RayCluster {spec.ray_cluster} reporting (`ray_node_cpu_count`, one a node); "
                         f"the plan runs {spec.nodes}, one pod a node."),
        stat("Ray GPUs joined", RAY_GPUS, unit="short", base="red", steps=[(spec.gpu_count, "green")],
             description=f"GPUs in the Ray cluster's resources (`ray_resources{{Name=\"GPU\"}}`, available + used); "
                         f"the plan needs {spec.gpu_count}: vLLM's placement group waits for all of them."),
        stat("Serving scrape targets down", 'count(up{namespace="$namespace"} == 0) or vector(0)', unit="short",
             steps=[(1, "red")], description="Targets in the serving namespace Prometheus fails to scrape (`up`)."),
        row("Nodes"),
        timeseries("Nodes Ready", [('sum(kube_node_status_condition{condition="Ready", status="true"})', "Ready"),
                                   ('sum(kube_node_status_condition{condition="Ready", status!="true"})', "not Ready"),
                                   (GPU_NODES_READY, "GPU nodes Ready")], unit="short", lines=[(spec.nodes, "blue")],
                   description=f"Nodes by Ready condition (`kube_node_status_condition`); blue: the plan's {spec.nodes} GPU nodes."),
        timeseries("Nodes not Ready", [('kube_node_status_condition{condition="Ready", status!="true"} == 1', "{{node}} {{status}}")],
                   unit="short", description="Each node whose Ready condition is false or unknown; nothing drawn is good."),
        row("Pods"),
        timeseries("Restarts in the serving namespace", [
            (f'sum by (pod, container) (increase(kube_pod_container_status_restarts_total{{namespace="$namespace"}}[1h])) > 0',
             "{{pod}} / {{container}}")], unit="short",
            description="Container restarts over the last hour (`kube_pod_container_status_restarts_total`); a vLLM "
                        "restart is a cold start (minutes of weight loading)."),
        timeseries("Restarts, all namespaces (top 10)", [
            ("topk(10, sum by (namespace, pod) (increase(kube_pod_container_status_restarts_total[1h]))) > 0",
             "{{namespace}} / {{pod}}")], unit="short",
            description="The operators' restarts too (KubeRay, GPU operator, EFA device plugin)."),
        row("Ray"),
        timeseries("Ray nodes and GPUs", [(RAY_NODES, "nodes"), (RAY_GPUS, "GPUs"),
                                          (f'sum(ray_resources{{Name="GPU", State="USED", {RAY_LABELS}}})',
                                           "GPUs in use")],
                   unit="short", lines=[(spec.nodes, "blue"), (spec.gpu_count, "purple")],
                   description=f"Ray nodes and GPUs joined; the plan: {spec.nodes} nodes (blue), {spec.gpu_count} GPUs (purple)."),
        timeseries("Scrape targets up", [('sum by (job) (up{namespace="$namespace"})', "{{job}}")], unit="short",
                   description="Targets Prometheus scrapes in the serving namespace, by job (`up`)."),
    ]  # fmt: skip
    return _dashboard("cluster", "GPU serving: cluster", "Node readiness, pod restarts, and the Ray nodes and GPUs "
                      "the serving RayCluster joined, against the plan.", spec, panels)  # fmt: skip


def dashboards(spec: DashboardSpec) -> dict[str, dict]:
    """The dashboards by file name (what the ConfigMaps Grafana's sidecar provisions hold)."""
    return {
        "serving.json": serving(spec),
        "plan-vs-reality.json": plan_vs_reality(spec),
        "gpus.json": gpus(spec),
        "cluster.json": cluster(spec),
    }
