"""Per-GPU memory math, following how vLLM accounts memory.

vLLM profiles one forward pass at max-num-batched-tokens and gives the KV cache
what is left of its share of the GPU (`v1/worker/gpu_worker.py
determine_available_memory`):

    KV = ceil(gpu_memory_utilization x total) - weights - torch activation peak
         - non-torch increase (NCCL buffers, cuBLAS workspaces, ...) [- CUDA graphs]

The CUDA context and NCCL communicators exist before vLLM's baseline snapshot
and are not counted: they, and whatever vLLM leaves uncounted, must fit in the
headroom (1 - utilization) x total. Whether CUDA graphs come out of the KV
budget depends on the release (`vllm_release.py`, `cudagraph.py`): not up to
0.19, an estimate from 0.20, the measured pool with 0.34's extensible KV cache,
which also caps the budget at the free memory less a margin
(`v1/worker/extensible_kv_cache.py measure_kv_cache_bytes`). Every function
here is pure; all byte figures are per rank (one GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.catalog.arch import CacheDtype, CacheSpec, LayerSpec, ModelArch, ParamGroup, Role, Shard
from infra.catalog.formats import get_format
from infra.catalog.quant import experts_on_fullest_rank, group_bytes

if TYPE_CHECKING:
    from infra.planning.vllm_release import Release

GiB = 2**30
MiB = 2**20

# --- Constants, each with where it comes from --------------------------------
# Calibration data: tests/data/vllm_memory_logs.yaml (published vLLM start-up
# logs, each with its source); tests/test_calibration.py checks the fit.

# CUDA context, cuBLAS handles and NCCL communicators that exist before vLLM's
# baseline snapshot: vLLM 0.19 logs on H100 show 0.51 GiB in use before profiling
# at TP1 and about 1.5 GiB once NCCL groups exist (TP2, TP4, PP2). Not counted by
# vLLM's profiler: it must fit in the headroom.
CUDA_CONTEXT_BYTES = int(0.55 * GiB)
CUDA_CONTEXT_DISTRIBUTED_BYTES = int(1.55 * GiB)

# CUDA-graph memory: infra/planning/cudagraph.py (a model fitted on published logs).

# vLLM 0.34's extensible KV cache keeps max(1 GiB, 0.75 x transient peak) free
# below the device's free memory (v1/worker/extensible_kv_cache.py
# KV_CACHE_MARGIN_FLOOR_BYTES, KV_CACHE_MARGIN_FRACTION; ROCm uses 3 GiB).
EXTENSIBLE_MARGIN_FLOOR_BYTES = 1 * GiB
EXTENSIBLE_MARGIN_FRACTION = 0.75

# Non-torch memory the profiler counts on a single GPU (cuBLAS workspaces,
# torch.compile): 0.24-0.27 GiB in vLLM 0.19 logs on H100 at TP1.
NON_TORCH_BASE_BYTES = int(0.27 * GiB)

# Tensor-parallel communication (NCCL buffers, vLLM's custom all-reduce and
# symmetric-memory buffers), counted as non-torch: vLLM 0.19 on H100 shows
# 2.06-2.10 GiB at TP2 and 2.13-2.21 GiB at TP4 in all, i.e. about 1.8 GiB over
# TP1 for the first peer and a few tens of MiB per further peer.
NCCL_TP_FIRST_PEER_BYTES = int(1.80 * GiB)
NCCL_TP_EXTRA_PEER_BYTES = 40 * MiB

# Pipeline send/recv: vLLM 0.19 logs at PP2 and PP4 inside one node show no
# increase over TP1. Across nodes NCCL's network plugin (aws-ofi-nccl on EFA)
# registers its own buffers. ASSUMPTION: 128 MiB per remote peer.
NCCL_NET_PEER_BYTES = 128 * MiB

# Expert-parallel all-to-all buffers: vLLM's all2all backends (pplx, DeepEP)
# register their own dispatch/combine buffers. ASSUMPTION: 1 GiB per rank (DeepEP
# high-throughput mode's default NVLink buffer), paid only with expert parallel.
EP_ALL2ALL_BYTES = 1 * GiB

# Activation peak of vLLM's profile run (max-num-batched-tokens tokens through
# the model, then a dummy sampler run over max-num-seqs requests):
# - the forward pass: at least ~1 GiB per 8192 batched tokens whatever the TP
#   (Llama-3.1-8B: 1.89 GiB at TP1, TP2 and TP4, of which ~1 GiB is the sampler;
#   middle pipeline stages 1.05-1.1 GiB), or the dense MLP's transient tensors
#   in bf16 when they are larger, plus the fused-MoE buffers on MoE stages;
# - the sampler on the last stage: float32 logits over the whole vocabulary for
#   max-num-seqs rows, held about twice (logits and probabilities).
FORWARD_FLOOR_BYTES_PER_TOKEN = GiB / 8192
ACTIVATION_BYTES_PER_ELEMENT = 2
SAMPLER_LOGIT_COPIES = 2


# --- Pipeline split ----------------------------------------------------------


def split_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as vLLM's `get_pp_indices` splits them.

    Each stage gets num_layers // pp; the remainder goes one by one to the stages
    before the last, starting from the second-to-last and moving towards the first
    (DeepSeek-V3, 61 layers, PP4 -> 15, 15, 16, 15).
    """
    if pp < 1 or pp > num_layers:
        raise ValueError(f"pipeline size {pp} must be between 1 and the layer count {num_layers}")
    counts = [num_layers // pp] * pp
    remainder = num_layers % pp
    # vllm/distributed/utils.py get_pp_indices: partitions[i] += 1 for
    # i in range(pp - 2, pp - 2 - remainder, -1) (when remainder > 0).
    for i in range(pp - 2, pp - 2 - remainder, -1):
        counts[i % pp] += 1
    return counts


def stage_layers(arch: ModelArch, pp: int) -> list[tuple[LayerSpec, ...]]:
    counts = split_layers(len(arch.layers), pp)
    stages, start = [], 0
    for n in counts:
        stages.append(arch.layers[start : start + n])
        start += n
    return stages


# --- Weights -----------------------------------------------------------------


def group_bytes_per_rank(
    group: ParamGroup,
    tp: int,
    expert_shards: int,
    *,
    expert_parallel: bool = False,
    num_experts: int = 0,
    mxfp4_backend: str = "none",
) -> float:
    """Bytes of one parameter group on one rank.

    Routed experts are split over `expert_shards` ranks: TP x DP, vLLM's TP flattened
    across DP for its MoE layers (fused_moe/config.py FusedMoEParallelConfig.make), by
    intermediate columns or, with expert parallel, by whole experts, as many of `num_experts` as
    the fullest rank holds (quant.experts_on_fullest_rank; an even split when it is 0).

    A quantised group (one with a vLLM scheme and shapes) costs what vLLM creates
    for its shapes on the rank (infra.catalog.quant.group_bytes): scales per block
    or group, zero points, and for gpt-oss's MXFP4 experts the padding of the MoE
    kernel that runs them (`mxfp4_backend`, quant.mxfp4_moe_backend: the GPU's and the
    release's) and whether experts are split by expert (`expert_parallel`) or by intermediate size.
    Any other group costs count x bytes per parameter, split by its shard.
    """
    if group.scheme is not None:
        return float(
            group_bytes(
                group.scheme, group.shapes, tp=tp, expert_shards=expert_shards,
                expert_parallel=expert_parallel, mxfp4_backend=mxfp4_backend,
            )
        )
    total = group.count * float(get_format(group.fmt).bytes_per_param)
    if group.shard in (Shard.TP, Shard.VOCAB):
        return total / tp
    if group.shard == Shard.EXPERT:
        if expert_parallel and num_experts:
            return total * experts_on_fullest_rank(num_experts, expert_shards) / num_experts
        return total / expert_shards
    return total


def stage_weight_bytes(
    arch: ModelArch,
    layers: tuple[LayerSpec, ...],
    *,
    first: bool,
    last: bool,
    tp: int,
    expert_shards: int,
    expert_parallel: bool = False,
    routed: bool | None = None,
    mxfp4_backend: str = "none",
) -> int:
    """Weights held by one rank of a stage: its layers, plus the embedding on the
    first stage and the LM head and final norm on the last. `routed`: only the routed
    experts (True), only the rest (False), or all (None)."""
    groups: list[ParamGroup] = [g for layer in layers for g in layer.params]
    if first:
        groups.append(arch.embedding)
    if last:
        groups.append(arch.lm_head)
        groups.extend(arch.final)
    if routed is not None:
        groups = [g for g in groups if (g.role == Role.ROUTED_EXPERT) == routed]
    return int(
        sum(
            group_bytes_per_rank(
                g, tp, expert_shards, expert_parallel=expert_parallel, num_experts=arch.num_experts,
                mxfp4_backend=mxfp4_backend,
            )
            for g in groups
        )
    )


# --- KV cache ------------------------------------------------------------------

KV_DTYPE_BYTES = {
    "auto": None,  # the model's dtype
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
}
MODEL_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def kv_element_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    size = KV_DTYPE_BYTES[kv_cache_dtype]
    return size if size is not None else MODEL_DTYPE_BYTES.get(model_dtype, 2)


def _element_bytes(spec: CacheSpec, kv_bytes: int, model_bytes: int = 2) -> int:
    return {CacheDtype.KV: kv_bytes, CacheDtype.FP8: 1, CacheDtype.FP32: 4, CacheDtype.MODEL: model_bytes}[spec.dtype]


def cache_entry_bytes(spec: CacheSpec, tp: int, kv_bytes: int, model_bytes: int = 2, *, extra_rows: int = 0) -> int:
    """Bytes of one cache entry (or of the whole state, for per-sequence states) on one rank;
    `extra_rows` more rows of a convolution state (one per speculative token)."""
    elements = spec.elements_per_entry
    if spec.conv_rows and extra_rows:
        elements = elements * (spec.conv_rows + extra_rows) // spec.conv_rows
    if spec.sharded_heads:
        # KV heads are split over TP and replicated when TP exceeds their count.
        elements *= max(1, spec.sharded_heads // tp)
    return elements * _element_bytes(spec, kv_bytes, model_bytes) + spec.extra_bytes_per_entry


def bytes_per_token(layers: tuple[LayerSpec, ...], tp: int, kv_bytes: int) -> int:
    """Marginal cache bytes of one more token of context in a long sequence, on one rank.

    Sliding windows and per-sequence states do not grow with length and are not
    counted; compressed caches count one entry per `compress_ratio` tokens.
    """
    total = 0.0
    for layer in layers:
        for spec in layer.caches:
            if spec.per_sequence or spec.window is not None:
                continue
            total += cache_entry_bytes(spec, tp, kv_bytes) / spec.compress_ratio
    return math.ceil(total)


def bytes_per_sequence(layers: tuple[LayerSpec, ...], tp: int, kv_bytes: int, seq_len: int) -> int:
    """Cache bytes one sequence of `seq_len` tokens holds on one rank, entry by entry.

    What vLLM charges a request is another matter (whole blocks of a shared pool,
    per-group reservations): infra/planning/kv_cache.py."""
    total = 0
    for layer in layers:
        for spec in layer.caches:
            entry = cache_entry_bytes(spec, tp, kv_bytes)
            if spec.per_sequence:
                total += entry
                continue
            tokens = seq_len if spec.window is None else min(seq_len, spec.window)
            total += math.ceil(tokens / spec.compress_ratio) * entry
    return total


# --- Activations, communication, CUDA overhead --------------------------------


def _dense_transient_elements(arch: ModelArch, tokens: int, tp: int) -> float:
    """Dense MLP: gate/up output (2 x intermediate / TP) and the activation output."""
    return tokens * 3 * arch.intermediate_size / tp


def _moe_elements(arch: ModelArch, tokens: int) -> float:
    """vLLM's fused_moe keeps, per token and chosen expert, a copy of the hidden
    state going in and the expert's output coming back before they are summed;
    Qwen3-30B-A3B (top-8) peaks ~0.5 GiB above a dense model of its vocabulary
    at 8192 tokens, Mixtral (top-2) ~0.2 GiB."""
    return tokens * arch.experts_per_token * arch.hidden_size * 2


def activation_peak_bytes(
    arch: ModelArch,
    layers: tuple[LayerSpec, ...],
    *,
    last: bool,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dp: int = 1,
) -> int:
    """Torch activation peak of vLLM's profile run on one rank (see module constants). With DP
    a MoE layer runs on every DP rank's tokens at once: vLLM 0.34.0 gathers them all before the
    experts (distributed/device_communicators/all2all.py AgRsAll2AllManager.dispatch, an
    all_gatherv of the sizes forward_context.py DPMetadata.sp_local_sizes gives, unchunked),
    and each rank profiles max-num-batched-tokens together."""
    tokens = max_num_batched_tokens
    residual = 2 * tokens * arch.hidden_size  # hidden states and residual
    dense = (residual + _dense_transient_elements(arch, tokens, tp)) * ACTIVATION_BYTES_PER_ELEMENT
    forward = max(dense, tokens * FORWARD_FLOOR_BYTES_PER_TOKEN)
    if arch.num_experts and any(layer.moe for layer in layers):
        forward += _moe_elements(arch, tokens * dp) * ACTIVATION_BYTES_PER_ELEMENT
    sampler = 0
    if last:
        # Logits are gathered to the full vocabulary in float32 for sampling.
        sampler = min(max_num_seqs, tokens) * arch.vocab_size * 4 * SAMPLER_LOGIT_COPIES
    return int(forward + sampler)


def comm_buffer_bytes(*, tp: int, pp: int, expert_parallel: bool, ep_size: int, gpus_per_node: int) -> int:
    """Non-torch NCCL and all-to-all buffers on one rank (counted by vLLM's profiler)."""
    total = 0
    if tp > 1:
        total += NCCL_TP_FIRST_PEER_BYTES + (tp - 2) * NCCL_TP_EXTRA_PEER_BYTES
    if pp > 1 and tp * pp > gpus_per_node:
        # Stages on other nodes: a middle stage talks to the previous and the next.
        total += min(pp - 1, 2) * NCCL_NET_PEER_BYTES
    if expert_parallel and ep_size > 1:
        total += EP_ALL2ALL_BYTES
        if ep_size > gpus_per_node:
            total += 2 * NCCL_NET_PEER_BYTES
    return total


def cuda_context_bytes(distributed: bool) -> int:
    return CUDA_CONTEXT_DISTRIBUTED_BYTES if distributed else CUDA_CONTEXT_BYTES


@dataclass(frozen=True)
class RankBudget:
    """Where the memory of one GPU of one pipeline stage goes. The lines weights,
    activation, KV cache, communication, CUDA overhead and headroom add up to
    `gpu_visible_bytes` exactly; a negative headroom means it does not fit."""

    stage: int
    layers: int
    gpu_visible_bytes: int
    weights_bytes: int
    activation_bytes: int
    kv_cache_bytes: int
    comm_buffer_bytes: int
    cuda_overhead_bytes: int  # non-torch base + CUDA context + CUDA graphs
    headroom_bytes: int
    usable_bytes: int  # what vLLM requests: ceil(utilization x visible)
    cudagraph_bytes: int  # the captured graph pool (part of cuda_overhead_bytes)
    cudagraph_estimate_bytes: int  # what vLLM took out of the KV budget for graphs (0: nothing)
    kv_bytes_per_token: int  # marginal bytes of one more token of context
    kv_bytes_per_block: int  # one block of vLLM's shared pool on this rank (the widest group)
    num_blocks: int  # blocks this rank's KV cache holds (the engine takes the minimum)
    kv_tokens: int  # vLLM's "GPU KV cache size" if this rank were the binding one
    max_sequences: float  # vLLM's max concurrency if this rank were the binding one


def extensible_margin_bytes(activation: int) -> int:
    """The margin 0.34's extensible KV cache keeps below free memory:
    max(floor, fraction x transient peak) (extensible_kv_cache.py measure_kv_cache_bytes)."""
    return max(EXTENSIBLE_MARGIN_FLOOR_BYTES, int(activation * EXTENSIBLE_MARGIN_FRACTION))


def extensible_withheld_bytes(*, visible: int, requested: int, activation: int, context: int) -> int:
    """Memory free at start that gpu-memory-utilization keeps out of 0.34's extensible KV
    cache: the `withheld` of extensible_kv_cache.py measure_kv_cache_blocks (the budget
    at all free memory less the budget at the requested memory), negative when none is."""
    return visible - context - extensible_margin_bytes(activation) - requested


def kv_budget_bytes(
    *,
    release: "Release",
    visible: int,
    requested: int,
    weights: int,
    activation: int,
    comm: int,
    cudagraph: int,
    cudagraph_estimate: int,
    context: int,
) -> int:
    """Bytes vLLM gives the KV cache on one rank.

    Up to 0.33 (`gpu_worker.py determine_available_memory`): requested - non-KV -
    the CUDA-graph estimate (0 before 0.20). 0.34, extensible KV cache
    (`extensible_kv_cache.py measure_kv_cache_bytes`, after warm-up and capture):
    min(requested - non_kv_used, free + committed - margin) - transient peak, with
    non_kv_used the weights, buffers and graph pool, and free + committed = the
    memory free at start (visible - context) - non_kv_used.
    """
    resident = weights + comm + NON_TORCH_BASE_BYTES
    if release.extensible_kv_cache:
        cap = min(requested, visible - context - extensible_margin_bytes(activation))
        return cap - resident - cudagraph - activation
    return requested - resident - activation - cudagraph_estimate


def rank_budget(
    *,
    release: "Release",
    stage: int,
    layers: int,
    visible: int,
    utilization: float,
    weights: int,
    activation: int,
    comm: int,
    cudagraph: int,
    cudagraph_estimate: int,
    kv_bytes_per_token: int,
    kv_bytes_per_block: int,
    distributed: bool,
    request_blocks: int = 0,
    tokens_for=None,
) -> RankBudget:
    """`request_blocks`: blocks one request at max-model-len takes (vLLM's max
    concurrency is num_blocks / request_blocks); `tokens_for(num_blocks)`: vLLM's
    'GPU KV cache size' for that many blocks."""
    # v1/worker/utils.py request_memory: math.ceil(total_memory x utilization).
    requested = math.ceil(utilization * visible)
    context = cuda_context_bytes(distributed)
    kv = kv_budget_bytes(
        release=release, visible=visible, requested=requested, weights=weights, activation=activation, comm=comm,
        cudagraph=cudagraph, cudagraph_estimate=cudagraph_estimate, context=context,
    )  # fmt: skip
    cuda_overhead = NON_TORCH_BASE_BYTES + context + cudagraph
    headroom = visible - (weights + activation + kv + comm + cuda_overhead)
    blocks = max(kv, 0) // kv_bytes_per_block if kv_bytes_per_block else 0
    return RankBudget(
        stage=stage,
        layers=layers,
        gpu_visible_bytes=visible,
        weights_bytes=weights,
        activation_bytes=activation,
        kv_cache_bytes=kv,
        comm_buffer_bytes=comm,
        cuda_overhead_bytes=cuda_overhead,
        headroom_bytes=headroom,
        usable_bytes=requested,
        cudagraph_bytes=cudagraph,
        cudagraph_estimate_bytes=cudagraph_estimate,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_bytes_per_block=kv_bytes_per_block,
        num_blocks=blocks,
        kv_tokens=tokens_for(blocks) if tokens_for else 0,
        max_sequences=blocks / request_blocks if request_blocks else 0.0,
    )
