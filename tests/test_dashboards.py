"""The Grafana dashboards (infra/monitoring/dashboards.py) against Grafana's schema, promtool and the pinned exporters.

- Every dashboard validates against Grafana's own dashboard JSON schema (the
  grafana-foundation-sdk's, generated from Grafana's schema; tests/fixtures/metrics/dashboards/),
  each panel's options and field config against its panel kind's schema and each query
  against the Prometheus query schema; the data source is the `datasource` variable
  everywhere; uids are stable; panels do not overlap.
- Every PromQL query parses with Prometheus' own parser (`promtool check rules` on a rule
  file of the queries, the Grafana variables filled in as Grafana would).
- Every metric name a query uses is exported by the pinned vLLM, Ray, dcgm-exporter (default
  counters) or kube-state-metrics (tests/metric_names.py and this folder's fixtures).
- The SLA lines are prod's stack config, and move when it does; the plan's lines are prod's
  plan as `bin/plan` prints it (`Plan.to_json_dict()`); the peaks are the catalog GPU's.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from infra.catalog.instances import get_instance_type
from infra.config import load_stack_file
from infra.k8s.serving_spec import ServingSpec
from infra.aws.gpu_nodes import efa_interface_count, efa_interfaces
from infra.k8s import dcgm_counters
from infra.k8s import monitoring as mon
from infra.k8s.helm_values import gpu_operator_values
from infra.k8s.monitoring_sizing import Sizing
from infra.k8s.scheduling import TAINT_EFFECTS, gpu_taints
from infra.monitoring.dashboards import NVLINK_ERRORS, DashboardSpec, dashboard_spec_from, dashboards
from infra.planning.plan import make_plan
from tests.conftest import REPO_ROOT, fixture_path
from tests.metric_names import known_metrics, metric_names
from tests import yaml_text

FILES = ("serving.json", "plan-vs-reality.json", "gpus.json", "cluster.json")
PANEL_KINDS = ("timeseries", "stat", "text")


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prod():
    config = load_stack_file("prod")
    return config, make_plan(config.plan_request())


@pytest.fixture(scope="module")
def spec(prod) -> DashboardSpec:
    return dashboard_spec_from(*prod)


def _variants(spec: DashboardSpec) -> list[DashboardSpec]:
    """prod's, and the switches prod sets the other way: an ITL SLA, the MFU counters, no NVLink error counters and no
    EFA (a g6e node group), no MTP."""
    return [spec, dataclasses.replace(spec, itl_p99_s=0.05, mfu_metrics=True, mfu_gap="", nvlink_error_counters=False,
                                      efa_devices_per_node=0),
            dataclasses.replace(spec, speculative_tokens=0, predicted_acceptance_rate=None)]  # fmt: skip


def _schema(name: str) -> dict:
    return json.loads(fixture_path("metrics", "dashboards", "grafana-foundation-sdk", f"{name}.jsonschema.json").read_text())


def _definition(schema: dict, ref: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator({"$ref": f"#/definitions/{ref}", "definitions": schema["definitions"]})


def _panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]


def _uses(panel: dict, metric: str) -> bool:
    return any(metric in metric_names(_fill(t["expr"])) for t in panel.get("targets", []))


def _lines(panel: dict) -> list[float]:
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


def _panel(dashboard: dict, metric: str, kind: str = "timeseries") -> dict:
    found = [p for p in _panels(dashboard) if p["type"] == kind and _uses(p, metric)]
    assert len(found) == 1, (metric, [p["title"] for p in found])
    return found[0]


def _fill(expr: str, variables: dict[str, str] | None = None) -> str:
    """The query Grafana sends: its variables filled in ($__rate_interval: 4 scrape intervals of 30 s)."""
    values = {"__rate_interval": "2m", **(variables or {"namespace": "gpu-serving", "model_name": "m", "ray_cluster": "vllm"})}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def _variables(dashboard: dict) -> dict[str, str]:
    return {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "constant"}


# --- Grafana's schema -----------------------------------------------------------------


@pytest.mark.parametrize("name", FILES)
def test_every_dashboard_is_valid_grafana_dashboard_json(spec: DashboardSpec, name: str) -> None:
    board_schema = _schema("dashboard")
    query = _definition(_schema("prometheus"), "Dataquery")
    kinds = {kind: _schema(kind) for kind in PANEL_KINDS}
    for variant in _variants(spec):
        board = dashboards(variant)[name]
        json.loads(json.dumps(board))  # plain JSON, as the ConfigMap holds it
        errors = [f"{list(e.path)}: {e.message[:300]}" for e in jsonschema.Draft7Validator(board_schema).iter_errors(board)]
        for panel in _panels(board):
            kind = kinds[panel["type"]]
            errors += [f"{panel['title']} options: {e.message[:300]}" for e in _definition(kind, "Options").iter_errors(panel["options"])]
            custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
            if custom is not None:
                errors += [f"{panel['title']} custom: {e.message}" for e in _definition(kind, "FieldConfig").iter_errors(custom)]
            for target in panel.get("targets", []):
                errors += [f"{panel['title']} target: {e.message}" for e in query.iter_errors(target)]
        assert not errors, errors


def test_the_schema_check_refuses_a_broken_dashboard(spec: DashboardSpec) -> None:
    board = copy.deepcopy(dashboards(spec)["serving.json"])
    board["panels"][0]["gridPos"]["w"] = 30  # wider than the grid
    board["panels"][1]["titel"] = "typo"
    del board["templating"]
    def messages(errors) -> list[str]:  # with the errors of each branch of an anyOf (a panel or a row)
        return [m for e in errors for m in [e.message, *messages(e.context)]]

    messages = messages(jsonschema.Draft7Validator(_schema("dashboard")).iter_errors(board))
    assert any("templating" in m for m in messages) and any("titel" in m for m in messages) and any("30" in m for m in messages)


@pytest.mark.parametrize("name", FILES)
def test_the_datasource_is_a_template_variable(spec: DashboardSpec, name: str) -> None:
    board = dashboards(spec)[name]
    (var,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert (var["name"], var["query"]) == ("datasource", "prometheus")
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for panel in _panels(board):
        if panel["type"] == "text":
            assert "targets" not in panel
            continue
        assert panel["datasource"] == ref and panel["targets"], panel["title"]
        assert all(t["datasource"] == ref for t in panel["targets"]), panel["title"]
    assert "${datasource}" not in json.dumps([v for v in board["templating"]["list"] if v["type"] != "datasource"])


def test_uids_are_stable_unique_and_fit_grafanas_limit(spec: DashboardSpec) -> None:
    other = dataclasses.replace(spec, namespace="serving-b", served_model_name="other/model", ttft_p99_s=1.0, gpu_count=8)
    uids = {name: board["uid"] for name, board in dashboards(spec).items()}
    assert uids == {name: board["uid"] for name, board in dashboards(other).items()}
    assert len(set(uids.values())) == len(FILES) and all(re.fullmatch(r"[a-z0-9-]{1,40}", u) for u in uids.values())


@pytest.mark.parametrize("name", FILES)
def test_panels_have_unique_ids_and_do_not_overlap(spec: DashboardSpec, name: str) -> None:
    panels = dashboards(spec)[name]["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]


# --- promtool -------------------------------------------------------------------------


def _check(promtool: Path, tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess:
    """`promtool check rules` on one recording rule per query: Prometheus' parser judges each."""
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    return subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_every_query_parses_with_promtool(promtool: Path, spec: DashboardSpec, tmp_path: Path) -> None:
    exprs = sorted({_fill(e, _variables(board)) for v in _variants(spec) for board in dashboards(v).values() for e in _exprs(board)})
    assert len(exprs) > 50
    out = _check(promtool, tmp_path, exprs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in out.stdout


def test_promtool_refuses_a_broken_query(promtool: Path, tmp_path: Path) -> None:
    out = _check(promtool, tmp_path, ['sum(rate(vllm:num_preemptions_total{namespace="x"}[2m])'])
    assert out.returncode != 0 and "unclosed left parenthesis" in out.stdout + out.stderr


# --- metric names ---------------------------------------------------------------------


# vLLM 0.34.0 metrics that are never registered, or never move, without a flag (the rest always are).
# --enable-mfu-metrics: ObservabilityConfig.enable_mfu_metrics; v1/core/sched/scheduler.py builds ModelMetrics only
# with it; v1/metrics/perf.py's PerfMetricsProm registers the counters whatever the flag (loggers.py
# PrometheusStatLogger.__init__), so without it they are exported and stay at 0. --kv-cache-metrics: the block residency histograms of
# v1/metrics/loggers.py. A --speculative-config: v1/spec_decode/metrics.py. --enable-lora: loggers.py's LoRA gauge.
# VLLM_COMPUTE_NANS_IN_LOGITS=1: loggers.py's corrupted-requests counter.
NEEDS = {
    "vllm:estimated_flops_per_gpu_total": "--enable-mfu-metrics",
    "vllm:estimated_read_bytes_per_gpu_total": "--enable-mfu-metrics",
    "vllm:estimated_write_bytes_per_gpu_total": "--enable-mfu-metrics",
    "vllm:kv_block_lifetime_seconds": "--kv-cache-metrics",
    "vllm:kv_block_idle_before_evict_seconds": "--kv-cache-metrics",
    "vllm:kv_block_reuse_gap_seconds": "--kv-cache-metrics",
    "vllm:spec_decode_num_drafts": "--speculative-config",
    "vllm:spec_decode_num_draft_tokens": "--speculative-config",
    "vllm:spec_decode_num_accepted_tokens": "--speculative-config",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "--speculative-config",
    "vllm:lora_requests_info": "--enable-lora",
    "vllm:corrupted_requests": "VLLM_COMPUTE_NANS_IN_LOGITS=1",
}


def _vllm_metrics() -> dict[str, tuple[str, str]]:
    """vLLM 0.34.0's metrics as exported -> (declared name, the flag it needs or ""), from the wheel's extract
    (tests/fixtures/metrics/vllm-0.34.0.tsv) and NEEDS above."""
    out = {}
    for line in fixture_path("metrics", "vllm-0.34.0.tsv").read_text().splitlines():
        if line.startswith("#"):
            continue
        name, kind, _where = line.split("\t")
        exported = {"counter": [name.removesuffix("_total") + "_total"], "gauge": [name],
                    "histogram": [name + s for s in ("_bucket", "_sum", "_count")]}[kind]  # fmt: skip
        out |= {e: (name, NEEDS.get(name, "")) for e in exported}
    return out


def test_the_flagged_metrics_are_the_wheels():
    """Every metric NEEDS names is one the pinned wheel declares (a renamed one would otherwise pass unflagged)."""
    declared = {name for name, _ in _vllm_metrics().values()}
    assert set(NEEDS) <= declared, set(NEEDS) - declared


def _ksm_pod_metrics() -> set[str]:
    text = fixture_path("metrics", "dashboards", "kube-state-metrics-v2.20.0-pod-metrics.md").read_text()
    return set(re.findall(r"^\|\s*(kube_[a-z0-9_]+)\s*\|", text, re.MULTILINE))


def _dcgm(commented: bool) -> set[str]:
    (path,) = fixture_path("metrics").glob("dcgm-exporter-*-default-counters.csv")
    lines = [ln.lstrip("#").strip() if commented else ln for ln in path.read_text().splitlines()]
    rows = csv.reader(ln for ln in lines if ln.strip() and not ln.startswith("#") and "," in ln)
    return {row[0].strip() for row in rows if row[0].strip().startswith("DCGM_")}


def _names(board: dict) -> set[str]:
    return set().union(*(metric_names(_fill(e)) for e in _exprs(board)))


def test_every_metric_name_is_exported_by_a_pinned_source(spec: DashboardSpec) -> None:
    known = known_metrics() | set(_vllm_metrics()) | _ksm_pod_metrics()
    ours = {line.split(",")[0].strip() for line in dcgm_counters.exported_lines()}  # the stack's counters file
    for variant in _variants(spec):
        boards = dashboards(variant)
        used = set().union(*(_names(b) for b in boards.values()))
        optional = (ours & _dcgm(commented=True)) - _dcgm(commented=False) if variant.nvlink_error_counters else set()
        assert used - known - optional == set()
        # Without the counters file the GPU dashboard draws only what dcgm-exporter exports by default; with it,
        # only what the stack's file exports.
        dcgm = {n for n in _names(boards["gpus.json"]) if n.startswith("DCGM_")}
        beyond_defaults = dcgm - _dcgm(commented=False)
        assert bool(beyond_defaults) == variant.nvlink_error_counters, beyond_defaults
        assert dcgm <= (ours if variant.nvlink_error_counters else _dcgm(commented=False))


def test_the_dcgm_counters_file_is_the_default_one_plus_the_nvlink_errors() -> None:
    """infra/k8s/dcgm_counters.py against dcgm-exporter's etc/default-counters.csv (the fixture): every line the default
    file exports, verbatim and in order, and its four commented NVLink error lines uncommented, nothing else."""
    (path,) = fixture_path("metrics").glob("dcgm-exporter-*-default-counters.csv")
    upstream = path.read_text().splitlines()
    nvlink = {f: next(ln.lstrip("# ") for ln in upstream if ln.startswith(f"# {f},")) for f in dcgm_counters.NVLINK_ERROR_FIELDS}
    expected = [ln for ln in upstream if ln.strip() and not ln.startswith("#")]
    ours = dcgm_counters.exported_lines()
    assert [ln for ln in ours if ln not in nvlink.values()] == expected
    assert set(ours) - set(expected) == set(nvlink.values())
    assert {f for f, _ in NVLINK_ERRORS} == set(dcgm_counters.NVLINK_ERROR_FIELDS)
    # The GPU operator's values carry the file, as the chart's ConfigMap key reads it, and the dashboards know it.
    config = gpu_operator_values()["dcgmExporter"]["config"]
    assert config == {"name": dcgm_counters.CONFIG_MAP, "create": True, "data": dcgm_counters.COUNTERS}


def test_the_dashboards_use_the_metrics_the_issue_names(spec: DashboardSpec) -> None:
    boards = dashboards(spec)
    serving, plan, gpus, cluster = (_names(boards[f]) for f in FILES)
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket", "vllm:num_requests_waiting", "vllm:num_requests_running",
            "vllm:num_preemptions_total", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total"} <= serving
    assert not {n for n in plan if n.startswith("vllm:estimated_")}  # prod's plan does not pass --enable-mfu-metrics
    with_mfu = _names(dashboards(dataclasses.replace(spec, mfu_metrics=True, mfu_gap=""))["plan-vs-reality.json"])
    assert {"vllm:estimated_flops_per_gpu_total", "vllm:estimated_read_bytes_per_gpu_total"} <= with_mfu
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_XID_ERRORS"} <= gpus
    assert {"kube_node_status_condition", "kube_pod_container_status_restarts_total", "ray_resources",
            "ray_node_cpu_count"} <= cluster  # fmt: skip


def test_metrics_behind_a_flag_say_so(prod, spec: DashboardSpec) -> None:
    """The FLOPs and bytes counters need --enable-mfu-metrics: a dashboard queries them only when the plan passes it;
    the draft-acceptance counters need a --speculative-config: without MTP no panel asks for them."""
    flagged = {name: needs for name, (_, needs) in _vllm_metrics().items() if needs}
    for variant in _variants(spec):
        for board in dashboards(variant).values():
            for panel in _panels(board):
                needs = {flagged[n] for t in panel.get("targets", []) for n in metric_names(_fill(t["expr"])) if n in flagged}
                if "--enable-mfu-metrics" in needs:
                    assert variant.mfu_metrics, panel["title"]
                if "--speculative-config" in needs:
                    assert variant.speculative_tokens, panel["title"]
    assert any("spec_decode" in n for n in _names(dashboards(spec)["serving.json"]))  # prod plans MTP


def _roofline_panels(board: dict) -> list[dict]:
    rows = [i for i, p in enumerate(board["panels"]) if p["type"] == "row"]
    start = next(i for i in rows if board["panels"][i]["title"].startswith("Roofline"))
    return board["panels"][start + 1 : next((i for i in rows if i > start), None)]


def test_prods_roofline_says_why_it_is_not_measured(prod, spec: DashboardSpec) -> None:
    """prod serves DeepSeek-V4-Pro, which vLLM 0.34.0's estimator does not cover (infra/planning/serving.py
    mfu_metrics_gap, checked against the wheel in tests/test_mfu_metrics.py): its plan leaves --enable-mfu-metrics out,
    and the roofline row is one text panel with that reason instead of counters that would read 0."""
    _config, plan = prod
    assert "--enable-mfu-metrics" not in plan.serving_args and not spec.mfu_metrics
    assert "DeepSeek-V4" in spec.mfu_gap and "LM head alone" in spec.mfu_gap
    (panel,) = _roofline_panels(dashboards(spec)["plan-vs-reality.json"])
    assert panel["type"] == "text" and spec.mfu_gap in panel["options"]["content"]
    assert "--enable-mfu-metrics" in panel["options"]["content"] and "stay at 0" in panel["options"]["content"]


def test_a_plan_that_passes_the_flag_draws_the_roofline() -> None:
    """The test stack (qwen3-0.6b on one g6e.xlarge: a dense GQA model, unquantised, no MTP, no data parallel) passes
    --enable-mfu-metrics; its roofline draws the wheel's counters against the L40S's peaks, and names the estimate."""
    config = load_stack_file("test")
    plan = make_plan(config.plan_request())
    assert "--enable-mfu-metrics" in plan.serving_args
    spec = dashboard_spec_from(config, plan)
    assert spec.mfu_metrics and spec.mfu_gap == ""
    board = dashboards(spec)["plan-vs-reality.json"]
    panels = _roofline_panels(board)
    assert [p["type"] for p in panels] == ["timeseries", "timeseries", "stat", "stat"]
    used = set().union(*(metric_names(_fill(t["expr"])) for p in panels for t in p["targets"]))
    flagged = {name for name, (_, needs) in _vllm_metrics().items() if needs == "--enable-mfu-metrics"}
    assert {"vllm:estimated_flops_per_gpu_total", "vllm:estimated_read_bytes_per_gpu_total",
            "vllm:estimated_write_bytes_per_gpu_total"} == used <= flagged  # fmt: skip
    assert all("v1/metrics/perf.py" in p["description"] for p in panels)
    gpu = get_instance_type(config.gpu.instance_type).gpu
    assert _lines(_panel(board, "vllm:estimated_read_bytes_per_gpu_total")) == [gpu.hbm_bandwidth_bytes_per_s]


# --- the stack's figures --------------------------------------------------------------


def _sla_lines(board: dict) -> dict[str, list[float]]:
    return {m: _lines(_panel(board, f"vllm:{m}_bucket")) for m in
            ("time_to_first_token_seconds", "request_time_per_output_token_seconds", "inter_token_latency_seconds")}


def test_the_sla_lines_are_the_prod_stack_configs(prod, spec: DashboardSpec) -> None:
    config, _plan = prod
    sla = yaml_text.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:serving"]["sla"]
    assert (sla["ttftP99Ms"], sla["tpotP99Ms"]) == (config.serving.sla.ttft_p99_ms, config.serving.sla.tpot_p99_ms)
    lines = _sla_lines(dashboards(spec)["serving.json"])
    assert lines == {"time_to_first_token_seconds": [sla["ttftP99Ms"] / 1000],
                     "request_time_per_output_token_seconds": [sla["tpotP99Ms"] / 1000],
                     "inter_token_latency_seconds": []}  # fmt: skip
    ttft_stat = _panel(dashboards(spec)["serving.json"], "vllm:time_to_first_token_seconds_bucket", "stat")
    assert _lines(ttft_stat) == [sla["ttftP99Ms"] / 1000]


def _stack_with_sla(tmp_path: Path, sla: dict):
    doc = yaml_text.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())
    doc["config"]["gpu-serving:serving"]["sla"] = sla
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(REPO_ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    return load_stack_file("prod", root=tmp_path)


def test_a_changed_sla_moves_the_lines(prod, tmp_path: Path) -> None:
    _config, plan = prod
    changed = _stack_with_sla(tmp_path, {"ttftP99Ms": 500, "tpotP99Ms": 80, "itlP99Ms": 60})
    board = dashboards(dashboard_spec_from(changed, plan))["serving.json"]
    assert _sla_lines(board) == {"time_to_first_token_seconds": [0.5], "request_time_per_output_token_seconds": [0.08],
                                 "inter_token_latency_seconds": [0.06]}  # fmt: skip


def test_the_plan_lines_are_the_prod_plans(prod, spec: DashboardSpec) -> None:
    config, plan = prod
    doc = plan.to_json_dict()  # what `bin/plan` prints and the stack exports as `plan`
    cap = doc["performance"]["sla_capacity"]
    work = doc["performance"]["workload"]
    board = dashboards(spec)["plan-vs-reality.json"]
    assert _lines(_panel(board, "vllm:generation_tokens_total")) == [cap["output_tokens_per_s"]]
    assert _lines(_panel(board, "vllm:prompt_tokens_total")) == [cap["input_tokens_per_s"]]
    assert _lines(_panel(board, "vllm:request_success_total")) == [cap["requests_per_s"]]
    in_engine = [p for p in _panels(board) if p["type"] == "timeseries" and _uses(p, "vllm:num_requests_waiting")]
    assert [_lines(p) for p in in_engine] == [[cap["concurrency"]]]
    assert sorted(_lines(_panel(board, "vllm:time_to_first_token_seconds_bucket"))) == sorted(
        [cap["ttft_ms"]["p99"] / 1000, config.serving.sla.ttft_p99_ms / 1000])
    assert sorted(_lines(_panel(board, "vllm:request_time_per_output_token_seconds_bucket"))) == sorted(
        [cap["tpot_ms"]["p99"] / 1000, config.serving.sla.tpot_p99_ms / 1000])
    assert _lines(_panel(board, "vllm:request_prompt_tokens_sum")) == [work["input_tokens"]]
    assert _lines(_panel(board, "vllm:request_generation_tokens_sum")) == [work["output_tokens"]]
    assert _lines(_panel(board, "vllm:prefix_cache_hits_total")) == [work["prefix_cache_hit_rate"]]
    ratio = _panel(board, "vllm:generation_tokens_total", "stat")["targets"][0]["expr"]
    assert ratio.endswith(f"/ {cap['output_tokens_per_s']!r}")


def test_the_roofline_is_the_catalog_gpus(prod, spec: DashboardSpec) -> None:
    config, _plan = prod
    gpu = get_instance_type(config.gpu.instance_type).gpu  # p5.48xlarge: H100 SXM
    # prod's plan leaves --enable-mfu-metrics out (test_prods_roofline_says_why_it_is_not_measured): drawn as if passed.
    board = dashboards(dataclasses.replace(spec, mfu_metrics=True, mfu_gap=""))["plan-vs-reality.json"]
    assert _lines(_panel(board, "vllm:estimated_flops_per_gpu_total")) == [gpu.bf16_dense_tflops * 1e12, gpu.fp8_dense_tflops * 1e12]
    assert _lines(_panel(board, "vllm:estimated_read_bytes_per_gpu_total")) == [gpu.hbm_bandwidth_bytes_per_s]
    hbm = _panel(board, "vllm:estimated_read_bytes_per_gpu_total", "stat")["targets"][0]["expr"]
    assert hbm.endswith(f"/ {gpu.hbm_bandwidth_bytes_per_s!r}")


def test_the_names_and_counts_are_the_stacks(prod, spec: DashboardSpec) -> None:
    config, plan = prod
    deployment = plan.deployment()
    default_raycluster = next(f.default for f in dataclasses.fields(ServingSpec) if f.name == "name")
    for board in dashboards(spec).values():
        assert _variables(board) == {"namespace": config.serving.namespace, "model_name": deployment.serve.checkpoint,
                                     "ray_cluster": default_raycluster}  # fmt: skip
    cluster = dashboards(spec)["cluster.json"]
    gpus = deployment.nodes.count * deployment.nodes.gpus_per_node
    assert (gpus, deployment.nodes.count) == (32, 4)  # Pulumi.prod.yaml: 4 x p5.48xlarge
    assert _lines(_panel(cluster, "ray_resources", "stat")) == [gpus]
    assert _lines(_panel(cluster, "ray_node_cpu_count", "stat")) == [deployment.nodes.count]
    assert _lines(_panel(cluster, "kube_node_status_capacity", "stat")) == [deployment.nodes.count]
    assert _lines(_panel(dashboards(spec)["gpus.json"], "DCGM_FI_DEV_FB_FREE")) == [plan.knobs.gpu_memory_utilization]


# --- EFA: what node exporter reads of it ----------------------------------------------


def _efa_fixture(name: str) -> str:
    return fixture_path("metrics", "efa", name).read_text()


def _collector() -> str:
    return fixture_path("metrics", "node_exporter-v1.12.1-infiniband_linux.go").read_text()


def _efa_driver_stats() -> set[str]:
    """The EFA driver's hw_counters names (efa_verbs.c, amzn-drivers efa_linux_3.1.0): port and device stats."""
    return set(re.findall(r'op\(EFA_\w+, "(\w+)"\)', _efa_fixture("efa-linux-3.1.0-efa_verbs-stats.c")))


def _procfs_hw_counter_names() -> set[str]:
    """The hw_counters files prometheus/procfs v0.21.1 reads (parseInfiniBandHwCounters' cases); others are skipped."""
    source = _efa_fixture("procfs-v0.21.1-class_infiniband.go")
    body = source[source.index("func parseInfiniBandHwCounters"):]
    return set(re.findall(r'case "(\w+)":', body))


def _metrics_without_counters() -> set[str]:
    """The collector's metrics that need neither a port's PMA `counters` nor its `hw_counters` (pushMetric or the info
    series, not pushCounter of port.Counters / port.HwCounters)."""
    source = _collector()
    names = set(re.findall(r'c\.pushMetric\(ch, "(\w+)", (?:uint64\()?port\.(?:StateID|PhysStateID|Rate)', source))
    names |= set(re.findall(r'BuildFQName\(namespace, c\.subsystem, "(\w+)"\)', source))
    return {f"node_infiniband_{n}" for n in names}


def _efa_panels(board: dict) -> list[dict]:
    out, inside = [], False
    for panel in board["panels"]:
        if panel["type"] == "row":
            inside = panel["title"].startswith("EFA")
        elif inside:
            out.append(panel)
    return out


def test_the_efa_driver_counters_are_not_what_node_exporter_reads() -> None:
    """The gap the dashboard states: EFA's traffic and error counters reach no exporter the stack runs.

    - EFA registers no `process_mad` (efa_main.c `efa_dev_ops`), so the kernel makes no PMA `counters` directory for its
      ports (drivers/infiniband/core/sysfs.c: the counters group only `if (device->ops.process_mad && ...)`);
    - its `hw_counters` are named tx_bytes, rdma_read_bytes, retrans_pkts, ...: procfs reads none of those names.
    """
    assert ".process_mad" not in _efa_fixture("efa-linux-3.1.0-efa_main-dev_ops.c")
    assert ".alloc_hw_port_stats" in _efa_fixture("efa-linux-3.1.0-efa_main-dev_ops.c")
    stats = _efa_driver_stats()
    assert {"tx_bytes", "rx_bytes", "rdma_read_bytes", "rdma_write_bytes", "retrans_pkts", "rx_drops"} <= stats
    read = _procfs_hw_counter_names()
    assert {"duplicate_request", "out_of_sequence", "rx_read_requests"} <= read  # mlx5's
    assert stats & read == set()


def test_node_exporter_reads_the_efa_devices_on_the_gpu_nodes() -> None:
    """node_exporter 1.12.1's infiniband collector is on by default, reads the host's /sys, and its DaemonSet runs on the
    GPU nodes with the stack's values (kube-prometheus-stack 88.5.3, prometheus-node-exporter 4.56.1)."""
    assert re.search(r'registerCollector\("infiniband", defaultEnabled,', _collector())
    daemonset = _efa_fixture("prometheus-node-exporter-4.56.1-daemonset.yaml")
    assert "- --path.sysfs=/host/sys" in daemonset
    assert re.search(r"- name: sys\n\s+mountPath: /host/sys\n", daemonset)
    assert re.search(r"- name: sys\n\s+hostPath:\n\s+path: /sys\n", daemonset)
    ours = mon.kube_prometheus_stack_values(Sizing(100_000, 1024, 20, 17), 15, "grafana-admin").get("prometheus-node-exporter", {})
    stack = yaml_text.safe_load(fixture_path("upstream", "kube-prometheus-stack-88.5.3", "values.yaml").read_text())["prometheus-node-exporter"]
    chart = yaml_text.safe_load(fixture_path("upstream", "kube-prometheus-stack-88.5.3", "prometheus-node-exporter-values.yaml").read_text())
    args = ours.get("extraArgs", stack.get("extraArgs", chart["extraArgs"]))
    assert not [a for a in args if "infiniband" in a], args
    tolerations = ours.get("tolerations", stack.get("tolerations", chart["tolerations"]))
    for taint in gpu_taints():
        effect = TAINT_EFFECTS[taint["effect"]]
        assert any(t.get("effect") in (None, effect) and (
            (t.get("operator") == "Exists" and t.get("key") in (None, taint["key"]))
            or (t.get("key"), t.get("value")) == (taint["key"], taint["value"])) for t in tolerations), tolerations


def test_the_efa_panels_draw_what_node_exporter_exports_for_efa(spec: DashboardSpec) -> None:
    board = dashboards(spec)["gpus.json"]
    panels = _efa_panels(board)
    names = set().union(*(metric_names(_fill(t["expr"])) for p in panels for t in p.get("targets", [])))
    assert names == {"node_infiniband_info"}
    assert names <= _metrics_without_counters() <= known_metrics()
    # The counters the text names are the EFA driver's.
    (note,) = [p for p in panels if p["type"] == "text"]
    named = set(re.findall(r"`([a-z_]+)`", note["options"]["content"]))
    assert {"tx_bytes", "rdma_read_bytes", "retrans_pkts"} <= named and named - {"counters", "hw_counters"} <= _efa_driver_stats()
    # Without EFA there is no EFA row.
    assert _efa_panels(dashboards(dataclasses.replace(spec, efa_devices_per_node=0))["gpus.json"]) == []


def test_the_efa_device_count_is_the_gpu_nodes_interfaces(prod, spec: DashboardSpec) -> None:
    config, plan = prod
    itype = get_instance_type(config.gpu.instance_type)
    interfaces = efa_interface_count(efa_interfaces(itype, ["sg-efa", "sg-cluster"]))  # what the launch template attaches
    assert spec.efa_devices_per_node == interfaces == 32
    board = dashboards(spec)["gpus.json"]
    (stat_panel,) = [p for p in _efa_panels(board) if p["type"] == "stat"]
    assert stat_panel["targets"][0]["expr"].startswith("count(count by (instance) (node_infiniband_info) >= 32)")
    assert _lines(stat_panel) == [plan.nodes]
    (series,) = [p for p in _efa_panels(board) if p["type"] == "timeseries"]
    assert _lines(series) == [interfaces]

