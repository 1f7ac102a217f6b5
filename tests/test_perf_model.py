"""The step-time model holds the physics, whatever the fitted fractions are.

Bounds are computed here from independent figures (the memory planner's weight
bytes, the datasheet bandwidth in the GPU catalog, a Monte-Carlo of routing), not
from the model's own terms.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.catalog.gpus import get_gpu
from infra.catalog.models import load_model
from infra.errors import UserError
from infra.planning import memory
from infra.planning.perf import predict
from infra.planning.perf.fitted import DEFAULT
from infra.planning.perf.hardware import for_gpu, for_instance, hardware
from infra.catalog.instances import get_instance_type
from infra.planning.perf.ops import compute_dtype, expected_distinct_experts
from infra.planning.perf.step import StepModel
from infra.planning.perf.workload import Workload
from infra.planning.vllm_release import PINNED


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


def test_expected_distinct_experts_at_its_edges() -> None:
    """No token touches no expert, a dense model (0 experts) none, one token exactly its top-k, and
    a single expert that every token picks is touched once."""
    assert expected_distinct_experts(256, 8, 0) == 0.0
    assert expected_distinct_experts(0, 0, 16) == 0.0
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8.0)
    assert expected_distinct_experts(1, 1, 5) == pytest.approx(1.0)


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


@pytest.mark.parametrize("model,ep", [("llama-3.1-70b", False), ("qwen3-32b-awq", False), ("qwen3-235b-a22b-fp8", True)])
def test_a_serving_steps_share_of_the_kernels_compute_slows_prefill_not_a_small_decode(model: str, ep: bool) -> None:
    """`serving_compute` scales the compute-bound rates only, whatever kernel runs them (bf16
    GEMMs and attention; AWQ's weight-only kernels; FP8 GEMMs and fused MoE): a long prefill
    chunk's compute time goes as its inverse (FLOPs over a lower ceiling), while a small decode
    batch, bound by the bytes it reads, takes the same time at any share."""
    s = predict.setup(load_model(model), for_gpu("H100-SXM-80GB"),
                      predict.Serving(tp=8, expert_parallel=ep, max_model_len=32768, max_num_batched_tokens=4096))  # fmt: skip
    tables = predict.with_efficiency(s, DEFAULT.replace(serving_compute=1.0)).step
    half = predict.with_efficiency(s, DEFAULT.replace(serving_compute=0.5)).step
    chunk = tables.parts([], [(4096, 8000)], 1)[0]
    slow = half.parts([], [(4096, 8000)], 1)[0]
    assert chunk.bound == slow.bound == "compute"
    assert slow.compute_s == pytest.approx(2 * chunk.compute_s, rel=1e-9)
    if ep:  # the compute-bound fused-MoE call's activations (nearly all its bytes here) go at the share too
        assert slow.memory_s == pytest.approx(2 * chunk.memory_s, rel=1e-2) and chunk.memory_s > 0
    assert half.stage_seconds([2000] * 4, [], 1) == pytest.approx(tables.stage_seconds([2000] * 4, [], 1), rel=1e-12)


def test_an_a100_steps_compute_takes_the_share_fitted_against_its_own_tables() -> None:
    """An A100 runs at its own tables' rates (fitted.AMPERE), so a serving step's share of them is
    its own too: its prefill chunk slows with `serving_compute_ampere` and not with the H100 tables'
    `serving_compute`, and an H100's the other way round."""
    chunk = [(4096, 8000)]

    def compute_s(gpu: str, **shares) -> float:
        s = predict.setup(load_model("qwen3-32b-awq"), for_gpu(gpu), predict.Serving(max_model_len=16384, max_num_batched_tokens=4096))
        return predict.with_efficiency(s, DEFAULT.replace(**shares)).step.parts([], chunk, 1)[0].compute_s

    a100 = compute_s("A100-80GB", serving_compute=1.0, serving_compute_ampere=1.0)
    assert compute_s("A100-80GB", serving_compute=0.5, serving_compute_ampere=1.0) == pytest.approx(a100, rel=1e-12)
    assert compute_s("A100-80GB", serving_compute=1.0, serving_compute_ampere=0.5) == pytest.approx(2 * a100, rel=1e-9)
    h100 = compute_s("H100-SXM-80GB", serving_compute=1.0, serving_compute_ampere=1.0)
    assert compute_s("H100-SXM-80GB", serving_compute=1.0, serving_compute_ampere=0.5) == pytest.approx(h100, rel=1e-12)
    assert compute_s("H100-SXM-80GB", serving_compute=0.5, serving_compute_ampere=1.0) == pytest.approx(2 * h100, rel=1e-9)


def test_the_engine_runs_the_max_num_seqs_vllm_resolves_from_the_batched_tokens() -> None:
    """`vllm serve --max-num-batched-tokens 512` on an H100 runs at most 512 sequences from 0.10.1
    (the default 1024, capped: vllm_release.Release.caps_default_max_num_seqs), and 0.10.0 refuses
    it (its default 1024 above the batched tokens; SchedulerConfig's check); `--max-num-seqs 2
    --max-model-len 2048` batches at most 4,096 tokens from 0.12 (caps_default_batched_tokens).
    The plan's knobs resolve them the same way."""
    from infra.planning import PlanRequest
    from infra.planning.plan import _knobs
    from infra.catalog.instances import get_instance_type

    s = _setup("llama-3.1-70b", tp=8, max_num_batched_tokens=512)
    assert (s.knobs.max_num_batched_tokens, s.knobs.max_num_seqs) == (512, 512)
    with pytest.raises(UserError, match=r"below vLLM 0\.10\.0's default --max-num-seqs for H100-SXM-80GB \(1024\)"):
        _setup("llama-3.1-70b", tp=8, max_num_batched_tokens=512, vllm_version="0.10.0")
    with pytest.raises(UserError, match="below --max-num-seqs 600: vLLM refuses fewer batched tokens than sequences"):
        _setup("llama-3.1-70b", tp=8, max_num_batched_tokens=512, max_num_seqs=600)
    with pytest.raises(UserError, match="--max-num-batched-tokens must be at least 1, got 0"):
        _setup("llama-3.1-70b", tp=8, max_num_batched_tokens=0)
    with pytest.raises(UserError, match="--max-model-len must be at least 1, got 0"):
        predict.setup(load_model("llama-3.1-70b"), for_gpu("H100-SXM-80GB"), predict.Serving(tp=8, max_model_len=0))
    # Two sequences of at most 2,048 tokens: 0.34.0 defaults the batched tokens to 4,096, not 8,192.
    two = predict.setup(load_model("llama-3.1-70b"), for_gpu("H100-SXM-80GB"), predict.Serving(tp=8, max_model_len=2048, max_num_seqs=2))
    assert (two.knobs.max_num_batched_tokens, two.knobs.max_num_seqs) == (4096, 2)
    one = _setup("llama-3.1-70b", tp=8, max_num_seqs=1, max_num_batched_tokens=1)  # vLLM's floor: one of each
    assert (one.knobs.max_num_seqs, one.knobs.max_num_batched_tokens) == (1, 1)
    req = PlanRequest(model="llama-3.1-70b", instance_type="p5.48xlarge", nodes=1, max_num_batched_tokens=512)
    assert _knobs(req, load_model("llama-3.1-70b"), get_instance_type("p5.48xlarge")).max_num_seqs == 512
    assert _knobs(replace(req, max_num_batched_tokens=None), load_model("llama-3.1-70b"),
                  get_instance_type("p5.48xlarge")).max_num_seqs == 1024  # fmt: skip


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
                                      ("deepseek-v4-pro", dict(tp=8, pp=4, num_speculative_tokens=2)),
                                      ("qwen3-235b-a22b-fp8", dict(tp=8, expert_parallel=True)),
                                      ("deepseek-r1", dict(tp=8, pp=2))])
def test_stage_seconds_is_the_total_of_the_parts(model: str, kw: dict) -> None:
    """The simulation's fast path gives what the breakdown adds up to."""
    hw = for_instance(get_instance_type("p5.48xlarge")) if kw.get("pp") else for_gpu("H100-SXM-80GB")
    s = predict.setup(load_model(model), hw, predict.Serving(max_model_len=8192, **kw))
    # The last: 600 one-token chunks, each sampling: a compute-bound LM head.
    for contexts, prefills in (([1000, 3000, 40], [(512, 0)]), ([], [(8192, 0)]), ([5] * 700, []), ([2000], [(100, 3000)]),
                               ([], [(1, 1000)] * 600)):
        fast = s.step.stage_seconds(contexts, prefills, 1)
        slow = [p.total_s for p in s.step.parts(contexts, prefills, 1)]
        assert fast == pytest.approx(slow, rel=1e-9)


