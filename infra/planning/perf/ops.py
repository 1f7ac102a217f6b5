"""A model's step as operations on one rank of each pipeline stage: what each one
computes (FLOPs per token) and reads (bytes), from the same `ModelArch` the memory
planner sizes (its parameter groups, cache specs and attention shapes).

Built once per model, layout and GPU; `step.StepModel` turns them into time for a
batch. Terms that behave alike are summed (all GEMMs of one weight format, all
layers with the same attention reads), so a step costs a few dozen multiplications.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from infra.catalog.arch import CacheSpec, LayerSpec, ModelArch, ParamGroup, Role, Shard
from infra.catalog.gpus import GPU
from infra.catalog.quant import mxfp4_moe_backend
from infra.planning import memory
from infra.planning.vllm_release import Release, SparseAttentionKernel


@dataclass(frozen=True)
class GemmTerm:
    """Linear layers of one weight format on a rank: read whole once per step."""

    compute: str  # the kernel's peak (gemm_kernel): "bf16" | "fp8" | "fp4", or "bf16_wo" (weight-only, upcast)
    flops_per_token: float
    weight_bytes: float
    per_sampled_token: bool = False  # the LM head: run for the sequences that sample, not every token


@dataclass(frozen=True)
class ExpertTerm:
    """The routed experts of `layers` MoE layers on a rank."""

    layers: int
    experts: int
    top_k: int
    flops_per_token: float  # of the top-k experts a token goes to, on this rank
    bytes_per_expert: float  # one expert's share of this rank's expert bytes
    compute: str
    kernel: str = "bf16"  # the fused-MoE kernel family (moe_kernel): "bf16" | "fp8" | "4bit" | "marlin"
    inter_per_rank: int = 0  # each expert's intermediate size on a rank (whole with expert parallel)
    activation_bytes_per_token: float = 0.0  # the fused call's activations through HBM (moe_activation_bytes)


@dataclass(frozen=True)
class AttentionTerm:
    """One pattern of attention reads in `layers` layers: per decoding sequence of
    context c, Σ-able entries min(c, threshold) / divisor, each read (`bytes_per_entry`)
    and met by every query token (`flops_per_entry`); plus fixed per-sequence state."""

    layers: int
    threshold: int | None  # None: the whole context
    divisor: int  # compressed caches: one entry per `divisor` tokens
    reads_context: bool
    bytes_per_entry: float = 0.0
    flops_per_entry: float = 0.0  # decode, per query token
    prefill_flops_per_entry: float = 0.0
    bytes_per_sequence: float = 0.0  # recurrent states: read and written each step
    flops_per_sequence_token: float = 0.0  # recurrent update per token
    prefill_context_flops: float = 0.0  # MLA prefill: expanding each context token's latent
    head_dim: float = 128.0  # the prefill kernel's head size, (query-key + value) / 2: its fraction follows it


# Kernels one decoder layer launches, by what it has (the fixed per-kernel cost in
# fitted.py multiplies them). ASSUMPTION, counted from vLLM's layer forward passes:
# a GQA layer with a dense MLP ~10 (two norms with residual adds, QKV, rotary,
# attention, O, gate-up, activation, down, all-reduce glue); MLA adds ~6 (q_a, q_b,
# kv_a, the latent norm, the absorbed q and output BMMs); DeepSeek-V4's compressed
# attention ~6 more (compressor, indexer, top-k); a MoE block ~8 more than a dense MLP
# (router GEMM, top-k, token sort, two grouped GEMMs, activation, combine, shared
# expert, of which the fused-MoE call itself has its own measured floor, moe_floor_s);
# FP8 weights one activation-quantisation kernel per GEMM (~4); KDA ~6 (convolutions,
# gates, the recurrent kernel).
KERNELS_BASE = 10
KERNELS_MLA = 6
KERNELS_COMPRESSED = 6
KERNELS_MOE = 3  # router GEMM, top-k, shared expert: the fused call is moe_floor_s
KERNELS_FP8 = 4
KERNELS_RECURRENT = 6
# The kernels of those an MLA layer's attention module launches (QKV, rotary, attention
# and O of the base count, the MLA ones, and the FP8 activation quantisation of its three
# GEMMs): what calibrate.fit_mla takes off the module's measured time before the rest
# becomes the per-layer `mla_floor_s`.
MLA_MODULE_KERNELS = 4 + KERNELS_MLA + 3


def is_mla(layer: LayerSpec) -> bool:
    """An MLA attention layer (a latent whose prefill expands it, or query/key widths that
    differ between the decode and prefill paths); a recurrent (KDA) layer is not."""
    attn = layer.attn
    if attn is None or attn.recurrent_dim:
        return False
    return bool(attn.prefill_expand_flops or attn.qk_dim != attn.prefill_qk_dim and attn.prefill_qk_dim)


def layer_kernels(layer: LayerSpec) -> int:
    attn = layer.attn
    n = KERNELS_BASE
    if attn is not None and attn.recurrent_dim:
        n += KERNELS_RECURRENT
    elif is_mla(layer):
        n += KERNELS_MLA
    if attn is not None and (attn.compress_ratio > 1 or attn.indexer_heads):
        n += KERNELS_COMPRESSED
    if layer.moe:
        n += KERNELS_MOE
    if any(g.fmt == "fp8" for g in layer.params):
        n += KERNELS_FP8
    return n


@dataclass(frozen=True)
class StageOps:
    layers: int
    gemms: tuple[GemmTerm, ...]
    experts: tuple[ExpertTerm, ...]
    attention: tuple[AttentionTerm, ...]
    allreduces: int  # TP all-reduces per step (two per layer when TP > 1)
    allreduce_bytes_per_token: int
    draft: "StageOps | None" = None  # the MTP layer(s) on the last stage
    kernels: int = 0  # kernels the stage's layers launch per step (layer_kernels)
    mla_layers: int = 0  # layers whose attention is vLLM's MLA module (is_mla): each pays mla_floor_s
    # Their query heads on the rank, summed over those layers: each decoding token pays mla_seq_s a
    # layer and mla_seq_head_s a head (fitted.py).
    mla_heads: int = 0


def expected_distinct_experts(experts: int, top_k: int, tokens: int) -> float:
    """Experts that `tokens` tokens route to, each choosing top_k of `experts`:
    E x (1 - (1 - k/E)^tokens). ASSUMPTION: uniform routing; real routing is skewed
    (EPLB exists because of it), which touches fewer experts for the same tokens."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def compute_dtype(fmt: str, gpu: GPU) -> str:
    """The tensor-core dtype vLLM's kernel for weights stored in `fmt` computes in on `gpu`.

    FP8 weights run W8A8 on FP8 tensor cores (Ada/Hopper on), and as weight-only Marlin
    (bf16 compute) before. ASSUMPTION: MXFP4 experts run with bf16 activations (W4A16:
    the Triton / Marlin MoE kernels on Hopper and older) and with MXFP8 activations on
    Blackwell (FP8 peak); NVFP4 runs on FP4 tensor cores on Blackwell, weight-only
    elsewhere; INT4 (GPTQ / AWQ / W4A16) and INT8 upcast to bf16.
    """
    if fmt == "fp8":
        return "fp8" if gpu.supports_fp8 else "bf16"
    if fmt == "mxfp4":
        return "fp8" if gpu.supports_fp4 else "bf16"
    if fmt == "nvfp4":
        return "fp4" if gpu.supports_fp4 else "bf16"
    return "bf16"


