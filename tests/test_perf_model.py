"""The step-time model holds the physics, whatever the fitted fractions are.

Bounds are computed here from independent figures (the memory planner's weight
bytes, the datasheet bandwidth in the GPU catalog, a Monte-Carlo of routing), not
from the model's own terms.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.catalog.gpus import get_gpu
from infra.catalog.models import load_model
from infra.planning import memory
from infra.planning.perf import predict
from infra.planning.perf.fitted import DEFAULT
from infra.planning.perf.hardware import for_gpu, for_instance, hardware
from infra.catalog.instances import get_instance_type
from infra.planning.perf.ops import compute_dtype, expected_distinct_experts
from infra.planning.perf.workload import Workload


def _setup(model: str, gpu: str = "H100-SXM-80GB", **serving) -> predict.Setup:
    return predict.setup(load_model(model), for_gpu(gpu), predict.Serving(max_model_len=8192, **serving))


@pytest.mark.parametrize("model,tp", [("llama-3.1-70b", 4), ("llama-3.1-70b", 8), ("qwen3-235b-a22b", 8), ("deepseek-r1", 8)])
def test_decode_at_batch_one_is_bound_by_the_bytes_it_reads(model: str, tp: int) -> None:
    """One decode step reads every dense weight of the rank at least once: it cannot take
    less than those bytes over the datasheet's HBM bandwidth."""
    s = _setup(model, gpu="H200-141GB" if model == "deepseek-r1" else "H100-SXM-80GB", tp=tp)
    arch = s.arch
    dense = [g for layer in arch.layers for g in layer.params if g.role.value != "routed_expert"]
    dense_bytes = sum(memory.group_bytes_per_rank(g, tp, tp) for g in dense)
    floor = dense_bytes / get_gpu(s.hw.gpu.name).hbm_bandwidth_bytes_per_s
    step = s.step.stage_seconds([1024], [], 1)[0]
    assert step >= floor
    assert s.step.parts([1024], [], 1)[0].bound in ("memory", "communication", "overhead")


def test_doubling_tp_at_batch_one_cuts_a_large_dense_models_tpot_by_less_than_half() -> None:
    """Per-layer all-reduces and fixed costs do not shrink with TP: TP 8 is faster than
    TP 4, but by less than 2x."""
    t4 = _setup("llama-3.1-70b", tp=4).step.stage_seconds([1024], [], 1)[0]
    t8 = _setup("llama-3.1-70b", tp=8).step.stage_seconds([1024], [], 1)[0]
    assert t8 < t4 < 2 * t8


def test_moe_decode_reads_more_distinct_experts_as_the_batch_grows() -> None:
    s = _setup("qwen3-235b-a22b-fp8", tp=8, expert_parallel=True)
    memory_s = [s.step.parts([512] * b, [], 1)[0].memory_s for b in (1, 4, 16, 64)]
    assert memory_s == sorted(memory_s) and memory_s[-1] > 1.5 * memory_s[0]


@settings(max_examples=30, deadline=None)
@given(experts=st.integers(8, 384), top_k=st.integers(1, 8), tokens=st.integers(1, 64))
def test_expected_distinct_experts_matches_uniform_routing(experts: int, top_k: int, tokens: int) -> None:
    """E (1 - (1 - k/E)^b) against a Monte-Carlo of b tokens each picking k distinct experts."""
    top_k = min(top_k, experts)
    rng = random.Random(experts * 1000 + top_k * 100 + tokens)
    trials = 400
    mean = sum(len({e for _ in range(tokens) for e in rng.sample(range(experts), top_k)}) for _ in range(trials)) / trials
    expected = expected_distinct_experts(experts, top_k, tokens)
    assert expected <= min(experts, top_k * tokens) + 1e-9
    assert abs(expected - mean) <= 0.05 * mean + 0.5


def test_prefill_is_compute_bound_and_grows_with_the_context_before_it() -> None:
    """A long prompt's chunk costs FLOPs over every token it attends: the same 2,048 new
    tokens take longer after 30,000 tokens of context than at the start."""
    s = _setup("llama-3.1-70b", tp=8, max_num_batched_tokens=2048)
    s = predict.setup(load_model("llama-3.1-70b"), for_gpu("H100-SXM-80GB"),
                      predict.Serving(tp=8, max_model_len=32768, max_num_batched_tokens=2048))  # fmt: skip
    first = s.step.parts([], [(2048, 0)], 1)[0]
    late = s.step.parts([], [(2048, 30_000)], 1)[0]
    assert first.bound == "compute"
    assert late.total_s > first.total_s * 1.2


