"""What changes in vLLM's memory and KV-cache accounting, and in the kernels the performance
model follows, from release to release.

The planner follows the release the stack serves (`serving.vllmVersion`,
`plan --vllm-version`). Every rule below was read in that release's wheel (the
`vllm/` tree of `vllm-X.Y.Z-*.whl` on PyPI); `CHANGES` lists each behaviour
change with the first release it applies to and the file that holds it, and
the version table in docs/planning.md is generated from it. Releases are compared by
version (`Release.at_least`); every rule but one changed in a minor release, so a patch
release keeps its minor release's accounting (the one: 0.10.1's cap on a defaulted
--max-num-seqs).

Supported: the V1 engine from 0.10.0 (the first release in which it is the
only engine the planner models) to the pinned release; anything else is
refused with the range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Sequence

from infra.errors import UserError

PINNED = "0.34.0"  # what infra/config/areas.py ServingConfig.vllm_version defaults to
FIRST_SUPPORTED = "0.10.0"


@lru_cache(maxsize=256)
def _minor(version: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if not m:
        raise UserError(f"vLLM version {version!r} is not a release number such as {PINNED}")
    return int(m.group(1)), int(m.group(2))


@lru_cache(maxsize=256)
def _patch(version: str) -> int:
    """The patch number of a release `_minor` has read ("0.10" reads as 0.10.0)."""
    return int(re.fullmatch(r"\d+\.\d+(?:\.(\d+))?", version.strip()).group(1) or 0)


@dataclass(frozen=True)
class Change:
    behaviour: str
    first: str  # first release the behaviour applies to
    source: str  # file (and function) in that release's wheel


# One row per behaviour change the planner follows, oldest first.
CHANGES: tuple[Change, ...] = (
    Change("requested memory = gpu-memory-utilization x total GPU memory (not free memory)", "0.10.0",
           "v1/worker/gpu_worker.py Worker.init_device (0.34: v1/worker/utils.py request_memory, math.ceil)"),
    Change("sliding-window layers reserve cdiv(min(window - 1 + max-num-batched-tokens, max-model-len), block) + 1 blocks per request",
           "0.10.0", "v1/kv_cache_interface.py SlidingWindowSpec.max_memory_usage_bytes"),
    Change("KV blocks: the minimum over all workers (PP stages); layers grouped by spec, one shared block pool",
           "0.10.0", "v1/core/kv_cache_utils.py get_kv_cache_config(s), _get_kv_cache_config_uniform_page_size"),
    Change("'GPU KV cache size' = num_blocks // number of groups x block size", "0.10.0",
           "v1/core/kv_cache_utils.py (get_kv_cache_config / _report_kv_cache_config)"),
    Change("max concurrency = num_blocks / cdiv(sum of per-group reservations, page of group 0)", "0.10.0",
           "v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config"),
    Change("default KV block size 16; MLA on Hopper forced to 64 (FlashMLA)", "0.10.0",
           "platforms/cuda.py CudaPlatform.check_and_update_config"),
    Change("default gpu-memory-utilization 0.9", "0.10.0", "config.py CacheConfig (0.11+: config/cache.py)"),
    Change("async scheduling off by default", "0.10.0", "config/scheduler.py SchedulerConfig.async_scheduling = False"),
    # The one rule the planner follows that changed in a patch release (Release.at_least reads it).
    Change("a --max-num-seqs left to its default is at most --max-num-batched-tokens (min of the two); 0.10.0 takes "
           "the default as it is", "0.10.1",
           "engine/arg_utils.py EngineArgs._set_default_args_v1 (0.11: _set_default_args; 0.34: _set_default_max_num_seqs_and_batched_tokens_args)"),
    Change("DeepSeek-V3.2's sparse MLA (performance model): every token, prefill too, in the absorbed MQA form "
           "(576 / 512), the rank's query heads padded to 64 (128 on SM 10.0; SM 10.x from 0.13)", "0.11.0",
           "v1/attention/backends/mla/flashmla_sparse.py FlashMLASparseImpl.forward, _forward_bf16_kv"),
    Change("a --max-num-batched-tokens left to its default is at most max-num-seqs x max-model-len", "0.12.0",
           "engine/arg_utils.py EngineArgs._set_default_max_num_seqs_and_batched_tokens_args"),
    Change("gpt-oss's MXFP4 experts on SM 9.0: the Triton backend's kernels in the wheel (vllm/third_party/triton_kernels); "
           "before, Marlin (W4A16, padded for it) unless triton_kernels is installed beside vLLM (ASSUMPTION: it is not)",
           "0.12.0", "model_executor/layers/quantization/mxfp4.py get_mxfp4_backend (0.10.2, 0.11.0: has_triton_kernels)"),
    Change("async scheduling on by default, except with the Ray executor (mp/uni/external_launcher only)", "0.14.0",
           "config/vllm.py VllmConfig.__post_init__ (executor_supports_async_sched)"),
    Change("one API server per data-parallel replica by default (internal load balancing); before, one for all "
           "(performance model: the replicas share its intake)", "0.15.0",
           "entrypoints/cli/serve.py ServeSubcommand.cmd; entrypoints/openai/cli_args.py --api-server-count default 1 up to 0.14"),
    Change("block size from the first attention layer's backend (FlashAttention MLA on Hopper: 16)", "0.18.0",
           "platforms/interface.py Platform.update_block_size_for_backend"),
    Change("CUDA-graph memory estimate implemented, not subtracted (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)", "0.18.0",
           "envs.py, v1/worker/gpu_model_runner.py GPUModelRunner.profile_cudagraph_memory"),
    Change("a waiting request is admitted only when its whole input fits in the free KV blocks (scheduler_reserve_full_isl, default True); before, its first chunk's blocks",
           "0.19.0", "config/scheduler.py SchedulerConfig.scheduler_reserve_full_isl, v1/core/sched/scheduler.py schedule"),
    Change("CUDA-graph estimate subtracted from the KV budget by default (env default '1'; the log says 'since v0.21.0')",
           "0.20.0", "envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, v1/worker/gpu_worker.py determine_available_memory"),
    Change("default gpu-memory-utilization 0.92", "0.20.0", "config/cache.py CacheConfig.gpu_memory_utilization"),
    Change("DeepSeek-V4 model code", "0.20.0", "model_executor/models/deepseek_v4.py"),
    Change("Ray uses RayExecutorV2 (a MultiprocExecutor): async scheduling on with Ray", "0.21.0",
           "envs.py VLLM_USE_RAY_V2_EXECUTOR_BACKEND default '1', v1/executor/abstract.py Executor.get_class"),
    Change("'GPU KV cache size' = int(max concurrency x max-model-len)", "0.21.0",
           "v1/core/kv_cache_utils.py _report_kv_cache_config"),
    Change("Model Runner V2 by default for some architectures", "0.22.0",
           "config/vllm.py VllmConfig.use_v2_model_runner, DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES"),
    Change("DeepSeek-V3.2's sparse MLA (performance model): FlashMLA computes only each token's valid top-k slots "
           "(topk_length, their count); before, all index_topk of them whatever the context (the SM 9.0 kernel loops over "
           "topk / B_TOPK blocks, vllm-project/FlashMLA 46d64a8 csrc/sm90/prefill/sparse/fwd.cu)", "0.24.0",
           "v1/attention/backends/mla/flashmla_sparse.py _forward_bf16_kv (return_valid_counts), _bf16_flash_mla_kernel"),
    Change("sliding-window reservation uses max_in_flight_tokens = max_concurrent_batches x max-num-batched-tokens "
           "(async: PP + 1 with Model Runner V2, 2 with the V1 runner at PP 1, else PP)", "0.26.0",
           "v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request, config/vllm.py max_in_flight_tokens"),
    Change("max concurrency = num_blocks / sum over groups of cdiv(reservation, page)", "0.27.0",
           "v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config"),
    Change("sparse MLA prefill (performance model): dense MHA, the un-absorbed form, when the batch's longest prefill "
           "reaches at most index_topk tokens", "0.27.0", "model_executor/layers/attention/sparse_mla_attention.py forward_mha"),
    # Before 0.27: weights + torch peak + non-torch increase. The planner's lines are the same
    # quantities either way (weights, activation peak, non-torch buffers), so no rule follows it.
    Change("non-KV memory = device free-memory drop (mem_get_info) + transient torch peak", "0.27.0",
           "utils/mem_utils.py memory_profiling"),
    Change("Model Runner V2 by default for every supported configuration", "0.29.0",
           "config/vllm.py VllmConfig.use_v2_model_runner"),
    Change("block-outermost packed KV groups for mixed page sizes (DeepSeek-V4)", "0.29.0",
           "v1/core/kv_cache_utils.py _get_packed_kv_cache_groups, _approximate_gcd"),
    Change("DeepSeek-V4's attention (performance model): FlashMLA's sparse kernels run the rank's query heads as 64 or "
           "128, prefill and decode (SM 12.x: FlashInfer's, as 8, 16, 32, 64 or 128)", "0.29.0",
           "models/deepseek_v4/nvidia/flashmla.py get_padded_num_q_heads, nvidia/model.py _select_dsv4_attn_cls"),
    Change("default KV block size 64, then per attention backend (DeepSeek-V4 256, its SWA cache 64)", "0.34.0",
           "config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE, platforms/interface.py update_block_size_for_backend"),
    Change("extensible KV cache on by default on CUDA: KV sized after warm-up and the real CUDA-graph capture, "
           "min(util x total - non-KV, free + committed - margin) - transient peak", "0.34.0",
           "config/vllm.py _resolve_extensible_kv_cache, v1/worker/extensible_kv_cache.py measure_kv_cache_bytes"),
    Change("max_concurrent_batches = PP + 1 with async scheduling (Model Runner V2 only)", "0.34.0",
           "config/vllm.py VllmConfig.max_concurrent_batches"),
    Change("hybrid (Mamba/KDA) models: prefix caching on, mamba_cache_mode 'align', attention block raised to cover the state",
           "0.34.0", "model_executor/models/config.py MambaModelConfig, platforms/interface.py _align_hybrid_block_size"),
)

# Model Runner V2 default architectures (config/vllm.py DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES)
# and the rule around them, per release, for the model types the catalog knows.
_MRV2_ARCHITECTURES = {
    (0, 22): {"Qwen3ForCausalLM"},
    (0, 23): {"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"},
    (0, 24): {"Qwen3ForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM",
              "LlamaForCausalLM", "MistralForCausalLM"},
    (0, 25): {"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"},
    (0, 26): {"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"},
    (0, 27): {"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM", "KimiK3ForConditionalGeneration"},
    (0, 28): {"DeepseekV2ForCausalLM", "DeepseekV4ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM",
              "KimiK3ForConditionalGeneration"},
}

# First release whose KV grouping the planner models for a model type; older
# releases are refused for it, with the reason.
FIRST_MODELLED = {
    # 0.20-0.28 group DeepSeek-V4 with group_and_unify_kv_cache_specs (v1/core/kv_cache_utils.py),
    # which the planner does not port; 0.29 introduced the packed grouping it follows.
    "deepseek_v4": ((0, 29), "DeepSeek-V4's KV grouping before 0.29 (group_and_unify_kv_cache_specs) is not modelled"),
    # Kimi K3 (models/kimi_k3) appears in 0.27; its KDA prefill checkpoints and the
    # align-mode Mamba reservations were read in 0.34 only.
    "kimi_linear": ((0, 34), "Kimi K3's KDA state accounting was read in 0.34 only"),
}


class SparseAttentionKernel(NamedTuple):
    """How a release's sparse attention kernel runs a rank's query heads (the performance model)."""

    absorbed_mla_prefill: bool = False  # MLA prefills in its decode (absorbed MQA) form
    head_counts: tuple[int, ...] = ()  # the head counts it runs at (the smallest holding the rank's); (): as many as there are
    # Each query token computes all index_topk slots, valid or not (a context shorter than
    # index_topk leaves the rest -1): FlashMLA's sparse kernels loop over topk / B_TOPK blocks and
    # mask the invalid ones after their MMAs, until vLLM passes the valid count (topk_length).
    every_topk_slot: bool = False


@dataclass(frozen=True)
class Release:
    version: str
    minor: tuple[int, int]
    patch: int = 0

    def at_least(self, version: str) -> bool:
        """This release is `version` or later ("0.11" is 0.11.0)."""
        return (*self.minor, self.patch) >= (*_minor(version), _patch(version))

    # --- Memory budget ----------------------------------------------------------

    @property
    def default_gpu_memory_utilization(self) -> float:
        """config/cache.py: 0.9 up to 0.19, 0.92 from 0.20; 0.34 resolves None to 1.0
        with the extensible KV cache (CacheConfig.resolved_gpu_memory_utilization)."""
        if self.extensible_kv_cache:
            return 1.0
        return 0.92 if self.at_least("0.20") else 0.9

    @property
    def cudagraph_estimate(self) -> bool:
        """Whether a CUDA-graph estimate is taken out of the KV budget (0.20-0.33)."""
        return self.at_least("0.20") and not self.extensible_kv_cache

    @property
    def extensible_kv_cache(self) -> bool:
        """0.34: on by default on CUDA (VllmConfig._resolve_extensible_kv_cache); the
        KV cache is sized after warm-up and the real CUDA-graph capture."""
        return self.at_least("0.34")

    @property
    def vendors_triton_kernels(self) -> bool:
        """Whether the wheel carries the Triton kernels gpt-oss's MXFP4 backend runs on SM 9.0
        (vllm/third_party/triton_kernels, from 0.12.0). Before, vLLM 0.10.2 and 0.11.0 fall back to
        Marlin without the separately installed triton_kernels package (quantization/mxfp4.py
        get_mxfp4_backend). ASSUMPTION: it is not installed: a pip-installed vLLM does not bring it
        (GPUStack's runner image, gpustack/runner pack/cuda/Dockerfile, installs vLLM and FlashInfer
        alone; the validation rows of those releases ran there)."""
        return self.at_least("0.12")

    # --- Scheduling -------------------------------------------------------------

    def async_scheduling(self, *, ray: bool = True) -> bool:
        """vLLM's default: off up to 0.13; from 0.14 on unless the executor cannot
        (Ray's RayDistributedExecutor could not until RayExecutorV2 became the
        default in 0.21)."""
        if not self.at_least("0.14"):
            return False
        return self.at_least("0.21") or not ray

    @property
    def caps_default_max_num_seqs(self) -> bool:
        """Whether a defaulted --max-num-seqs is capped at --max-num-batched-tokens: from 0.10.1
        (engine/arg_utils.py _set_default_args_v1: min(default, max_num_batched_tokens); 0.10.0
        sets the default alone; 0.11.0 the same min in _set_default_args, 0.34.0 in
        _set_default_max_num_seqs_and_batched_tokens_args). vLLM refuses a pinned pair with fewer
        batched tokens than sequences (config/scheduler.py, every release in the range)."""
        return self.at_least("0.10.1")

    @property
    def caps_default_batched_tokens(self) -> bool:
        """Whether a defaulted --max-num-batched-tokens is capped at max-num-seqs x max-model-len:
        from 0.12 (engine/arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args, "Ensure
        max_num_batched_tokens does not exceed model limit"; 0.11.0's _set_default_args has no such
        cap)."""
        return self.at_least("0.12")

    def api_servers(self, dp: int) -> int:
        """API server processes `vllm serve` starts for `dp` replicas by default: one up to 0.14
        (entrypoints/openai/cli_args.py --api-server-count default=1), the replica count from 0.15
        (entrypoints/cli/serve.py ServeSubcommand.cmd: internal load balancing, api_server_count =
        data_parallel_size when neither an external nor a hybrid balancer is asked for, as the
        stack's serving arguments never ask)."""
        return dp if self.at_least("0.15") else 1

    def model_runner_v2(self, architectures: Sequence[str], *, moe: bool, hybrid: bool, quantized: bool) -> bool:
        """config/vllm.py VllmConfig.use_v2_model_runner (default, no env override), for the
        config's `architectures` (ModelArch.architectures, what the model config resolves), by
        _is_default_v2_model_runner_model: 0.22-0.23 a listed architecture that is neither MoE nor
        quantized; 0.24 a listed one; 0.25-0.26 no hybrid, and a listed or dense one; 0.27-0.28 the
        same, but a listed hybrid runs it too (`is_hybrid and not is_default_v2_architecture`);
        from 0.29 every configuration. ASSUMPTION: none of the features
        _get_v2_model_runner_unsupported_features names (ngram drafting, prompt embeds, dual batch
        overlap, ...) is on: the stack's serving arguments ask for none."""
        if self.at_least("0.29"):
            return True
        archs = _MRV2_ARCHITECTURES.get(self.minor)
        if archs is None:
            return False
        listed = any(a in archs for a in architectures)
        if self.minor <= (0, 23):
            return listed and not moe and not quantized
        if self.minor == (0, 24):
            return listed
        if self.minor <= (0, 26):
            return not hybrid and (listed or not moe)
        return listed or (not hybrid and not moe)

    def max_concurrent_batches(self, pp: int, *, async_scheduling: bool, mrv2: bool) -> int:
        """config/vllm.py VllmConfig.max_concurrent_batches."""
        if async_scheduling:
            if self.at_least("0.34") or mrv2:
                return pp + 1
            if pp <= 1:
                return 2
        return pp

    @property
    def reserve_full_input(self) -> bool:
        """Admission of a waiting request asks for its whole input's blocks (0.19+)."""
        return self.at_least("0.19")

    def sliding_window_tokens(self, pp: int, max_num_batched_tokens: int, *, async_scheduling: bool, mrv2: bool) -> int:
        """Tokens a sliding-window layer holds per request beyond its window:
        max-num-batched-tokens up to 0.25, VllmConfig.max_in_flight_tokens from 0.26."""
        if not self.at_least("0.26"):
            return max_num_batched_tokens
        return self.max_concurrent_batches(pp, async_scheduling=async_scheduling, mrv2=mrv2) * max_num_batched_tokens

    # --- KV cache ---------------------------------------------------------------

    @property
    def concurrency_sum_of_ceils(self) -> bool:
        """get_max_concurrency_for_kv_cache_config: sum of per-group cdiv from 0.27."""
        return self.at_least("0.27")

    @property
    def kv_tokens_from_concurrency(self) -> bool:
        """'GPU KV cache size' = int(max_concurrency x max_model_len) from 0.21."""
        return self.at_least("0.21")

    @property
    def packed_kv_groups(self) -> bool:
        return self.at_least("0.29")

    @property
    def default_block_size(self) -> int:
        """CacheConfig.DEFAULT_BLOCK_SIZE: 16, 64 from 0.34."""
        return 64 if self.at_least("0.34") else 16

    @property
    def mla_block_size_hopper(self) -> int:
        """Block size of an MLA model on Hopper: FlashMLA forced 64 up to 0.17
        (platforms/cuda.py); from 0.18 the first backend's preferred size with the
        default (FlashAttention MLA accepts any multiple of 16)."""
        if self.at_least("0.18"):
            return self.default_block_size
        return 64

    # --- Kernels (performance model) -----------------------------------------------

    def sparse_attention_kernel(self, model_type: str, compute_capability: str) -> SparseAttentionKernel:
        """How vLLM's sparse attention kernel runs a rank's query heads, for the performance model.

        - DeepSeek-V3.2 up to 0.26 (CHANGES): every token through FlashMLA's sparse kernel in the
          absorbed form, heads padded to 64 (128 on SM 10.0; SM 10.x from 0.13:
          is_device_capability_family); before 0.24 each token computes all index_topk slots, valid
          or not (every_topk_slot). From 0.27 prefills up to index_topk tokens run dense MHA;
          ASSUMPTION: the longer ones too, and no padding (0.28 adds an unpadded small-head kernel
          on SM 9.0 for large batches; 0.27 on picks masked MHA or MQA by per-backend heuristics).
        - DeepSeek-V4 (0.29 on, the releases the planner models it in): FlashMLA's sparse kernels
          run 64 or 128 query heads (DeepseekV4FlashMLAAttention.get_padded_num_q_heads, "FP8 decode
          kernel only supports h_q = 64 or 128"), for prefill and decode, on every CUDA GPU but
          SM 12.x, which runs FlashInfer's at 8, 16, 32, 64 or 128 (_select_dsv4_attn_cls,
          pad_to_supported_q_heads; models/deepseek_v4/nvidia/)."""
        major = compute_capability.split(".")[0]
        if model_type == "deepseek_v32" and not self.at_least("0.27"):
            sm100 = major == "10" if self.at_least("0.13") else compute_capability == "10.0"
            return SparseAttentionKernel(True, (128,) if sm100 else (64, 128), every_topk_slot=not self.at_least("0.24"))
        if model_type == "deepseek_v4":
            return SparseAttentionKernel(False, (8, 16, 32, 64, 128) if major == "12" else (64, 128))
        return SparseAttentionKernel()

    def check_model(self, model_type: str) -> None:
        first = FIRST_MODELLED.get(model_type)
        if first and self.minor < first[0]:
            raise UserError(
                f"vLLM {self.version}: {first[1]}; plan {model_type} with vLLM {first[0][0]}.{first[0][1]} or later"
            )


def supported_range() -> str:
    return f"{FIRST_SUPPORTED} to {PINNED}"


def release(version: str | None = None) -> Release:
    """The accounting of a vLLM release; refuses one outside the supported range."""
    version = (version or PINNED).strip()
    minor = _minor(version)
    if not (_minor(FIRST_SUPPORTED) <= minor <= _minor(PINNED)):
        raise UserError(
            f"vLLM {version} is not supported: the planner follows vLLM {supported_range()} "
            "(the V1 engine's accounting, read release by release)"
        )
    return Release(version=version, minor=minor, patch=_patch(version))


def changes_table() -> str:
    """The Markdown table of CHANGES, as docs/planning.md shows it."""
    rows = ["| behaviour | first release | source (in that release's wheel) |", "|---|---|---|"]
    rows += [f"| {c.behaviour} | {c.first} | `{c.source}` |" for c in CHANGES]
    return "\n".join(rows)
