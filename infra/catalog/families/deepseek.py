"""DeepSeek families: V3 / R1 / Kimi K2 (same shape), V3.2 (plus the lightning indexer) and V4."""

from __future__ import annotations

from dataclasses import replace

from infra.catalog.arch import AttentionShape, CacheDtype, CacheSpec, LayerSpec, ModelArch, ParamGroup, Role, Shard
from infra.catalog.families.common import (
    dense_mlp,
    embedding,
    expert_count,
    experts_per_token,
    format_label,
    group,
    lm_head,
    make_layer,
    mla,
    mla_attention,
    mla_cache,
    model_dtype,
    moe_params,
    norms,
    quant_config,
)
from infra.catalog.quant import QuantConfig, Scheme
from infra.errors import UserError


def _deepseek_moe(c: dict, expert_fmt: str, other_fmt: str, expert_scheme: Scheme | None = None) -> list[ParamGroup]:
    """DeepseekV2MoE: router (bf16 weight, fp32 e_score_correction_bias), routed and shared experts."""
    return moe_params(
        c["hidden_size"], expert_count(c), c["moe_intermediate_size"], expert_fmt,
        shared_inter=c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0),
        shared_fmt=other_fmt,
        router_bias="fp32" if c.get("topk_method") == "noaux_tc" else None,
        expert_scheme=expert_scheme,
    )


def _routed_experts_only(c: dict, name: str) -> QuantConfig:
    """A quantization_config other than block FP8 (e.g. Kimi-K2.5's compressed-tensors
    W4A16): the planner supports it when it converts the routed experts only, which the
    config's ignore list must show for attention, shared experts and the dense MLP."""
    quant = quant_config(c)
    first = c.get("first_k_dense_replace", 0)
    moe_layer = f"model.layers.{max(first, 1 if expert_count(c) else 0)}"
    probes = {
        "attention": [f"{moe_layer}.self_attn.kv_a_proj_with_mqa"],
        "shared experts": [f"{moe_layer}.mlp.shared_experts.gate_proj", f"{moe_layer}.mlp.shared_experts.up_proj"],
        "dense MLP": ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"],
    }
    converted = [what for what, names in probes.items() if quant.linear(names) is not None]
    if converted or quant.lm_head() is not None:
        raise UserError(
            f"model {name!r}: its {quant.method} quantization_config converts "
            f"{', '.join(converted) or 'the LM head'} as well as the routed experts; the planner supports "
            "block FP8 or quantised routed experts only for this family"
        )
    return quant


def _is_moe_layer(c: dict, i: int) -> bool:
    return bool(expert_count(c)) and i >= c.get("first_k_dense_replace", 0) and i % (c.get("moe_layer_freq") or 1) == 0


