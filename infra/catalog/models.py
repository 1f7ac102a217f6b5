"""Model architectures from Hugging Face `config.json` files.

`load_model` reads a catalog name (bundled copy of the published config) or a
path; `parse_config` turns a config dict into a `ModelArch`: one `LayerSpec`
per decoder layer with its parameter groups (how many parameters, in what
stored format, sharded the way vLLM shards them) and its cache components.

Every shape here follows the config and vLLM's model implementation of the
family (vllm/model_executor/models/<family>.py). Figures a config does not
give are written down as assumptions in the arch's `notes` and next to the
code that uses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from infra.catalog.arch import CacheDtype, CacheSpec, LayerSpec, ModelArch, ParamGroup, Role, Shard
from infra.catalog.formats import FOUR_BIT_FORMATS, get_format
from infra.errors import UserError

CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"


# --- Catalog ---------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogEntry:
    file: str  # in model_configs/
    hf_repo: str
    published_total: int | None  # parameters, as the model card states them (rounded there)
    published_active: int | None  # activated parameters per token; None for dense models / not published
    published_source: str
    # Checkpoints of the same model published in another weight format, by the
    # --weight-format name; the planner falls back to them when the model's own
    # checkpoint does not fit. Each of these repositories' config.json ships in
    # the aiconfigurator-core 0.12.0 package (model_configs/), which is where
    # their existence was checked.
    variants: dict[str, str] = field(default_factory=dict)


CATALOG: dict[str, CatalogEntry] = {
    "deepseek-v4-pro": CatalogEntry(
        "deepseek-v4-pro.json", "deepseek-ai/DeepSeek-V4-Pro", 1_600_000_000_000, 49_000_000_000,
        "model card huggingface.co/deepseek-ai/DeepSeek-V4-Pro: 1.6T total, 49B activated "
        "(main model, MTP module not counted, as for V3)",
        {"fp8": "sgl-project/DeepSeek-V4-Pro-FP8", "nvfp4": "nvidia/DeepSeek-V4-Pro-NVFP4"},
    ),
    "deepseek-v4-flash": CatalogEntry(
        "deepseek-v4-flash.json", "deepseek-ai/DeepSeek-V4-Flash", 284_000_000_000, 13_000_000_000,
        "model card huggingface.co/deepseek-ai/DeepSeek-V4-Flash: 284B total, 13B activated",
        {"fp8": "sgl-project/DeepSeek-V4-Flash-FP8", "nvfp4": "nvidia/DeepSeek-V4-Flash-NVFP4"},
    ),
    "kimi-k3": CatalogEntry(
        "kimi-k3.json", "moonshotai/Kimi-K3", 2_800_000_000_000, None,
        "Hugging Face model page moonshotai/Kimi-K3: 2.8T parameters; no activated figure found",
    ),
    "deepseek-v3": CatalogEntry(
        "deepseek-v3.json", "deepseek-ai/DeepSeek-V3", 671_000_000_000, 37_000_000_000,
        "model card huggingface.co/deepseek-ai/DeepSeek-V3: 671B total, 37B activated; the repo's "
        "685B = 671B main model + 14B MTP module",
    ),
    "deepseek-r1": CatalogEntry(
        "deepseek-r1.json", "deepseek-ai/DeepSeek-R1", 671_000_000_000, 37_000_000_000,
        "model card huggingface.co/deepseek-ai/DeepSeek-R1: 671B total, 37B activated",
    ),
    "deepseek-v3.2": CatalogEntry(
        "deepseek-v3.2.json", "deepseek-ai/DeepSeek-V3.2", None, None,
        "no separate figure; architecture of DeepSeek-V3 plus the lightning indexer",
        {"nvfp4": "nvidia/DeepSeek-V3.2-NVFP4"},
    ),
    "kimi-k2": CatalogEntry(
        "kimi-k2.json", "moonshotai/Kimi-K2-Instruct", 1_000_000_000_000, 32_000_000_000,
        "model card huggingface.co/moonshotai/Kimi-K2-Instruct: 1T total, 32B activated "
        "(Kimi K2 technical report: 1.04T total)",
    ),
    "qwen3-235b-a22b": CatalogEntry(
        "qwen3-235b-a22b.json", "Qwen/Qwen3-235B-A22B", 235_000_000_000, 22_000_000_000,
        "model card huggingface.co/Qwen/Qwen3-235B-A22B: 235B total, 22B activated",
        {"fp8": "Qwen/Qwen3-235B-A22B-FP8", "nvfp4": "nvidia/Qwen3-235B-A22B-NVFP4"},
    ),
    "qwen3-30b-a3b": CatalogEntry(
        "qwen3-30b-a3b.json", "Qwen/Qwen3-30B-A3B", 30_500_000_000, 3_300_000_000,
        "model card huggingface.co/Qwen/Qwen3-30B-A3B: 30.5B total, 3.3B activated",
        {"fp8": "Qwen/Qwen3-30B-A3B-FP8"},
    ),
    "llama-3.1-405b": CatalogEntry(
        "llama-3.1-405b.json", "meta-llama/Meta-Llama-3.1-405B", 405_000_000_000, None,
        "model card huggingface.co/meta-llama/Llama-3.1-405B (formerly Meta-Llama-3.1-405B): 405B",
    ),
    "llama-3.1-70b": CatalogEntry(
        "llama-3.1-70b.json", "meta-llama/Meta-Llama-3.1-70B", 70_000_000_000, None,
        "model card huggingface.co/meta-llama/Llama-3.1-70B (formerly Meta-Llama-3.1-70B): 70B",
        {"fp8": "nvidia/Llama-3.1-70B-Instruct-FP8"},
    ),
    "mixtral-8x7b": CatalogEntry(
        "mixtral-8x7b.json", "mistralai/Mixtral-8x7B-v0.1", 46_700_000_000, 12_900_000_000,
        "Mistral AI, 'Mixtral of experts' (2023-12-11): 46.7B total, 12.9B used per token",
    ),
    "gpt-oss-120b": CatalogEntry(
        "gpt-oss-120b.json", "openai/gpt-oss-120b", 116_830_000_000, 5_130_000_000,
        "OpenAI gpt-oss-120b model card: 116.83B total, 5.13B active per token "
        "(active counts the unembedding, not the embedding)",
    ),
    "qwen3-0.6b": CatalogEntry(
        "qwen3-0.6b.json", "Qwen/Qwen3-0.6B", 600_000_000, None,
        "model card huggingface.co/Qwen/Qwen3-0.6B: 0.6B total, 0.44B non-embedding",
    ),
}


# --- Loading ---------------------------------------------------------------------


def published_variants(name_or_path: str) -> dict[str, str]:
    """Other published checkpoints of a catalog model, by weight format (empty for paths)."""
    entry = CATALOG.get(str(name_or_path).strip())
    return dict(entry.variants) if entry else {}


def checkpoint_repo(name_or_path: str) -> str:
    """The Hugging Face repository to serve: the catalog's, or the path as given."""
    entry = CATALOG.get(str(name_or_path).strip())
    return entry.hf_repo if entry else str(name_or_path)