def _decode_memory_s(s: predict.Setup, context: int, batch: int = 32) -> float:
    return sum(p.memory_s for p in s.step.parts([context] * batch, [], 1))


def test_a_compressed_and_windowed_cache_reads_far_less_per_token_of_context_than_full_mla() -> None:
    """DeepSeek-V4 reads a 128-token window, one entry per 4 tokens (top-k of them) or per
    128 tokens, and the indexer's small keys; DeepSeek-V3 reads every token's latent. From
    4k to 64k of context, V3's reads grow many times more than V4's."""
    hw = for_instance(get_instance_type("p5.48xlarge"))
    v4 = predict.setup(load_model("deepseek-v4-pro"), hw, predict.Serving(tp=8, pp=4, max_model_len=131072))
    v3 = predict.setup(load_model("deepseek-v3"), for_gpu("H200-141GB"), predict.Serving(tp=8, max_model_len=131072))
    grow_v4 = _decode_memory_s(v4, 65536) - _decode_memory_s(v4, 4096)
    grow_v3 = _decode_memory_s(v3, 65536) - _decode_memory_s(v3, 4096)
    assert grow_v4 > 0 and grow_v3 > 8 * grow_v4


def test_a_sliding_window_stops_growing_at_its_window() -> None:
    """gpt-oss alternates 128-token sliding layers with full ones: past the window only the
    full layers' reads grow, so the growth from 8k to 16k is the full layers' alone."""
    s = _setup("gpt-oss-120b", tp=1)
    step = lambda c: s.step.parts([c] * 64, [], 1)[0].memory_s  # noqa: E731
    assert step(16384) - step(8192) == pytest.approx(step(8192 + 8192 + 100) - step(8192 + 100), rel=1e-6)
    assert step(100) < step(8192)


def test_kda_layers_read_a_fixed_state_whatever_the_context() -> None:
    """Kimi K3's KDA layers keep a d x d state per head: reading and writing it does not
    depend on the context; only its MLA layers' reads grow."""
    hw = for_instance(get_instance_type("p5.48xlarge"))
    s = predict.setup(load_model("kimi-k3"), hw, predict.Serving(tp=8, pp=4, max_model_len=32768))
    kda = [a for a in s.step.stages[0].attention if not a.reads_context]
    assert kda and all(a.bytes_per_sequence > 0 and a.flops_per_sequence_token > 0 for a in kda)
    short, long = _decode_memory_s(s, 1024, 8), _decode_memory_s(s, 16384, 8)
    assert long > short


@pytest.mark.parametrize("model", ["deepseek-r1", "deepseek-v4-pro", "kimi-k3", "qwen3-235b-a22b", "llama-3.1-70b"])
def test_each_part_of_a_layer_launches_kernels_of_its_own(model: str) -> None:
    """ops.layer_kernels (ASSUMED counts, each from vLLM's layer forward passes): a layer launches
    more kernels with each part it has than without it: a MoE block (router, top-k, shared expert),
    FP8 weights (an activation-quantisation kernel per GEMM), MLA's projections and BMMs, KDA's
    convolutions and gates, DeepSeek-V4's compressor and indexer; a plain GQA layer launches the
    base set. Each part is taken off a real layer of the model and the count must fall."""
    from dataclasses import replace

    from infra.planning.perf.ops import KERNELS_BASE, is_mla, layer_kernels

    parts_seen = set()
    for layer in load_model(model).layers:
        n = layer_kernels(layer)
        attn = layer.attn
        if layer.moe:
            parts_seen.add("moe")
            assert layer_kernels(replace(layer, moe=False)) < n
        if any(g.fmt == "fp8" for g in layer.params):
            parts_seen.add("fp8")
            assert layer_kernels(replace(layer, params=tuple(replace(g, fmt="bf16") for g in layer.params))) < n
        if attn is not None and attn.recurrent_dim:
            parts_seen.add("kda")
            assert layer_kernels(replace(layer, attn=replace(attn, recurrent_dim=0))) < n
        elif is_mla(layer):
            parts_seen.add("mla")
            plain = replace(attn, prefill_expand_flops=0, prefill_qk_dim=attn.qk_dim)
            assert not is_mla(replace(layer, attn=plain)) and layer_kernels(replace(layer, attn=plain)) < n
        if attn is not None and (attn.compress_ratio > 1 or attn.indexer_heads):
            parts_seen.add("compressed")
            assert layer_kernels(replace(layer, attn=replace(attn, compress_ratio=1, indexer_heads=0))) < n
        if model == "llama-3.1-70b":
            assert n == KERNELS_BASE  # GQA, a dense MLP, bf16 weights: the base set alone
    expected = {"deepseek-r1": {"moe", "fp8", "mla"}, "deepseek-v4-pro": {"moe", "compressed"},
                "kimi-k3": {"moe", "kda", "mla"}, "qwen3-235b-a22b": {"moe"}, "llama-3.1-70b": set()}[model]
    assert expected <= parts_seen


def test_a_kda_layer_computes_three_multiply_adds_per_state_element_per_token() -> None:
    """Kimi K3's KDA layers (linear_attn_config in its config.json: 96 heads of head_dim 128, the
    layers kda_layers lists): each token decays and rank-1 updates every head's d x d state and
    reads it out with its query, ~3 d^2 multiply-adds (6 d^2 FLOPs) a head, over the rank's heads."""
    import json
    from pathlib import Path

    from infra.planning.perf.ops import model_stages

    kda = json.loads((Path(__file__).parents[1] / "infra" / "catalog" / "model_configs" / "kimi-k3.json").read_text())
    kda = kda.get("text_config", kda)["linear_attn_config"]
    tp = 8
    stages = model_stages(load_model("kimi-k3"), tp=tp, pp=1, gpu=get_gpu("H200-141GB"), expert_parallel=False, kv_bytes=2)
    (state,) = [a for a in stages[0].attention if not a.reads_context and a.flops_per_sequence_token]
    assert state.layers == len(kda["kda_layers"])
    assert state.flops_per_sequence_token == 6 * kda["head_dim"] ** 2 * kda["num_heads"] // tp


def test_mtp_drafts_cost_time_and_are_refused_without_mtp_layers() -> None:
    from infra.errors import UserError

    base = _setup("deepseek-r1", gpu="H200-141GB", tp=8)
    mtp = _setup("deepseek-r1", gpu="H200-141GB", tp=8, num_speculative_tokens=2)
    assert mtp.step.stage_seconds([2048] * 16, [], 3)[-1] > base.step.stage_seconds([2048] * 16, [], 1)[-1]
    with pytest.raises(UserError, match="multi-token-prediction"):
        _setup("llama-3.1-70b", tp=8, num_speculative_tokens=1)


def test_without_cuda_graphs_a_step_pays_a_launch_per_layer() -> None:
    """Above vLLM's largest captured size a step runs eagerly: each layer pays its launches."""
    s = _setup("llama-3.1-70b", tp=8)
    limit = s.step.graph_max_tokens
    inside = s.step.parts([], [(limit, 0)], 1)[0]
    outside = s.step.parts([], [(limit + 1, 0)], 1)[0]
    assert outside.overhead_s - inside.overhead_s == pytest.approx(80 * DEFAULT.eager_layer_overhead_s, rel=1e-6)


