"""Properties that must hold for any model, hardware and knobs."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from infra.catalog.instances import INSTANCE_TYPES
from infra.planning import PlanRequest, make_plan

MODELS = ["qwen3-0.6b", "qwen3-30b-a3b", "llama-3.1-70b", "mixtral-8x7b", "gpt-oss-120b", "deepseek-v3", "deepseek-v4-flash", "deepseek-v4-pro", "kimi-k3"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])

requests = st.builds(
    PlanRequest,
    model=st.sampled_from(MODELS),
    instance_type=st.sampled_from(sorted(INSTANCE_TYPES)),
    nodes=st.integers(1, 6),
    max_model_len=st.sampled_from([4096, 32768, 131072]),
    gpu_memory_utilization=st.floats(0.5, 0.95),
    max_num_batched_tokens=st.sampled_from([None, 2048, 16384]),
    # Pinned: with no dtype given the planner may fall back to FP8 KV, a
    # different trade (accuracy for room), which these properties do not compare.
    kv_cache_dtype=st.sampled_from(["auto", "fp8"]),
)


@SETTINGS
@given(requests)
def test_budget_adds_up_to_the_gpu(req):
    plan = make_plan(req)
    for s in plan.stages:
        parts = s.weights_bytes + s.activation_bytes + s.kv_cache_bytes + s.comm_buffer_bytes + s.cuda_overhead_bytes + s.headroom_bytes
        assert parts == s.gpu_visible_bytes
        if plan.feasible:
            assert min(s.weights_bytes, s.activation_bytes, s.kv_cache_bytes, s.cuda_overhead_bytes) > 0


@SETTINGS
@given(requests)
def test_more_nodes_never_lowers_capacity(req):
    smaller = make_plan(req)
    assume(smaller.feasible)
    # Same weights: with more room the planner may return to the model's own,
    # larger checkpoint, a different trade (precision for room).
    larger = make_plan(req.replace(nodes=req.nodes + 1, weight_format=smaller.weight_format))
    small = smaller.evaluation
    windowed = any(g.first.spec in ("sliding", "sliding_mla") for g in small.kv.groups)
    if windowed and req.max_num_batched_tokens is not None and not larger.feasible:
        # With the batch pinned the planner cannot shrink it: a deeper pipeline reserves
        # (PP + 1) x max-num-batched-tokens per request in every sliding-window group, which
        # may leave no room for one request at all (seen: DeepSeek-V4-Flash, 6 -> 7 x g5.48xlarge).
        assert any("no room for one sequence" in e for e in larger.errors), larger.errors
        return
    assert larger.feasible
    big = larger.evaluation
    if windowed and (big.layout.pp, big.layout.dp) != (small.layout.pp, small.layout.dp):
        # vLLM charges each request of a sliding-window group (PP + 1) x max-num-batched-tokens
        # in-flight tokens (config/vllm.py max_in_flight_tokens), and every node is used: one more
        # node means a deeper pipeline (more reserved per request) or more replicas (the weights
        # once more), either of which can admit fewer sequences: at most in the ratio of the
        # in-flight tokens charged, and 5% more.
        growth = small.admission.sliding_tokens / big.admission.sliding_tokens
        assert big.max_concurrency >= 0.95 * min(1.0, growth) * small.max_concurrency
        return
    assert big.max_concurrency >= small.max_concurrency


@SETTINGS
@given(requests, st.floats(0.0, 0.1))
def test_higher_utilization_never_lowers_kv(req, more):
    low = make_plan(req)
    assume(low.feasible)
    lay = low.layout  # same layout: a higher share can rule out a layout (below), not shrink it
    high = make_plan(
        req.replace(
            gpu_memory_utilization=min(req.gpu_memory_utilization + more, 0.97),
            tp=lay.tp, pp=lay.pp, dp=lay.dp, expert_parallel=lay.expert_parallel,
            weight_format=low.weight_format,
        )  # fmt: skip
    )
    if not high.feasible:
        # The only way up can fail: too little left outside vLLM's share for the
        # CUDA context, which vLLM refuses at start.
        assert all("gpu-memory-utilization" in e for e in high.errors), high.errors
        return
    assert high.evaluation.kv_tokens >= low.evaluation.kv_tokens
    assert high.evaluation.max_concurrency >= low.evaluation.max_concurrency