def load_model(name_or_path: str) -> ModelArch:
    """A catalog name (or its Hugging Face repo id), a config.json, or a directory holding one."""
    by_repo = {entry.hf_repo.lower(): name for name, entry in CATALOG.items()}
    key = str(name_or_path).strip()
    name = key if key in CATALOG else by_repo.get(key.lower())
    if name is not None:
        path = CONFIG_DIR / CATALOG[name].file
        return parse_config(_read_json(path), name, f"{CATALOG[name].hf_repo} config.json (bundled copy)")

    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"directory {str(path)!r} has no config.json; point at a model directory or a config.json")
        path = path / "config.json"
    if path.is_file():
        return parse_config(_read_json(path), str(path), str(path))
    if path.suffix == ".json" or "/" in key or key.startswith("."):
        raise UserError(
            f"model config {key!r} not found: no such file or directory "
            f"(catalog names: {', '.join(sorted(CATALOG))})"
        )
    raise UserError(
        f"unknown model {key!r}; known catalog names: {', '.join(sorted(CATALOG))}; "
        "or give the path of a config.json or of a model directory holding one"
    )


def _read_json(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"cannot read model config {str(path)!r}: {e.strerror or e}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"model config {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"model config {str(path)!r} is not a JSON object")
    return cfg


def parse_config(cfg: dict, name: str, source: str) -> ModelArch:
    """Dispatch on the text model's `model_type` (`text_config` when the config has one)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    model_type = text.get("model_type") or cfg.get("model_type")
    parser = PARSERS.get(model_type)
    if parser is None:
        raise UserError(
            f"model {name!r}: unsupported model_type {model_type!r}; "
            f"supported model types: {', '.join(sorted(PARSERS))}"
        )
    notes = []
    if text is not cfg:
        notes.append(
            f"text model read from text_config ({model_type}) of a {cfg.get('model_type')} config; "
            "the vision tower and multimodal projector are not part of the text model and are left out"
        )
    try:
        arch = parser(text, name, source)
    except KeyError as e:
        raise UserError(f"model {name!r} ({model_type}): config lacks {e.args[0]!r}") from None
    return arch.with_(notes=tuple(notes) + arch.notes)


# --- Small helpers ---------------------------------------------------------------


def _g(role: Role, shard: Shard, count: int, fmt: str) -> ParamGroup:
    return ParamGroup(role=role, shard=shard, count=int(count), fmt=fmt)


def _norms(*sizes: int, fmt: str = "bf16") -> ParamGroup:
    """Norm weights (RMSNorm / LayerNorm), whole on every rank."""
    return _g(Role.OTHER, Shard.REPLICATED, sum(sizes), fmt)


def _embedding(c: dict) -> ParamGroup:
    return _g(Role.EMBEDDING, Shard.VOCAB, c["vocab_size"] * c["hidden_size"], "bf16")


def _lm_head(c: dict) -> ParamGroup:
    tied = bool(c.get("tie_word_embeddings", False))
    return _g(Role.LM_HEAD, Shard.VOCAB, 0 if tied else c["vocab_size"] * c["hidden_size"], "bf16")


def _model_dtype(c: dict) -> str:
    dtype = c.get("torch_dtype") or c.get("dtype") or "bfloat16"
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, "bf16")


def _dense_mlp(hidden: int, inter: int, fmt: str) -> list[ParamGroup]:
    """gate_up (MergedColumnParallelLinear) + down (RowParallelLinear)."""
    return [_g(Role.DENSE_MLP, Shard.TP, 3 * hidden * inter, fmt)]


def _gqa(c: dict, fmt: str, *, bias: bool, qk_norm: bool) -> list[ParamGroup]:
    """QKVParallelLinear + RowParallelLinear o_proj (+ biases, + per-head q/k RMSNorm)."""
    hidden, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    qkv_out = (heads + 2 * kv) * head_dim
    groups = [_g(Role.ATTENTION, Shard.TP, hidden * qkv_out + heads * head_dim * hidden, fmt)]
    if bias:
        # qkv bias; o_proj bias too except in qwen2 (qkv-only biases)
        o_bias = 0 if c.get("model_type") == "qwen2" else hidden
        groups.append(_g(Role.ATTENTION, Shard.TP, qkv_out + o_bias, "bf16"))
    if qk_norm:
        groups.append(_norms(head_dim, head_dim))
    return groups


def _gqa_cache(c: dict, window: int | None = None) -> CacheSpec:
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"]
    if window is None:
        return CacheSpec("gqa", 2 * head_dim, sharded_heads=kv, note="K and V per KV head")
    return CacheSpec("sliding", 2 * head_dim, sharded_heads=kv, window=window, note="K and V per KV head, sliding window")


def _mla(c: dict, fmt: str, *, output_gate: bool = False) -> list[ParamGroup]:
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
    norms = [kv_lora]
    if q_lora:
        replicated += hidden * q_lora  # q_a_proj
        sharded += q_lora * heads * (nope + rope)  # q_b_proj
        norms.append(q_lora)
    else:
        sharded += hidden * heads * (nope + rope)  # q_proj
    if output_gate:
        sharded += hidden * heads * v  # g_proj
    return [
        _g(Role.ATTENTION, Shard.REPLICATED, replicated, fmt),
        _g(Role.ATTENTION, Shard.TP, sharded, fmt),
        _norms(*norms),
    ]


def _mla_cache(c: dict) -> CacheSpec:
    return CacheSpec(
        "mla", c["kv_lora_rank"] + c["qk_rope_head_dim"],
        note="MLA latent (kv_lora_rank) + RoPE key, one per token, the same on every TP rank",
    )


def _moe(
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
) -> list[ParamGroup]:
    """Router + routed experts (FusedMoE: w13 and w2 per expert) + optional shared experts.

    `router_bias`: None, "bf16" (a Linear bias, gpt-oss) or "fp32"
    (e_score_correction_bias of noaux_tc routing). `expert_hidden`: the width
    the routed experts work in when it differs from hidden_size (latent MoE).
    """
    width = expert_hidden or hidden
    groups = [
        _g(Role.OTHER, Shard.REPLICATED, hidden * num_experts, router_fmt),
        _g(Role.ROUTED_EXPERT, Shard.EXPERT, num_experts * 3 * width * expert_inter, expert_fmt),
    ]
    if router_bias:
        groups.append(_g(Role.OTHER, Shard.REPLICATED, num_experts, router_bias))
    if shared_inter:
        groups.append(_g(Role.SHARED_EXPERT, Shard.TP, 3 * hidden * shared_inter, shared_fmt))
    return groups


def _layer(index: int, attention: str, params: list[ParamGroup], caches: list[CacheSpec], moe: bool) -> LayerSpec:
    params = [p for p in params if p.count]
    return LayerSpec(index=index, attention=attention, params=tuple(params), caches=tuple(caches), moe=moe)


def _num_experts(c: dict) -> int:
    for key in ("n_routed_experts", "num_experts", "num_local_experts"):
        if c.get(key):
            return int(c[key])
    return 0


def _experts_per_token(c: dict) -> int:
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


def _format_label(layers: tuple[LayerSpec, ...]) -> str:
    """'fp8', or 'fp8+mxfp4 experts' when the routed experts are stored differently."""
    groups = [g for layer in layers for g in layer.params]
    base = _dominant_fmt([g for g in groups if g.role in LINEAR_ROLES and g.role != Role.ROUTED_EXPERT])
    experts = _dominant_fmt([g for g in groups if g.role == Role.ROUTED_EXPERT])
    if experts is None or experts == base:
        return base or "bf16"
    return f"{base}+{experts} experts"


# --- Dense and GQA MoE families ----------------------------------------------------


def _parse_gqa_dense(c: dict, name: str, source: str) -> ModelArch:
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
        _layer(
            i, "sliding" if window else "gqa",
            _gqa(c, "bf16", bias=bias, qk_norm=qk_norm) + _dense_mlp(hidden, inter, "bf16") + [_norms(hidden, hidden)],
            [_gqa_cache(c, window)],
            moe=False,
        )
        for i in range(c["num_hidden_layers"])
    )
    return _finish_gqa(c, name, source, layers, notes)


def _parse_gqa_moe(c: dict, name: str, source: str) -> ModelArch:
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
            _moe(hidden, _num_experts(c), expert_inter, "bf16")
            if moe
            else _dense_mlp(hidden, c["intermediate_size"], "bf16")
        )
        params = _gqa(c, "bf16", bias=bool(c.get("attention_bias")), qk_norm=qk_norm) + mlp + [_norms(hidden, hidden)]
        layers.append(_layer(i, "sliding" if window else "gqa", params, [_gqa_cache(c, window)], moe))
    return _finish_gqa(c, name, source, tuple(layers), [])


def _parse_gpt_oss(c: dict, name: str, source: str) -> ModelArch:
    """gpt-oss: GQA with attention sinks and biases; sliding (128) and full layers
    alternate per `layer_types`; MoE with biased experts and router.

    Formats per quantization_config: the routed experts are MXFP4 (their biases
    bf16); everything in modules_to_not_convert (attention, router, embedding,
    lm_head) is bf16.
    """
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    num_experts, inter = _num_experts(c), c["intermediate_size"]
    quant = c.get("quantization_config") or {}
    expert_fmt = "mxfp4" if quant.get("quant_method") == "mxfp4" else "bf16"
    n = c["num_hidden_layers"]
    types = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    layers = []
    for i in range(n):
        sliding = types[i] == "sliding_attention"
        params = _gqa(c, "bf16", bias=True, qk_norm=False) + [
            _g(Role.OTHER, Shard.TP, heads, "bf16"),  # attention sinks, one per head
            *_moe(hidden, num_experts, inter, expert_fmt, router_bias="bf16"),
            # expert biases: w13 (2 x inter) and w2 (hidden) per expert, bf16 in vLLM's Mxfp4MoEMethod
            _g(Role.ROUTED_EXPERT, Shard.EXPERT, num_experts * (2 * inter + hidden), "bf16"),
            _norms(hidden, hidden),
        ]
        cache = _gqa_cache(c, c["sliding_window"] if sliding else None)
        layers.append(_layer(i, "sliding" if sliding else "gqa", params, [cache], moe=True))
    notes = [
        "expert biases are counted as routed-expert parameters; a --weight-format override "
        "re-labels them with the experts' format (39.8M parameters, negligible)",
    ]
    return _finish_gqa(c, name, source, tuple(layers), notes)


def _finish_gqa(c: dict, name: str, source: str, layers: tuple[LayerSpec, ...], notes: list[str]) -> ModelArch:
    num_experts = _num_experts(c)
    return ModelArch(
        name=name,
        model_type=c["model_type"],
        hidden_size=c["hidden_size"],
        vocab_size=c["vocab_size"],
        num_attention_heads=c["num_attention_heads"],
        tp_divides=(c["num_attention_heads"],),
        num_kv_heads=c["num_key_value_heads"],
        num_experts=num_experts,
        experts_per_token=_experts_per_token(c) if num_experts else 0,
        moe_intermediate_size=(c.get("moe_intermediate_size") or c["intermediate_size"]) if num_experts else 0,
        intermediate_size=c["intermediate_size"],
        layers=layers,
        embedding=_embedding(c),
        lm_head=_lm_head(c),
        final=(_norms(c["hidden_size"]),),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=_model_dtype(c),
        weight_format=_format_label(layers),
        source=source,
        notes=tuple(notes),
    )


# --- DeepSeek V3 / R1 / Kimi K2 / V3.2 -------------------------------------------------


def _deepseek_moe(c: dict, expert_fmt: str, other_fmt: str) -> list[ParamGroup]:
    """DeepseekV2MoE: router (bf16 weight, fp32 e_score_correction_bias), routed and shared experts."""
    return _moe(
        c["hidden_size"], _num_experts(c), c["moe_intermediate_size"], expert_fmt,
        shared_inter=c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0),
        shared_fmt=other_fmt,
        router_bias="fp32" if c.get("topk_method") == "noaux_tc" else None,
    )


def _is_moe_layer(c: dict, i: int) -> bool:
    return bool(_num_experts(c)) and i >= c.get("first_k_dense_replace", 0) and i % (c.get("moe_layer_freq") or 1) == 0


def _v32_indexer(c: dict) -> tuple[list[ParamGroup], CacheSpec]:
    """DeepSeek-V3.2 lightning indexer (vLLM deepseek_v2.Indexer), replicated on every rank.

    wq_b q_lora -> index_n_heads x index_head_dim (FP8); wk hidden -> index_head_dim
    and weights_proj hidden -> index_n_heads fused into one bf16 linear (vLLM
    up-casts the FP8 wk to bf16 to fuse it); k_norm a LayerNorm (weight + bias).
    Cache: per token an FP8 key of index_head_dim plus one fp32 scale per 128.
    """
    hidden, d, h = c["hidden_size"], c["index_head_dim"], c["index_n_heads"]
    params = [
        _g(Role.ATTENTION, Shard.REPLICATED, c["q_lora_rank"] * h * d, "fp8"),
        _g(Role.ATTENTION, Shard.REPLICATED, hidden * (d + h), "bf16"),
        _norms(2 * d),
    ]
    cache = CacheSpec(
        "indexer", d, dtype=CacheDtype.FP8, extra_bytes_per_entry=4 * (d // 128),
        note="lightning-indexer key: FP8 + fp32 scale per 128 elements",
    )
    return params, cache


def _parse_deepseek_v3(c: dict, name: str, source: str) -> ModelArch:
    """deepseek_v3 / kimi_k2 (same shape) and deepseek_v32 (plus the indexer).

    FP8 block-scaled linear layers (quantization_config fmt e4m3, 128x128
    blocks); embedding, lm_head, norms and the router gate bf16; the router's
    e_score_correction_bias fp32.
    """
    hidden = c["hidden_size"]
    fp8 = (c.get("quantization_config") or {}).get("quant_method") == "fp8"
    fmt = "fp8" if fp8 else "bf16"
    sparse = c["model_type"] == "deepseek_v32"
    n = c["num_hidden_layers"]

    def block(i: int) -> LayerSpec:
        params = _mla(c, fmt) + [_norms(hidden, hidden)]
        caches = [_mla_cache(c)]
        if sparse:
            idx_params, idx_cache = _v32_indexer(c)
            params += idx_params
            caches.append(idx_cache)
        moe = _is_moe_layer(c, i)
        params += _deepseek_moe(c, fmt, fmt) if moe else _dense_mlp(hidden, c["intermediate_size"], fmt)
        return _layer(i, "mla+indexer" if sparse else "mla", params, caches, moe)

    layers = tuple(block(i) for i in range(n))
    mtp = []
    for j in range(c.get("num_nextn_predict_layers") or 0):
        base = block(n + j)
        extra = [
            # DeepSeekMultiTokenPredictorLayer: enorm, hnorm, shared_head.norm, eh_proj (nn.Linear
            # 2h -> h, bf16, replicated). Its embed_tokens and shared_head.head copies in the
            # checkpoint are not counted: vLLM's MTP proposer shares the main model's instead.
            _norms(hidden, hidden, hidden),
            _g(Role.DENSE_MLP, Shard.REPLICATED, 2 * hidden * hidden, "bf16"),
        ]
        mtp.append(_layer(base.index, base.attention, list(base.params) + extra, list(base.caches), base.moe))
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
        num_experts=_num_experts(c),
        experts_per_token=_experts_per_token(c),
        moe_intermediate_size=c["moe_intermediate_size"],
        intermediate_size=c["intermediate_size"],
        layers=layers,
        embedding=_embedding(c),
        lm_head=_lm_head(c),
        final=(_norms(hidden),),
        mtp_layers=tuple(mtp),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=_model_dtype(c),
        weight_format=_format_label(layers),
        source=source,
        notes=tuple(notes),
    )


# --- DeepSeek-V4 ----------------------------------------------------------------------

# vLLM's fp8_ds_mla entry for one 512-wide V4 KV vector (sparse_swa.py: 584 bytes):
# 448 FP8 NoPE elements + 64 bf16 RoPE elements + 7 UE8M0 scales + 1 pad byte.
# Counted as 512 one-byte elements + 72 extra bytes (64 for the RoPE part's second
# byte, 8 for scales and padding).
V4_KV_EXTRA_BYTES = 72


def _v4_compressor(hidden: int, head_dim: int, ratio: int) -> tuple[list[ParamGroup], CacheSpec]:
    """vLLM DeepseekCompressor: fused_wkv_wgate hidden -> 2 x coff x head_dim (unquantised,
    replicated), ape (ratio x coff x head_dim, fp32), an RMSNorm of head_dim. Ratio-4
    compressors overlap windows (coff 2). Its state cache keeps, per token of the last
    coff x ratio tokens, coff x head_dim KV and as many scores, in fp32."""
    coff = 2 if ratio == 4 else 1
    params = [
        _g(Role.ATTENTION, Shard.REPLICATED, hidden * 2 * coff * head_dim, "bf16"),
        _g(Role.OTHER, Shard.REPLICATED, ratio * coff * head_dim, "fp32"),
        _norms(head_dim),
    ]
    state = CacheSpec(
        "compressor_state", 2 * coff * head_dim, dtype=CacheDtype.FP32, window=coff * ratio,
        note=f"ratio-{ratio} compressor state: kv + score of the last {coff * ratio} tokens, fp32",
    )
    return params, state


def _v4_block(c: dict, index: int, ratio: int, expert_fmt: str) -> LayerSpec:
    """One DeepseekV4DecoderLayer (vllm/model_executor/models/deepseek_v4.py)."""
    hidden, heads, head_dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    q_lora, o_groups, o_lora = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    hc = c["hc_mult"]
    mix = (2 + hc) * hc
    num_experts, k = _num_experts(c), _experts_per_token(c)
    params = [
        # fused wq_a + wkv (MergedColumnParallelLinear with disable_tp): hidden -> q_lora + head_dim
        _g(Role.ATTENTION, Shard.REPLICATED, hidden * (q_lora + head_dim), "fp8"),
        # wq_b q_lora -> heads x head_dim; wo_a grouped (o_groups x o_lora from heads x head_dim / o_groups
        # each); wo_b o_groups x o_lora -> hidden
        _g(Role.ATTENTION, Shard.TP, q_lora * heads * head_dim + heads * head_dim * o_lora + o_groups * o_lora * hidden, "fp8"),
        _g(Role.OTHER, Shard.TP, heads, "fp32"),  # attn_sink
        _norms(q_lora, head_dim, hidden, hidden),  # q_norm, kv_norm, attn_norm, ffn_norm
        # hyper-connections: hc_attn_fn and hc_ffn_fn (mix x hc*hidden), their bases (mix) and scales (3), fp32
        _g(Role.OTHER, Shard.REPLICATED, 2 * (mix * hc * hidden + mix + 3), "fp32"),
    ]
    caches = [
        CacheSpec(
            "sliding", head_dim, dtype=CacheDtype.FP8, window=c["sliding_window"],
            extra_bytes_per_entry=V4_KV_EXTRA_BYTES,
            note="uncompressed sliding window, fp8_ds_mla layout (584 B per token), every TP rank",
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
            _g(Role.ATTENTION, Shard.REPLICATED, q_lora * h * d, "fp8"),
            _g(Role.ATTENTION, Shard.REPLICATED, hidden * h, "bf16"),
            _norms(2 * d),
            *idx_comp_params,
        ]
        caches += [
            CacheSpec(
                "indexer", d, dtype=CacheDtype.FP8, compress_ratio=4, extra_bytes_per_entry=4 * (d // 128),
                note="indexer key per 4 tokens: FP8 + fp32 scale per 128 (132 B)",
            ),
            idx_comp_state,
        ]
    # MoE: router gate bf16; the first num_hash_layers route by a token-id table
    # tid2eid (vocab x k, int32: counted as 4-byte 'fp32') instead of the fp32
    # e_score_correction_bias.
    hashed = index < c.get("num_hash_layers", 0)
    params += _moe(
        hidden, num_experts, c["moe_intermediate_size"], expert_fmt,
        shared_inter=c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0),
        shared_fmt="fp8",
        router_bias=None if hashed else "fp32",
    )
    if hashed:
        params.append(_g(Role.OTHER, Shard.REPLICATED, c["vocab_size"] * k, "fp32"))
    return _layer(index, label, params, caches, moe=True)


def _parse_deepseek_v4(c: dict, name: str, source: str) -> ModelArch:
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
            _g(Role.DENSE_MLP, Shard.REPLICATED, 2 * hidden * hidden, "fp8"),
            _norms(hidden, hidden, hidden),
            _g(Role.OTHER, Shard.REPLICATED, hc_head, "fp32"),
        ]
        mtp.append(_layer(base.index, base.attention, list(base.params) + extra, list(base.caches), base.moe))
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
        num_experts=_num_experts(c),
        experts_per_token=_experts_per_token(c),
        moe_intermediate_size=c["moe_intermediate_size"],
        intermediate_size=c["moe_intermediate_size"] * (c.get("n_shared_experts") or 1),
        layers=layers,
        embedding=_embedding(c),
        lm_head=_lm_head(c),
        final=(_norms(hidden), _g(Role.OTHER, Shard.REPLICATED, hc_head, "fp32")),
        mtp_layers=tuple(mtp),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=_model_dtype(c),
        weight_format=_format_label(layers),
        source=source,
        notes=notes,
    )


# --- Kimi Linear (Kimi K3's text model) ---------------------------------------------


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
        _g(Role.ATTENTION, Shard.TP, 3 * hidden * proj + d * proj + hidden * heads + hidden * proj + proj * hidden, "bf16"),
        _g(Role.ATTENTION, Shard.REPLICATED, hidden * d, "bf16"),  # f_a_proj
        _g(Role.OTHER, Shard.TP, 3 * proj * kernel + proj + heads, "fp32"),  # conv1d x3, dt_bias, A_log
        _norms(d),  # o_norm
    ]
    caches = [
        CacheSpec(
            "linear_state", d * d, sharded_heads=heads, dtype=CacheDtype.FP32, per_sequence=True,
            note="KDA recurrent state, head_dim x head_dim per head, fp32",
        ),
        CacheSpec(
            "linear_state", 3 * (kernel - 1) * d, sharded_heads=heads, dtype=CacheDtype.KV, per_sequence=True,
            note="KDA short-conv states (q, k, v): kernel-1 per channel; vLLM keeps them in "
            "mamba_cache_dtype (model dtype by default), not --kv-cache-dtype",
        ),
    ]
    return params, caches


def _parse_kimi_linear(c: dict, name: str, source: str) -> ModelArch:
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
    num_experts = _num_experts(c)
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
        else:
            params, caches = _mla(c, "bf16", output_gate=output_gate), [_mla_cache(c)]
            label = "mla"
        params = params + [_norms(hidden, hidden)]
        if attn_res:
            # AttnRes: self_attention_res_norm / _proj and mlp_res_norm / _proj per layer (hidden each);
            # ASSUMPTION from third-party K3 loaders, not the config.
            params.append(_norms(4 * hidden))
        moe = bool(num_experts) and i >= first_dense and i % freq == 0
        if moe:
            params += _moe(
                hidden, num_experts, c["moe_intermediate_size"], expert_fmt,
                shared_inter=c["moe_intermediate_size"] * (c.get("num_shared_experts") or 0),
                router_bias="fp32",
                expert_hidden=latent or None,
            )
            if latent:
                # routed_expert_down_proj and _up_proj: every token passes them, so dense-MLP role.
                params += [_g(Role.DENSE_MLP, Shard.REPLICATED, 2 * hidden * latent, "bf16"), _norms(latent)]
        else:
            params += _dense_mlp(hidden, c["intermediate_size"], "bf16")
        layers.append(_layer(i, label, params, caches, moe))
    layers = tuple(layers)
    final = [_norms(hidden)]
    if attn_res:
        final.append(_norms(2 * hidden))  # output_attn_res_norm / _proj
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
        experts_per_token=_experts_per_token(c),
        moe_intermediate_size=c["moe_intermediate_size"],
        intermediate_size=c["intermediate_size"],
        layers=layers,
        embedding=_embedding(c),
        lm_head=_lm_head(c),
        final=tuple(final),
        mtp_layers=(),
        max_position_embeddings=c.get("max_position_embeddings", 0),
        model_dtype=_model_dtype(c),
        weight_format=_format_label(layers),
        source=source,
        notes=notes,
    )


PARSERS = {
    "llama": _parse_gqa_dense,
    "mistral": _parse_gqa_dense,
    "qwen2": _parse_gqa_dense,
    "qwen3": _parse_gqa_dense,
    "qwen3_moe": _parse_gqa_moe,
    "mixtral": _parse_gqa_moe,
    "gpt_oss": _parse_gpt_oss,
    "deepseek_v3": _parse_deepseek_v3,
    "kimi_k2": _parse_deepseek_v3,
    "deepseek_v32": _parse_deepseek_v3,
    "deepseek_v4": _parse_deepseek_v4,
    "kimi_linear": _parse_kimi_linear,
}


# --- Counting and the weight-format override -------------------------------------------


def _all_groups(arch: ModelArch, include_mtp: bool) -> list[ParamGroup]:
    layers = arch.layers + (arch.mtp_layers if include_mtp else ())
    return [g for layer in layers for g in layer.params] + [arch.embedding, arch.lm_head, *arch.final]


def params_total(arch: ModelArch, include_mtp: bool = False) -> int:
    """All parameters (MTP layers only when asked: DeepSeek's published totals exclude them)."""
    return sum(g.count for g in _all_groups(arch, include_mtp))


def params_active(arch: ModelArch, include_embedding: bool = True) -> int:
    """Parameters one token uses: the total minus the routed experts it is not routed
    to, routed x (1 - k/E). MTP layers are not counted.

    `include_embedding=False` leaves out the input embedding table (a lookup, no
    matmul), the convention of model cards such as gpt-oss's; Mistral counts it.
    """
    total = params_total(arch)
    if arch.num_experts:
        routed = sum(g.count for layer in arch.layers for g in layer.params if g.role == Role.ROUTED_EXPERT)
        unused = Fraction(routed) * (1 - Fraction(arch.experts_per_token, arch.num_experts))
        total -= int(unused)
    if not include_embedding:
        total -= arch.embedding.count
    return total


def weight_bytes(arch: ModelArch, include_mtp: bool = False) -> int:
    """Bytes of the stored weights: sum of count x bytes per parameter (scales included)."""
    return int(sum(g.count * Fraction(get_format(g.fmt).bytes_per_param) for g in _all_groups(arch, include_mtp)))


def with_weight_format(arch: ModelArch, fmt: str) -> ModelArch:
    """The `--weight-format` override: the model as if its checkpoint stored `fmt`.

    - bf16 or fp8: every linear layer (attention incl. MLA / indexer / KDA projections,
      dense MLP, shared and routed experts) is stored in `fmt`.
    - 4-bit formats (mxfp4, nvfp4, int4) on an MoE model: the routed experts only; the
      other linear layers keep the checkpoint's own format. On a dense model: all
      linear layers.
    - Embedding, LM head, norms, routers, convolutions and other small parameters
      (role OTHER) stay as stored.
    MTP layers follow the same rule. An unknown format name is a UserError.
    """
    get_format(fmt)  # UserError for an unknown name
    if fmt in FOUR_BIT_FORMATS and arch.num_experts:
        roles = {Role.ROUTED_EXPERT}
    else:
        roles = set(LINEAR_ROLES)

    def convert(layer: LayerSpec) -> LayerSpec:
        params = tuple(ParamGroup(g.role, g.shard, g.count, fmt) if g.role in roles else g for g in layer.params)
        return LayerSpec(layer.index, layer.attention, params, layer.caches, layer.moe)

    layers = tuple(convert(layer) for layer in arch.layers)
    return arch.with_(
        layers=layers,
        mtp_layers=tuple(convert(layer) for layer in arch.mtp_layers),
        weight_format=_format_label(layers),
    )