def test_an_mla_models_decode_step_takes_at_least_its_layers_measured_attention_modules() -> None:
    """DeepSeek-R1 at TP 8 on H200, one sequence decoding: each of its 61 layers runs vLLM's
    MLA attention module, measured whole in a CUDA graph at 89.9 us (16 heads, batch 1,
    128 tokens of context: tests/fixtures/perf/kernels/mla_decode_h200_sxm.csv, a table
    the constants are not fitted on). The step holds those and its MoE and all-reduces
    too, and each MLA layer pays the module's fitted floor once, with CUDA graphs or
    without (the rest of the module's time is its kernels' floors and reads), and its time
    per decoding sequence (16 heads a rank) for each sequence decoding: a prefill chunk's
    tokens do not pay it."""
    from pathlib import Path

    from infra.planning.perf.calibrate import read

    rows = read(Path(__file__).resolve().parent / "fixtures" / "perf" / "kernels" / "mla_decode_h200_sxm.csv")
    module = next(r["latency_us"] * 1e-6 for r in rows if (r["heads"], r["batch"], r["context_len"], r["kv_cache_dtype"],
                  r["gemm_type"]) == (16, 1, 128, "bfloat16", "fp8_block"))  # fmt: skip
    s = _setup("deepseek-r1", gpu="H200-141GB", tp=8)
    st = s.step
    assert st.stages[0].mla_layers == 61 and _setup("qwen3-235b-a22b", tp=8).step.stages[0].mla_layers == 0
    step = st.parts([128], [], 1)[0].total_s
    assert step - DEFAULT.seq_overhead_s >= 61 * module
    # Each MLA layer pays the module's floor once, inside or outside a CUDA graph, and its time
    # per sequence for each decoding one.
    assert st.stages[0].mla_heads == 61 * 16
    plain = StepModel([replace(stage, mla_layers=0, mla_heads=0) for stage in st.stages], st.hw, tp=8, eff=st.eff,
                      async_scheduling=st.async_scheduling, graph_max_tokens=st.graph_max_tokens)  # fmt: skip
    per_seq = 61 * (DEFAULT.mla_seq_s + 16 * DEFAULT.mla_seq_head_s)
    for contexts, prefills, decoding in (([128], [], 1), ([128] * 40, [], 40), ([], [(st.graph_max_tokens + 1, 0)], 0)):
        for parts in (st.parts, st.stage_seconds):
            total = parts(contexts, prefills, 1)[0]
            base = (plain.parts if parts == st.parts else plain.stage_seconds)(contexts, prefills, 1)[0]
            added = getattr(total, "total_s", total) - getattr(base, "total_s", base)
            assert added == pytest.approx(61 * DEFAULT.mla_floor_s + decoding * per_seq, rel=1e-6), (len(contexts), prefills)


def test_async_scheduling_hides_the_cpu_step_behind_the_gpu_but_not_the_time_per_sequence() -> None:
    """Without async scheduling the CPU's step adds to the GPU's; with it the step takes the
    longer of the two. The time per sampled sequence adds in both (the measured burst pairs,
    tests/test_perf_validation.py)."""
    hw, arch = for_gpu("H100-SXM-80GB"), load_model("qwen3-30b-a3b")
    sync = predict.setup(arch, hw, predict.Serving(max_model_len=8192, async_scheduling=False)).step
    async_ = predict.setup(arch, hw, predict.Serving(max_model_len=8192, async_scheduling=True)).step
    per_seq = DEFAULT.seq_overhead_s * 8
    gpu = sync.stage_seconds([1024] * 8, [], 1)[0] - DEFAULT.step_overhead_s - per_seq
    assert gpu > DEFAULT.step_overhead_s > 0
    assert async_.stage_seconds([1024] * 8, [], 1)[0] == pytest.approx(gpu + per_seq, rel=1e-9)
    parts = async_.parts([1024] * 8, [], 1)[0]
    assert parts.total_s == pytest.approx(gpu + per_seq, rel=1e-9)


@pytest.mark.parametrize("model,tp,ep", [("llama-3.1-70b", 8, False), ("qwen3-235b-a22b", 8, False), ("qwen3-235b-a22b", 8, True)])
def test_gemm_flops_per_token_are_twice_the_active_parameters_on_a_rank(model: str, tp: int, ep: bool) -> None:
    """Per token, the GEMMs on a rank do 2 FLOPs per active parameter it holds: the catalog's
    active count (embedding left out; routed experts at top-k of E) over TP, except the
    replicated groups (routers, norms), which every rank holds whole."""
    from infra.catalog.arch import Shard
    from infra.catalog.models import params_active

    s = _setup(model, tp=tp, expert_parallel=ep)
    stage = s.step.stages[0]
    per_token = sum(g.flops_per_token for g in stage.gemms) + sum(e.layers * e.flops_per_token for e in stage.experts)
    replicated = sum(g.count for layer in s.arch.layers for g in layer.params if g.shard == Shard.REPLICATED)
    replicated += sum(g.count for g in s.arch.final if g.shard == Shard.REPLICATED)
    expected = 2 * params_active(s.arch, include_embedding=False) / tp + 2 * replicated * (1 - 1 / tp)
    assert per_token == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("model,tp", [("llama-3.1-70b", 8), ("llama-3.1-70b", 4), ("deepseek-r1", 8), ("qwen3-30b-a3b", 1)])
def test_decode_reads_the_kv_bytes_the_memory_planner_stores_per_token(model: str, tp: int) -> None:
    """A full-attention decode reads every cached token once per layer: per token of context,
    the attention terms' bytes are the planner's KV bytes per token on the rank."""
    gpu = "H200-141GB" if model == "deepseek-r1" else "H100-SXM-80GB"
    s = _setup(model, gpu=gpu, tp=tp)
    arch = s.arch
    per_token = sum(a.layers * a.bytes_per_entry / a.divisor for a in s.step.stages[0].attention if a.threshold is None)
    kv_bytes = memory.kv_element_bytes("auto", arch.model_dtype)
    assert per_token == pytest.approx(memory.bytes_per_token(arch.layers, tp, kv_bytes), rel=1e-9)


def test_a_decode_steps_reads_grow_by_the_kv_bytes_of_the_added_context() -> None:
    """One more token of context in each of 16 sequences adds 16 x the KV bytes per token
    to the bytes read, at the achieved bandwidth (llama at TP 8: memory-bound)."""
    s = _setup("llama-3.1-70b", tp=8)
    kv = memory.bytes_per_token(s.arch.layers, 8, 2)
    bw = get_gpu("H100-SXM-80GB").hbm_bandwidth_bytes_per_s * DEFAULT.hbm
    grow = s.step.parts([2001] * 16, [], 1)[0].memory_s - s.step.parts([2000] * 16, [], 1)[0].memory_s
    assert grow == pytest.approx(16 * kv / bw, rel=1e-6)


def test_an_a100_reads_at_the_bandwidth_its_own_kernel_tables_reach() -> None:
    """On an A100 the same added context is read at A100's datasheet bandwidth times the weight-read
    fraction its own GEMM table gives (fitted.AMPERE), not H100's."""
    from infra.planning.perf.fitted import AMPERE

    s = _setup("llama-3.1-70b", gpu="A100-80GB", tp=8)
    kv = memory.bytes_per_token(s.arch.layers, 8, 2)
    bw = get_gpu("A100-80GB").hbm_bandwidth_bytes_per_s * AMPERE["hbm"]
    grow = s.step.parts([2001] * 16, [], 1)[0].memory_s - s.step.parts([2000] * 16, [], 1)[0].memory_s
    assert AMPERE["hbm"] < DEFAULT.hbm and grow == pytest.approx(16 * kv / bw, rel=1e-6)


def test_tp_all_reduces_two_per_layer_of_hidden_activations() -> None:
    """Llama-70B at TP 8: 160 all-reduces of tokens x 8,192 x 2 bytes, each the custom
    all-reduce's latency plus 2 (n - 1) / n of the bytes over NVLink's achieved bus bandwidth."""
    s = _setup("llama-3.1-70b", tp=8)
    nvlink = get_gpu("H100-SXM-80GB").nvlink_bandwidth_bytes_per_s / 2
    for tokens in (1, 4096):
        expected = 160 * (DEFAULT.allreduce_latency_s + 2 * 7 / 8 * tokens * 8192 * 2 / (nvlink * DEFAULT.allreduce_bw))
        assert s.step.parts([], [(tokens, 0)], 1)[0].communication_s == pytest.approx(expected, rel=1e-9)
    assert _setup("qwen3-30b-a3b", tp=1).step.parts([100], [], 1)[0].communication_s == 0.0


@settings(max_examples=60, deadline=None)
@given(before=st.integers(0, 5000), new=st.integers(1, 3000), threshold=st.one_of(st.none(), st.integers(1, 6000)))
def test_prefill_sum_min_counts_what_each_causal_query_reaches(before: int, new: int, threshold) -> None:
    from infra.planning.perf.step import _prefill_sum_min

    naive = sum(min(before + j, threshold) if threshold else before + j for j in range(1, new + 1))
    assert _prefill_sum_min(before, new, threshold) == pytest.approx(naive, rel=1e-12)


def test_the_pipeline_hop_is_latency_plus_activations_over_the_link() -> None:
    """vLLM sends hidden states and residual in bf16 between stages: over EFA between
    whole-node stages (p5: 400 Gb/s per GPU, aws-ofi-nccl's 75 us), over NVLink inside a node."""
    hw = for_instance(get_instance_type("p5.48xlarge"))
    arch = load_model("deepseek-v4-pro")
    across = predict.setup(arch, hw, predict.Serving(tp=8, pp=4, max_model_len=8192)).step
    assert across.hop_seconds(100) == pytest.approx(75e-6 + 100 * 4 * arch.hidden_size / 50e9, rel=1e-9)
    assert across.hop_seconds(0) == 0.0
    inside = predict.setup(load_model("qwen3-30b-a3b"), for_gpu("H100-SXM-80GB"), predict.Serving(tp=4, pp=2, max_model_len=8192)).step
    assert not inside.hop_over_network
    assert inside.hop_seconds(100) == pytest.approx(2e-6 + 100 * 4 * 2048 / 450e9, rel=1e-9)
    single = _setup("qwen3-30b-a3b", tp=1).step
    assert single.hop_seconds(100) == 0.0


