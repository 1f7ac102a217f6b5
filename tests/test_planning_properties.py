"""Properties that must hold for any model, hardware and knobs."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from infra.catalog.instances import INSTANCE_TYPES
from infra.planning import PlanRequest, kv_cache, make_plan, serving
from infra.planning.layout import evaluate

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
    moe_replicas = bool(smaller.model.num_experts) and max(smaller.evaluation.layout.dp, larger.evaluation.layout.dp) > 1
    if moe_replicas and (not larger.feasible or larger.evaluation.max_concurrency < smaller.evaluation.max_concurrency):
        # Replicas of a MoE model share its experts, but each one's MoE layers run every replica's
        # tokens (activations grow with DP, memory.activation_peak_bytes) and a replica count that
        # does not divide the experts' columns needs expert parallel and its buffers: one more node
        # can leave each GPU less room (seen: Qwen3-30B-A3B, 6 -> 7 x g5.2xlarge). A memory refusal.
        assert larger.feasible or all("gpu-memory-utilization" not in e for e in larger.errors), larger.errors
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
@given(requests)
def test_memory_figures_are_those_of_the_flags_passed(req):
    """The budget, KV cache and concurrency the plan prints are vLLM's at the --max-num-seqs
    it passes (the CUDA graphs and the sampler profile depend on it), however the planner
    settled on it: at a block's edge 89 can hold 88 requests and 88 hold 89."""
    plan = make_plan(req)
    assume(plan.feasible)
    assert plan.evaluation.knobs.max_num_seqs == plan.max_num_seqs
    assert plan.serving_args[plan.serving_args.index("--max-num-seqs") + 1] == str(plan.max_num_seqs)


def test_max_num_seqs_settles_at_a_block_edge():
    """The case that cycles (89 holds 88, 88 holds 89): the plan passes the value its cache
    supports, with that value's figures."""
    req = PlanRequest(model="qwen3-30b-a3b", instance_type="g5.12xlarge", nodes=2, max_model_len=131072,
                      gpu_memory_utilization=0.5 + 1e-05, kv_cache_dtype="fp8")  # fmt: skip
    plan = make_plan(req)
    assert plan.max_num_seqs_bound == "kv-at-typical-context"
    assert plan.evaluation.knobs.max_num_seqs == plan.max_num_seqs
    ev = plan.evaluation
    per_request = kv_cache.request_blocks(list(ev.kv.groups), ev.admission, release=ev.knobs.release,
                                          max_len=serving.TYPICAL_CONTEXT_TOKENS)  # fmt: skip
    assert ev.num_blocks // per_request >= plan.max_num_seqs  # the cache at this value holds it
    one_more = evaluate_at(plan, plan.max_num_seqs + 1)
    assert one_more.num_blocks // per_request < plan.max_num_seqs + 1  # and the next value would not


def evaluate_at(plan, max_num_seqs: int):
    ev = plan.evaluation
    return evaluate(plan.model, plan.instance, plan.nodes, ev.layout, ev.knobs.replace(max_num_seqs=max_num_seqs))


@SETTINGS
@given(requests, st.floats(0.0, 0.1))
def test_higher_utilization_never_lowers_kv(req, more):
    low = make_plan(req)
    assume(low.feasible)
    lay = low.layout  # same layout: a higher share can rule out a layout (below), not shrink it
    # Same flags too: left to the planner, the larger cache can raise --max-num-seqs by one,
    # whose sampler profile costs the last stage a block (qwen3-30b-a3b, 2 x g5.12xlarge, 128k).
    high = make_plan(
        req.replace(
            gpu_memory_utilization=min(req.gpu_memory_utilization + more, 0.97),
            tp=lay.tp, pp=lay.pp, dp=lay.dp, expert_parallel=lay.expert_parallel,
            weight_format=low.weight_format, max_num_seqs=low.max_num_seqs,
            # and the chunk the search chose (replicas of a MoE model may take a smaller one)
            max_num_batched_tokens=low.evaluation.knobs.max_num_batched_tokens,
            async_scheduling=low.evaluation.knobs.async_scheduling,
        )  # fmt: skip
    )
    if not high.feasible:
        # The only way up can fail: too little left outside vLLM's share for the
        # CUDA context, which vLLM refuses at start.
        assert all("gpu-memory-utilization" in e for e in high.errors), high.errors
        return
    assert high.evaluation.kv_tokens >= low.evaluation.kv_tokens
    assert high.evaluation.max_concurrency >= low.evaluation.max_concurrency
