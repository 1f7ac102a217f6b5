"""Dense and GQA-MoE families: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gpt-oss."""

from __future__ import annotations

from infra.catalog.arch import CacheSpec, LayerSpec, Linear, ModelArch, ParamGroup, Role, Shard
from infra.catalog.families.common import (
    dense_mlp,
    embedding,
    expert_count,
    experts_per_token,
    format_label,
    group,
    lm_head,
    linear_group,
    gqa_attention,
    make_layer,
    model_dtype,
    moe_params,
    norms,
    quant_config,
)
from infra.catalog.quant import QuantConfig


def _gqa(
    c: dict, fmt: str, *, bias: bool, qk_norm: bool, quant: QuantConfig | None = None, prefix: str = ""
) -> list[ParamGroup]:
    """QKVParallelLinear + RowParallelLinear o_proj (+ biases, + per-head q/k RMSNorm).

    With a quantization_config, qkv_proj and o_proj are one group each, with the scheme
    the config gives the checkpoint's `{prefix}.self_attn.{q,k,v,o}_proj`.
    """
    hidden, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    qkv_out = (heads + 2 * kv) * head_dim
    if quant is None:
        groups = [group(Role.ATTENTION, Shard.TP, hidden * qkv_out + heads * head_dim * hidden, fmt)]
    else:
        attn = f"{prefix}.self_attn"
        qkv = Linear(((heads, head_dim), (kv, head_dim), (kv, head_dim)), hidden, "column")
        o = Linear(((hidden, 1),), heads * head_dim, "row")
        groups = [
            linear_group(Role.ATTENTION, qkv, quant.linear([f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"]), fmt),
            linear_group(Role.ATTENTION, o, quant.linear([f"{attn}.o_proj"]), fmt),
        ]
    if bias:
        # qkv bias; o_proj bias too except in qwen2 (qkv-only biases)
        o_bias = 0 if c.get("model_type") == "qwen2" else hidden
        groups.append(group(Role.ATTENTION, Shard.TP, qkv_out + o_bias, "bf16"))
    if qk_norm:
        groups.append(norms(head_dim, head_dim))
    return groups


def _mlp(hidden: int, inter: int, quant: QuantConfig | None, prefix: str) -> list[ParamGroup]:
    """Dense SwiGLU MLP: gate_up_proj (MergedColumnParallelLinear) + down_proj (RowParallelLinear)."""
    if quant is None:
        return dense_mlp(hidden, inter, "bf16")
    mlp = f"{prefix}.mlp"
    return [
        linear_group(
            Role.DENSE_MLP, Linear(((inter, 1), (inter, 1)), hidden, "column"),
            quant.linear([f"{mlp}.gate_proj", f"{mlp}.up_proj"]),
        ),
        linear_group(Role.DENSE_MLP, Linear(((hidden, 1),), inter, "row"), quant.linear([f"{mlp}.down_proj"])),
    ]


def _gqa_cache(c: dict, window: int | None = None) -> CacheSpec:
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"]
    if window is None:
        return CacheSpec("gqa", 2 * head_dim, sharded_heads=kv, note="K and V per KV head")
    return CacheSpec("sliding", 2 * head_dim, sharded_heads=kv, window=window, note="K and V per KV head, sliding window")


def parse_gqa_dense(c: dict, name: str, source: str) -> ModelArch:
    """llama, mistral, qwen2, qwen3: GQA attention and a dense SwiGLU MLP, bf16 unless the
    quantization_config converts the linear layers (infra.catalog.quant)."""
    model_type = c["model_type"]
    quant = quant_config(c)
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
            _gqa(c, "bf16", bias=bias, qk_norm=qk_norm, quant=quant, prefix=f"model.layers.{i}")
            + _mlp(hidden, inter, quant, f"model.layers.{i}")
            + [norms(hidden, hidden)],
            [_gqa_cache(c, window)],
            moe=False,
            attn=gqa_attention(c, window),
        )
        for i in range(c["num_hidden_layers"])
    )
    return _finish_gqa(c, name, source, layers, notes, quant)


def parse_gqa_moe(c: dict, name: str, source: str) -> ModelArch:
    """qwen3_moe, mixtral: GQA attention and a routed MoE without shared experts, bf16
    unless the quantization_config converts them.

    Checkpoint names: qwen3_moe `model.layers.N.mlp.gate` (router) and `.mlp.experts`;
    mixtral `model.layers.N.block_sparse_moe.gate` / `.experts` (w1, w3, w2). vLLM's
    Qwen3MoeSparseMoeBlock passes the quant config to its GateLinear router, so an FP8
    or ModelOpt router is quantised unless ignored; Mixtral's router never is. AWQ and
    GPTQ routers are taken as unquantised (ASSUMPTION: AutoAWQ / GPTQModel leave the
    router alone; vLLM finds that from the checkpoint's dtypes in maybe_update_config).
    """
    hidden = c["hidden_size"]
    model_type = c["model_type"]
    qk_norm = model_type == "qwen3_moe"
    mlp_only = set(c.get("mlp_only_layers") or [])
    step = int(c.get("decoder_sparse_step") or 1)
    window = c.get("sliding_window") if model_type == "mixtral" else None
    expert_inter = c.get("moe_intermediate_size") or c["intermediate_size"]
    quant = quant_config(c)
    block = "block_sparse_moe" if model_type == "mixtral" else "mlp"
    layers = []
    for i in range(c["num_hidden_layers"]):
        prefix = f"model.layers.{i}"
        moe = i not in mlp_only and (i + 1) % step == 0
        if not moe:
            mlp = _mlp(hidden, c["intermediate_size"], quant, prefix)
        elif quant is None:
            mlp = moe_params(hidden, expert_count(c), expert_inter, "bf16")
        else:
            router_quantised = model_type == "qwen3_moe" and quant.method not in ("awq", "gptq")
            mlp = moe_params(
                hidden, expert_count(c), expert_inter, "bf16",
                expert_scheme=quant.experts(f"{prefix}.{block}.experts"),
                router_scheme=quant.linear([f"{prefix}.{block}.gate"]) if router_quantised else None,
            )
        attention = _gqa(c, "bf16", bias=bool(c.get("attention_bias")), qk_norm=qk_norm, quant=quant, prefix=prefix)
        params = attention + mlp + [norms(hidden, hidden)]
        layers.append(make_layer(i, "sliding" if window else "gqa", params, [_gqa_cache(c, window)], moe,
                                 attn=gqa_attention(c, window)))
    return _finish_gqa(c, name, source, tuple(layers), [], quant)


def parse_gpt_oss(c: dict, name: str, source: str) -> ModelArch:
    """gpt-oss: GQA with attention sinks and biases; sliding (128) and full layers
    alternate per `layer_types`; MoE with biased experts and router.

    Formats per quantization_config: the routed experts are MXFP4 (their biases
    bf16); everything in modules_to_not_convert (attention, router, embedding,
    lm_head) is bf16.
    """
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    num_experts, inter = expert_count(c), c["intermediate_size"]
    quant = quant_config(c)
    n = c["num_hidden_layers"]
    types = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    layers = []
    for i in range(n):
        sliding = types[i] == "sliding_attention"
        scheme = quant.experts(f"model.layers.{i}.mlp.experts") if quant else None
        if scheme is not None:
            # GptOssMxfp4MoEMethod.create_weights: MXFP4 experts with their biases, sized
            # after vLLM's padding for the MoE kernel (costed per GPU in the planner).
            experts = moe_params(hidden, num_experts, inter, "mxfp4", router_bias="bf16",
                                 expert_scheme=scheme, expert_bias=True)
        else:
            experts = [
                *moe_params(hidden, num_experts, inter, "bf16", router_bias="bf16"),
                # expert biases: w13 (2 x inter) and w2 (hidden) per expert
                group(Role.ROUTED_EXPERT, Shard.EXPERT, num_experts * (2 * inter + hidden), "bf16"),
            ]
        params = _gqa(c, "bf16", bias=True, qk_norm=False, quant=quant, prefix=f"model.layers.{i}") + [
            group(Role.OTHER, Shard.TP, heads, "bf16"),  # attention sinks, one per head
            *experts,
            norms(hidden, hidden),
        ]
        window = c["sliding_window"] if sliding else None
        layers.append(make_layer(i, "sliding" if sliding else "gqa", params, [_gqa_cache(c, window)], moe=True,
                                 attn=gqa_attention(c, window)))
    notes = [
        "expert biases are counted as routed-expert parameters; a --weight-format override "
        "re-labels them with the experts' format (39.8M parameters, negligible)",
    ]
    if quant is not None and quant.moe_scheme is not None:
        notes.append(
            "MXFP4 experts per rank are padded as vLLM pads them for the GPU's MoE kernel "
            "(H100/H200 Triton: intermediate per rank to a multiple of 64, biases fp32; B200 TRT-LLM: "
            "hidden to 256, intermediate to 128; older GPUs Marlin: hidden 256, intermediate 128)"
        )
    return _finish_gqa(c, name, source, tuple(layers), notes, quant)


def _finish_gqa(
    c: dict, name: str, source: str, layers: tuple[LayerSpec, ...], notes: list[str], quant: QuantConfig | None = None
) -> ModelArch:
    num_experts = expert_count(c)
    head = lm_head(c)
    head_scheme = quant.lm_head() if quant is not None and head.count else None
    if head_scheme is not None:
        head = linear_group(Role.LM_HEAD, Linear(((c["vocab_size"], 1),), c["hidden_size"], "column"), head_scheme)
        head = ParamGroup(head.role, Shard.VOCAB, head.count, head.fmt, head.scheme, head.shapes)
    if quant is not None:
        notes = list(notes) + [f"quantization_config: {quant.method}; " + _quant_summary(layers, head)]
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
        lm_head=head,
        final=(norms(c["hidden_size"]),),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=model_dtype(c),
        weight_format=format_label(layers),
        source=source,
        notes=tuple(notes),
    )


def _quant_summary(layers: tuple[LayerSpec, ...], head: ParamGroup) -> str:
    """Which roles the quantization_config converted, for the arch's notes."""
    kept, converted = set(), set()
    for g in [g for layer in layers for g in layer.params] + [head]:
        if g.role in (Role.ATTENTION, Role.DENSE_MLP, Role.ROUTED_EXPERT, Role.LM_HEAD) and g.count:
            (converted if g.scheme is not None else kept).add(g.role.value)
    return (
        f"quantised: {', '.join(sorted(converted)) or 'nothing'}; "
        f"left in the model dtype: {', '.join(sorted(kept)) or 'nothing'} (plus embedding, norms, routers)"
    )
