"""Dense and GQA-MoE families: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gpt-oss."""

from __future__ import annotations

from infra.catalog.arch import CacheSpec, LayerSpec, ModelArch, ParamGroup, Role, Shard
from infra.catalog.families.common import (
    dense_mlp,
    embedding,
    expert_count,
    experts_per_token,
    format_label,
    group,
    lm_head,
    make_layer,
    model_dtype,
    moe_params,
    norms,
)


def _gqa(c: dict, fmt: str, *, bias: bool, qk_norm: bool) -> list[ParamGroup]:
    """QKVParallelLinear + RowParallelLinear o_proj (+ biases, + per-head q/k RMSNorm)."""
    hidden, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    qkv_out = (heads + 2 * kv) * head_dim
    groups = [group(Role.ATTENTION, Shard.TP, hidden * qkv_out + heads * head_dim * hidden, fmt)]
    if bias:
        # qkv bias; o_proj bias too except in qwen2 (qkv-only biases)
        o_bias = 0 if c.get("model_type") == "qwen2" else hidden
        groups.append(group(Role.ATTENTION, Shard.TP, qkv_out + o_bias, "bf16"))
    if qk_norm:
        groups.append(norms(head_dim, head_dim))
    return groups


def _gqa_cache(c: dict, window: int | None = None) -> CacheSpec:
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"]
    if window is None:
        return CacheSpec("gqa", 2 * head_dim, sharded_heads=kv, note="K and V per KV head")
    return CacheSpec("sliding", 2 * head_dim, sharded_heads=kv, window=window, note="K and V per KV head, sliding window")


def parse_gqa_dense(c: dict, name: str, source: str) -> ModelArch:
    """llama, mistral, qwen2, qwen3: GQA attention and a dense SwiGLU MLP, all bf16."""
    model_type = c["model_type"]
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    bias = bool(c.get("attention_bias", model_type == "qwen2"))
    qk_norm = model_type == "qwen3"
    window = c.get("sliding_window") if c.get("use_sliding_window", model_type == "mistral") else None
    notes = []
    if model_type == "qwen2" and window:
        notes.append("qwen2 sliding window applies to layers from max_window_layers; treated as full attention")
        window = None
    layers = tuple(
        make_layer(
            i, "sliding" if window else "gqa",
            _gqa(c, "bf16", bias=bias, qk_norm=qk_norm) + dense_mlp(hidden, inter, "bf16") + [norms(hidden, hidden)],
            [_gqa_cache(c, window)],
            moe=False,
        )
        for i in range(c["num_hidden_layers"])
    )
    return _finish_gqa(c, name, source, layers, notes)


def parse_gqa_moe(c: dict, name: str, source: str) -> ModelArch:
    """qwen3_moe, mixtral: GQA attention and a routed MoE without shared experts, all bf16."""
    hidden = c["hidden_size"]
    qk_norm = c["model_type"] == "qwen3_moe"
    mlp_only = set(c.get("mlp_only_layers") or [])
    step = int(c.get("decoder_sparse_step") or 1)
    window = c.get("sliding_window") if c["model_type"] == "mixtral" else None
    expert_inter = c.get("moe_intermediate_size") or c["intermediate_size"]
    layers = []
    for i in range(c["num_hidden_layers"]):
        moe = i not in mlp_only and (i + 1) % step == 0
        mlp = (
            moe_params(hidden, expert_count(c), expert_inter, "bf16")
            if moe
            else dense_mlp(hidden, c["intermediate_size"], "bf16")
        )
        params = _gqa(c, "bf16", bias=bool(c.get("attention_bias")), qk_norm=qk_norm) + mlp + [norms(hidden, hidden)]
        layers.append(make_layer(i, "sliding" if window else "gqa", params, [_gqa_cache(c, window)], moe))
    return _finish_gqa(c, name, source, tuple(layers), [])


def parse_gpt_oss(c: dict, name: str, source: str) -> ModelArch:
    """gpt-oss: GQA with attention sinks and biases; sliding (128) and full layers
    alternate per `layer_types`; MoE with biased experts and router.

    Formats per quantization_config: the routed experts are MXFP4 (their biases
    bf16); everything in modules_to_not_convert (attention, router, embedding,
    lm_head) is bf16.
    """
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    num_experts, inter = expert_count(c), c["intermediate_size"]
    quant = c.get("quantization_config") or {}
    expert_fmt = "mxfp4" if quant.get("quant_method") == "mxfp4" else "bf16"
    n = c["num_hidden_layers"]
    types = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    layers = []
    for i in range(n):
        sliding = types[i] == "sliding_attention"
        params = _gqa(c, "bf16", bias=True, qk_norm=False) + [
            group(Role.OTHER, Shard.TP, heads, "bf16"),  # attention sinks, one per head
            *moe_params(hidden, num_experts, inter, expert_fmt, router_bias="bf16"),
            # expert biases: w13 (2 x inter) and w2 (hidden) per expert, bf16 in vLLM's Mxfp4MoEMethod
            group(Role.ROUTED_EXPERT, Shard.EXPERT, num_experts * (2 * inter + hidden), "bf16"),
            norms(hidden, hidden),
        ]
        cache = _gqa_cache(c, c["sliding_window"] if sliding else None)
        layers.append(make_layer(i, "sliding" if sliding else "gqa", params, [cache], moe=True))
    notes = [
        "expert biases are counted as routed-expert parameters; a --weight-format override "
        "re-labels them with the experts' format (39.8M parameters, negligible)",
    ]
    return _finish_gqa(c, name, source, tuple(layers), notes)


def _finish_gqa(c: dict, name: str, source: str, layers: tuple[LayerSpec, ...], notes: list[str]) -> ModelArch:
    num_experts = expert_count(c)
    return ModelArch(
        name=name,
        model_type=c["model_type"],
        hidden_size=c["hidden_size"],
        vocab_size=c["vocab_size"],
        num_attention_heads=c["num_attention_heads"],
        tp_divides=(c["num_attention_heads"],),
        num_kv_heads=c["num_key_value_heads"],
        num_experts=num_experts,
        experts_per_token=experts_per_token(c) if num_experts else 0,
        moe_intermediate_size=(c.get("moe_intermediate_size") or c["intermediate_size"]) if num_experts else 0,
        intermediate_size=c["intermediate_size"],
        layers=layers,
        embedding=embedding(c),
        lm_head=lm_head(c),
        final=(norms(c["hidden_size"]),),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=model_dtype(c),
        weight_format=format_label(layers),
        source=source,
        notes=tuple(notes),
    )