def gemm_kernel(fmt: str, gpu: GPU) -> str:
    """Which peak a dense linear layer of weights stored in `fmt` runs at: its tensor-core dtype,
    or "bf16_wo" where the weights are quantised and the GEMM computes in bf16: a weight-only
    kernel that dequantises as it goes (vLLM 0.11: FP8 below SM 8.9 runs Marlin,
    quantization/fp8.py `use_marlin = not has_device_capability(89)`; AWQ runs awq_marlin on every
    GPU, awq_marlin.py override_quantization_method; GPTQ Marlin, or Machete on SM 9.0), which
    reaches its own fraction of the peak (fitted.py gemm_weight_only)."""
    compute = compute_dtype(fmt, gpu)
    return "bf16_wo" if compute == "bf16" and fmt not in ("bf16", "fp16", "fp32") else compute


def _params_on_rank(g: ParamGroup, tp: int) -> float:
    return g.count / tp if g.shard in (Shard.TP, Shard.VOCAB, Shard.EXPERT) else float(g.count)


def _gemms(groups: list[ParamGroup], *, tp: int, gpu: GPU, expert_parallel: bool, sampled: bool = False) -> list[GemmTerm]:
    """One term per (compute dtype, format): within a format FLOPs per byte are the same
    for every group, so their summed roofline is the sum of theirs."""
    flops: Counter = Counter()
    nbytes: Counter = Counter()
    for g in groups:
        if g.role == Role.ROUTED_EXPERT or not g.count:
            continue
        if g.fmt == "fp32" and g.shard == Shard.REPLICATED:
            # fp32 parameters are small mixers, biases and the hash-routing table
            # (a gather, not a GEMM): left out.
            continue
        key = (gemm_kernel(g.fmt, gpu), g.fmt)
        flops[key] += 2 * _params_on_rank(g, tp)
        nbytes[key] += memory.group_bytes_per_rank(g, tp, tp, expert_parallel=expert_parallel)
    return [GemmTerm(k[0], flops[k], nbytes[k], per_sampled_token=sampled) for k in sorted(flops)]


