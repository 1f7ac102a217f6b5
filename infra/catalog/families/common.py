"""Building blocks shared by the family parsers: parameter groups, layers, attention and MoE shapes.

Each helper counts one component the way vLLM shards it (the docstrings name
the vLLM class); the family modules put them together per `model_type`.
"""

from __future__ import annotations

from infra.catalog.arch import AttentionShape, CacheSpec, Experts, LayerSpec, Linear, ParamGroup, Role, Shard
from infra.catalog.quant import QuantConfig, Scheme, parse_quant_config


def group(role: Role, shard: Shard, count: int, fmt: str) -> ParamGroup:
    """`count` parameters of one role, stored in `fmt`, sharded by `shard`."""
    return ParamGroup(role=role, shard=shard, count=int(count), fmt=fmt)


def quant_config(c: dict) -> QuantConfig | None:
    """The config's quantization_config, with scales kept in the model dtype (params_dtype)."""
    return parse_quant_config(c, param_bytes=4 if model_dtype(c) == "fp32" else 2)


def linear_group(role: Role, shape: Linear, scheme: Scheme | None, fmt: str = "bf16") -> ParamGroup:
    """One linear layer: in `fmt` when not quantised, else carrying its scheme and shape."""
    shard = Shard.REPLICATED if shape.split == "replicated" else Shard.TP
    if scheme is None:
        return group(role, shard, shape.count, fmt)
    return ParamGroup(role=role, shard=shard, count=shape.count, fmt=scheme.fmt, scheme=scheme, shapes=(shape,))


def experts_group(shape: Experts, scheme: Scheme) -> ParamGroup:
    """The routed experts of one FusedMoE, quantised by `scheme`."""
    return ParamGroup(
        role=Role.ROUTED_EXPERT, shard=Shard.EXPERT, count=shape.count, fmt=scheme.fmt, scheme=scheme, shapes=(shape,)
    )


def norms(*sizes: int, fmt: str = "bf16") -> ParamGroup:
    """Norm weights (RMSNorm / LayerNorm), whole on every rank."""
    return group(Role.OTHER, Shard.REPLICATED, sum(sizes), fmt)


def embedding(c: dict) -> ParamGroup:
    return group(Role.EMBEDDING, Shard.VOCAB, c["vocab_size"] * c["hidden_size"], "bf16")


def lm_head(c: dict) -> ParamGroup:
    tied = bool(c.get("tie_word_embeddings", False))
    return group(Role.LM_HEAD, Shard.VOCAB, 0 if tied else c["vocab_size"] * c["hidden_size"], "bf16")


def model_dtype(c: dict) -> str:
    dtype = c.get("torch_dtype") or c.get("dtype") or "bfloat16"
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, "bf16")


def dense_mlp(hidden: int, inter: int, fmt: str) -> list[ParamGroup]:
    """gate_up (MergedColumnParallelLinear) + down (RowParallelLinear)."""
    return [group(Role.DENSE_MLP, Shard.TP, 3 * hidden * inter, fmt)]


def mla(c: dict, fmt: str, *, output_gate: bool = False) -> list[ParamGroup]:
    """DeepSeek-style MLA (vLLM DeepseekV2Attention / KimiMLAAttention).

    q_a_proj and kv_a_proj_with_mqa are ReplicatedLinear; q_b/q_proj, kv_b and
    o_proj are column/row parallel. With `output_gate` (Kimi K3's gated MLA) a
    g_proj hidden -> heads x v_head_dim, column parallel like q_b (assumption:
    sharded by heads, as the gate multiplies each head's output).
    """
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_lora, kv_lora = c.get("q_lora_rank"), c["kv_lora_rank"]
    replicated = hidden * (kv_lora + rope)  # kv_a_proj_with_mqa
    sharded = kv_lora * heads * (nope + v) + heads * v * hidden  # kv_b_proj + o_proj
    norm_sizes = [kv_lora]
    if q_lora:
        replicated += hidden * q_lora  # q_a_proj
        sharded += q_lora * heads * (nope + rope)  # q_b_proj
        norm_sizes.append(q_lora)
    else:
        sharded += hidden * heads * (nope + rope)  # q_proj
    if output_gate:
        sharded += hidden * heads * v  # g_proj
    return [
        group(Role.ATTENTION, Shard.REPLICATED, replicated, fmt),
        group(Role.ATTENTION, Shard.TP, sharded, fmt),
        norms(*norm_sizes),
    ]


def mla_cache(c: dict) -> CacheSpec:
    return CacheSpec(
        "mla", c["kv_lora_rank"] + c["qk_rope_head_dim"],
        note="MLA latent (kv_lora_rank) + RoPE key, one per token, the same on every TP rank",
    )