def test_stages_split_the_layers_and_the_last_holds_the_lm_head_and_the_drafter() -> None:
    from infra.planning.perf.ops import model_stages

    arch = load_model("deepseek-r1")
    gpu = get_gpu("H200-141GB")
    stages = model_stages(arch, tp=8, pp=4, gpu=gpu, expert_parallel=False, kv_bytes=1, speculative=True)
    assert [s.layers for s in stages] == memory.split_layers(len(arch.layers), 4)
    assert [any(g.per_sampled_token for g in s.gemms) for s in stages] == [False, False, False, True]
    assert [s.draft is not None for s in stages] == [False, False, False, True]
    assert stages[-1].draft.layers == len(arch.mtp_layers)
    plain = model_stages(arch, tp=8, pp=4, gpu=gpu, expert_parallel=False, kv_bytes=1, speculative=False)
    assert plain[-1].draft is None
    # vocab x hidden / TP, bf16, for each sampled sequence
    head = [g for g in stages[-1].gemms if g.per_sampled_token][0]
    assert head.flops_per_token == pytest.approx(2 * arch.vocab_size * arch.hidden_size / 8)
    assert head.weight_bytes == pytest.approx(arch.vocab_size * arch.hidden_size * 2 / 8)


def test_gqa_attention_flops_per_cached_token_follow_the_config() -> None:
    """Llama-3.1-70B (64 query heads of 128) at TP 8: 8 heads per rank, each dotting K and
    summing V of 128 elements per cached token, 2 FLOPs a multiply-add: 4,096 per token."""
    import json

    from infra.catalog.models import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "llama-3.1-70b.json").read_text())
    s = _setup("llama-3.1-70b", tp=8)
    full = [a for a in s.step.stages[0].attention if a.threshold is None and a.reads_context]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert len(full) == 1 and full[0].layers == cfg["num_hidden_layers"]
    assert full[0].flops_per_entry == 2 * (cfg["num_attention_heads"] // 8) * 2 * head_dim
    assert full[0].bytes_per_entry == 2 * max(1, cfg["num_key_value_heads"] // 8) * head_dim * 2


def test_deepseek_v4_reads_its_window_its_top_k_compressed_entries_and_its_indexer_keys() -> None:
    """The attention patterns of a V4 stage, from the config: a 128-token window, CSA's
    top-k (index_topk) of entries one per 4 tokens, the indexer scoring all of those, and
    HCA's entries one per 128 tokens."""
    import json

    from infra.catalog.models import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "deepseek-v4-pro.json").read_text())
    hw = for_instance(get_instance_type("p5.48xlarge"))
    s = predict.setup(load_model("deepseek-v4-pro"), hw, predict.Serving(tp=8, pp=4, max_model_len=8192))
    patterns = {(a.threshold, a.divisor) for st_ in s.step.stages for a in st_.attention if a.reads_context}
    assert (cfg["sliding_window"], 1) in patterns
    assert (cfg["index_topk"] * 4, 4) in patterns
    assert (None, 4) in patterns and (None, 128) in patterns


def test_a_kda_layer_reads_and_writes_its_whole_state_each_decode_step() -> None:
    """Kimi K3's KDA state per sequence on a rank, from the config: heads / TP of a d x d fp32
    recurrent state plus the q, k, v convolution states (kernel - 1 rows of d each, bf16);
    a decode step reads all of it and writes it back."""
    import json

    from infra.catalog.models import CONFIG_DIR

    lac = json.loads((CONFIG_DIR / "kimi-k3.json").read_text())
    lac = lac.get("linear_attn_config") or lac["text_config"]["linear_attn_config"]
    heads, d, kernel = lac["num_heads"] // 8, lac["head_dim"], lac["short_conv_kernel_size"]
    state = heads * d * d * 4 + 3 * (kernel - 1) * heads * d * 2
    hw = for_instance(get_instance_type("p5.48xlarge"))
    s = predict.setup(load_model("kimi-k3"), hw, predict.Serving(tp=8, pp=4, max_model_len=8192))
    kda = [a for a in s.step.stages[0].attention if not a.reads_context]
    assert len(kda) == 1 and kda[0].bytes_per_sequence == 2 * state


@pytest.mark.parametrize("name", sorted(__import__("infra.catalog.gpus", fromlist=["GPUS"]).GPUS))
def test_every_catalog_gpu_has_its_links_and_peaks(name: str) -> None:
    """Each GPU of the catalog gets a link between its GPUs (NVLink, or PCIe without it) and
    a network when an instance type carries it, and a bf16 peak to compute with."""
    hw = for_gpu(name)
    assert hw.intra_node_bytes_per_s > 0 and hw.peak_flops("bf16") > 0
    assert hw.gpus_per_node >= 1 and hw.source


def test_the_mla_layers_are_those_config_json_gives_a_latent_kv_cache() -> None:
    """Every catalog model: a layer runs vLLM's MLA module where its config.json has a
    kv_lora_rank (DeepSeek-V3/R1/V3.2, Kimi K2), in Kimi K3 only its full-attention layers
    (linear_attn_config.full_attn_layers; the rest are KDA), and nowhere else (DeepSeek-V4
    has no kv_lora_rank: its attention is not that module)."""
    import json
    from pathlib import Path

    from infra.planning.perf.ops import is_mla

    folder = Path(__file__).resolve().parent.parent / "infra" / "catalog" / "model_configs"
    seen = 0
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith("hf_quant_config.json"):
            continue
        cfg = json.loads(path.read_text())
        cfg = cfg.get("text_config", cfg)
        linear = cfg.get("linear_attn_config") or {}
        expected = len(linear["full_attn_layers"]) if linear else cfg["num_hidden_layers"] if cfg.get("kv_lora_rank") else 0
        assert sum(is_mla(layer) for layer in load_model(path.stem).layers) == expected, path.stem
        seen += expected > 0
    assert seen >= 5


@pytest.mark.parametrize("model,path", [("gpt-oss-120b", "frontend_intake_harmony_s"), ("qwen3-30b-a3b", "frontend_intake_s")])
def test_a_burst_waits_for_the_intake_of_its_models_chat_path(model: str, path: str) -> None:
    """vLLM's API server renders gpt-oss's chat requests with openai_harmony and every other
    model's with the chat template and the tokenizer (serving_chat.py, by model_type): a burst
    of n requests reaches the engine about n x that path's intake after it is sent, so 10 ms
    more on its path adds about n x 10 ms to its mean TTFT, and 10 ms more on the other path
    adds nothing."""
    other = ({"frontend_intake_s", "frontend_intake_harmony_s"} - {path}).pop()
    s, n, work = _setup(model), 50, Workload.fixed(128, 4)

    def ttft(eff) -> float:
        res = predict.run(predict.with_efficiency(s, eff), work, concurrency=n, request_rate=None, num_prompts=n)
        return res.ttft_ms.mean

    base = ttft(DEFAULT)
    assert ttft(DEFAULT.replace(**{other: getattr(DEFAULT, other) + 0.010})) == pytest.approx(base, rel=1e-9)
    added = ttft(DEFAULT.replace(**{path: getattr(DEFAULT, path) + 0.010})) - base
    assert added == pytest.approx(n * 10.0, rel=0.1)


