"""Kimi Linear (Kimi K3's text model): KDA linear-attention layers, gated MLA layers, latent MoE."""

from __future__ import annotations

from infra.catalog.arch import AttentionShape, CacheDtype, CacheSpec, ModelArch, ParamGroup, Role, Shard
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
)
from infra.errors import UserError


def _kda_layer_sets(c: dict, name: str) -> tuple[set[int], set[int]]:
    """0-based indices of the KDA and the full-attention (MLA) layers.

    The config lists are 1-based layer numbers: vLLM's KimiLinearConfig.is_kda_layer
    tests `layer_idx + 1 in kda_layers`, and for Kimi K3 (93 layers) the two lists
    together are exactly 1..93 (69 KDA + 24 MLA, MLA at every 4th layer and at 93).
    """
    n = c["num_hidden_layers"]
    lac = c["linear_attn_config"]
    kda = set(lac.get("kda_layers") or [])
    full = set(lac.get("full_attn_layers") or [])
    if kda & full:
        raise UserError(f"model {name!r}: layers {sorted(kda & full)} are listed as both KDA and full attention")
    if kda | full == set(range(1, n + 1)):
        return {i - 1 for i in kda}, {i - 1 for i in full}
    if kda | full == set(range(n)):  # tolerate 0-based lists
        return kda, full
    raise UserError(
        f"model {name!r}: linear_attn_config kda_layers and full_attn_layers do not cover the "
        f"{n} layers exactly once"
    )


def _kda(c: dict) -> tuple[list[ParamGroup], list[CacheSpec]]:
    """vLLM KimiDeltaAttention (layers/kda.py) with Kimi K3's full-rank output gate.

    q/k/v_proj hidden -> heads x head_dim (column parallel); f_a_proj hidden -> head_dim
    (replicated) and f_b_proj head_dim -> heads x head_dim (column); b_proj hidden -> heads;
    g_proj hidden -> heads x head_dim (use_full_rank_gate; ASSUMPTION: column parallel like
    q_proj -- vLLM's kda.py has the low-rank g_a/g_b pair instead); o_proj row parallel;
    q/k/v_conv1d (heads x head_dim x kernel), dt_bias and A_log in fp32; o_norm of head_dim.

    State per sequence (MambaStateShapeCalculator.kda_state_shape): the recurrent state,
    heads x head_dim x head_dim in fp32, and the short-convolution states, 3 x (kernel - 1)
    per q/k/v channel at the model dtype (mamba_cache_dtype 'auto'); both split by heads.
    """
    hidden = c["hidden_size"]
    lac = c["linear_attn_config"]
    heads, d, kernel = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    proj = heads * d
    params = [
        group(Role.ATTENTION, Shard.TP, 3 * hidden * proj + d * proj + hidden * heads + hidden * proj + proj * hidden, "bf16"),
        group(Role.ATTENTION, Shard.REPLICATED, hidden * d, "bf16"),  # f_a_proj
        group(Role.OTHER, Shard.TP, 3 * proj * kernel + proj + heads, "fp32"),  # conv1d x3, dt_bias, A_log
        norms(d),  # o_norm
    ]
    caches = [
        CacheSpec(
            "linear_state", d * d, sharded_heads=heads, dtype=CacheDtype.FP32, per_sequence=True,
            note="KDA recurrent state, head_dim x head_dim per head, fp32",
        ),
        CacheSpec(
            "linear_state", 3 * (kernel - 1) * d, sharded_heads=heads, dtype=CacheDtype.MODEL, per_sequence=True,
            note="KDA short-conv states (q, k, v): kernel-1 per channel; vLLM keeps them in "
            "mamba_cache_dtype (model dtype by default), not --kv-cache-dtype",
            conv_rows=kernel - 1,
        ),
    ]
    return params, caches