def _experts(layers: tuple[LayerSpec, ...], arch: ModelArch, *, tp: int, gpu: GPU, expert_parallel: bool,
             expert_shards: int, triton_kernels: bool = True) -> list[ExpertTerm]:  # fmt: skip
    """`expert_shards`: the GPUs each expert is split over, TP x DP (layout.expert_shards); every
    figure is of one rank for one token its MoE layer runs, which with DP is every replica's.
    `triton_kernels`: Release.vendors_triton_kernels (gpt-oss's MXFP4 experts run Marlin without)."""
    terms: Counter = Counter()
    backend = mxfp4_moe_backend(float(gpu.compute_capability), triton_kernels)
    for layer in layers:
        for g in layer.params:
            if g.role != Role.ROUTED_EXPERT or not arch.num_experts:
                continue
            rank_bytes = memory.group_bytes_per_rank(g, tp, expert_shards, expert_parallel=expert_parallel,
                                                     num_experts=arch.num_experts, mxfp4_backend=backend)  # fmt: skip
            # Per token: top_k of the experts' parameters, split over the ranks (with expert
            # parallel, the expected share of tokens a rank's experts get).
            flops = 2 * g.count / arch.num_experts * arch.experts_per_token / expert_shards
            inter = arch.moe_intermediate_size if expert_parallel else arch.moe_intermediate_size // expert_shards
            kernel = "marlin" if backend == "marlin" and g.scheme is not None and g.scheme.kind == "gpt_oss_mxfp4" else moe_kernel(g.fmt)
            compute = compute_dtype(g.fmt, gpu)
            activations = moe_activation_bytes(fused=kernel == "4bit", fp8_activations=compute == "fp8",
                                               top_k=arch.experts_per_token, hidden=arch.hidden_size, inter=inter,
                                               ep=expert_shards if expert_parallel else 1)  # fmt: skip
            key = (arch.num_experts, arch.experts_per_token, flops, rank_bytes / arch.num_experts, compute, kernel, inter,
                   activations)  # fmt: skip
            terms[key] += 1
    return [ExpertTerm(n, *key) for key, n in sorted(terms.items())]