def test_a_tokenizer_that_encodes_the_conversation_itself_takes_the_intake_without_a_chat_template() -> None:
    """DeepSeek-V3.2's tokenizer mode renders a chat request to token ids in its own code, with no
    chat template (0.13.0 tokenizers/deepseek_v32.py; serving_engine.py _preprocess_chat then skips
    the micro-batching tokenizer); so does DeepSeek-V4's under the pinned release, which the stack
    serves with --tokenizer-mode deepseek_v4 (model_serving). Their intake is harmony's figure, the
    request's own time the template path's (the output path is the detokenizer's, not harmony's).
    Kimi K3's mode loads the HF tokenizer, chat template and all (0.34.0 tokenizers/registry.py)."""
    from infra.catalog.vllm import load_reference

    h200 = for_gpu("H200-141GB")
    v32 = load_model("deepseek-v3.2")

    def v32_setup(version: str, mode: str | None) -> predict.Setup:
        return predict.setup(v32, h200, predict.Serving(tp=8, max_model_len=8192, vllm_version=version, tokenizer_mode=mode))

    given = v32_setup("0.13.0", "deepseek_v32")
    assert predict.chat_path(given) == "encoded"
    assert predict.frontend_intake(given) == DEFAULT.frontend_intake_harmony_s
    assert predict.request_overhead(given) == DEFAULT.request_overhead_s
    # Without the flag 0.13.0 loads the HF tokenizer; the pinned release resolves `auto` to the
    # architecture's own mode (its flag reference: registries.auto_tokenizer_modes).
    assert predict.chat_path(v32_setup("0.13.0", "auto")) == "template"
    assert predict.tokenizer_mode(v32_setup(PINNED, "auto")) == "deepseek_v32"
    # An architecture the release does not map keeps `auto` (the HF tokenizer and its template).
    assert predict.tokenizer_mode(_setup("qwen3-30b-a3b")) == "auto"
    assert predict.chat_path(v32_setup(PINNED, None)) == "encoded"
    # The stack's own modes: DeepSeek-V4's encodes, Kimi K3's renders the template.
    v4 = predict.setup(load_model("deepseek-v4-pro"), h200, predict.Serving(tp=8, max_model_len=8192))
    assert (predict.tokenizer_mode(v4), predict.chat_path(v4)) == ("deepseek_v4", "encoded")
    k3 = predict.setup(load_model("kimi-k3"), h200, predict.Serving(tp=8, pp=2, max_model_len=8192))
    assert (predict.tokenizer_mode(k3), predict.chat_path(k3)) == ("kimi_k3", "template")
    # Every mode named is one the pinned release registers.
    assert predict.ENCODED_TOKENIZER_MODES <= set(load_reference(PINNED)["registries"]["tokenizer_modes"])


def test_a_rows_tokenizer_mode_is_the_one_its_server_ran() -> None:
    """The published rows that passed --tokenizer-mode deepseek_v32 (DeepSeek-V3.2's, on vLLM
    0.13.0) take the encoded path; every other row its model's own."""
    from infra.planning.perf import validate

    root = Path(__file__).parent / "fixtures" / "perf"
    encoded, other = set(), set()
    for row in validate.load_rows(root / "measurements.jsonl"):
        flags = " ".join(filter(None, [row.get("other_flags"), row.get("serve_command")]))
        try:
            s = validate.row_setup(row, root)
        except UserError:
            continue
        (encoded if predict.chat_path(s) == "encoded" else other).add(row["id"])
        assert (predict.chat_path(s) == "encoded") == ("--tokenizer-mode deepseek_v32" in flags), row["id"]
    assert len(encoded) >= 10 and len(other) >= 100


def test_gpt_oss_experts_on_hopper_run_marlin_until_the_wheel_carries_the_triton_kernels() -> None:
    """vLLM 0.10.2 and 0.11.0 run gpt-oss's MXFP4 experts with Marlin on H100 (no triton_kernels in the
    wheel: Release.vendors_triton_kernels), 0.12 on with the Triton kernels. Compute-bound (16k tokens
    on one H100), the MoE layer takes the two kernels' tables' shares apart: Marlin's H100 table
    (kernels/moe_marlin_h100_sxm.csv) against the Triton MXFP4 kernel's; and Marlin's padded experts
    are larger on the GPU (quant.MXFP4_MOE_ALIGNMENT)."""
    from infra.planning.perf import ops
    from infra.planning.perf.step import StepModel
    from infra.planning.vllm_release import release

    arch, hw = load_model("gpt-oss-120b"), for_gpu("H100-SXM-80GB")

    def expert_term(version: str):
        (stage,) = ops.model_stages(arch, tp=1, pp=1, gpu=hw.gpu, expert_parallel=False, kv_bytes=2, release=release(version))
        (term,) = stage.experts
        return term

    step = StepModel([], hw, tp=1, eff=DEFAULT)
    marlin, triton = expert_term("0.11.0"), expert_term("0.12.0")
    assert (marlin.kernel, triton.kernel) == ("marlin", "4bit")

    def compute_s(t) -> float:
        term = (t.experts, t.top_k, t.flops_per_token, t.bytes_per_expert, t.compute, t.kernel, t.inter_per_rank,
                t.activation_bytes_per_token)  # fmt: skip
        return step._moe(term, 16384)[0]

    assert compute_s(marlin) / compute_s(triton) == pytest.approx(DEFAULT.moe_gemm_4bit / DEFAULT.moe_gemm_marlin, rel=1e-6)
    assert 1.5 < compute_s(marlin) / compute_s(triton) < 2.0
    assert marlin.bytes_per_expert > triton.bytes_per_expert


@pytest.mark.parametrize("version,servers", [("0.14.0", 1), ("0.15.0", 4), (PINNED, 4)])
def test_replicas_share_the_intake_of_the_one_api_server_releases_before_0_15_start(version: str, servers: int) -> None:
    """`vllm serve --data-parallel-size 4` starts one API server up to 0.14 and one per replica from
    0.15 (entrypoints/openai/cli_args.py --api-server-count default 1; 0.15's entrypoints/cli/serve.py
    defaults it to data_parallel_size). A burst of n requests over 4 replicas reaches the engines
    after the intake of all n on one server, of n / 4 on each of four: 10 ms more intake a request
    adds about n x 10 ms to the mean TTFT with one server, n / 4 x 10 ms with four."""
    n, work = 200, Workload.fixed(128, 4)
    s = predict.setup(load_model("qwen3-0.6b"), for_gpu("H100-SXM-80GB"),
                      predict.Serving(dp=4, max_model_len=4096, async_scheduling=True, vllm_version=version))  # fmt: skip

    def ttft(eff) -> float:
        return predict.run(predict.with_efficiency(s, eff), work, concurrency=n, request_rate=None, num_prompts=n).ttft_ms.mean

    added = ttft(DEFAULT.replace(frontend_intake_s=DEFAULT.frontend_intake_s + 0.010)) - ttft(DEFAULT)
    assert added == pytest.approx(n / servers * 10.0, rel=0.1)


@pytest.mark.parametrize("model,gpu,serving", [
    ("qwen3-30b-a3b", "H100-SXM-80GB", dict(pp=2, async_scheduling=True, vllm_version="0.11.0")),
    ("gpt-oss-120b", "A100-80GB", dict(vllm_version="0.11.0")),
    ("deepseek-v3.2", "H200-141GB", dict(tp=8, num_speculative_tokens=1, acceptance_rate=0.6)),
])  # fmt: skip
def test_a_run_simulates_the_engine_its_setup_describes(monkeypatch, model: str, gpu: str, serving: dict) -> None:
    """`run` hands the scheduler simulation the setup's own engine: its knobs (batch limits, async
    scheduling, MTP drafts and acceptance), its release's behaviour (full-input reservation, batches
    in flight for its PP and async scheduling), prefix-cache reuse by its KV groups, the API server's
    intake on its chat path, the caller's seed and prefix hits; and adds the request's own time to
    every TTFT figure the simulation returns, p90 included."""
    from infra.planning.layout import model_runner_v2
    from infra.planning.perf import scheduler

    s = predict.setup(load_model(model), for_gpu(gpu), predict.Serving(max_model_len=8192, **serving))
    k, seen = s.knobs, {}
    real = scheduler.simulate

    def spy(*args, **kwargs):
        seen.update(kwargs)
        seen["result"] = real(*args, **kwargs)
        return seen["result"]

    monkeypatch.setattr(predict, "simulate", spy)
    res = predict.run(s, Workload.fixed(128, 8), concurrency=4, request_rate=None, num_prompts=8, seed=3,
                      prefix_cache_hit_rate=0.25)  # fmt: skip
    expected = dict(
        seed=3, prefix_hit_rate=0.25, max_num_seqs=k.max_num_seqs, max_num_batched_tokens=k.max_num_batched_tokens,
        max_model_len=k.max_model_len, async_scheduling=k.async_scheduling, num_speculative_tokens=k.num_speculative_tokens,
        acceptance_rate=s.serving.acceptance_rate, dp=s.layout.dp, reserve_full_input=k.release.reserve_full_input,
        max_concurrent_batches=k.release.max_concurrent_batches(s.layout.pp, async_scheduling=k.async_scheduling,
                                                                mrv2=model_runner_v2(s.arch, k.release)),
        frontend_s=predict.frontend_intake(s), prefix_caching=predict.prefix_cache_reuse(s.evaluation),
    )  # fmt: skip
    assert {key: seen[key] for key in expected} == expected
    assert (seen["num_speculative_tokens"], seen["acceptance_rate"]) == (serving.get("num_speculative_tokens", 0),
                                                                        serving.get("acceptance_rate", predict.DEFAULT_MTP_ACCEPTANCE))
    extra = predict.request_overhead(s) * 1000
    sim = seen["result"].ttft_ms
    assert (res.ttft_ms.mean, res.ttft_ms.p50, res.ttft_ms.p90, res.ttft_ms.p99) == pytest.approx(
        (sim.mean + extra, sim.p50 + extra, sim.p90 + extra, sim.p99 + extra))
    # Without them, a run takes seed 0 and no prefix hits.
    predict.run(s, Workload.fixed(128, 8), concurrency=4, request_rate=None, num_prompts=8)
    assert (seen["seed"], seen["prefix_hit_rate"]) == (0, 0.0)