def parse_kimi_linear(c: dict, name: str, source: str) -> ModelArch:
    """Kimi Linear / Kimi K3 text model: KDA linear-attention layers and gated MLA layers,
    first_k_dense_replace dense MLP layers, then latent MoE.

    Latent MoE: routed experts work in routed_expert_hidden_size; a down-projection
    hidden -> latent before them, an RMSNorm and an up-projection back after them
    (replicated, bf16; the experts shard inside). Shared experts at hidden_size.
    Formats per quantization_config (compressed-tensors mxfp4-pack-quantized targets
    Linear, minus its `ignore` list): routed experts MXFP4; attention, shared experts,
    the dense MLP, lm_head bf16. The router gate is unquantised in vLLM (bf16) and the
    latent projections are stored unquantised (`.weight`, not `.weight_packed`).
    """
    hidden, n = c["hidden_size"], c["num_hidden_layers"]
    kda_idx, full_idx = _kda_layer_sets(c, name)
    num_experts = expert_count(c)
    latent = c.get("routed_expert_hidden_size") or 0
    quant = c.get("quantization_config") or {}
    qfmt = str(quant.get("format", "")) + str(quant.get("quant_method", ""))
    expert_fmt = "mxfp4" if "mxfp4" in qfmt else ("fp8" if "fp8" in qfmt else "bf16")
    output_gate = bool(c.get("mla_use_output_gate"))
    first_dense = c.get("first_k_dense_replace", 0)
    freq = c.get("moe_layer_freq") or 1
    attn_res = bool(c.get("attn_res_block_size"))
    layers = []
    for i in range(n):
        if i in kda_idx:
            params, caches = _kda(c)
            label = "kda"
            lac = c["linear_attn_config"]
            # KDA (vLLM layers/kda.py, fla chunk / fused_recurrent kernels): a head_dim x
            # head_dim state per head, updated and read once per token.
            attn = AttentionShape(heads=lac["num_heads"], qk_dim=lac["head_dim"], v_dim=lac["head_dim"],
                                  recurrent_dim=lac["head_dim"], source="KDA recurrent state per head")
        else:
            params, caches = mla(c, "bf16", output_gate=output_gate), [mla_cache(c)]
            label = "mla"
            attn = mla_attention(c)
        params = params + [norms(hidden, hidden)]
        if attn_res:
            # AttnRes: self_attention_res_norm / _proj and mlp_res_norm / _proj per layer (hidden each);
            # ASSUMPTION from third-party K3 loaders, not the config.
            params.append(norms(4 * hidden))
        moe = bool(num_experts) and i >= first_dense and i % freq == 0
        if moe:
            params += moe_params(
                hidden, num_experts, c["moe_intermediate_size"], expert_fmt,
                shared_inter=c["moe_intermediate_size"] * (c.get("num_shared_experts") or 0),
                router_bias="fp32",
                expert_hidden=latent or None,
            )
            if latent:
                # routed_expert_down_proj and _up_proj: every token passes them, so dense-MLP role.
                params += [group(Role.DENSE_MLP, Shard.REPLICATED, 2 * hidden * latent, "bf16"), norms(latent)]
        else:
            params += dense_mlp(hidden, c["intermediate_size"], "bf16")
        layers.append(make_layer(i, label, params, caches, moe, attn=attn))
    layers = tuple(layers)
    final = [norms(hidden)]
    if attn_res:
        final.append(norms(2 * hidden))  # output_attn_res_norm / _proj
    lac = c["linear_attn_config"]
    notes = (
        "kda_layers / full_attn_layers read as 1-based layer numbers (vLLM KimiLinearConfig.is_kda_layer "
        f"tests layer_idx + 1); {len(kda_idx)} KDA + {len(full_idx)} MLA layers cover all {n}",
        "ASSUMPTION: K3's gated-MLA g_proj and the KDA full-rank g_proj are column parallel "
        "(split by heads); vLLM's kda.py shows the low-rank g_a/g_b variant",
        "ASSUMPTION: AttnRes norms/projections per layer (4 x hidden) from third-party K3 loaders",
        "latent MoE down/up projections and their norm are replicated on every rank and bf16",
        f"KDA: {lac['num_heads']} heads x {lac['head_dim']}; conv states follow the model dtype",
    )
    return ModelArch(
        name=name,
        model_type=c["model_type"],
        hidden_size=hidden,
        vocab_size=c["vocab_size"],
        num_attention_heads=c["num_attention_heads"],
        tp_divides=tuple(sorted({c["num_attention_heads"], lac["num_heads"]})),
        num_kv_heads=None,
        num_experts=num_experts,
        experts_per_token=experts_per_token(c),
        moe_intermediate_size=c["moe_intermediate_size"],
        intermediate_size=c["intermediate_size"],
        layers=layers,
        embedding=embedding(c),
        lm_head=lm_head(c),
        final=tuple(final),
        mtp_layers=(),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=model_dtype(c),
        weight_format=format_label(layers),
        source=source,
        notes=notes,
    )