def moe_activation_bytes(*, fused: bool, fp8_activations: bool, top_k: int, hidden: int, inter: int, ep: int) -> float:
    """Bytes one token's routed (token, expert) pairs move through HBM in the fused-MoE call on a
    rank besides its weights: bf16 activations (2 bytes), `inter` each expert's intermediate size
    on the rank (whole with expert parallel), `ep` the expert-parallel ranks (1 without).

    vLLM's fused_experts (Triton fused_moe, fused_moe.py of 0.11.0 and 0.24.0; Marlin's
    fused_marlin_moe alike) runs its steps as kernels of their own over every pair: the gate-up
    GEMM writes 2 x inter values a pair, silu_and_mul reads them and writes inter, the down GEMM
    writes `hidden` a pair and moe_sum reads them back: 10 x inter + 4 x hidden bytes; with FP8
    activations (moe_kernel_quantize_input) the activation is read again and written as one byte:
    3 x inter more. With expert parallel and no all-to-all kernel every rank runs the call over
    every pair of its tokens: a pair whose expert is elsewhere has expert id -1 (moe_align_block_size's
    expert_map), its GEMM blocks write zeros (fused_moe_kernel write_zeros_to_output; Marlin zeroes
    its output) and the activation and moe_sum run over it too, at the whole expert's width.
    `fused`: the kernels that fuse the activation into the first GEMM and the combine into the
    second and route only the rank's own pairs (the OAI Triton matmul_ogs of gpt-oss's MXFP4,
    gpt_oss_triton_kernels_moe.py): the intermediate written and read once, the output scattered
    into the token's sum, 4 x inter + 2 x hidden. ASSUMPTION: NVFP4's and INT4's 4-bit grouped
    kernels move what the OAI kernel does, and FP8's other kernels (DeepGEMM's and CUTLASS's grouped
    GEMMs, where a release picks them) what the Triton call does."""
    if fused:
        return top_k / ep * (4 * inter + 2 * hidden)
    return top_k * ((13 if fp8_activations else 10) * inter + 4 * hidden)


def moe_kernel(fmt: str) -> str:
    """Which family of vLLM fused-MoE kernels runs experts stored in `fmt`: unquantised
    (fused_moe Triton), FP8 (block-scaled W8A8, Triton / DeepGEMM / CUTLASS) or 4-bit
    (MXFP4 matmul_ogs, Marlin W4A16, NVFP4): each reaches its own fraction (fitted.py). gpt-oss's
    MXFP4 experts on Marlin are "marlin" (_experts: the backend is the GPU's and the release's)."""
    if fmt == "fp8":
        return "fp8"
    if fmt in ("mxfp4", "nvfp4", "int4"):
        return "4bit"
    return "bf16"


def _cache_pattern(spec: CacheSpec, layer: LayerSpec) -> tuple[int | None, int]:
    """(threshold, divisor) of the entries a decode step reads from one cache."""
    attn = layer.attn
    topk = attn.topk if attn else None
    if spec.kind in ("compressed",):
        return (topk * spec.compress_ratio if topk else None), spec.compress_ratio
    if spec.kind == "indexer":
        return None, spec.compress_ratio  # the indexer scores every compressed key
    if spec.window is not None:
        return spec.window, 1
    if topk:  # DeepSeek-V3.2: the latent of the indexer's top-k tokens only
        return topk, 1
    return None, spec.compress_ratio


def _absorbed_prefill(layer: LayerSpec, kernel: SparseAttentionKernel) -> bool:
    """Whether the layer's prefill runs in its decode (absorbed MQA) form: MLA where the release says
    so for the model (Release.sparse_attention_kernel: DeepSeek-V3.2's sparse MLA up to 0.26)."""
    return kernel.absorbed_mla_prefill and is_mla(layer)


def _kernel_heads(heads: int, supported: tuple[int, ...]) -> int:
    """The rank's query heads as the sparse attention kernel runs them: the smallest head count it
    supports that holds them (the padding heads computed like the others), or as many as there are."""
    return next((h for h in supported if h >= heads), heads)


def _head_dim(layer: LayerSpec | None, kernel: SparseAttentionKernel = SparseAttentionKernel()) -> float:
    """The prefill kernel's head size: the mean of its query-key and value widths (128 where
    the layer has no attention heads: the fraction as fitted)."""
    attn = layer.attn if layer else None
    if attn is None or attn.recurrent_dim:
        return 128.0
    if _absorbed_prefill(layer, kernel):
        return (attn.qk_dim + attn.v_dim) / 2
    return ((attn.prefill_qk_dim or attn.qk_dim) + (attn.prefill_v_dim or attn.v_dim)) / 2