@pytest.mark.parametrize("model,path", [("gpt-oss-120b", "request_overhead_harmony_s"), ("qwen3-30b-a3b", "request_overhead_s")])
def test_every_ttft_carries_the_request_overhead_of_its_models_chat_path(model: str, path: str) -> None:
    """A request's own time outside the engine (the HTTP round trip, the first token streamed
    back) is its chat path's, as the intake is: 10 ms more on the model's path adds 10 ms to
    every TTFT, mean and p99, in the simulation and in the SLA search's points alike, and 10 ms
    more on the other path adds nothing."""
    from infra.planning import performance as perf

    other = ({"request_overhead_s", "request_overhead_harmony_s"} - {path}).pop()
    s, work = _setup(model), Workload.fixed(128, 16)

    def ttfts(eff) -> tuple[float, float, float]:
        t = predict.with_efficiency(s, eff)
        res = predict.run(t, work, concurrency=4, request_rate=None, num_prompts=40)
        point = perf.closed_loop(t, perf.WorkloadSpec(128, 16, 0.0), perf.Sla(10_000, 10_000), 4)
        return res.ttft_ms.mean, res.ttft_ms.p99, point.ttft_p99_ms

    base = ttfts(DEFAULT)
    assert ttfts(DEFAULT.replace(**{other: getattr(DEFAULT, other) + 0.010})) == pytest.approx(base, rel=1e-9)
    more = ttfts(DEFAULT.replace(**{path: getattr(DEFAULT, path) + 0.010}))
    assert [b - a for a, b in zip(base, more)] == pytest.approx([10.0, 10.0, 10.0], rel=1e-6)


def test_the_time_per_token_counts_every_position_an_mtp_step_verifies() -> None:
    """The fitted time per token a step hands on: one per decoding sequence without drafting,
    k + 1 with k drafted tokens (each verified position may be emitted), one per prefill chunk."""
    s = _setup("deepseek-r1", gpu="H200-141GB", tp=8, num_speculative_tokens=1)
    without = predict.with_efficiency(s, DEFAULT.replace(seq_overhead_s=0.0))
    for query_len in (1, 2):
        added = s.step.stage_seconds([1000] * 64, [(512, 0)], query_len)[0] - without.step.stage_seconds([1000] * 64, [(512, 0)], query_len)[0]
        assert added == pytest.approx((64 * query_len + 1) * DEFAULT.seq_overhead_s, rel=1e-9)
        parts = s.step.parts([1000] * 64, [(512, 0)], query_len)[0].total_s
        assert parts == pytest.approx(s.step.stage_seconds([1000] * 64, [(512, 0)], query_len)[0], rel=1e-9)


@pytest.mark.parametrize("model,head_dim", [("gpt-oss-120b", 64), ("llama-3.1-70b", 128), ("deepseek-r1", 160)])
def test_prefill_attention_runs_at_the_fraction_of_its_head_size(model: str, head_dim: float) -> None:
    """The head size each model's prefill kernel works at, from its config (gpt-oss 64; MLA's
    prefill 192 query-key and 128 value wide, 160 on average), and a long prefill's attention
    time: its FLOPs at the attention peak times that size's fraction (step.head_dim_factor)."""
    from infra.planning.perf.step import head_dim_factor

    s = _setup(model, gpu="H200-141GB" if model == "deepseek-r1" else "H100-SXM-80GB", tp=8 if model != "gpt-oss-120b" else 1)
    assert {a.head_dim for a in s.step.stages[0].attention if a.reads_context} == {head_dim}
    flat = predict.with_efficiency(s, DEFAULT.replace(attention_half_dim=0.0))  # every size at 128's fraction
    long = [(8192, 0)]
    with_term, without = s.step.parts([], long, 1)[0].compute_s, flat.step.parts([], long, 1)[0].compute_s
    if head_dim == 128:
        assert with_term == pytest.approx(without, rel=1e-9)
    else:
        assert (with_term > without) == (head_dim < 128)


@pytest.mark.parametrize("version,gpu,tp,heads", [("0.13.0", "H200-141GB", 8, 64), ("0.13.0", "B200", 8, 128),
                                                  ("0.26.0", "H200-141GB", 2, 64), ("0.23.0", "H200-141GB", 8, 64),
                                                  ("0.13.0", "H200-141GB", 1, 128), ("0.12.0", "B200", 8, 128), ("0.12.0", "B300", 8, 64),
                                                  ("0.13.0", "B300", 8, 128), ("0.27.0", "H200-141GB", 8, None),
                                                  ("0.34.0", "H200-141GB", 8, None)])  # fmt: skip
def test_sparse_mla_prefill_runs_in_the_form_of_the_release(version: str, gpu: str, tp: int, heads: int | None) -> None:
    """DeepSeek-V3.2's sparse MLA, from its config.json: up to vLLM 0.26 every token, prefill too,
    runs the absorbed MQA kernel (keys kv_lora_rank + qk_rope_head_dim wide, values kv_lora_rank),
    the rank's query heads padded up to 64 (128 on SM 10.0, SM 10.x from 0.13), and no latent is expanded
    (flashmla_sparse.py FlashMLASparseImpl.forward of 0.11 to 0.26); from 0.27 prefills up to
    index_topk tokens run dense MHA (sparse_mla_attention.py), kept un-absorbed as DeepSeek-R1's."""
    import json
    from pathlib import Path

    from infra.planning.perf.ops import model_stages
    from infra.planning.vllm_release import release

    c = json.loads((Path(__file__).parents[1] / "infra" / "catalog" / "model_configs" / "deepseek-v3.2.json").read_text())
    stages = model_stages(load_model("deepseek-v3.2"), tp=tp, pp=1, gpu=get_gpu(gpu), expert_parallel=False, kv_bytes=2,
                          release=release(version))  # fmt: skip
    (main,) = [a for a in stages[0].attention if a.threshold == c["index_topk"]]
    if tp == 8:  # what a prediction at that release runs
        assert _setup("deepseek-v3.2", gpu=gpu, tp=tp, vllm_version=version).step.stages[0].attention == stages[0].attention
    per_rank = c["num_attention_heads"] // tp
    if heads is None:
        mha = c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]
        assert main.prefill_flops_per_entry == 2 * per_rank * mha
        assert main.prefill_context_flops == 2 * c["kv_lora_rank"] * c["num_attention_heads"] * (c["qk_nope_head_dim"] + c["v_head_dim"]) / tp
    else:
        mqa = 2 * c["kv_lora_rank"] + c["qk_rope_head_dim"]
        if version < "0.24":  # every one of the index_topk slots, per token whatever its context
            assert main.prefill_flops_per_entry == main.flops_per_entry == 0
            assert main.flops_per_sequence_token == 2 * heads * mqa * c["index_topk"]
        else:  # the valid ones (topk_length): min(context, index_topk) entries
            assert main.prefill_flops_per_entry == main.flops_per_entry == 2 * heads * mqa
            assert main.flops_per_sequence_token == 0
        assert main.prefill_context_flops == 0
        assert main.head_dim == mqa / 2