def test_pipeline_hop_between_nodes_goes_over_efa() -> None:
    """Whole-node stages on p5.48xlarge send activations over EFA (400 Gb/s per GPU), slower
    than NVLink inside a node."""
    hw = for_instance(get_instance_type("p5.48xlarge"))
    assert hw.network_bytes_per_s == pytest.approx(3200e9 / 8 / 8)
    s = predict.setup(load_model("deepseek-v4-pro"), hw, predict.Serving(tp=8, pp=4, max_model_len=8192))
    assert s.step.hop_over_network
    assert s.step.hop_seconds(64) > hw.network_latency_s


def test_compute_dtypes_follow_the_gpu() -> None:
    """FP8 weights use FP8 tensor cores on Hopper, weight-only (bf16) kernels on Ampere."""
    assert compute_dtype("fp8", get_gpu("H100-SXM-80GB")) == "fp8"
    assert compute_dtype("fp8", get_gpu("A100-80GB")) == "bf16"
    assert compute_dtype("nvfp4", get_gpu("B200")) == "fp4"
    assert compute_dtype("int4", get_gpu("B200")) == "bf16"


def test_a_request_rate_above_capacity_makes_ttft_grow_with_the_runs_length() -> None:
    s = _setup("qwen3-235b-a22b-fp8", tp=8, expert_parallel=True, max_num_seqs=64)
    load = Workload.fixed(512, 128)
    # Capacity: every prompt at once, the engine at its largest batch (64).
    capacity = predict.run(s, load, concurrency=400, request_rate=None, num_prompts=400).requests_per_s
    over = capacity * 2
    short = predict.run(s, load, concurrency=None, request_rate=over, num_prompts=100)
    long = predict.run(s, load, concurrency=None, request_rate=over, num_prompts=400)
    assert long.ttft_ms.mean > 2 * short.ttft_ms.mean


def test_hardware_needs_exactly_one_of_gpu_and_instance_type() -> None:
    from infra.errors import UserError

    with pytest.raises(UserError):
        hardware()
    with pytest.raises(UserError):
        hardware(gpu="H100-SXM-80GB", instance_type="p5.48xlarge")
    with pytest.raises(UserError, match="GPU"):
        hardware(gpu="H900")


def test_the_fitted_fractions_are_fractions() -> None:
    for name in ("gemm_bf16", "gemm_fp8", "attention", "hbm", "allreduce_bw", "moe_gemm_bf16", "moe_gemm_fp8", "moe_gemm_4bit"):
        assert 0 < getattr(DEFAULT, name) <= 1, name


@settings(max_examples=50, deadline=None)
@given(contexts=st.lists(st.integers(0, 10_000), max_size=40), thresholds=st.lists(st.integers(1, 5_000), max_size=4))
def test_threshold_sums_are_the_sums_of_min(contexts: list[int], thresholds: list[int]) -> None:
    from infra.planning.perf.step import _threshold_sums

    sums = _threshold_sums(contexts, sorted(set(thresholds)))
    assert sums[None] == sum(contexts)
    for t in set(thresholds):
        assert sums[t] == sum(min(c, t) for c in contexts)


@pytest.mark.parametrize("model,kw", [("deepseek-v4-pro", dict(tp=8, pp=4)), ("llama-3.1-70b", dict(tp=8)),
                                      ("qwen3-235b-a22b-fp8", dict(tp=8, expert_parallel=True))])
def test_stage_seconds_is_the_total_of_the_parts(model: str, kw: dict) -> None:
    """The simulation's fast path gives what the breakdown adds up to."""
    hw = for_instance(get_instance_type("p5.48xlarge")) if kw.get("pp") else for_gpu("H100-SXM-80GB")
    s = predict.setup(load_model(model), hw, predict.Serving(max_model_len=8192, **kw))
    for contexts, prefills in (([1000, 3000, 40], [(512, 0)]), ([], [(8192, 0)]), ([5] * 700, []), ([2000], [(100, 3000)])):
        fast = s.step.stage_seconds(contexts, prefills, 1)
        slow = [p.total_s for p in s.step.parts(contexts, prefills, 1)]
        assert fast == pytest.approx(slow, rel=1e-9)
