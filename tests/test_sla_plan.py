"""The SLA drives the plan: capacity search, --max-num-seqs, cost per token, objective, config."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from infra.config import from_mapping
from infra.errors import UserError
from infra.planning import PlanRequest, make_plan
from infra.planning import performance as perf
from infra.planning.cost import HOURS_PER_MONTH, cost_lines
from infra.planning.perf import predict
from infra.planning.perf.hardware import hardware

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = perf.WorkloadSpec.from_preset("sharegpt")
SLA = perf.Sla(250.0, 40.0)


# --- The search's bracket on a known load ------------------------------------------------


@pytest.mark.parametrize("edge", [1, 7, 100, 517])
@pytest.mark.parametrize("shape", ["linear", "sqrt", "step"])
def test_edge_brackets_the_largest_load_that_meets(edge, shape):
    def load(x: float) -> tuple[float, ...]:
        if shape == "linear":
            return (x / edge,)
        if shape == "sqrt":
            return (math.sqrt(x / edge), 0.1)
        return (0.5 if x <= edge else 2.0,)

    calls = []
    lo, hi = perf._edge(lambda x: calls.append(x) or load(x), 1.0, 4096.0, integer=True)
    assert lo <= edge < hi
    assert hi - lo <= max(1, lo * perf.BISECT_TOLERANCE)
    assert max(load(lo)) <= 1 < max(load(hi))
    assert len(calls) < 20  # each call is a simulation


def test_edge_stops_at_the_ceiling_when_it_meets():
    lo, hi = perf._edge(lambda x: (x / 10_000,), 1.0, 300.0, integer=True)
    assert (lo, hi) == (300.0, None)


def test_sla_misses_each_term():
    sla = perf.Sla(100, 10, 20)
    assert sla.misses(100, 10, 20) == ()
    assert sla.misses(100.1, 10, 20) == ("ttft",)
    assert sla.misses(1, 10.1, 20.1) == ("tpot", "itl")
    assert perf.Sla(100, 10).misses(1, 1, 1e9) == ()  # no ITL term unless the SLA sets one


def test_the_sharegpt_presets_lengths_are_the_datasets_and_its_spread_theirs():
    """The preset draws ShareGPT's own pairs (perf/sharegpt.py), and the one spread figure it
    carries (for the benchmark Job's uniform stand-in) is their std / mean, both lengths averaged."""
    from infra.planning.perf import sharegpt

    pairs = sharegpt.pairs()
    cv = [statistics.pstdev(x) / statistics.fmean(x) for x in zip(*pairs)]
    assert SHAREGPT.spread == pytest.approx(statistics.fmean(cv), abs=0.005) and SHAREGPT.spread > 1
    assert SHAREGPT.workload().kind == "sharegpt"
    sample = SHAREGPT.workload().sample(3000, seed=0)
    assert statistics.fmean(o for _, o in sample) == pytest.approx(200, abs=0.5)


def test_the_sharegpt_preset_is_the_mean_of_the_measured_sharegpt_runs():
    rows = [json.loads(line) for line in (REPO / "tests/fixtures/perf/measurements.jsonl").read_text().splitlines()]
    share = [r for r in rows if r["lengths"] == "sharegpt"]
    assert len(share) >= 30
    assert SHAREGPT.input_tokens == round(sum(r["isl"] for r in share) / len(share))
    assert SHAREGPT.output_tokens == round(sum(r["osl"] for r in share) / len(share))


# --- Capacity of a layout -------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    """Qwen3-0.6B on one A10G: seconds to search."""
    from infra.catalog.models import load_model

    return predict.setup(load_model("qwen3-0.6b"), hardware(instance_type="g5.xlarge"), predict.Serving(max_model_len=8192))


@pytest.fixture(scope="module")
def full(small):
    """small's capacity under SLA, with its rate: the search the tests below compare against, run once
    (the rate is computed after the closed-loop search and changes none of its figures)."""
    return perf.sla_capacity(small, SHAREGPT, SLA)


def test_capacity_meets_the_sla_and_one_more_step_does_not(full):
    cap = full
    assert cap.concurrency > 1 and cap.at.meets and cap.at.preemptions == 0
    assert cap.beyond is not None and cap.beyond.concurrency > cap.concurrency
    assert not cap.beyond.meets or cap.beyond.preemptions
    assert cap.binding in {"ttft", "tpot", "kv-admission"}
    assert cap.binding in cap.beyond.misses or cap.binding == "kv-admission"
    # Little's law of the closed loop: throughput = concurrency / mean latency, so it grows with load.
    assert cap.at.requests_per_s > cap.single.requests_per_s
    # A Poisson stream at the capacity's rate is burstier than the closed loop: never more.
    assert 0 < cap.requests_per_s <= cap.at.requests_per_s * 1.0001


def test_a_looser_tpot_target_admits_at_least_as_many(small):
    tight = perf.sla_capacity(small, SHAREGPT, perf.Sla(10_000, 12.0), with_rate=False)
    loose = perf.sla_capacity(small, SHAREGPT, perf.Sla(10_000, 20.0), with_rate=False)
    assert tight.concurrency > 0
    assert loose.concurrency >= tight.concurrency
    assert loose.output_tokens_per_s >= tight.output_tokens_per_s


def test_an_sla_below_one_requests_tpot_has_no_capacity_and_says_why(small):
    single = perf.closed_loop(small, SHAREGPT, SLA, 1)
    cap = perf.sla_capacity(small, SHAREGPT, perf.Sla(10_000, single.tpot_p99_ms / 2))
    assert cap.concurrency == 0 and cap.at is None and cap.requests_per_s == 0
    assert cap.binding == "tpot"
    assert f"TPOT p99 at concurrency 1 is {single.tpot_p99_ms:,.1f} ms" in cap.refusal()


def test_a_cached_prefix_shortens_ttft_of_long_prompts(small):
    cold = perf.closed_loop(small, perf.WorkloadSpec(4000, 50), SLA, 4)
    warm = perf.closed_loop(small, perf.WorkloadSpec(4000, 50, prefix_cache_hit_rate=0.9), SLA, 4)
    assert warm.ttft_p50_ms < cold.ttft_p50_ms * 0.7


# --- Cost -------------------------------------------------------------------------------------


def test_cost_per_token_uses_the_measurement_over_the_prediction_and_the_duty_cycle():
    kw = dict(price_usd_per_hour=10.0, nodes=2, tco_categories={"all": 7300.0}, api_price_usd_per_mtok=2.0)
    predicted = cost_lines(**kw, throughput_tokens_per_s=None, predicted_tokens_per_s=1000.0)
    assert predicted.throughput_source == "predicted"
    seconds = HOURS_PER_MONTH * 3600
    assert predicted.usd_per_million_tokens["cloud"] == pytest.approx(20.0 * HOURS_PER_MONTH / (1000.0 * seconds) * 1e6)
    assert predicted.usd_per_million_tokens["tco"] == pytest.approx(7300.0 / (1000.0 * seconds) * 1e6)
    measured = cost_lines(**kw, throughput_tokens_per_s=500.0, predicted_tokens_per_s=1000.0, duty_cycle=0.5)
    assert measured.throughput_source == "measured"
    assert measured.capacity_tokens_per_month == pytest.approx(250.0 * seconds)
    assert measured.usd_per_million_tokens["tco"] == pytest.approx(4 * predicted.usd_per_million_tokens["tco"])


def test_breakeven_verdict_in_both_directions():
    kw = dict(price_usd_per_hour=10.0, nodes=1, tco_categories=None, throughput_tokens_per_s=None)
    monthly = 10.0 * HOURS_PER_MONTH
    # Break-even = monthly / price per token; capacity = tokens/s x seconds a month.
    easy = cost_lines(**kw, api_price_usd_per_mtok=10.0, predicted_tokens_per_s=1000.0)
    share = (monthly / 10.0 * 1e6) / (1000.0 * HOURS_PER_MONTH * 3600)
    assert easy.breakeven["share_of_capacity"] == pytest.approx(share)
    assert f"needs {share:.0%} of it" in easy.breakeven["verdict"]
    hard = cost_lines(**kw, api_price_usd_per_mtok=0.001, predicted_tokens_per_s=1000.0)
    assert hard.breakeven["verdict"].startswith("cannot reach the break-even within the SLA")
    unknown = cost_lines(**kw, api_price_usd_per_mtok=1.0)
    assert unknown.breakeven["share_of_capacity"] is None and "no throughput" in unknown.breakeven["verdict"]


# --- The plan ---------------------------------------------------------------------------------


def _sla_request(**kw) -> PlanRequest:
    base = dict(instance_type="p5.48xlarge", nodes=1, max_model_len=8192, objective="sla-throughput-per-dollar",
                sla=SLA, workload=SHAREGPT, api_price_usd_per_mtok=2.0)  # fmt: skip
    base.update(kw)
    return PlanRequest(**base)


def test_dense_model_on_one_node_picks_data_parallel_when_tp1_meets_the_sla():
    plan = make_plan(_sla_request(model="qwen3-32b-awq"))
    data = plan.to_json_dict()
    assert (data["layout"]["tp"], data["layout"]["dp"]) == (1, 8)
    # TP 1 meets the TPOT target one request at a time, so replicas beat splitting the model.
    assert data["performance"]["single_request"]["tpot_ms"]["p99"] < SLA.tpot_p99_ms
    won, lost = data["performance"]["sla_capacity"]["output_tokens_per_s"], data["runner_up"]["output_tokens_per_s"]
    assert won > lost
    assert f"{won:,.0f}" in data["runner_up"]["why"] and f"{lost:,.0f}" in data["runner_up"]["why"]


def test_max_num_seqs_is_the_sla_capacity_per_replica_and_its_bound_is_named():
    plan = make_plan(_sla_request(model="qwen3-32b-awq"))
    cap, dp = plan.performance, plan.layout.dp
    assert plan.max_num_seqs_bound == "sla-capacity"
    assert plan.max_num_seqs == -(-cap.concurrency // dp)
    assert f"--max-num-seqs {plan.max_num_seqs}" in " ".join(plan.serving_args)
    # Never below what the max-model-len worst case admits.
    assert plan.max_num_seqs >= int(plan.evaluation.max_concurrency_per_replica)


def test_cost_per_token_comes_from_the_prediction():
    plan = make_plan(_sla_request(model="qwen3-32b-awq"))
    c = plan.to_json_dict()["cost"]
    assert c["throughput_source"] == "predicted"
    assert c["predicted_tokens_per_s"] == pytest.approx(plan.performance.at.output_tokens_per_s)
    assert c["usd_per_million_tokens"]["cloud"] == pytest.approx(
        plan.instance.price_usd_per_hour / (c["predicted_tokens_per_s"] * 3600) * 1e6)


def test_an_sla_no_layout_meets_is_refused_with_the_best_figures():
    with pytest.raises(UserError, match=r"no layout of 1 x p5.48xlarge meets the SLA .*TPOT p99 at concurrency 1 is [\d.]+ ms > 1.0 ms"):
        make_plan(_sla_request(model="qwen3-32b-awq", sla=perf.Sla(250.0, 1.0)))


def test_without_an_sla_the_plan_predicts_nothing_and_keeps_the_kv_derived_max_num_seqs():
    plan = make_plan(PlanRequest(model="qwen3-32b-awq", instance_type="p5.48xlarge", nodes=1, max_model_len=8192))
    assert plan.performance is None and plan.to_json_dict()["performance"] is None
    assert plan.max_num_seqs_bound in {"kv-at-typical-context", "vllm-default", "max-num-batched-tokens"}


# --- Config -----------------------------------------------------------------------------------


def _cfg(**areas):
    base = {"model": {"name": "qwen3-0.6b"}, "gpu": {"instanceType": "g5.xlarge", "nodes": 1}, "lifecycle": {"production": True}}
    base.update(areas)
    return from_mapping("x", base)


def test_old_benchmark_thresholds_point_to_the_sla():
    with pytest.raises(UserError, match=r"moved to gpu-serving:serving.sla.ttftP99Ms"):
        _cfg(checks={"ttftP99Ms": 100})


def test_workload_is_a_preset_or_lengths_not_both():
    with pytest.raises(UserError, match="inputTokens"):
        _cfg(serving={"workload": {"preset": None}})
    with pytest.raises(UserError, match="not both"):
        _cfg(serving={"workload": {"inputTokens": 10, "outputTokens": 10}})
    own = _cfg(serving={"workload": {"preset": None, "inputTokens": 1000, "outputTokens": 100, "spread": 0.3}})
    assert own.plan_request().workload == perf.WorkloadSpec(1000, 100, 0.3)


def test_a_misspelt_sla_key_gets_a_suggestion():
    with pytest.raises(UserError, match="did you mean 'tpotP99Ms'"):
        _cfg(serving={"sla": {"tpotP99ms": 30}})


def test_the_printed_concurrency_is_vllms_at_the_passed_max_num_seqs():
    plan = make_plan(_sla_request(model="qwen3-32b-awq"))
    from infra.planning.layout import evaluate

    # Recomputed: the KV cache left once CUDA graphs and the sampler are budgeted at the
    # --max-num-seqs the plan passes (vLLM's default would budget 1,024).
    at_passed = evaluate(plan.model, plan.instance, plan.nodes, plan.layout, plan.knobs.replace(max_num_seqs=plan.max_num_seqs))
    at_default = evaluate(plan.model, plan.instance, plan.nodes, plan.layout, plan.knobs.replace(max_num_seqs=1024))
    data = plan.to_json_dict()
    assert data["kv_cache"]["max_concurrency"] == pytest.approx(at_passed.max_concurrency)
    assert data["per_rank"]["cudagraph_bytes"] == at_passed.constrained.cudagraph_bytes
    assert at_passed.constrained.cudagraph_bytes < at_default.constrained.cudagraph_bytes
    assert at_passed.max_concurrency > at_default.max_concurrency


def test_prod_turns_mtp_on_at_vllms_batch_defaults_and_says_what_that_rests_on():
    from dataclasses import replace

    from infra.config import load_stack_file

    req = load_stack_file("prod", REPO).plan_request()
    assert req.speculative_method is None  # prod leaves speculative decoding to the search
    plan = make_plan(req)
    data = plan.to_json_dict()
    assert data["vllm"]["async_scheduling"] and data["vllm"]["max_num_batched_tokens"] == 8192
    assert data["vllm"]["speculative"] == {"method": "mtp", "num_speculative_tokens": 1}
    # Expert parallel on and off serve within 1% in the model (it leaves out the all-to-all):
    # a tie, which the memory ranking decides (off holds more sequences), not the last digits.
    assert data["layout"]["expert_parallel"] is False
    args = plan.serving_args
    assert json.loads(args[args.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 1}
    note = next(n for n in data["vllm"]["notes"] if n.startswith("MTP speculative decoding on"))
    assert f"{plan.performance.output_tokens_per_s:,.0f} output tokens/s within the SLA" in note
    assert f"ASSUMPTION: {predict.DEFAULT_MTP_ACCEPTANCE:.0%} of drafted tokens accepted" in note
    # The runner-up is the same shape without the drafter, expert parallel on or off (the tie above),
    # and `off` plans that shape: within the tie of the runner-up.
    from infra.planning.sla_search import TIE

    runner = data["runner_up"]
    assert "MTP" not in runner["layout"] and runner["output_tokens_per_s"] < plan.performance.output_tokens_per_s
    assert runner["layout"].startswith("TP 8 x PP 4 x DP 1")
    off = make_plan(replace(req, speculative_method="off"))
    assert off.speculative is None and "--speculative-config" not in off.serving_args
    assert off.performance.output_tokens_per_s == pytest.approx(runner["output_tokens_per_s"], rel=TIE)
    assert f"against {off.performance.output_tokens_per_s:,.0f} without it" in note
    # Without MTP, vLLM's batch defaults still beat the knobs that hold the most sequences, and say so.
    off_notes = off.to_json_dict()["vllm"]["notes"]
    defaults = next(n for n in off_notes if n.startswith("vLLM's batch defaults"))
    assert f"{off.performance.output_tokens_per_s:,.0f} output tokens/s within the SLA" in defaults
    assert f"{off.evaluation.max_concurrency:,.2f} sequences at max-model-len" in defaults


def test_the_benchmark_compares_the_measured_acceptance_with_the_assumed(small):
    s = _setup_with_mtp()
    load = perf.benchmark_load(s, SHAREGPT, 4)
    assert dict(load.predicted)["spec_decode_acceptance_rate"] == pytest.approx(100 * predict.DEFAULT_MTP_ACCEPTANCE)
    assert "spec_decode_acceptance_rate" not in dict(perf.benchmark_load(small, SHAREGPT, 4).predicted)


def _setup_with_mtp():
    from infra.catalog.models import load_model

    return predict.setup(load_model("deepseek-r1"), hardware(gpu="H200-141GB"),
                         predict.Serving(tp=8, max_model_len=8192, num_speculative_tokens=1))  # fmt: skip


# --- The search's details that decide what it costs and reports ----------------------------


def test_edge_never_steps_more_than_four_times_past_what_met():
    # Large loads cost the most to simulate: the search climbs rather than overshoots.
    seen = []
    perf._edge(lambda x: seen.append(x) or (x / 900,), 1.0, 4096.0, integer=True)
    met = 1.0
    for x in seen[1:]:
        assert x <= 4 * met
        if x <= 900:
            met = max(met, x)


def test_edge_on_a_continuous_load_and_from_a_known_miss():
    lo, hi = perf._edge(lambda x: (x / 2.5,), 1.0, 100.0, integer=False)
    assert lo <= 2.5 < hi and hi - lo <= lo * perf.BISECT_TOLERANCE
    calls = []
    lo, hi = perf._edge(lambda x: calls.append(x) or (x / 50,), 1.0, 4096.0, integer=True, hi=64.0)
    assert all(x < 64 for x in calls) and lo <= 50 < hi <= 64


def test_edge_stops_when_told():
    calls = []
    lo, hi = perf._edge(lambda x: calls.append(x) or (x / 50,), 1.0, 4096.0, integer=True,
                        stop=lambda lo, hi: hi is not None)  # fmt: skip
    assert hi is not None and calls[-1] == hi and hi > 50  # the first miss ends it


def test_a_hint_from_an_equal_layout_settles_the_search_in_two_points(small, full):
    hinted = perf.sla_capacity(small, SHAREGPT, SLA, with_rate=False, hint=(full.concurrency, full.beyond.concurrency))
    assert (hinted.concurrency, hinted.binding) == (full.concurrency, full.binding)
    assert sorted(p.concurrency for p in hinted.curve) == [1, full.concurrency, full.beyond.concurrency]
    # A hint above the capacity is a miss to search below.
    high = perf.sla_capacity(small, SHAREGPT, SLA, with_rate=False, hint=(full.beyond.concurrency * 2, None))
    assert high.concurrency == pytest.approx(full.concurrency, rel=perf.BISECT_TOLERANCE)


def test_a_layout_that_cannot_beat_the_best_stops_at_its_first_miss(small, full):
    bar = full.output_tokens_per_s * 10
    out = perf.sla_capacity(small, SHAREGPT, SLA, must_beat=bar)
    assert out.outclassed and not out.beyond.meets and out.beyond.output_tokens_per_s <= bar
    assert out.requests_per_s == 0 and len(out.curve) < len(full.curve)
    passed = perf.sla_capacity(small, SHAREGPT, SLA, with_rate=False, must_beat=full.single.output_tokens_per_s)
    assert not passed.outclassed and passed.concurrency == full.concurrency


def test_the_rate_capacity_meets_the_sla_below_the_closed_loops_throughput(small, full):
    cap = full
    rate = cap.requests_per_s
    assert 0.6 * cap.at.requests_per_s <= rate <= cap.at.requests_per_s
    prompts = max(perf.MIN_MEASURED * 2, 4 * cap.concurrency)
    assert perf.open_loop(small, SHAREGPT, SLA, rate, prompts=prompts).meets


def test_no_rate_meets_when_even_60_percent_misses(small):
    point = perf.closed_loop(small, SHAREGPT, SLA, 64)
    assert perf.rate_capacity(small, SHAREGPT, perf.Sla(1e-3, 1e9), point) == 0.0  # no TTFT is that short


def test_the_benchmark_load_stands_in_for_the_workload(small):
    w = perf.WorkloadSpec(1000, 100, 0.3, None, 0.25)
    b = perf.benchmark_load(small, w, 8)
    assert (b.prefix_len, b.input_len, b.output_len, b.concurrency) == (250, 750, 100, 8)
    assert b.range_ratio == pytest.approx(0.3 * math.sqrt(3), abs=1e-3)  # the same std / mean, uniform
    assert b.prompts == perf.MIN_BENCH_PROMPTS
    wide = perf.benchmark_load(small, perf.WorkloadSpec(100, 10, 2.0), 100)
    assert wide.range_ratio == perf.BENCH_MAX_RANGE_RATIO and wide.prompts == perf.BENCH_PROMPTS_PER_SLOT * 100
    pred = dict(b.predicted)
    assert set(pred) == {"median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "output_throughput",
                         "request_throughput"}  # fmt: skip
    assert 0 < pred["median_ttft_ms"] <= pred["p99_ttft_ms"] and 0 < pred["median_tpot_ms"] <= pred["p99_tpot_ms"]
    assert pred["output_throughput"] == pytest.approx(pred["request_throughput"] * 100, rel=0.1)
    cold = dict(perf.benchmark_load(small, perf.WorkloadSpec(1000, 100, 0.3), 8).predicted)
    assert pred["median_ttft_ms"] < cold["median_ttft_ms"]  # the shared prefix is cached


def test_the_performance_json_carries_the_capacity_under_the_issues_names(small):
    cap = perf.sla_capacity(small, SHAREGPT, perf.Sla(250, 40, 1000))
    j = perf.performance_json(cap, "deepseek_v4")
    assert j["sla"] == {"ttft_p99_ms": 250, "tpot_p99_ms": 40, "itl_p99_ms": 1000}
    assert {k: j["workload"][k] for k in ("preset", "input_tokens", "output_tokens", "spread", "prefix_cache_hit_rate")} == {
        "preset": "sharegpt", "input_tokens": 219, "output_tokens": 200, "spread": SHAREGPT.spread, "prefix_cache_hit_rate": 0.0}
    c, at = j["sla_capacity"], cap.at
    assert (c["concurrency"], c["requests_per_s"], c["binding"], c["ceiling"]) == (cap.concurrency, cap.requests_per_s, cap.binding, cap.ceiling)
    assert c["closed_loop_requests_per_s"] == at.requests_per_s
    assert (c["input_tokens_per_s"], c["output_tokens_per_s"]) == (at.input_tokens_per_s, at.output_tokens_per_s)
    assert c["total_tokens_per_s"] == pytest.approx(at.input_tokens_per_s + at.output_tokens_per_s)
    assert c["output_tokens_per_s_per_gpu"] == pytest.approx(at.output_tokens_per_s / small.gpus)
    assert c["ttft_ms"] == {"p50": at.ttft_p50_ms, "p99": at.ttft_p99_ms}
    assert c["tpot_ms"] == {"p50": at.tpot_p50_ms, "p99": at.tpot_p99_ms}
    assert [p["concurrency"] for p in j["curve"]] == sorted(p.concurrency for p in cap.curve)
    for p, q in zip(j["curve"], cap.curve):
        assert (p["meets_sla"], p["misses"], p["preemptions"]) == (q.meets, list(q.misses), q.preemptions)
        assert p["itl_ms"] == {"p99": q.itl_p99_ms} and p["request_rate"] is None
    assert j["single_request"]["concurrency"] == 1 and j["beyond"]["meets_sla"] is False and j["refusal"] == ""
    none = perf.performance_json(perf.sla_capacity(small, SHAREGPT, perf.Sla(1, 1)), "kimi_linear")
    assert none["sla_capacity"]["concurrency"] == 0 and none["sla_capacity"]["ttft_ms"] is None
    assert none["sla_capacity"]["output_tokens_per_s"] == 0.0 and none["refusal"].startswith("TTFT p99 at concurrency 1")
    # The model's error on published runs: of DeepSeek's family for DeepSeek-V4 (V3 and V3.2 runs),
    # none for a family no published run is of.
    assert j["model_error"]["family"]["name"] == "deepseek" and j["model_error"]["family"]["rows"] > 0
    assert none["model_error"]["family"] is None and none["model_error"]["all"] == j["model_error"]["all"]


def test_each_missed_term_is_named_in_the_refusal(small):
    single = perf.closed_loop(small, SHAREGPT, SLA, 1)
    ttft = perf.sla_capacity(small, SHAREGPT, perf.Sla(single.ttft_p99_ms / 2, 1e6))
    assert ttft.refusal() == f"TTFT p99 at concurrency 1 is {single.ttft_p99_ms:,.0f} ms > {single.ttft_p99_ms / 2:,.0f} ms"
    itl = perf.sla_capacity(small, SHAREGPT, perf.Sla(1e6, 1e6, single.itl_p99_ms / 2))
    assert itl.binding == "itl" and itl.refusal().startswith(f"ITL p99 at concurrency 1 is {single.itl_p99_ms:,.1f} ms")


def test_workload_descriptions_presets_and_lengths():
    assert SHAREGPT.describe() == "sharegpt: 219 input / 200 output tokens"
    assert perf.WorkloadSpec(2000, 100).describe() == "fixed: 2,000 input / 100 output tokens"
    assert perf.WorkloadSpec(2000, 100, 0.5, None, 0.25).describe() == (
        "lognormal: 2,000 input / 100 output tokens, spread 0.5, 25% of each prompt cached")
    with pytest.raises(UserError, match="unknown workload preset 'chat'; known: sharegpt"):
        perf.WorkloadSpec.from_preset("chat")
    assert perf.WorkloadSpec.from_preset("sharegpt", 0.5).prefix_cache_hit_rate == 0.5
    from infra.planning.perf.workload import Workload

    assert SHAREGPT.workload() == Workload.sharegpt(219, 200)
    assert perf.WorkloadSpec(2000, 100, 0.5).workload() == Workload.lognormal(2000, 100, 0.5)
    assert perf.WorkloadSpec(10, 5).workload() == Workload.fixed(10, 5)


def test_token_counts_read_in_units_and_cost_fields_follow_their_inputs():
    from infra.planning.cost import DAYS_PER_MONTH, _tokens

    assert [_tokens(n) for n in (999, 1500, 2.5e6, 22.8e9, 1.2e12)] == ["999", "1.50k", "2.50M", "22.80B", "1.20T"]
    c = cost_lines(price_usd_per_hour=1.0, nodes=3, tco_categories=None, api_price_usd_per_mtok=None,
                   throughput_tokens_per_s=None, predicted_tokens_per_s=10.0)  # fmt: skip
    assert (c.hourly_usd, c.basis_monthly_usd, c.tco_monthly_usd) == (3.0, 3.0 * HOURS_PER_MONTH, None)
    assert c.breakeven == {} and c.usd_per_million_tokens["tco"] is None and c.predicted_tokens_per_s == 10.0
    with_api = cost_lines(price_usd_per_hour=1.0, nodes=3, tco_categories=None, api_price_usd_per_mtok=1.0,
                          throughput_tokens_per_s=None, predicted_tokens_per_s=10.0)  # fmt: skip
    assert with_api.breakeven["tokens_per_day"] == pytest.approx(with_api.breakeven["tokens_per_month"] / DAYS_PER_MONTH)
    assert with_api.breakeven_tokens_per_month == with_api.breakeven["tokens_per_month"]


def test_data_parallel_replicas_serve_side_by_side(small):
    # Four replicas of the one-GPU setup (4 x A10G) at four times the concurrency: each sees
    # the same load, so latencies match and the throughput is four times as much.
    from infra.catalog.models import load_model

    four = predict.setup(load_model("qwen3-0.6b"), hardware(instance_type="g5.12xlarge"), predict.Serving(dp=4, max_model_len=8192))
    fixed = perf.WorkloadSpec(220, 202)  # the same requests on every replica
    one, many = perf.closed_loop(small, fixed, SLA, 8), perf.closed_loop(four, fixed, SLA, 32)
    assert many.requests_per_s == pytest.approx(4 * one.requests_per_s, rel=0.02)
    assert many.tpot_p99_ms == pytest.approx(one.tpot_p99_ms, rel=0.02)
    # The search's ceiling is every replica's --max-num-seqs.
    cap = perf.sla_capacity(four, SHAREGPT, perf.Sla(1e6, 1e6), with_rate=False)
    assert cap.ceiling == 4 * four.knobs.max_num_seqs and cap.binding == "max-num-seqs"


def test_tco_is_the_basis_of_the_breakeven_and_the_duty_cycle_scales_both_prices():
    kw = dict(price_usd_per_hour=10.0, nodes=2, tco_categories={"all": 7300.0}, api_price_usd_per_mtok=2.0,
              throughput_tokens_per_s=None)  # fmt: skip
    full = cost_lines(**kw, predicted_tokens_per_s=1000.0)
    half = cost_lines(**kw, predicted_tokens_per_s=1000.0, duty_cycle=0.5)
    assert full.basis_monthly_usd == 7300.0 and full.breakeven["tokens_per_month"] == pytest.approx(7300.0 / 2.0 * 1e6)
    assert half.usd_per_million_tokens["cloud"] == pytest.approx(2 * full.usd_per_million_tokens["cloud"])
    assert cost_lines(**kw).throughput_source == "none" and cost_lines(**kw).capacity_tokens_per_month is None


def test_the_json_names_the_largest_graph_capture_at_the_passed_max_num_seqs():
    from infra.planning import cudagraph

    plan = make_plan(_sla_request(model="qwen3-32b-awq"))
    got = plan.to_json_dict()["vllm"]["cudagraph_max_capture_size"]
    # vLLM 0.34 (config/vllm.py _set_cudagraph_sizes): up to min(2 x max-num-seqs, 512), on the
    # 8-step then 16-step grid, capped by max-num-batched-tokens.
    sizes = cudagraph.capture_sizes(plan.knobs.release, max_num_seqs=plan.max_num_seqs,
                                    max_num_batched_tokens=plan.knobs.max_num_batched_tokens)  # fmt: skip
    assert got == max(sizes) <= min(2 * plan.max_num_seqs, 512)


def test_the_plan_shows_a_measurement_beside_the_prediction():
    from rich.console import Console

    from infra.cli.app import render

    predicted = make_plan(_sla_request(model="qwen3-32b-awq")).performance.output_tokens_per_s
    plan = make_plan(_sla_request(model="qwen3-32b-awq", throughput_tokens_per_s=predicted / 2))
    console = Console(record=True, width=200)
    render(plan, console)
    text = console.export_text()
    assert f"{predicted / 2:,.0f} / {predicted:,.0f} output tokens/s = 0.50" in text
    assert plan.cost.throughput_source == "measured"