def test_sparse_mla_before_0_24_computes_every_topk_slot_of_a_short_context() -> None:
    """DeepSeek-V3.2 on 8 x H200: up to vLLM 0.23 FlashMLA's sparse kernel runs all 2,048 top-k slots
    of every token, masking the invalid ones after its MMAs (csrc/sm90/prefill/sparse/fwd.cu loops
    topk / B_TOPK blocks); 0.24 passes the valid count (topk_length). So a decode step over contexts
    shorter than index_topk takes longer under 0.23 than 0.24, the more so the shorter they are, and
    the same once every context fills the top-k; a prefill chunk's tokens, which see 1 to 2,048
    others, take longer too."""
    old, new = (_setup("deepseek-v3.2", gpu="H200-141GB", tp=8, vllm_version=v) for v in ("0.23.0", "0.24.0"))

    def extra(context: int) -> float:
        batch = ([context] * 512, [])
        return old.step.stage_seconds(*batch)[0] - new.step.stage_seconds(*batch)[0]

    assert extra(200) > extra(1000) > 0
    assert extra(4096) == pytest.approx(0.0, abs=1e-12)
    chunk = ([], [(2048, 0)])
    assert old.step.stage_seconds(*chunk)[0] > new.step.stage_seconds(*chunk)[0]


@pytest.mark.parametrize("model", ["deepseek-r1", "kimi-k2", "gpt-oss-120b", "llama-3.1-70b"])
def test_only_sparse_attention_runs_padded_heads(model: str) -> None:
    """Padded query heads and the absorbed MQA prefill are the sparse attention kernels' (DeepSeek-V3.2
    and V4): dense MLA (DeepSeek-R1, Kimi K2) and GQA run the same terms at every release."""
    from infra.planning.perf.ops import model_stages
    from infra.planning.vllm_release import release

    def stages(version):
        return model_stages(load_model(model), tp=8, pp=1, gpu=get_gpu("H200-141GB"), expert_parallel=False, kv_bytes=2,
                            release=release(version) if version else None)  # fmt: skip

    assert stages("0.13.0") == stages("0.34.0") == stages(None)


@pytest.mark.parametrize("gpu,tp,heads", [("H100-SXM-80GB", 8, 64), ("H100-SXM-80GB", 2, 64), ("B200", 1, 128),
                                          ("RTX-PRO-6000-Server", 16, 8), ("RTX-PRO-6000-Server", 8, 16),
                                          ("RTX-PRO-6000-Server", 4, 32), ("RTX-PRO-6000-Server", 2, 64),
                                          ("RTX-PRO-6000-Server", 1, 128)])  # fmt: skip
def test_deepseek_v4_attention_runs_the_heads_its_kernel_supports(gpu: str, tp: int, heads: int) -> None:
    """DeepSeek-V4 (vLLM 0.29 to 0.34, models/deepseek_v4/nvidia/): FlashMLA's sparse kernels run a
    rank's query heads as 64 or 128 ("FP8 decode kernel only supports h_q = 64 or 128"), prefill and
    decode, on every CUDA GPU but SM 12.x, where FlashInfer's run 8, 16, 32, 64 or 128: every
    attention pattern computes that many heads of head_dim-wide keys and values (its config.json)."""
    import json
    from pathlib import Path

    from infra.planning.perf.ops import model_stages
    from infra.planning.vllm_release import release

    c = json.loads((Path(__file__).parents[1] / "infra" / "catalog" / "model_configs" / "deepseek-v4-pro.json").read_text())
    arch = load_model("deepseek-v4-pro")
    stages = model_stages(arch, tp=tp, pp=1, gpu=get_gpu(gpu), expert_parallel=False, kv_bytes=1, release=release("0.34.0"))
    # Every pattern is the attention's, or the CSA indexer's (its own heads, replicated: not padded).
    attention = {(a.flops_per_entry, a.prefill_flops_per_entry) for a in stages[0].attention if a.flops_per_entry}
    indexer = 2 * c["index_n_heads"] * c["index_head_dim"]
    assert attention == {(2 * heads * 2 * c["head_dim"],) * 2, (indexer, indexer)}


def test_quantised_dense_weights_run_weight_only_kernels_where_no_tensor_core_takes_them() -> None:
    """vLLM 0.11: FP8 weights run Marlin below SM 8.9 (quantization/fp8.py use_marlin), natively on
    H100; AWQ (INT4) runs awq_marlin everywhere. Such kernels dequantise and compute in bf16."""
    from infra.planning.perf.ops import gemm_kernel

    a100, h100 = get_gpu("A100-80GB"), get_gpu("H100-SXM-80GB")
    assert [gemm_kernel(f, a100) for f in ("bf16", "fp16", "fp8", "int4")] == ["bf16", "bf16", "bf16_wo", "bf16_wo"]
    assert [gemm_kernel(f, h100) for f in ("bf16", "fp16", "fp8", "int4")] == ["bf16", "bf16", "fp8", "bf16_wo"]


def test_awq_on_a100_decodes_faster_and_prefills_slower_than_bf16() -> None:
    """Qwen3-32B on one A100: AWQ reads a quarter of the weight bytes, so one sequence decodes
    faster than bf16's; a long prefill is compute-bound, where Marlin's dequantising GEMM reaches
    less of the peak than cuBLAS (AMPERE gemm_weight_only, from the Marlin table), so it is slower."""
    from pathlib import Path

    root = Path(__file__).resolve().parent / "fixtures" / "perf" / "models"
    bf16 = predict.setup(load_model(str(root / "Qwen--Qwen3-32B.json")), for_gpu("A100-80GB"), predict.Serving(max_model_len=8192))
    awq = _setup("qwen3-32b-awq", gpu="A100-80GB")
    decode, prefill = ([1024], []), ([], [(8192, 0)])
    assert awq.step.stage_seconds(*decode)[0] < bf16.step.stage_seconds(*decode)[0]
    assert awq.step.stage_seconds(*prefill)[0] > bf16.step.stage_seconds(*prefill)[0]
    # ASSUMPTION where no table times a weight-only kernel (H100): cuBLAS bf16's fraction, so the
    # compute-bound prefill takes as long as bf16's.
    bf16_h100 = predict.setup(load_model(str(root / "Qwen--Qwen3-32B.json")), for_gpu("H100-SXM-80GB"), predict.Serving(max_model_len=8192))
    awq_h100 = _setup("qwen3-32b-awq", gpu="H100-SXM-80GB")
    assert awq_h100.step.parts(*prefill)[0].compute_s == pytest.approx(bf16_h100.step.parts(*prefill)[0].compute_s, rel=0.02)


def test_a_sliding_window_holds_its_window_while_decoding() -> None:
    """vLLM frees the blocks a sliding window has passed at every allocate_slots
    (SlidingWindowManager.remove_skipped_blocks, 0.11.0 and 0.34.0); admission charges the window
    plus every token in flight. gpt-oss-120b on one A100 (half its layers sliding, 128 tokens): a
    request of 415 tokens holds fewer blocks decoding than admission charges it, so a KV-bound
    burst decodes more sequences at once than the pool holds at the admission charge; a model with
    full attention only holds what it is charged."""
    s = predict.setup(load_model("gpt-oss-120b"), for_gpu("A100-80GB"), predict.Serving(max_model_len=8192, vllm_version="0.11.0"))
    pool = s.pool
    assert pool.held_for(415, 3) < pool.blocks_for(415)
    assert pool.held_for(415, 2048) == pool.blocks_for(415)  # a 2,048-token chunk in flight: as charged
    res = predict.run(s, Workload.fixed(215, 200), concurrency=600, request_rate=None, num_prompts=600)
    # The pool holds 1.47x as many at the decoding charge; the burst's mean batch counts its ramps.
    assert res.mean_batch_size > 1.2 * pool.num_blocks / pool.blocks_for(415)
    dense = _setup("llama-3.1-70b", tp=4)
    assert all(dense.pool.held_for(n, 3) == dense.pool.blocks_for(n) for n in (100, 415, 5000))


def test_replicas_sharing_a_moe_models_experts_read_their_share_and_exchange_tokens() -> None:
    """vLLM 0.34 splits a MoE model's experts over TP x DP GPUs and each MoE layer runs every
    replica's tokens, gathered before the experts and scattered after (fused_moe/config.py
    FusedMoEParallelConfig.make; device_communicators/all2all.py AgRsAll2AllManager). A decode
    step of one sequence per replica: each GPU reads at most its eighth of the experts (of
    Qwen3-30B-A3B's 128 experts, 8 tokens x top-8 touch at most 64), and pays the exchange."""
    arch = load_model("qwen3-30b-a3b")
    alone = _setup("qwen3-30b-a3b", tp=1)
    shared = _setup("qwen3-30b-a3b", tp=1, dp=8, expert_parallel=True)
    moe_layers = sum(1 for layer in arch.layers if layer.moe)
    routed = sum(memory.group_bytes_per_rank(g, 1, 1) for layer in arch.layers for g in layer.params
                 if g.role.value == "routed_expert")  # fmt: skip
    assert routed > 0
    [one] = alone.step.parts([1024], [])
    [each] = shared.step.parts([1024], [])
    bw = alone.step.hw.gpu.hbm_bandwidth_bytes_per_s
    # Bytes read at the achieved bandwidth, so at least bytes / peak: the lone replica reads the
    # eight experts its token routes to in every layer, a shared GPU at most 8 of its 16.
    assert one.memory_s >= 8 / 128 * routed / bw
    assert each.memory_s < one.memory_s
    # Within one node the exchange is NVLink's: two collectives per MoE layer, each at least the
    # link's latency (the fitted all-reduce latency is a floor the same way).
    assert each.communication_s >= 2 * moe_layers * shared.step.eff.allreduce_latency_s
    assert one.communication_s == 0.0  # TP 1: no all-reduce, no replicas