def moe_params(
    hidden: int,
    num_experts: int,
    expert_inter: int,
    expert_fmt: str,
    *,
    shared_inter: int = 0,
    shared_fmt: str = "bf16",
    router_fmt: str = "bf16",
    router_bias: str | None = None,
    expert_hidden: int | None = None,
    expert_scheme: Scheme | None = None,
    expert_bias: bool = False,
    router_scheme: Scheme | None = None,
) -> list[ParamGroup]:
    """Router + routed experts (FusedMoE: w13 and w2 per expert) + optional shared experts.

    `router_bias`: None, "bf16" (a Linear bias, gpt-oss) or "fp32"
    (e_score_correction_bias of noaux_tc routing). `expert_hidden`: the width
    the routed experts work in when it differs from hidden_size (latent MoE).
    `expert_scheme`: the quantisation of the routed experts (then costed from
    their shape; `expert_bias` adds gpt-oss's per-expert biases to them);
    `router_scheme`: of the router gate, a ReplicatedLinear.
    """
    width = expert_hidden or hidden
    router = linear_group(Role.OTHER, Linear(((num_experts, 1),), hidden, "replicated"), router_scheme, router_fmt)
    if expert_scheme is not None:
        routed = experts_group(Experts(num_experts, width, expert_inter, bias=expert_bias), expert_scheme)
    else:
        routed = group(Role.ROUTED_EXPERT, Shard.EXPERT, num_experts * 3 * width * expert_inter, expert_fmt)
    groups = [router, routed]
    if router_bias:
        groups.append(group(Role.OTHER, Shard.REPLICATED, num_experts, router_bias))
    if shared_inter:
        groups.append(group(Role.SHARED_EXPERT, Shard.TP, 3 * hidden * shared_inter, shared_fmt))
    return groups


def make_layer(index: int, attention: str, params: list[ParamGroup], caches: list[CacheSpec], moe: bool,
               attn: AttentionShape | None = None) -> LayerSpec:
    params = [p for p in params if p.count]
    return LayerSpec(index=index, attention=attention, params=tuple(params), caches=tuple(caches), moe=moe, attn=attn)


def mla_attention(c: dict) -> AttentionShape:
    """DeepSeek-style MLA (vLLM MLACommonImpl, v1/attention/backends/mla/common.py): decode
    absorbs kv_b_proj into the query and output (forward_mqa: one latent "head" of
    kv_lora + rope for keys, kv_lora for values); prefill (forward_mha) expands the
    cached latent of every context token to per-head K (nope) and V with kv_b_proj."""
    heads, nope, rope, v = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    kv_lora = c["kv_lora_rank"]
    return AttentionShape(
        heads=heads, qk_dim=kv_lora + rope, v_dim=kv_lora, prefill_qk_dim=nope + rope, prefill_v_dim=v,
        prefill_expand_flops=2 * kv_lora * heads * (nope + v),
        source="MLA: absorbed decode, un-absorbed prefill (vLLM MLACommonImpl)",
    )


def gqa_attention(c: dict, window: int | None = None) -> AttentionShape:
    """GQA / MHA (vLLM FlashAttention backend): every query head dots head_dim keys and
    sums head_dim values of each cached token (of the window for sliding layers)."""
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return AttentionShape(heads=c["num_attention_heads"], qk_dim=head_dim, v_dim=head_dim, window=window,
                          source="GQA: q heads x head_dim against K and V of each cached token")


def expert_count(c: dict) -> int:
    for key in ("n_routed_experts", "num_experts", "num_local_experts"):
        if c.get(key):
            return int(c[key])
    return 0


def experts_per_token(c: dict) -> int:
    for key in ("num_experts_per_tok", "num_experts_per_token", "experts_per_token"):
        if c.get(key):
            return int(c[key])
    return 0


def _dominant_fmt(groups: list[ParamGroup]) -> str | None:
    totals: dict[str, int] = {}
    for g in groups:
        totals[g.fmt] = totals.get(g.fmt, 0) + g.count
    return max(totals, key=totals.get) if totals else None


LINEAR_ROLES = (Role.ATTENTION, Role.DENSE_MLP, Role.SHARED_EXPERT, Role.ROUTED_EXPERT)


def format_label(layers: tuple[LayerSpec, ...]) -> str:
    """'fp8', or 'fp8+mxfp4 experts' when the routed experts are stored differently."""
    groups = [g for layer in layers for g in layer.params]
    base = _dominant_fmt([g for g in groups if g.role in LINEAR_ROLES and g.role != Role.ROUTED_EXPERT])
    experts = _dominant_fmt([g for g in groups if g.role == Role.ROUTED_EXPERT])
    if experts is None or experts == base:
        return base or "bf16"
    return f"{base}+{experts} experts"