def _layer_terms(layer: LayerSpec, *, tp: int, kv_bytes: int, model_bytes: int,
                 kernel: SparseAttentionKernel = SparseAttentionKernel()) -> list[tuple]:  # fmt: skip
    """(threshold, divisor, reads_context, bytes/entry, flops/entry, prefill flops/entry,
    bytes/seq, flops/seq/token, prefill context flops) per pattern of one layer; `kernel`:
    Release.sparse_attention_kernel for the model and GPU."""
    attn = layer.attn
    terms: dict[tuple, list[float]] = {}

    def add(key: tuple, i: int, value: float) -> None:
        terms.setdefault(key, [0.0] * 6)[i] += value

    for spec in layer.caches:
        entry = memory.cache_entry_bytes(spec, tp, kv_bytes, model_bytes)
        if spec.per_sequence:
            add((None, 1, False), 3, 2 * entry)  # read and written back every step
        else:
            add((*_cache_pattern(spec, layer), True), 0, entry)
    if attn is None:
        return [(*k, *v) for k, v in terms.items()]
    heads = max(1, attn.heads // tp)
    expand = attn.prefill_expand_flops / tp
    per_token = 0.0  # FLOPs each query token pays the main pattern whatever its context
    if _absorbed_prefill(layer, kernel):
        # One kernel for every token (bf16 cache: _bf16_flash_mla_kernel), decode and prefill, on the
        # padded heads; no latent expanded (the query absorbs kv_b_proj: its GEMM is per token).
        # ASSUMPTION: the FP8 (fp8_ds_mla) cache's decode kernel pads the same.
        per_entry = prefill_per_entry = 2 * _kernel_heads(heads, kernel.head_counts) * (attn.qk_dim + attn.v_dim)
        expand = 0.0
        if kernel.every_topk_slot and attn.topk:
            # Every token computes all top-k slots whatever its context: per token, not per entry
            # read (the reads stay the valid entries': the kernel loads no invalid row).
            per_token, per_entry, prefill_per_entry = per_entry * attn.topk, 0.0, 0.0
    else:
        # DeepSeek-V4's kernels run the padded heads for decode and prefill (the release pads no
        # model whose prefill takes another form: un-absorbed MLA runs the rank's heads).
        run = _kernel_heads(heads, kernel.head_counts)
        per_entry = 2 * run * (attn.qk_dim + attn.v_dim)
        prefill_per_entry = 2 * run * ((attn.prefill_qk_dim or attn.qk_dim) + (attn.prefill_v_dim or attn.v_dim))
    if attn.recurrent_dim:
        # KDA per token and head: decay and rank-1 update of the d x d state, and its
        # read-out by the query: ~3 d^2 multiply-adds.
        add((None, 1, False), 4, heads * 6 * attn.recurrent_dim**2)
        return [(*k, *v) for k, v in terms.items()]
    main = (attn.topk * attn.compress_ratio if attn.topk else None, attn.compress_ratio, True)
    if attn.window is not None:
        add((attn.window, 1, True), 1, per_entry)
        add((attn.window, 1, True), 2, prefill_per_entry)
    if attn.window is None or attn.compress_ratio > 1:
        add(main, 1, per_entry)
        add(main, 2, prefill_per_entry)
        add(main, 4, per_token)
        add(main, 5, expand)
    if attn.indexer_heads:
        # The indexer (replicated on every rank) scores each compressed key.
        idx = 2 * attn.indexer_heads * attn.indexer_dim
        add((None, attn.compress_ratio, True), 1, idx)
        add((None, attn.compress_ratio, True), 2, idx)
    return [(*k, *v) for k, v in terms.items()]


def _attention(layers: tuple[LayerSpec, ...], *, tp: int, kv_bytes: int, model_bytes: int,
               kernel: SparseAttentionKernel = SparseAttentionKernel()) -> list[AttentionTerm]:  # fmt: skip
    counts: Counter = Counter()
    for layer in layers:
        for t in _layer_terms(layer, tp=tp, kv_bytes=kv_bytes, model_bytes=model_bytes, kernel=kernel):
            counts[(*t, _head_dim(layer, kernel))] += 1
    out = []
    for (thr, div, reads, b, f, pf, bseq, fseq, pctx, hd), n in counts.items():
        out.append(AttentionTerm(n, thr, div, reads, b, f, pf, bseq, fseq, pctx, hd))
    return sorted(out, key=lambda a: (a.threshold is None, a.threshold or 0, a.divisor, a.reads_context))


def stage_ops(arch: ModelArch, layers: tuple[LayerSpec, ...], *, first: bool, last: bool, tp: int, gpu: GPU,
              expert_parallel: bool, kv_bytes: int, release: Release | None = None, dp: int = 1) -> StageOps:  # fmt: skip
    """`release`: the vLLM release whose attention kernels run (Release.sparse_attention_kernel); None:
    as many query heads as the rank has, and MLA prefilled un-absorbed. `dp`: the replicas whose
    MoE layers share the experts (vLLM splits them over TP x DP)."""
    kernel = release.sparse_attention_kernel(arch.model_type, gpu.compute_capability) if release else SparseAttentionKernel()
    model_bytes = memory.MODEL_DTYPE_BYTES.get(arch.model_dtype, 2)
    groups = [g for layer in layers for g in layer.params] + (list(arch.final) if last else [])
    gemms = _gemms(groups, tp=tp, gpu=gpu, expert_parallel=expert_parallel)
    if last and arch.lm_head.count:
        gemms += _gemms([arch.lm_head], tp=tp, gpu=gpu, expert_parallel=expert_parallel, sampled=True)
    elif last:  # tied: the embedding's matrix serves as LM head
        gemms += _gemms([arch.embedding], tp=tp, gpu=gpu, expert_parallel=expert_parallel, sampled=True)
    return StageOps(
        layers=len(layers),
        gemms=tuple(gemms),
        experts=tuple(_experts(layers, arch, tp=tp, gpu=gpu, expert_parallel=expert_parallel, expert_shards=tp * dp,
                               triton_kernels=release.vendors_triton_kernels if release else True)),
        attention=tuple(_attention(layers, tp=tp, kv_bytes=kv_bytes, model_bytes=model_bytes, kernel=kernel)),
        allreduces=2 * len(layers) if tp > 1 else 0,
        allreduce_bytes_per_token=arch.hidden_size * 2,  # bf16 activations
        kernels=sum(layer_kernels(layer) for layer in layers),
        mla_layers=sum(1 for layer in layers if is_mla(layer)),
        mla_heads=sum(max(1, layer.attn.heads // tp) for layer in layers if is_mla(layer)),
    )


def model_stages(arch: ModelArch, *, tp: int, pp: int, gpu: GPU, expert_parallel: bool, kv_bytes: int,
                 speculative: bool = False, release: Release | None = None, dp: int = 1) -> list[StageOps]:  # fmt: skip
    """Every pipeline stage as vLLM splits the layers (memory.stage_layers); with MTP
    speculative decoding the last stage carries the drafter (its layers and the LM head).
    `dp`: the replicas sharing a MoE model's experts (stage_ops)."""
    split = memory.stage_layers(arch, pp)
    out = []
    for i, layers in enumerate(split):
        stage = stage_ops(arch, layers, first=i == 0, last=i == pp - 1, tp=tp, gpu=gpu,
                          expert_parallel=expert_parallel, kv_bytes=kv_bytes, release=release, dp=dp)  # fmt: skip
        if i == pp - 1 and speculative and arch.mtp_layers:
            draft = stage_ops(arch, arch.mtp_layers, first=False, last=True, tp=tp, gpu=gpu,
                              expert_parallel=expert_parallel, kv_bytes=kv_bytes, release=release, dp=dp)  # fmt: skip
            stage = replace(stage, draft=draft)
        out.append(stage)
    return out
