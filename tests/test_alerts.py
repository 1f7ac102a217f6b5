"""The serving alerts (infra/monitoring/alerts.py) judged by Prometheus' own promtool.

`promtool check rules` on prod's generated rule file; `promtool test rules` with input
series for every alert, one case that crosses the threshold for longer than its
`for:` (and is still pending before that) and one that stays under it or not long
enough; the SLA in the rules is the stack file's, through the config loader, and a
changed SLA changes what fires; every metric name of every expression is one the
pinned exporters expose (tests/metric_names.py, tests/fixtures/metrics/).

promtool is Debian's, at .tools/bin/promtool, put there by `bin/install-promtool`
(bin/test runs it; no test installs it). Missing, its tests fail under CI=true and
skip otherwise.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.config import load_stack_file
from infra.monitoring.alerts import AlertSpec, prometheus_rule_groups, rule_file
from infra.planning.plan import make_plan
from tests.conftest import REPO_ROOT
from tests.metric_names import known_metrics, metric_names
from tests import yaml_text

NS, MODEL, JOB = "gpu-serving", "deepseek-ai/DeepSeek-V4-Pro", "gpu-serving/vllm"
VLLM = f'namespace="{NS}", model_name="{MODEL}", engine="0"'


@pytest.fixture(scope="module")
def prod() -> AlertSpec:
    config = load_stack_file("prod")
    return AlertSpec.from_stack(config, make_plan(config.plan_request()).deployment())


def _rules(spec: AlertSpec) -> dict[str, dict]:
    return {rule["alert"]: rule for group in prometheus_rule_groups(spec) for rule in group["rules"]}


def _render(text: str, labels: dict[str, str], value: str) -> str:
    text = text.replace("{{ $value }}", value)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def _minutes(duration: str) -> int:
    assert re.fullmatch(r"\d+m", duration), duration
    return int(duration[:-1])


def _promtool_test(promtool: Path, tmp_path: Path, spec: AlertSpec, tests: list[dict]) -> subprocess.CompletedProcess:
    (tmp_path / "rules.yaml").write_text(rule_file(spec))
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([str(promtool), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)


# name -> (input series that fire, input series that do not, the alerts' labels, $value of the firing alert).
# Series are sampled every 30 s for 40 minutes ('a+bxN': start at a, add b N times).
STEPS = 80
HIST_TTFT_OVER = {"0.1": 90, "0.25": 95, "0.5": 100, "+Inf": 100}  # 5% of requests above 250 ms
HIST_TTFT_UNDER = {"0.1": 90, "0.25": 100, "0.5": 100, "+Inf": 100}  # p99 interpolates to 235 ms
HIST_TPOT_OVER = {"0.025": 90, "0.05": 95, "0.075": 100, "+Inf": 100}  # 5% above 50 ms
HIST_TPOT_UNDER = {"0.025": 98, "0.05": 100, "0.075": 100, "+Inf": 100}  # p99 interpolates to 37.5 ms


def _histogram(name: str, per_step: dict[str, int]) -> list[dict]:
    return [{"series": f'{name}_bucket{{{VLLM}, le="{le}"}}', "values": f"0+{n}x{STEPS}"} for le, n in per_step.items()]


def _flat(series: str, value: str) -> dict:
    return {"series": series, "values": f"{value}x{STEPS}"}


UP = f'up{{namespace="{NS}", job="{JOB}", endpoint="http", pod="vllm-head-x7k2p"}}'
NODE_READY = 'kube_node_status_condition{node="ip-10-0-1-5", condition="Ready", status="true"}'
XID = 'DCGM_FI_DEV_XID_ERRORS{gpu="3", UUID="GPU-36e1567d", instance="10.0.1.5:9400"}'
SLA_LABELS = {"namespace": NS, "model_name": MODEL}


def _ray(gpus_per_pod: list[int]) -> list[dict]:
    return [_flat(f'ray_resources{{Name="GPU", State="USED", namespace="{NS}", job="{JOB}", pod="vllm-{i}"}}', str(n))
            for i, n in enumerate(gpus_per_pod)]  # fmt: skip


# node exporter's series carry its target's pod (the ServiceMonitor's labels), kube-state-metrics' the pod's node.
NODE_EXPORTER_POD = 'namespace="monitoring", pod="kube-prometheus-stack-prometheus-node-exporter-4xq8d"'
GPU_CAPACITY = 'kube_node_status_capacity{node="ip-10-0-1-5", resource="nvidia_com_gpu", unit="integer"}'


def _efa(devices: int, gpus: str = "8") -> list[dict]:
    """A node's EFA devices as node exporter's infiniband collector exports them, and the joins the alert reads."""
    info = [_flat(f'node_infiniband_info{{{NODE_EXPORTER_POD}, job="node-exporter", instance="10.0.1.5:9100", '
                  f'device="rdmap{i}s0", board_id="EFA-E2", firmware_version="0.0.0.0", hca_type="efa"}}', "1")
            for i in range(devices)]  # fmt: skip
    node = _flat(f'kube_pod_info{{{NODE_EXPORTER_POD}, node="ip-10-0-1-5", host_ip="10.0.1.5", job="kube-state-metrics"}}', "1")
    capacity = _flat(GPU_CAPACITY if gpus else GPU_CAPACITY.replace("nvidia_com_gpu", "cpu"), gpus or "4")
    return info + [node, capacity]


CASES: dict[str, tuple[list[dict], list[dict], list[dict], str]] = {
    "ServingTtftP99AboveSla": (
        _histogram("vllm:time_to_first_token_seconds", HIST_TTFT_OVER),
        _histogram("vllm:time_to_first_token_seconds", HIST_TTFT_UNDER),
        [SLA_LABELS], "",
    ),
    "ServingTpotP99AboveSla": (
        _histogram("vllm:request_time_per_output_token_seconds", HIST_TPOT_OVER),
        _histogram("vllm:request_time_per_output_token_seconds", HIST_TPOT_UNDER),
        [SLA_LABELS], "",
    ),
    "ServingKvCacheFull": (  # full with a queue; full with nobody waiting is the engine at work
        [_flat(f"vllm:kv_cache_usage_perc{{{VLLM}}}", "0.97"), _flat(f"vllm:num_requests_waiting{{{VLLM}}}", "3")],
        [_flat(f"vllm:kv_cache_usage_perc{{{VLLM}}}", "0.97"), _flat(f"vllm:num_requests_waiting{{{VLLM}}}", "0")],
        [{**SLA_LABELS, "engine": "0"}], "",
    ),
    "ServingPreemptions": (  # steady preemptions, against one burst that stops
        [{"series": f"vllm:num_preemptions_total{{{VLLM}}}", "values": f"0+2x{STEPS}"}],
        [{"series": f"vllm:num_preemptions_total{{{VLLM}}}", "values": f"0x10 5x{STEPS - 10}"}],
        [SLA_LABELS], "",
    ),
    "ServingEngineDown": (  # the target down and vLLM's series gone, against a healthy target
        [_flat(UP, "0")],
        [_flat(UP, "1"), _flat(f"vllm:num_requests_running{{{VLLM}}}", "4")],
        [{"namespace": NS, "job": JOB, "endpoint": "http", "pod": "vllm-head-x7k2p"}, {"namespace": NS, "model_name": MODEL}],
        "",
    ),
    "RayGpusBelowPlan": (_ray([8, 8, 8]), _ray([8, 8, 8, 8]), [{}], ""),  # 3 of prod's 4 nodes, against all 4
    "GpuXidError": (
        [{"series": XID, "values": f"0x10 79x{STEPS - 10}"}],
        [_flat(XID, "0")],
        [{"gpu": "3", "UUID": "GPU-36e1567d", "instance": "10.0.1.5:9400"}], "79",
    ),
    "GpuNodeEfaDevicesMissing": (  # a p5.48xlarge node showing 31 of its 32 EFA devices, against all 32
        _efa(31), _efa(32), [{"node": "ip-10-0-1-5"}], "31",
    ),
    "GpuNodeNotReady": (  # a GPU node down, against a system node (no nvidia.com/gpu) down
        [_flat(NODE_READY, "0"), _flat('kube_node_status_capacity{node="ip-10-0-1-5", resource="nvidia_com_gpu", unit="integer"}', "8")],
        [_flat(NODE_READY, "0"), _flat('kube_node_status_capacity{node="ip-10-0-1-5", resource="cpu", unit="core"}', "4")],
        [{"node": "ip-10-0-1-5", "condition": "Ready", "status": "true"}], "",
    ),
}


def _alerts(rule: dict, labels: list[dict], value: str) -> list[dict]:
    severity = rule["labels"]["severity"]
    return [{"exp_labels": {**lab, "severity": severity},
             "exp_annotations": {k: _render(v, lab, value) for k, v in rule["annotations"].items()}} for lab in labels]  # fmt: skip


def _cases(spec: AlertSpec, name: str) -> list[dict]:
    firing, quiet, labels, value = CASES[name]
    rule = _rules(spec)[name]
    hold = _minutes(rule["for"])
    late = "35m"  # past every `for:` and window
    checks = [{"eval_time": late, "alertname": name, "exp_alerts": _alerts(rule, labels, value)}]
    if hold >= 2:  # crossed, but not yet for long enough: pending, not firing
        checks.append({"eval_time": f"{hold - 1}m", "alertname": name, "exp_alerts": []})
    return [
        {"interval": "30s", "input_series": firing, "alert_rule_test": checks},
        {"interval": "30s", "input_series": quiet, "alert_rule_test": [{"eval_time": late, "alertname": name, "exp_alerts": []}]},
    ]


def test_prod_rules_pass_promtool_check(promtool: Path, prod: AlertSpec, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rule_file(prod))
    out = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_rules(prod))} rules found" in out.stdout


def test_every_alert_has_a_case() -> None:
    spec = AlertSpec(namespace=NS, raycluster="vllm", served_model_name=MODEL, ttft_p99_s=0.25, tpot_p99_s=0.04, gpus=32, nodes=4,
                     efa_devices=32)  # fmt: skip
    assert set(_rules(spec)) == set(CASES)


# --- the EFA devices alert: only on EFA instance types ----------------------------


def test_the_efa_alert_counts_the_plans_interfaces_and_only_where_there_are_some(prod: AlertSpec) -> None:
    import dataclasses

    from infra.catalog.instances import get_instance_type

    config = load_stack_file("prod")
    assert prod.efa_devices == get_instance_type(config.gpu.instance_type).max_efa_interfaces == 32  # p5.48xlarge
    rule = _rules(prod)["GpuNodeEfaDevicesMissing"]
    assert "< 32\n" in rule["expr"] and rule["for"] == "10m"
    assert rule["annotations"]["runbook"].startswith("kubectl get node {{ $labels.node }}")
    assert "TCP" in rule["annotations"]["description"] and "fewer rails" in rule["annotations"]["description"]
    assert "GpuNodeEfaDevicesMissing" not in _rules(dataclasses.replace(prod, efa_devices=0))  # no EFA: no alert


@pytest.mark.parametrize(
    "series, fires",
    [
        (_efa(0), True),  # a GPU node whose kernel shows no EFA device has no node_infiniband_info at all: 0
        (_efa(0, gpus=""), False),  # a system node (no nvidia.com/gpu) without EFA is not a GPU node
        (_efa(33), False),  # more than the plan expects is not fewer
    ],
    ids=["gpu-node-without-any", "system-node", "more"],
)
def test_the_efa_alert_on_a_node_with_none_and_not_on_system_nodes(promtool: Path, prod: AlertSpec, tmp_path: Path, series, fires) -> None:
    name = "GpuNodeEfaDevicesMissing"
    expected = _alerts(_rules(prod)[name], [{"node": "ip-10-0-1-5"}], "0") if fires else []
    case = {"interval": "30s", "input_series": series, "alert_rule_test": [{"eval_time": "35m", "alertname": name, "exp_alerts": expected}]}
    out = _promtool_test(promtool, tmp_path, prod, [case])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", sorted(CASES))
def test_alert_fires_past_its_threshold_and_for_and_not_under(promtool: Path, prod: AlertSpec, tmp_path: Path, name: str) -> None:
    out = _promtool_test(promtool, tmp_path, prod, _cases(prod, name))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rayless_cluster_counts_as_no_gpus(promtool: Path, prod: AlertSpec, tmp_path: Path) -> None:
    rule = _rules(prod)["RayGpusBelowPlan"]
    case = {"interval": "30s", "input_series": [_flat(UP, "1")],
            "alert_rule_test": [{"eval_time": "35m", "alertname": "RayGpusBelowPlan", "exp_alerts": _alerts(rule, [{}], "")}]}  # fmt: skip
    out = _promtool_test(promtool, tmp_path, prod, [case])
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_rules_hold_the_stack_files_sla(prod: AlertSpec) -> None:
    sla = load_stack_file("prod").serving.sla
    rules = _rules(prod)
    threshold = {name: float(rules[name]["expr"].rsplit(">", 1)[1]) for name in ("ServingTtftP99AboveSla", "ServingTpotP99AboveSla")}
    assert threshold == {"ServingTtftP99AboveSla": sla.ttft_p99_ms / 1000, "ServingTpotP99AboveSla": sla.tpot_p99_ms / 1000}
    assert threshold == {"ServingTtftP99AboveSla": 0.25, "ServingTpotP99AboveSla": 0.04}  # Pulumi.prod.yaml today
    assert "for: 13m" in rule_file(prod)  # coldStartTargetSeconds 750, rounded up to minutes
    assert f'(sum(ray_resources{{Name="GPU", namespace="{NS}", job="{JOB}"}}) or vector(0)) < 32' == rules["RayGpusBelowPlan"]["expr"]


def _stack_with_sla(tmp_path: Path, ttft_ms: int, tpot_ms: int):
    doc = yaml_text.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())
    doc["config"]["gpu-serving:serving"]["sla"] = {"ttftP99Ms": ttft_ms, "tpotP99Ms": tpot_ms}
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(REPO_ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    return load_stack_file("prod", root=tmp_path)


def test_a_changed_sla_changes_the_rules_and_what_fires(promtool: Path, prod: AlertSpec, tmp_path: Path) -> None:
    """TTFT p99 of the 'over' series is 450 ms: above prod's 250 ms, under a 500 ms SLA; TPOT's at 70 ms: above 40 ms, under 80 ms."""
    config = _stack_with_sla(tmp_path, 500, 80)
    relaxed = AlertSpec.from_stack(config, make_plan(load_stack_file("prod").plan_request()).deployment())
    assert (relaxed.ttft_p99_s, relaxed.tpot_p99_s) == (0.5, 0.08)
    changed = _rules(relaxed)
    assert changed["ServingTtftP99AboveSla"]["expr"].endswith("> 0.5")
    assert changed["ServingTpotP99AboveSla"]["expr"].endswith("> 0.08")
    for name in ("ServingTtftP99AboveSla", "ServingTpotP99AboveSla"):
        quiet = {"interval": "30s", "input_series": CASES[name][0],
                 "alert_rule_test": [{"eval_time": "35m", "alertname": name, "exp_alerts": []}]}  # fmt: skip
        out = _promtool_test(promtool, tmp_path, relaxed, [quiet])
        assert out.returncode == 0, out.stdout + out.stderr
        assert _promtool_test(promtool, tmp_path, prod, [quiet]).returncode != 0  # the same series fire under prod's SLA


def test_an_itl_sla_adds_its_alert(prod: AlertSpec) -> None:
    import dataclasses

    rules = _rules(dataclasses.replace(prod, itl_p99_s=0.05))
    assert "vllm:inter_token_latency_seconds_bucket" in rules["ServingItlP99AboveSla"]["expr"]
    assert "ServingItlP99AboveSla" not in _rules(prod)


def test_every_metric_in_every_expression_is_exported_by_a_pinned_source(prod: AlertSpec) -> None:
    used = set().union(*(metric_names(rule["expr"]) for rule in _rules(prod).values()))
    assert {"vllm:time_to_first_token_seconds_bucket", "ray_resources", "DCGM_FI_DEV_XID_ERRORS", "up"} <= used
    assert used - known_metrics() == set()


def test_a_bad_duration_is_refused() -> None:
    from infra.errors import UserError

    with pytest.raises(UserError, match="burn_window"):
        AlertSpec(namespace=NS, raycluster="vllm", served_model_name=MODEL, ttft_p99_s=0.25, tpot_p99_s=0.04, gpus=32, nodes=4, burn_window="10 minutes")


# --- the metric-name lexer (tests/metric_names.py) -------------------------------
@pytest.mark.parametrize(
    "expr, names",
    [
        ('histogram_quantile(0.99, sum by (le) (rate(vllm:x_bucket{model_name="a/b", le=~".+"}[10m])))', {"vllm:x_bucket"}),
        ("sum without (instance) (a) / on (node) group_left (pod) b offset 1h30m > bool 1e3", {"a", "b"}),
        ('max_over_time(c[5m:30s]) or absent(d{x="{not a name}"}) unless count(e) > 0x1f', {"c", "d", "e"}),
        ("(sum(f) or vector(0)) < 32 and\n# a comment g\nh", {"f", "h"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}),
    ],
)
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_fixtures_know_the_names_the_alerts_need_and_not_others() -> None:
    known = known_metrics()
    assert {"vllm:num_preemptions_total", "vllm:kv_cache_usage_perc", "kube_node_status_condition"} <= known
    assert "vllm:num_preemptions" not in known  # a counter is exposed with _total
    assert "vllm:time_to_first_token_seconds" not in known  # a histogram only as _bucket, _sum, _count
    assert "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" not in known  # commented out in the default counters


def test_the_engine_down_alert_selects_the_pod_monitors_vllm_endpoint():
    """prometheus-operator labels a PodMonitor target `endpoint=<podMetricsEndpoints[].port>`: the alert's
    `endpoint` must be the port the serving PodMonitor scrapes vLLM on (infra/k8s/exposure.py)."""
    from infra.k8s import exposure
    from infra.monitoring import alerts
    from tests.test_rayspec import make_spec, stack_plan

    spec = make_spec(stack_plan("prod"))
    monitor = exposure.pod_monitor(spec)
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == alerts.VLLM_PORT_NAME
    # and `job` is `<namespace>/<PodMonitor name>` (ASSUMPTION, prometheus-operator's default job label):
    rule_spec = alerts.AlertSpec.from_stack(load_stack_file("prod"), make_plan(load_stack_file("prod").plan_request()).deployment(),
                                            raycluster=spec.name)  # fmt: skip
    assert rule_spec.job == f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"


# --- the SLA alerts' window and `for:` from gpu-serving:monitoring.alerts (issue 20 item 4) ------------------------


def _stack_with_alerts(tmp_path: Path, **alerts: str):
    doc = yaml_text.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())
    doc["config"]["gpu-serving:monitoring"] = {"alerts": alerts}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(REPO_ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    config = load_stack_file("prod", root=tmp_path)
    return AlertSpec.from_stack(config, make_plan(config.plan_request()).deployment())


def _burst(name: str, over: dict[str, int], under: dict[str, int], steps_over: int) -> list[dict]:
    """A histogram with `over`'s per-step counts for `steps_over` scrapes, then `under`'s (cumulative counters)."""
    return [{"series": f'{name}_bucket{{{VLLM}, le="{le}"}}',
             "values": f"0+{over[le]}x{steps_over} {over[le] * steps_over}+{under[le]}x{STEPS - steps_over}"} for le in over]  # fmt: skip


def test_the_sla_window_and_for_are_the_configs(tmp_path: Path, prod: AlertSpec) -> None:
    assert (prod.burn_window, prod.burn_for) == ("10m", "10m")  # the defaults, prod's stack file names neither
    spec = _stack_with_alerts(tmp_path, slaWindow="2m", slaFor="5m")
    for name in ("ServingTtftP99AboveSla", "ServingTpotP99AboveSla"):
        rule = _rules(spec)[name]
        assert "[2m]" in rule["expr"] and "[10m]" not in rule["expr"] and rule["for"] == "5m"
        assert "for 5m" in rule["annotations"]["description"] and "last 2m" in rule["annotations"]["description"]
    assert _rules(spec)["ServingKvCacheFull"]["for"] == _rules(prod)["ServingKvCacheFull"]["for"]  # the others keep theirs


@pytest.mark.parametrize("name", ["ServingTtftP99AboveSla", "ServingTpotP99AboveSla"])
def test_a_configured_window_and_for_pass_promtool_firing_and_quiet(promtool: Path, tmp_path: Path, name: str) -> None:
    spec = _stack_with_alerts(tmp_path, slaWindow="2m", slaFor="5m")
    out = _promtool_test(promtool, tmp_path, spec, _cases(spec, name))  # fires by 35m, pending at 4m; the quiet never
    assert out.returncode == 0, out.stdout + out.stderr


def test_for_decides_whether_a_burst_of_slow_requests_pages(promtool: Path, tmp_path: Path) -> None:
    """Seven minutes of slow first tokens, then fast ones: over a 2m window the p99 is above the SLA for about 8.5
    minutes, so a 5m `for:` pages at 8m and a 10m one never does."""
    name = "ServingTtftP99AboveSla"
    burst = _burst("vllm:time_to_first_token_seconds", HIST_TTFT_OVER, HIST_TTFT_UNDER, steps_over=14)
    short, long_ = _stack_with_alerts(tmp_path / "a", slaWindow="2m", slaFor="5m"), _stack_with_alerts(tmp_path / "b", slaWindow="2m", slaFor="10m")
    fires = {"interval": "30s", "input_series": burst, "alert_rule_test": [
        {"eval_time": "8m", "alertname": name, "exp_alerts": _alerts(_rules(short)[name], [SLA_LABELS], "")},
        {"eval_time": "20m", "alertname": name, "exp_alerts": []}]}  # resolved once the window holds only fast ones
    quiet = {"interval": "30s", "input_series": burst,
             "alert_rule_test": [{"eval_time": t, "alertname": name, "exp_alerts": []} for t in ("8m", "12m", "20m")]}
    out = _promtool_test(promtool, tmp_path, short, [fires])
    assert out.returncode == 0, out.stdout + out.stderr
    out = _promtool_test(promtool, tmp_path, long_, [quiet])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _promtool_test(promtool, tmp_path, long_, [fires]).returncode != 0  # the same series do not page with 10m