def _v32_indexer(c: dict) -> tuple[list[ParamGroup], CacheSpec]:
    """DeepSeek-V3.2 lightning indexer (vLLM deepseek_v2.Indexer), replicated on every rank.

    wq_b q_lora -> index_n_heads x index_head_dim (FP8); wk hidden -> index_head_dim
    and weights_proj hidden -> index_n_heads fused into one bf16 linear (vLLM
    up-casts the FP8 wk to bf16 to fuse it); k_norm a LayerNorm (weight + bias).
    Cache: per token an FP8 key of index_head_dim plus one fp32 scale per 128.
    """
    hidden, d, h = c["hidden_size"], c["index_head_dim"], c["index_n_heads"]
    params = [
        group(Role.ATTENTION, Shard.REPLICATED, c["q_lora_rank"] * h * d, "fp8"),
        group(Role.ATTENTION, Shard.REPLICATED, hidden * (d + h), "bf16"),
        norms(2 * d),
    ]
    cache = CacheSpec(
        "indexer", d, dtype=CacheDtype.FP8, extra_bytes_per_entry=4 * (d // 128),
        note="lightning-indexer key: FP8 + fp32 scale per 128 elements",
    )
    return params, cache


def parse_deepseek_v3(c: dict, name: str, source: str) -> ModelArch:
    """deepseek_v3 / kimi_k2 (same shape) and deepseek_v32 (plus the indexer).

    FP8 block-scaled linear layers (quantization_config fmt e4m3, 128x128
    blocks); embedding, lm_head, norms and the router gate bf16; the router's
    e_score_correction_bias fp32. Another quantization_config (Kimi-K2.5's
    compressed-tensors W4A16) may convert the routed experts only, which are then
    costed from vLLM's parameter shapes (infra.catalog.quant).
    """
    hidden = c["hidden_size"]
    method = (c.get("quantization_config") or {}).get("quant_method")
    fp8 = method == "fp8"
    fmt = "fp8" if fp8 else "bf16"
    quant = _routed_experts_only(c, name) if method and not fp8 else None
    sparse = c["model_type"] == "deepseek_v32"
    n = c["num_hidden_layers"]

    def block(i: int) -> LayerSpec:
        params = mla(c, fmt) + [norms(hidden, hidden)]
        caches = [mla_cache(c)]
        if sparse:
            idx_params, idx_cache = _v32_indexer(c)
            params += idx_params
            caches.append(idx_cache)
        moe = _is_moe_layer(c, i)
        if moe:
            scheme = quant.experts(f"model.layers.{i}.mlp.experts") if quant else None
            params += _deepseek_moe(c, fmt, fmt, scheme)
        else:
            params += dense_mlp(hidden, c["intermediate_size"], fmt)
        attn = mla_attention(c)
        if sparse:
            # DeepSeek-V3.2 sparse MLA: each query attends the indexer's index_topk tokens
            # (vLLM deepseek_v2.Indexer, FlashMLA sparse); the indexer scores every cached key.
            attn = replace(attn, topk=c["index_topk"], indexer_heads=c["index_n_heads"], indexer_dim=c["index_head_dim"])
        return make_layer(i, "mla+indexer" if sparse else "mla", params, caches, moe, attn=attn)

    layers = tuple(block(i) for i in range(n))
    mtp = []
    for j in range(c.get("num_nextn_predict_layers") or 0):
        base = block(n + j)
        extra = [
            # DeepSeekMultiTokenPredictorLayer: enorm, hnorm, shared_head.norm, eh_proj (nn.Linear
            # 2h -> h, bf16, replicated). Its embed_tokens and shared_head.head copies in the
            # checkpoint are not counted: vLLM's MTP proposer shares the main model's instead.
            norms(hidden, hidden, hidden),
            group(Role.DENSE_MLP, Shard.REPLICATED, 2 * hidden * hidden, "bf16"),
        ]
        mtp.append(make_layer(base.index, base.attention, list(base.params) + extra, list(base.caches), base.moe, base.attn))
    notes = []
    if mtp:
        notes.append(
            "MTP layer: the checkpoint's own embed_tokens / shared_head.head copies are not counted; "
            "vLLM's MTP proposer shares the main model's ('Sharing target model embedding weights')"
        )
    if sparse:
        notes.append(
            "DeepSeek-V3.2 MLA cache counted as kv_lora_rank + rope elements at the KV dtype; "
            "vLLM's fp8_ds_mla layout stores 656 bytes per token (512 fp8 + 16 scale + 128 rope)"
        )
    return ModelArch(
        name=name,
        model_type=c["model_type"],
        hidden_size=hidden,
        vocab_size=c["vocab_size"],
        num_attention_heads=c["num_attention_heads"],
        tp_divides=(c["num_attention_heads"],),
        num_kv_heads=None,
        num_experts=expert_count(c),
        experts_per_token=experts_per_token(c),
        moe_intermediate_size=c["moe_intermediate_size"],
        intermediate_size=c["intermediate_size"],
        layers=layers,
        embedding=embedding(c),
        lm_head=lm_head(c),
        final=(norms(hidden),),
        mtp_layers=tuple(mtp),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=model_dtype(c),
        weight_format=format_label(layers),
        source=source,
        notes=tuple(notes),
    )


# --- DeepSeek-V4 ----------------------------------------------------------------------

# vLLM's fp8_ds_mla entry for one 512-wide V4 KV vector (sparse_swa.py: 584 bytes):
# 448 FP8 NoPE elements + 64 bf16 RoPE elements + 7 UE8M0 scales + 1 pad byte.
# Counted as 512 one-byte elements + 72 extra bytes (64 for the RoPE part's second
# byte, 8 for scales and padding).
V4_KV_EXTRA_BYTES = 72
# fp8_ds_mla pages are rounded up to 576 B (vLLM 0.34 v1/attention/backends/mla/sparse_swa.py
# DeepseekV4SWACache packed_page_alignment, models/deepseek_v4/attention.py
# MLAAttentionSpec(alignment=576)); the SWA cache fixes its block at 64 tokens
# (DeepseekV4SWACache block_size=64), the compressed and indexer caches take the engine's.
V4_PAGE_ALIGNMENT = 576
V4_SWA_BLOCK = 64


def _v4_compressor(hidden: int, head_dim: int, ratio: int) -> tuple[list[ParamGroup], CacheSpec]:
    """vLLM DeepseekCompressor: fused_wkv_wgate hidden -> 2 x coff x head_dim (unquantised,
    replicated), ape (ratio x coff x head_dim, fp32), an RMSNorm of head_dim. Ratio-4
    compressors overlap windows (coff 2). Its state cache keeps, per token of the last
    coff x ratio tokens, coff x head_dim KV and as many scores, in fp32."""
    coff = 2 if ratio == 4 else 1
    params = [
        group(Role.ATTENTION, Shard.REPLICATED, hidden * 2 * coff * head_dim, "bf16"),
        group(Role.OTHER, Shard.REPLICATED, ratio * coff * head_dim, "fp32"),
        norms(head_dim),
    ]
    # vLLM 0.34 models/deepseek_v4/compressor.py CompressorStateCache: a SlidingWindowMLASpec of window coff x ratio,
    # block 4 (ratio 4) or 8 (ratio 128) so it shares a page size with the KV blocks, page
    # rounded up to 576 B (fp8_ds_mla alignment).
    state = CacheSpec(
        "compressor_state", 2 * coff * head_dim, dtype=CacheDtype.FP32, window=coff * ratio,
        note=f"ratio-{ratio} compressor state: kv + score of the last {coff * ratio} tokens, fp32",
        vllm_spec="sliding_mla", block_size=4 if ratio == 4 else 8, page_alignment=V4_PAGE_ALIGNMENT,
    )
    return params, state


def _v4_block(c: dict, index: int, ratio: int, expert_fmt: str) -> LayerSpec:
    """One DeepseekV4DecoderLayer (vllm/model_executor/models/deepseek_v4.py)."""
    hidden, heads, head_dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    q_lora, o_groups, o_lora = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    hc = c["hc_mult"]
    mix = (2 + hc) * hc
    num_experts, k = expert_count(c), experts_per_token(c)
    params = [
        # fused wq_a + wkv (MergedColumnParallelLinear with disable_tp): hidden -> q_lora + head_dim
        group(Role.ATTENTION, Shard.REPLICATED, hidden * (q_lora + head_dim), "fp8"),
        # wq_b q_lora -> heads x head_dim; wo_a grouped (o_groups x o_lora from heads x head_dim / o_groups
        # each); wo_b o_groups x o_lora -> hidden
        group(Role.ATTENTION, Shard.TP, q_lora * heads * head_dim + heads * head_dim * o_lora + o_groups * o_lora * hidden, "fp8"),
        group(Role.OTHER, Shard.TP, heads, "fp32"),  # attn_sink
        norms(q_lora, head_dim, hidden, hidden),  # q_norm, kv_norm, attn_norm, ffn_norm
        # hyper-connections: hc_attn_fn and hc_ffn_fn (mix x hc*hidden), their bases (mix) and scales (3), fp32
        group(Role.OTHER, Shard.REPLICATED, 2 * (mix * hc * hidden + mix + 3), "fp32"),
    ]
    # Caches in the order vLLM registers their layers (static_forward_context, which
    # orders the KV cache specs): DeepseekV4Attention.__init__ builds the indexer (its
    # k_cache, then its compressor's state), then the SWA cache, then registers itself
    # (the compressed KV), then its compressor (the state).
    caches = [
        CacheSpec(
            "sliding", head_dim, dtype=CacheDtype.FP8, window=c["sliding_window"],
            extra_bytes_per_entry=V4_KV_EXTRA_BYTES,
            note="uncompressed sliding window, fp8_ds_mla layout (584 B per token), every TP rank",
            vllm_spec="sliding_mla", block_size=V4_SWA_BLOCK, page_alignment=V4_PAGE_ALIGNMENT,
        )
    ]
    label = "swa"
    if ratio > 1:
        comp_params, comp_state = _v4_compressor(hidden, head_dim, ratio)
        params += comp_params
        caches += [
            CacheSpec(
                "compressed", head_dim, dtype=CacheDtype.FP8, compress_ratio=ratio,
                extra_bytes_per_entry=V4_KV_EXTRA_BYTES,
                note=f"one compressed KV entry per {ratio} tokens, fp8_ds_mla layout, every TP rank",
                page_alignment=V4_PAGE_ALIGNMENT,
            ),
            comp_state,
        ]
        label = f"csa-{ratio}" if ratio == 4 else f"hca-{ratio}"
    if ratio == 4:
        # DeepseekV4Indexer (deepseek_v4_attention.py): wq_b q_lora -> index_n_heads x index_head_dim
        # (FP8, replicated), weights_proj hidden -> index_n_heads (unquantised, replicated), k_norm
        # LayerNorm (weight + bias), and its own ratio-4 compressor of index_head_dim.
        d, h = c["index_head_dim"], c["index_n_heads"]
        idx_comp_params, idx_comp_state = _v4_compressor(hidden, d, 4)
        params += [
            group(Role.ATTENTION, Shard.REPLICATED, q_lora * h * d, "fp8"),
            group(Role.ATTENTION, Shard.REPLICATED, hidden * h, "bf16"),
            norms(2 * d),
            *idx_comp_params,
        ]
        caches[:0] = [
            CacheSpec(
                "indexer", d, dtype=CacheDtype.FP8, compress_ratio=4, extra_bytes_per_entry=4 * (d // 128),
                note="indexer key per 4 tokens: FP8 + fp32 scale per 128 (132 B)",
                page_alignment=V4_PAGE_ALIGNMENT,
            ),
            idx_comp_state,
        ]
    # MoE: router gate bf16; the first num_hash_layers route by a token-id table
    # tid2eid (vocab x k, int32: counted as 4-byte 'fp32') instead of the fp32
    # e_score_correction_bias.
    hashed = index < c.get("num_hash_layers", 0)
    params += moe_params(
        hidden, num_experts, c["moe_intermediate_size"], expert_fmt,
        shared_inter=c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0),
        shared_fmt="fp8",
        router_bias=None if hashed else "fp32",
    )
    if hashed:
        params.append(group(Role.OTHER, Shard.REPLICATED, c["vocab_size"] * k, "fp32"))
    return make_layer(index, label, params, caches, moe=True, attn=_v4_attention(c, ratio))


def _v4_attention(c: dict, ratio: int) -> AttentionShape:
    """DeepseekV4Attention (vLLM models/deepseek_v4): MQA of every query head over one
    head_dim-wide KV entry (keys and values share it), both for decode and prefill,
    over the sliding window of uncompressed tokens plus the compressed entries: all of
    them for HCA (ratio 128), the indexer's index_topk for CSA (ratio 4), whose indexer
    scores index_n_heads x index_head_dim queries against every compressed key."""
    head_dim = c["head_dim"]
    csa = ratio == 4
    return AttentionShape(
        heads=c["num_attention_heads"], qk_dim=head_dim, v_dim=head_dim, window=c["sliding_window"],
        compress_ratio=ratio if ratio > 1 else 1, topk=c["index_topk"] if csa else None,
        indexer_heads=c["index_n_heads"] if csa else 0, indexer_dim=c["index_head_dim"] if csa else 0,
        source="DeepSeek-V4: sliding window + compressed entries (CSA top-k via the indexer, HCA all)",
    )


def parse_deepseek_v4(c: dict, name: str, source: str) -> ModelArch:
    """DeepSeek-V4 (Pro / Flash): MQA over one 512-wide KV head, per-layer compressed
    attention (compress_ratios: 4 = CSA with an indexer, 128 = HCA, 0 = sliding
    window only), grouped low-rank output projection, manifold hyper-connections,
    hash-routed first layers, FP4 (MXFP4) routed experts and FP8 elsewhere.

    compress_ratios has num_hidden_layers + num_nextn_predict_layers entries;
    the trailing ones belong to the MTP layer(s) (vLLM treats every layer index
    >= num_hidden_layers as uncompressed).
    """
    hidden, n = c["hidden_size"], c["num_hidden_layers"]
    n_mtp = c.get("num_nextn_predict_layers") or 0
    ratios = list(c["compress_ratios"])
    if len(ratios) < n:
        raise UserError(f"model {name!r}: compress_ratios has {len(ratios)} entries for {n} layers")
    for r in set(ratios):
        if r not in (0, 1, 4, 128):
            raise UserError(f"model {name!r}: compress ratio {r} is not one vLLM supports (0/1, 4, 128)")
    expert_dtype = c.get("expert_dtype", "fp4")
    # DeepseekV4FP8Config: expert_dtype 'fp4' -> Mxfp4MoEMethod (E2M1 + one E8M0 scale per 32),
    # 'fp8' -> block FP8 experts.
    expert_fmt = {"fp4": "mxfp4", "fp8": "fp8"}.get(expert_dtype)
    if expert_fmt is None:
        raise UserError(f"model {name!r}: unsupported expert_dtype {expert_dtype!r} (fp4 or fp8)")

    layers = tuple(_v4_block(c, i, ratios[i], expert_fmt) for i in range(n))
    hc = c["hc_mult"]
    hc_head = hc * hc * hidden + hc + 1  # hc_head_fn (hc x hc*hidden), base (hc), scale (1), fp32
    mtp = []
    for j in range(n_mtp):
        ratio = ratios[n + j] if n + j < len(ratios) else 0
        base = _v4_block(c, n + j, ratio, expert_fmt)
        extra = [
            # DeepSeekV4MultiTokenPredictorLayer: e_proj and h_proj (hidden -> hidden, FP8, replicated),
            # enorm, hnorm, shared_head norm, hc_head. Embedding and LM head: shared with the main
            # model by vLLM's MTP proposer, not counted.
            group(Role.DENSE_MLP, Shard.REPLICATED, 2 * hidden * hidden, "fp8"),
            norms(hidden, hidden, hidden),
            group(Role.OTHER, Shard.REPLICATED, hc_head, "fp32"),
        ]
        mtp.append(make_layer(base.index, base.attention, list(base.params) + extra, list(base.caches), base.moe, base.attn))
    notes = (
        "DeepSeek-V4 shapes from vLLM deepseek_v4.py, deepseek_v4_attention.py, deepseek_compressor.py: "
        "compressor, indexer and hyper-connection sizes are read from that code, not from the config",
        "compress_ratios[num_hidden_layers:] are the MTP layer(s)' (0: sliding window only)",
        f"routed experts: expert_dtype {expert_dtype!r} read as {expert_fmt}; other linear layers FP8 "
        "(128x128 blocks), compressor and indexer weights_proj unquantised bf16",
        "KV cache is FP8 only (vLLM fp8_ds_mla, 584 B per entry) whatever --kv-cache-dtype says",
        "MTP layer: its embedding and LM head are shared with the main model by vLLM, not counted",
        "hash-routing table tid2eid (int32) counted as a 4-byte parameter group",
    )
    return ModelArch(
        name=name,
        model_type=c["model_type"],
        hidden_size=hidden,
        vocab_size=c["vocab_size"],
        num_attention_heads=c["num_attention_heads"],
        tp_divides=(c["num_attention_heads"], c["o_groups"]),
        num_kv_heads=None,
        num_experts=expert_count(c),
        experts_per_token=experts_per_token(c),
        moe_intermediate_size=c["moe_intermediate_size"],
        intermediate_size=c["moe_intermediate_size"] * (c.get("n_shared_experts") or 1),
        layers=layers,
        embedding=embedding(c),
        lm_head=lm_head(c),
        final=(norms(hidden), group(Role.OTHER, Shard.REPLICATED, hc_head, "fp32")),
        mtp_layers=tuple(mtp),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=model_dtype(c),
        weight_format=format_label(layers),
        source=source,
        notes=notes,
    )