def test_replicas_across_nodes_exchange_a_moe_layers_tokens_over_efa() -> None:
    """Four p5.48xlarge as TP 8 x DP 4: the DP group spans nodes, so every MoE layer's gather and
    scatter cross EFA: at least two of aws-ofi-nccl's 75 us latencies per MoE layer a step, and
    more with more tokens (the other replicas' hidden states in, the outputs back)."""
    hw = for_instance(get_instance_type("p5.48xlarge"))
    arch = load_model("deepseek-v4-pro")
    s = predict.setup(arch, hw, predict.Serving(tp=8, dp=4, expert_parallel=True, max_model_len=8192))
    assert s.step.exchange_over_network
    moe_layers = sum(1 for layer in arch.layers if layer.moe)
    [small] = s.step.parts([1024], [])
    [large] = s.step.parts([1024] * 64, [])
    assert small.communication_s >= 2 * moe_layers * 75e-6
    # 63 more tokens per replica, from 3 other replicas: at least their bf16 hidden states in and out.
    assert large.communication_s - small.communication_s >= 3 * 63 * 2 * arch.hidden_size * 2 * moe_layers / hw.network_bytes_per_s


def test_a_closed_loop_of_fewer_requests_than_replicas_leaves_the_other_replicas_idle() -> None:
    """At concurrency 1 of DP 8 only one replica has tokens: its MoE layers run its own (prefill
    chunks of 8 x 512 tokens would be compute-bound), only the exchange's latency is left of the
    others. The setup's model takes all 8 as busy; at_load(1) as the run at concurrency 1 does."""
    s = _setup("qwen3-30b-a3b", tp=1, dp=8, expert_parallel=True)
    busy, lone = s.step, s.step.at_load(1)
    assert busy.at_load(8) is busy and lone.moe_load == 1 and busy.moe_load == 8
    [b] = busy.parts([], [(512, 0)])
    [a] = lone.parts([], [(512, 0)])
    assert a.total_s < b.total_s and a.communication_s < b.communication_s
    assert a.communication_s > 0  # the idle replicas still take part in each collective


def test_replicas_on_nodes_without_efa_exchange_over_the_instances_network() -> None:
    """g7e.2xlarge has no EFA (its AWS page: up to 50 Gbps): four one-GPU replicas of
    Qwen3-30B-A3B exchange each MoE layer's tokens over TCP at that bandwidth."""
    itype = get_instance_type("g7e.2xlarge")
    assert itype.max_efa_interfaces == 0 and itype.network_bandwidth_gbps == 50
    hw = for_instance(itype)
    arch = load_model("qwen3-30b-a3b")
    s = predict.setup(arch, hw, predict.Serving(tp=1, dp=4, max_model_len=4096))
    assert s.step.exchange_over_network and hw.network_bytes_per_s == 0
    moe_layers = sum(1 for layer in arch.layers if layer.moe)
    [small] = s.step.parts([1024], [])
    [large] = s.step.parts([1024] * 64, [])
    slope = (large.communication_s - small.communication_s) / (3 * 63 * moe_layers)
    assert slope == pytest.approx((2 * arch.hidden_size * 2 + 8 * arch.experts_per_token) / (50e9 / 8), rel=1e-9)


def test_two_replicas_already_exchange_and_split_columns_narrow_the_moe_kernel() -> None:
    """Replicas share the MoE layers from two on. Without expert parallel each GPU runs every
    expert's 1/(TP x DP) of its columns, narrower GEMMs at a lower fraction of the peak than whole
    experts (fitted.py moe_half_inter): a prefill chunk's MoE FLOPs take longer than with expert
    parallel, whose GPUs run whole experts, but carry fewer activation bytes, which with expert
    parallel are every pair's at the whole expert's width (ops.moe_activation_bytes; AIConfigurator's
    H100 table times Qwen3-235B's 16k-token MoE at 2.3 ms split 8 ways and 2.7 ms whole on 8 GPUs)."""
    two = _setup("qwen3-30b-a3b", tp=1, dp=2)
    [p] = two.step.parts([1024], [])
    assert p.communication_s >= 2 * 48 * two.step.eff.allreduce_latency_s
    sliced = _setup("qwen3-30b-a3b", tp=1, dp=8)
    whole = _setup("qwen3-30b-a3b", tp=1, dp=8, expert_parallel=True)
    [a] = sliced.step.parts([], [(4096, 0)])
    [b] = whole.step.parts([], [(4096, 0)])
    assert a.compute_s > b.compute_s and a.memory_s < b.memory_s


def test_one_request_on_replicas_sharing_moe_layers_is_faster_than_on_a_lone_replica() -> None:
    """At concurrency 1 the other replicas are idle (vLLM steps them on dummy batches), so each
    GPU runs only the request's own tokens through its eighth of the experts: the same FLOPs as a
    lone TP 1 replica, fewer expert bytes (a decode token's 8 experts spread over 8 GPUs), plus
    the exchange's latencies (under half a millisecond a step here). Had the model taken all
    eight replicas as busy, each GPU would read eight tokens' experts and be slower than alone."""
    w = Workload.fixed(2000, 50)
    lone = predict.run(_setup("qwen3-30b-a3b", tp=1), w, concurrency=1, request_rate=None, num_prompts=4)
    shared = predict.run(_setup("qwen3-30b-a3b", tp=1, dp=8, expert_parallel=True), w, concurrency=1, request_rate=None,
                         num_prompts=4)  # fmt: skip
    assert shared.ttft_ms.mean < lone.ttft_ms.mean and shared.tpot_ms.mean < lone.tpot_ms.mean


@pytest.mark.parametrize("model,gpu,version,ep,per_pair,pairs", [
    # Triton fused_moe over every pair, FP8 activations on Hopper: 13 x inter + 4 x hidden a pair.
    ("qwen3-235b-a22b-fp8", "H100-SXM-80GB", PINNED, False, 13 * 1536 // 8 + 4 * 4096, 8),
    # ... with expert parallel, every pair at the whole expert's width.
    ("qwen3-235b-a22b-fp8", "H100-SXM-80GB", PINNED, True, 13 * 1536 + 4 * 4096, 8),
    # No FP8 tensor cores on A100 (Marlin, W8A16): bf16 activations, no quantisation of them.
    ("qwen3-235b-a22b-fp8", "A100-80GB", PINNED, True, 10 * 1536 + 4 * 4096, 8),
    # gpt-oss's MXFP4 on H100 from 0.12: the OAI Triton kernel, fused, the rank's own pairs only.
    ("gpt-oss-120b", "H100-SXM-80GB", PINNED, True, 4 * 2880 + 2 * 2880, 4 / 8),
    ("gpt-oss-120b", "H100-SXM-80GB", PINNED, False, 4 * 2880 // 8 + 2 * 2880, 4),
    # ... before 0.12 Marlin, unfused: every pair, zeroed where the expert is elsewhere.
    ("gpt-oss-120b", "H100-SXM-80GB", "0.11.0", True, 10 * 2880 + 4 * 2880, 4),
])  # fmt: skip
def test_a_moe_layers_activation_bytes_follow_its_kernel_and_split(model, gpu, version, ep, per_pair, pairs) -> None:
    """ops.moe_activation_bytes as a real model's MoE layers get it at TP 8 (Qwen3-235B: hidden 4,096,
    expert intermediate 1,536, top-8 of 128; gpt-oss-120b: 2,880, 2,880, top-4 of 128): the kernel
    family the release and GPU run, whether its activations are FP8, and the expert-parallel split."""
    from infra.planning.perf import ops
    from infra.planning.vllm_release import release

    (stage,) = ops.model_stages(load_model(model), tp=8, pp=1, gpu=get_gpu(gpu), expert_parallel=ep, kv_bytes=2,
                                release=release(version))  # fmt: skip
    (term,) = stage.experts
    assert term.activation_bytes_per_token == pytest.approx(pairs * per_pair, rel=1e-12)
