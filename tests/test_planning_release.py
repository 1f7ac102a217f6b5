"""The planner's per-release rules, and the grouping code on small cases.

Each expectation names the vLLM file it was read in (the wheel of that release).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.errors import UserError
from infra.planning import PlanRequest, make_plan
from infra.planning import kv_cache
from infra.planning.kv_cache import Admission, LayerKV
from infra.planning.vllm_release import CHANGES, PINNED, changes_table, release

CONFIGS = Path(__file__).parent / "data" / "model_configs"


# --- Versions --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.9.2", "0.35.0", "1.0.0", "0.6.6"])
def test_unsupported_releases_are_refused_with_the_range(version):
    with pytest.raises(UserError, match=r"0\.10\.0 to 0\.34\.0 \(the V1 engine's accounting, read release by release\)"):
        release(version)
    with pytest.raises(UserError, match=r"0\.10\.0 to 0\.34\.0"):
        make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, vllm_version=version))


def test_not_a_version_is_refused():
    with pytest.raises(UserError, match="release number"):
        release("latest")


def test_every_release_in_the_range_plans():
    for minor in range(10, 35):
        plan = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, vllm_version=f"0.{minor}.0", tp=1))
        assert plan.feasible, (minor, plan.errors)


def test_the_pinned_release_is_the_stack_default():
    from infra.config.areas import ServingConfig

    assert ServingConfig().vllm_version == PINNED == PlanRequest(model="", instance_type="", nodes=0).vllm_version


def test_docs_carry_the_version_table(repo_root):
    page = (repo_root / "docs" / "planning.md").read_text()
    assert changes_table() in page, "docs/planning.md's version table is stale: run `python -m infra docs`"
    assert changes_table().splitlines()[0] == "| behaviour | first release | source (in that release's wheel) |"
    assert len(changes_table().splitlines()) == len(CHANGES) + 2  # header, rule, one row per change
    assert all(c.first and c.source for c in CHANGES)


@pytest.mark.parametrize(
    "version, util, estimate, extensible, block, async_ray, sum_of_ceils, tokens_from_conc",
    [
        ("0.10.0", 0.9, False, False, 16, False, False, False),
        ("0.19.0", 0.9, False, False, 16, False, False, False),
        ("0.20.0", 0.92, True, False, 16, False, False, False),
        ("0.21.0", 0.92, True, False, 16, True, False, True),
        ("0.27.0", 0.92, True, False, 16, True, True, True),
        ("0.33.0", 0.92, True, False, 16, True, True, True),
        ("0.34.0", 1.0, False, True, 64, True, True, True),
    ],
)
def test_release_rules(version, util, estimate, extensible, block, async_ray, sum_of_ceils, tokens_from_conc):
    r = release(version)
    assert r.default_gpu_memory_utilization == util  # config/cache.py
    assert r.cudagraph_estimate is estimate  # envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    assert r.extensible_kv_cache is extensible  # config/vllm.py _resolve_extensible_kv_cache
    assert r.default_block_size == block  # config/cache.py DEFAULT_BLOCK_SIZE
    assert r.async_scheduling(ray=True) is async_ray  # RayExecutorV2 from 0.21
    assert r.async_scheduling() is async_ray  # the default asks for the stack's executor, Ray
    assert r.concurrency_sum_of_ceils is sum_of_ceils  # kv_cache_utils.py get_max_concurrency_for_kv_cache_config
    assert r.kv_tokens_from_concurrency is tokens_from_conc


def test_async_scheduling_without_ray_from_0_14():
    """config/vllm.py VllmConfig.__post_init__: async scheduling on by default from 0.14 where the
    executor supports it (mp, uni, external_launcher), which Ray's did not until RayExecutorV2
    (0.21); off before 0.14 whatever the executor (config/scheduler.py async_scheduling = False)."""
    for version, mp, ray in (("0.13.0", False, False), ("0.14.0", True, False), ("0.20.0", True, False), ("0.21.0", True, True)):
        assert release(version).async_scheduling(ray=False) is mp, version
        assert release(version).async_scheduling(ray=True) is ray, version


def test_api_servers_per_release():
    """`vllm serve` with data parallel: one API server up to 0.14 (entrypoints/openai/cli_args.py
    --api-server-count default=1 in the 0.13.0 and 0.14.0 wheels), one per replica from 0.15
    (its default None, resolved to data_parallel_size in entrypoints/cli/serve.py in the 0.15.0,
    0.16.0, 0.17.0, 0.18.0, 0.24.0 and 0.34.0 wheels); without data parallel always one."""
    for version, servers in (("0.10.0", 1), ("0.13.0", 1), ("0.14.1", 1), ("0.15.0", 8), ("0.24.0", 8), (PINNED, 8)):
        assert release(version).api_servers(8) == servers, version
        assert release(version).api_servers(1) == 1


def test_a_defaulted_max_num_seqs_is_capped_at_the_batched_tokens_from_0_10_1():
    """engine/arg_utils.py: 0.10.0's _set_default_args_v1 sets max_num_seqs = default_max_num_seqs[...]
    alone; 0.10.1's and 0.10.2's, min(default, max_num_batched_tokens or sys.maxsize); 0.11.0's
    _set_default_args the same; 0.34.0's _set_default_max_num_seqs_and_batched_tokens_args
    min(max_num_seqs, max_num_batched_tokens) when max_num_seqs was not given. The one rule here
    that changed in a patch release: "0.10" is 0.10.0."""
    from infra.planning import serving

    h100 = 80 * 2**30
    for version, capped in (("0.10.0", False), ("0.10", False), ("0.10.1", True), ("0.10.2", True), ("0.11.0", True), (PINNED, True)):
        r = release(version)
        assert r.caps_default_max_num_seqs is capped, version
        default = serving.default_max_num_seqs(h100, "H100-SXM-80GB", r)
        assert serving.batch_knobs(512, None, 8192, h100, "H100-SXM-80GB", r) == (512, 512 if capped else default) and default > 512
        assert serving.batch_knobs(8192, None, 8192, h100, "H100-SXM-80GB", r)[1] == default  # the cap only binds below it
        assert serving.batch_knobs(512, 600, 8192, h100, "H100-SXM-80GB", r) == (512, 600)  # pinned: vLLM takes it as given


def test_a_defaulted_batched_tokens_is_capped_at_max_num_seqs_times_max_model_len_from_0_12():
    """engine/arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args of 0.12.0 (and 0.14.0,
    0.17.0, 0.19.0, 0.22.0, 0.25.0, 0.27.0, 0.29.0, 0.34.0): a defaulted max_num_batched_tokens is
    min(max_num_seqs x max_model_len, default), max_num_seqs as pinned or defaulted; 0.11.0's
    _set_default_args has no such line. Then a defaulted max_num_seqs is capped at the result."""
    from infra.planning import serving

    h100 = 80 * 2**30
    for version, capped in (("0.11.0", False), ("0.12.0", True), (PINNED, True)):
        r = release(version)
        assert r.caps_default_batched_tokens is capped, version
        default = serving.default_batched_tokens(h100, "H100-SXM-80GB", r)
        assert default > 2 * 1024
        # Two sequences of at most 1,024 tokens: the batch never needs more than 2,048.
        assert serving.batch_knobs(None, 2, 1024, h100, "H100-SXM-80GB", r) == (2048 if capped else default, 2)
        assert serving.batch_knobs(4096, 2, 1024, h100, "H100-SXM-80GB", r) == (4096, 2)  # pinned: as given
        # Both defaulted: the defaults' product is far above the default batched tokens.
        assert serving.batch_knobs(None, None, 1024, h100, "H100-SXM-80GB", r)[0] == default


# (architecture, MoE, hybrid, quantized) of the model configs the table below asks about.
_RUNNER_CASES = {
    "qwen3 dense": ("Qwen3ForCausalLM", False, False, False),
    "qwen3 dense fp8": ("Qwen3ForCausalLM", False, False, True),
    "llama dense": ("LlamaForCausalLM", False, False, False),
    "deepseek-v3 moe": ("DeepseekV3ForCausalLM", True, False, False),
    "deepseek-v2 moe": ("DeepseekV2ForCausalLM", True, False, False),
    "qwen3 moe": ("Qwen3MoeForCausalLM", True, False, False),
    "kimi-k3 hybrid moe": ("KimiK3ForConditionalGeneration", True, True, False),
    "deepseek-v4 moe": ("DeepseekV4ForCausalLM", True, False, False),
    "gemma dense": ("Gemma3ForCausalLM", False, False, False),  # never listed
}


@pytest.mark.parametrize("version, v2", [
    # DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES and _is_default_v2_model_runner_model in each wheel's
    # config/vllm.py: 0.22 {Qwen3ForCausalLM}, listed and not MoE and not quantized.
    ("0.21.0", set()),
    ("0.22.0", {"qwen3 dense"}),
    # 0.23 adds Llama and Mistral, the same rule.
    ("0.23.0", {"qwen3 dense", "llama dense"}),
    # 0.24: Qwen3, DeepseekV2, Qwen2Moe, GraniteMoe, Llama, Mistral; any listed one.
    ("0.24.0", {"qwen3 dense", "qwen3 dense fp8", "llama dense", "deepseek-v2 moe"}),
    # 0.25: DeepseekV2, Qwen2Moe, GraniteMoe; not hybrid, and listed or not MoE.
    ("0.25.0", {"qwen3 dense", "qwen3 dense fp8", "llama dense", "deepseek-v2 moe", "gemma dense"}),
    ("0.26.0", {"qwen3 dense", "qwen3 dense fp8", "llama dense", "deepseek-v2 moe", "gemma dense"}),  # adds Inkling, LongcatFlashNgram
    # 0.27 lists KimiK3ForConditionalGeneration, and a listed hybrid passes.
    ("0.27.0", {"qwen3 dense", "qwen3 dense fp8", "llama dense", "deepseek-v2 moe", "kimi-k3 hybrid moe", "gemma dense"}),
    # 0.28 lists DeepseekV4ForCausalLM.
    ("0.28.0", {"qwen3 dense", "qwen3 dense fp8", "llama dense", "deepseek-v2 moe", "kimi-k3 hybrid moe", "deepseek-v4 moe",
                "gemma dense"}),
    # 0.29: use_v2_model_runner no longer asks _is_default_v2_model_runner_model.
    ("0.29.0", set(_RUNNER_CASES)),
    (PINNED, set(_RUNNER_CASES)),
])  # fmt: skip
def test_which_models_run_model_runner_v2_by_default_per_release(version, v2):
    for name, (arch, moe, hybrid, quantized) in _RUNNER_CASES.items():
        got = release(version).model_runner_v2([arch], moe=moe, hybrid=hybrid, quantized=quantized)
        assert got is (name in v2), (version, name)


def test_the_triton_mxfp4_kernels_ship_in_the_wheel_from_0_12():
    """vllm/third_party/triton_kernels: none of its files in the 0.10.2 and 0.11.0 wheels, 40 in
    0.12.0's, whose utils/import_utils.py has_triton_kernels also finds the vendored copy; before, the
    separately installed package or Marlin on SM 9.0 (quantization/mxfp4.py get_mxfp4_backend)."""
    from infra.catalog.quant import mxfp4_moe_backend

    for version, vendored in (("0.10.0", False), ("0.10.2", False), ("0.11.0", False), ("0.12.0", True), (PINNED, True)):
        assert release(version).vendors_triton_kernels is vendored, version
        assert mxfp4_moe_backend(9.0, release(version).vendors_triton_kernels) == ("triton" if vendored else "marlin")
        assert mxfp4_moe_backend(8.0, release(version).vendors_triton_kernels) == "marlin"  # A100: Marlin either way


def test_in_flight_tokens_per_release():
    # 0.25: max-num-batched-tokens; 0.26-0.33 V1 runner: 2 at PP1 with async, PP otherwise;
    # Model Runner V2 and 0.34: PP + 1 with async (config/vllm.py max_concurrent_batches).
    assert release("0.25.0").sliding_window_tokens(4, 8192, async_scheduling=True, mrv2=True) == 8192
    assert release("0.26.0").sliding_window_tokens(1, 8192, async_scheduling=True, mrv2=False) == 2 * 8192
    assert release("0.26.0").sliding_window_tokens(4, 8192, async_scheduling=True, mrv2=False) == 4 * 8192
    assert release("0.26.0").sliding_window_tokens(4, 8192, async_scheduling=True, mrv2=True) == 5 * 8192
    assert release("0.34.0").sliding_window_tokens(4, 8192, async_scheduling=True, mrv2=False) == 5 * 8192
    assert release("0.34.0").sliding_window_tokens(4, 8192, async_scheduling=False, mrv2=True) == 4 * 8192


def test_models_before_their_first_modelled_release_are_refused():
    with pytest.raises(UserError, match="0.29 or later"):
        make_plan(PlanRequest(model="deepseek-v4-pro", instance_type="p5.48xlarge", nodes=4, vllm_version="0.28.0"))
    with pytest.raises(UserError, match="0.34 or later"):
        make_plan(PlanRequest(model="kimi-k3", instance_type="p5.48xlarge", nodes=4, vllm_version="0.33.0"))
    assert make_plan(PlanRequest(model="deepseek-v4-pro", instance_type="p5.48xlarge", nodes=4, vllm_version="0.29.0")).feasible


def _gpt_oss(version: str, **kw):
    return make_plan(PlanRequest(model=str(CONFIGS / "openai--gpt-oss-20b.json"), instance_type="p5.48xlarge", nodes=1,
                                 tp=2, dp=4, max_model_len=8192, max_num_batched_tokens=8192, vllm_version=version, **kw))  # fmt: skip


def test_sliding_window_model_across_releases():
    old, new = _gpt_oss("0.19.0"), _gpt_oss("0.34.0", async_scheduling=True)
    g_old = old.to_json_dict()["kv_cache"]["groups"]
    g_new = new.to_json_dict()["kv_cache"]["groups"]
    # 0.19: block 16, the window holds max-num-batched-tokens, capped at max-model-len
    assert [(g["kind"], g["block_size"], g["blocks_per_request"]) for g in g_old] == [
        ("sliding_window", 16, 513), ("full", 16, 512),
    ]  # fmt: skip
    # 0.34: block 64, DP replicas run PP1: (1 + 1) x 8,192 in flight, still capped at 8,192
    assert [(g["kind"], g["block_size"], g["blocks_per_request"]) for g in g_new] == [
        ("sliding_window", 64, 129), ("full", 64, 128),
    ]  # fmt: skip


def test_cuda_graphs_leave_the_kv_budget_from_0_20():
    a = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, tp=1, vllm_version="0.19.0"))
    b = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, tp=1, vllm_version="0.20.0"))
    sa, sb = a.stages[0], b.stages[0]
    assert sa.cudagraph_estimate_bytes == 0 < sb.cudagraph_estimate_bytes
    assert sa.kv_cache_bytes - sb.kv_cache_bytes == sb.cudagraph_estimate_bytes
    for s in (sa, sb):  # the lines add up whichever way the graphs are counted
        assert s.weights_bytes + s.activation_bytes + s.kv_cache_bytes + s.comm_buffer_bytes + s.cuda_overhead_bytes + s.headroom_bytes == s.gpu_visible_bytes


def test_extensible_kv_cache_keeps_a_margin_below_free_memory():
    # 0.34 (extensible_kv_cache.py measure_kv_cache_bytes): at utilisation 0.98 the budget is
    # capped by what is free at start (visible - CUDA context) less max(1 GiB, 0.75 x peak).
    from infra.planning.memory import GiB, cuda_context_bytes

    # At vLLM's default --max-num-seqs (1,024), whose sampler and graphs set the activation peak.
    plan = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, tp=1, gpu_memory_utilization=0.98,
                                 max_num_seqs=1024))  # fmt: skip
    s = plan.stages[0]
    margin = max(GiB, int(0.75 * s.activation_bytes))
    assert s.usable_bytes > s.gpu_visible_bytes - cuda_context_bytes(False) - margin  # the cap binds
    assert s.headroom_bytes == margin  # what stays free is exactly the margin
    low = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, tp=1, gpu_memory_utilization=0.9,
                                max_num_seqs=1024))  # fmt: skip
    assert low.stages[0].headroom_bytes > margin  # below the cap the utilisation binds



def test_utilisation_one_is_0_34s_default_and_older_releases_are_told_it_leaves_no_headroom():
    # 0.34 takes 1.0 when --gpu-memory-utilization is unset (config/cache.py
    # resolved_gpu_memory_utilization): its margin, not the utilisation, bounds the cache.
    def at(u: float, version: str):
        return make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, tp=1,
                                     gpu_memory_utilization=u, vllm_version=version, max_num_seqs=1024))  # fmt: skip

    full, capped = at(1.0, "0.34.0"), at(0.98, "0.34.0")
    assert full.feasible and full.stages[0].kv_cache_bytes == capped.stages[0].kv_cache_bytes > 0
    assert not [w for w in full.warnings if "headroom" in w or "gpu-memory-utilization" in w]
    old = at(1.0, "0.21.0")  # no extensible cache: nothing is left for the CUDA context
    assert old.stages[0].headroom_bytes < 0 and any("lower the utilization" in w for w in old.warnings)

# --- Grouping on small cases (v1/core/kv_cache_planning.py) ----------------------------------


def _layer(i: int, spec: str = "full", *, page: int = 4096, block: int = 16, window: int = 0, kind: str = "full") -> LayerKV:
    return LayerKV(name=f"{i}.{spec}", layer=i, kind=kind, spec=spec, block_size=block, page_bytes=page, window=window)


def test_approximate_gcd_prefers_least_padding_then_larger():
    assert kv_cache.approximate_gcd([61, 31, 30], lower_bound=30) == 31
    assert kv_cache.approximate_gcd([62, 31, 30], lower_bound=30) == 31
    assert kv_cache.approximate_gcd([4, 6]) == 2  # pad 0 at d = 1 and 2: the larger wins
    assert kv_cache.approximate_gcd([5], lower_bound=9) == 9


def test_uniform_page_size_groups_pad_near_equal_buckets():
    # gpt-oss-20b + an EAGLE draft (the comment in _get_kv_cache_groups_uniform_page_size): 12 sliding
    # + 13 full layers -> groups of 13, not 12 + 12 + 1.
    layers = [_layer(i, "sliding", window=128, kind="sliding_window") for i in range(12)] + [_layer(12 + i) for i in range(13)]
    groups = kv_cache.uniform_page_size_groups(layers)
    assert [len(g.layers) for g in groups] == [12, 13]
    # 10 full + 20 sliding: groups of 10, sliding split as layers[i::2]
    layers = [_layer(i) for i in range(10)] + [_layer(10 + i, "sliding", window=128) for i in range(20)]
    groups = kv_cache.uniform_page_size_groups(layers)
    assert [len(g.layers) for g in groups] == [10, 10, 10]
    assert [s.layer for s in groups[1].layers] == list(range(10, 30, 2))


def test_unify_page_sizes_scales_blocks_and_refuses_unpaddable_mla():
    small, big = _layer(0, page=2048), _layer(1, "sliding", page=8192, window=128)
    out = kv_cache.unify_page_sizes([small, big])
    assert (out[0].block_size, out[0].page_bytes) == (64, 8192)
    with pytest.raises(ValueError, match="MLA"):
        kv_cache.unify_page_sizes([_layer(0, "mla", page=3000), _layer(1, page=8192)])


def test_sliding_window_reservation_formula():
    spec = _layer(0, "sliding", block=64, window=128)
    # SlidingWindowSpec.max_admission_blocks_per_request: cdiv(min(127 + in-flight, L), 64) + 1
    assert kv_cache.blocks_per_request(spec, Admission(max_model_len=131072, sliding_tokens=16384)) == 259
    assert kv_cache.blocks_per_request(spec, Admission(max_model_len=4096, sliding_tokens=16384)) == 65


def test_concurrency_before_0_27_is_a_ceiling_of_the_sum():
    groups = [kv_cache.Group((_layer(0, page=100),)), kv_cache.Group((_layer(1, "sliding", page=100, window=8),))]
    adm = Admission(max_model_len=20, sliding_tokens=4)
    # full: cdiv(20, 16) = 2 blocks; sliding: cdiv(min(7 + 4, 20), 16) + 1 = 2 -> 4 either way
    assert kv_cache.request_blocks(groups, adm, release=release("0.26.0")) == 4
    assert kv_cache.request_blocks(groups, adm, release=release("0.34.0")) == 4
    assert kv_cache.kv_tokens(100, groups, adm, release=release("0.20.0")) == 100 // 2 * 16
    assert kv_cache.kv_tokens(100, groups, adm, release=release("0.21.0")) == int(100 / 4 * 20)


def test_kimi_k3_hybrid_alignment():
    # platforms/interface.py _align_hybrid_block_size at TP8: a KDA state (96 / 8 heads: 12 x 128 x
    # 128 fp32 + 36,864 / 8 x 3 bf16 conv) = 814,080 B; the MLA page per token 576 x 2 B; the block
    # becomes 128 x cdiv(814,080, 128 x 1,152) = 768 and the state is padded to 768 x 1,152 B.
    plan = make_plan(PlanRequest(model="kimi-k3", instance_type="p5.48xlarge", nodes=4, max_model_len=131072))
    groups = plan.to_json_dict()["kv_cache"]["groups"]
    assert {g["block_size"] for g in groups} == {768}
    assert {p for g in groups for p in g["layer_page_bytes"]} == {768 * 1152}
    kinds = [g["kind"] for g in groups]
    assert kinds.count("linear_state") == 3 and kinds.count("full") == 1  # 69 KDA layers in groups of 24 (padded to 72)
    # align mode: 2 + speculative + checkpoint blocks per KDA group; MLA cdiv(L, 768)
    assert [g["blocks_per_request"] for g in groups] == [3, 3, 3, cdiv(131072, 768)]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
