"""CUDA-graph memory: which graphs vLLM captures and how much memory they take.

What vLLM does with it depends on the release (`vllm_release.py`): up to 0.19
the graph pool comes out of the (1 - utilisation) headroom; 0.20-0.33 subtract
an estimate (`GPUModelRunner.profile_cudagraph_memory`: the two largest graphs
of each mode captured, the rest extrapolated) from the KV budget; 0.34's
extensible KV cache measures free memory after the real capture
(`v1/worker/extensible_kv_cache.py measure_kv_cache_blocks`), so the actual
pool counts.

The size model is fitted on published H100 start-up logs of vLLM 0.19
(tests/data/vllm_memory_logs.yaml, checked by tests/test_calibration.py): the
"Estimated CUDA graph memory: X GiB total" line and "Graph capturing finished
in N secs, took X GiB" (the actual pool), for dense, MoE and MLA models of
8-80 layers per rank, captured with vLLM's default 51 + 51 graphs (gpt-oss:
83 + 83, which the fit under-predicts by 0.6-0.9 GiB; its pool is larger). A pool
holds the largest graph's intermediate buffers plus each further graph's own
allocations, both growing with the layers a rank runs; MLA layers keep larger
attention metadata. Per rank:

    graphs(layers) = BASE + (PER_LAYER x layers + PER_MLA_LAYER x MLA layers) x captured / 102

ASSUMPTION: the per-layer part scales with the number of graphs captured
(fewer with a small max-num-seqs); the logs all have 102.
"""

from __future__ import annotations

from infra.planning.memory import GiB, MiB
from infra.planning.vllm_release import Release

# Least-squares fit on the 0.19 H100 logs (tests/test_calibration.py reproduces it):
# actual pool: rms error 0.12 GiB, worst 0.29 GiB over 40 runs.
ACTUAL_BASE_BYTES = int(0.317 * GiB)
ACTUAL_PER_LAYER_BYTES = int(17.2 * MiB)
ACTUAL_PER_MLA_LAYER_BYTES = int(25.5 * MiB)
# estimate: rms 0.13 GiB over 34 runs; it over-estimates some TP2 runs by up to
# 0.9 GiB (custom all-reduce buffers captured twice; vllm#45178 reports the same
# over-estimate), which the fit leaves out.
ESTIMATE_BASE_BYTES = int(0.150 * GiB)
ESTIMATE_PER_LAYER_BYTES = int(19.3 * MiB)
ESTIMATE_PER_MLA_LAYER_BYTES = int(20.9 * MiB)
DEFAULT_GRAPHS = 102  # 51 PIECEWISE + 51 FULL at max-num-seqs 1024, max-num-batched-tokens 8192


# gpt-oss captures up to 1024 tokens whatever max-num-seqs says
# (model_executor/models/config.py GptOssForCausalLMConfig: "Overriding max cuda graph
# capture size to 1024 for performance", 0.11+; 0.34 skips the override on SM100,
# whose own defaults are wider, see capture_sizes).
MODEL_CAPTURE_CEILING = {"gpt_oss": ("0.11", 1024)}


def model_ceiling(release: Release, model_type: str) -> int | None:
    rule = MODEL_CAPTURE_CEILING.get(model_type)
    return rule[1] if rule and release.at_least(rule[0]) else None


def capture_sizes(release: Release, *, max_num_seqs: int, max_num_batched_tokens: int, decode_query_len: int = 1,
                  sm100: bool = False, ceiling: int | None = None) -> list[int]:
    """config/vllm.py `_set_cudagraph_sizes`: the batch sizes captured.

    0.10-0.11: [1, 2, 4] + range(8, N + 1, 8) with N = min(2 x max-num-seqs, 512);
    0.12+: [1, 2, 4] + range(8, 256, 8) + range(256, N + 1, 16), N also capped
    by max-num-batched-tokens; 0.13+ multiplies max-num-seqs by the uniform
    decode query length (1 + speculative tokens); 0.28+ raises the ceiling to
    1024 on data-center Blackwell (SM100 family).

    ASSUMPTION, 0.34 (config/vllm.py `_set_cudagraph_sizes`,
    `_split_cudagraph_capture_sizes`), what this count leaves out: max-num-seqs
    and max-num-batched-tokens are also captured when they fit under the
    ceiling off the grid's steps (a graph or two); with speculative decoding
    the token counts of uniform decode batches (request counts x query length)
    are captured too; and on SM100 the defaults are other grids (prefill up to
    8192 tokens, `config/compilation.py prefill_cudagraph_capture_grid`, 54
    sizes at 8192; decode up to max-num-seqs, `decode_cudagraph_capture_grid`,
    64 at 1024), where this count keeps the 0.28-0.33 grid.
    """
    seqs = max_num_seqs * (decode_query_len if release.at_least("0.13") else 1)
    if ceiling is None:
        top = min(2 * seqs, 1024 if (sm100 and release.at_least("0.28")) else 512)
    else:
        top = ceiling
    if release.at_least("0.12"):
        top = min(top, max_num_batched_tokens)
        sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    else:
        sizes = [1, 2, 4] + list(range(8, top + 1, 8))
    return [s for s in sizes if s <= top] or [1]


def graph_count(release: Release, *, max_num_seqs: int, max_num_batched_tokens: int, decode_query_len: int = 1,
                sm100: bool = False, ceiling: int | None = None) -> int:
    """PIECEWISE graphs at every capture size plus FULL decode graphs at the sizes
    up to max-num-seqs x query length (FULL_AND_PIECEWISE, the default mode;
    0.34's `_split_cudagraph_capture_sizes` keeps the same two lists off SM100)."""
    sizes = capture_sizes(release, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          decode_query_len=decode_query_len, sm100=sm100, ceiling=ceiling)  # fmt: skip
    full = [s for s in sizes if s <= max_num_seqs * decode_query_len]
    return len(sizes) + len(full)


def graph_bytes(*, layers: int, mla_layers: int, graphs: int, estimate: bool) -> int:
    """Memory of one rank's CUDA graphs: vLLM's estimate or the captured pool."""
    if estimate:
        base, per_layer, per_mla = ESTIMATE_BASE_BYTES, ESTIMATE_PER_LAYER_BYTES, ESTIMATE_PER_MLA_LAYER_BYTES
    else:
        base, per_layer, per_mla = ACTUAL_BASE_BYTES, ACTUAL_PER_LAYER_BYTES, ACTUAL_PER_MLA_LAYER_BYTES
    return int(base + (per_layer * layers + per_mla * mla_layers) * graphs / DEFAULT_GRAPHS)
