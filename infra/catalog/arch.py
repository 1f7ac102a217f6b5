"""The architecture description the planner works from.

A model is a list of decoder layers, each a set of parameter groups (how many
parameters, in what stored format, and how vLLM shards them) and a set of cache
components (what the layer keeps per sequence while serving). The parsers in
`infra.catalog.families` build these from a Hugging Face `config.json`
(`infra.catalog.models.load_model`); the planner in `infra.planning` never
looks at a raw config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum


class Shard(str, Enum):
    """How vLLM places a parameter group across the ranks of one pipeline stage."""

    TP = "tp"  # column/row-parallel linear layers: 1/TP on each rank
    VOCAB = "vocab"  # VocabParallelEmbedding / ParallelLMHead: 1/TP on each rank
    EXPERT = "expert"  # routed experts: 1/EP with expert parallel, 1/TP without
    REPLICATED = "replicated"  # ReplicatedLinear, norms, routers: whole on every rank


class Role(str, Enum):
    """What a parameter group is; decides which weight format applies to it."""

    EMBEDDING = "embedding"
    LM_HEAD = "lm_head"
    ATTENTION = "attention"  # attention / linear-attention projections (incl. MLA, indexer)
    DENSE_MLP = "dense_mlp"
    SHARED_EXPERT = "shared_expert"
    ROUTED_EXPERT = "routed_expert"
    OTHER = "other"  # norms, routers, gates, convolutions, hyper-connection mixers


@dataclass(frozen=True)
class Linear:
    """The shape of one linear layer as vLLM builds it.

    `outputs` are the fused parts (q, k, v of a QKVParallelLinear; gate, up of a
    MergedColumnParallelLinear) as (units, width): a column-parallel layer keeps
    max(1, units // TP) units of each part on a rank, so K/V heads fewer than TP
    are replicated as QKVParallelLinear does; a plain output of N is (N, 1).
    `split`: "column" (outputs over TP), "row" (inputs over TP) or "replicated".
    """

    outputs: tuple[tuple[int, int], ...]
    inputs: int
    split: str

    @property
    def count(self) -> int:
        return sum(units * width for units, width in self.outputs) * self.inputs

    def per_rank(self, tp: int) -> tuple[tuple[int, ...], int]:
        """(output partition sizes, input size) on one rank."""
        if self.split == "column":
            return tuple(max(1, units // tp) * width for units, width in self.outputs), self.inputs
        parts = tuple(units * width for units, width in self.outputs)
        return parts, (self.inputs // tp if self.split == "row" else self.inputs)


@dataclass(frozen=True)
class Experts:
    """One FusedMoE: `experts` x (w13 gate/up 2 x inter by hidden, w2 hidden by inter),
    with per-expert biases when `bias` (gpt-oss)."""

    experts: int
    hidden: int
    inter: int
    bias: bool = False

    @property
    def count(self) -> int:
        return self.experts * (3 * self.hidden * self.inter + (2 * self.inter + self.hidden if self.bias else 0))


@dataclass(frozen=True)
class ParamGroup:
    role: Role
    shard: Shard
    count: int  # number of parameters
    fmt: str  # key of infra.catalog.formats.FORMATS, as stored in the checkpoint
    # A quantised group carries the vLLM scheme (infra.catalog.quant.Scheme) and the
    # shapes it is made of: its bytes per rank are those of the parameters vLLM
    # creates for these shapes (scales, zero points, padding), not count x bytes.
    scheme: object | None = None
    shapes: tuple[Linear | Experts, ...] = ()


class CacheDtype(str, Enum):
    KV = "kv"  # follows --kv-cache-dtype (model dtype by default)
    FP8 = "fp8"  # always one byte per element (e.g. the sparse indexer's keys)
    FP32 = "fp32"  # recurrent states of linear attention
    MODEL = "model"  # the model's dtype whatever --kv-cache-dtype says (vLLM's mamba_cache_dtype "auto")


@dataclass(frozen=True)
class CacheSpec:
    """One thing a layer caches per sequence, seen from one tensor-parallel rank.

    Length-proportional entries: `elements_per_entry` elements for each stored
    entry, one entry per `compress_ratio` tokens, at most `window` entries when
    the layer only keeps a sliding window. When `sharded_heads` > 0 the entry is
    split by heads over TP, and a rank keeps max(1, sharded_heads // TP) heads
    (KV heads are replicated when TP exceeds their count); otherwise the entry is
    replicated on every TP rank (MLA's latent).

    Fixed per-sequence state (linear attention): `per_sequence=True`, the
    elements do not depend on the sequence length.

    How vLLM pages it (v1/kv_cache_interface.py): `vllm_spec` names the spec
    class the layer registers ("" = the default for `kind`, see VLLM_SPEC),
    `block_size` a block size the layer fixes itself (None = the engine's),
    `page_alignment` the `alignment` vLLM rounds the page up to, and
    `conv_rows` the rows of a convolution state that `elements_per_entry`
    covers (each speculative token adds one more row).
    """

    kind: str  # "gqa" | "mla" | "sliding" | "compressed" | "indexer" | "compressor_state" | "linear_state"
    elements_per_entry: int  # per head when sharded_heads > 0, else per entry
    sharded_heads: int = 0
    dtype: CacheDtype = CacheDtype.KV
    window: int | None = None
    compress_ratio: int = 1
    per_sequence: bool = False
    extra_bytes_per_entry: int = 0  # e.g. per-entry quantisation scales
    note: str = ""
    vllm_spec: str = ""  # "full" | "mla" | "sliding" | "sliding_mla" | "mamba"; "" = VLLM_SPEC[kind]
    block_size: int | None = None
    page_alignment: int | None = None
    conv_rows: int = 0

    @property
    def spec_class(self) -> str:
        return self.vllm_spec or VLLM_SPEC[self.kind]

    @property
    def label(self) -> str:
        """The cache's name in the plan: full, sliding_window, compressed, indexer, compressor_state, linear_state."""
        return CACHE_LABEL.get(self.kind, self.kind)


# vLLM spec class per cache kind (v1/kv_cache_interface.py): GQA layers register a
# FullAttentionSpec, MLA latents / compressed / indexer caches an MLAAttentionSpec,
# sliding windows a SlidingWindowSpec, DeepSeek-V4 compressor states a
# SlidingWindowMLASpec, linear-attention states one MambaSpec per layer.
VLLM_SPEC = {
    "gqa": "full", "mla": "mla", "sliding": "sliding", "compressed": "mla", "indexer": "mla",
    "compressor_state": "sliding_mla", "linear_state": "mamba",
}
CACHE_LABEL = {"gqa": "full", "mla": "full", "sliding": "sliding_window"}


@dataclass(frozen=True)
class AttentionShape:
    """What one layer's attention computes per query token, for the performance model
    (infra/planning/perf): the memory it reads is in the layer's `caches`.

    `heads` query heads are split over TP (never fewer than one per rank). Per head,
    a query meets each attended cache entry with a `qk_dim` dot product and takes a
    `v_dim` weighted sum: 2 x (qk_dim + v_dim) FLOPs per head and entry. MLA decodes
    in the absorbed form (qk = latent + RoPE, v = latent, one shared latent "head")
    and prefills un-absorbed (`prefill_qk_dim` / `prefill_v_dim`, per-head K and V
    expanded from the latent by kv_b_proj: `prefill_expand_flops` per context token
    and rank). Which entries a query attends: the last `window` tokens; with
    `compress_ratio` > 1 one entry per that many tokens, of which a sparse indexer
    keeps the `topk` best (DeepSeek V3.2 / V4 CSA, `indexer_*` its own scoring cost).
    `recurrent_dim` > 0: linear attention (KDA) with a d x d state per head, updated
    and read once per token instead of attending over entries.
    """

    heads: int
    qk_dim: int
    v_dim: int
    prefill_qk_dim: int = 0  # 0: as qk_dim
    prefill_v_dim: int = 0  # 0: as v_dim
    prefill_expand_flops: int = 0  # per context token and layer (whole model: split over TP)
    window: int | None = None
    compress_ratio: int = 1
    topk: int | None = None
    indexer_heads: int = 0  # sparse indexer: heads x dim scored against each compressed entry (replicated)
    indexer_dim: int = 0
    recurrent_dim: int = 0
    source: str = ""


@dataclass(frozen=True)
class LayerSpec:
    index: int
    attention: str  # human label: "gqa", "mla", "sliding", "csa-4", "hca-128", "kda", ...
    params: tuple[ParamGroup, ...]
    caches: tuple[CacheSpec, ...]
    moe: bool = False
    # Attention compute per query token (performance model); None: not described.
    attn: AttentionShape | None = None


@dataclass(frozen=True)
class ModelArch:
    name: str  # catalog name, or the path it was read from
    model_type: str  # the config's model_type (text model)
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    # Head counts that tensor parallelism must divide (attention heads, linear
    # attention heads, ...); vLLM refuses a TP size that does not divide them.
    tp_divides: tuple[int, ...]
    num_kv_heads: int | None  # GQA/MHA KV heads; None when the model caches an MLA latent
    num_experts: int  # routed experts per MoE layer; 0 for dense models
    experts_per_token: int
    moe_intermediate_size: int  # per routed expert (0 for dense models)
    intermediate_size: int  # dense MLP
    layers: tuple[LayerSpec, ...]
    embedding: ParamGroup
    lm_head: ParamGroup  # count 0 when tied to the embedding and not duplicated
    final: tuple[ParamGroup, ...]  # final norm etc., on the last stage
    mtp_layers: tuple[LayerSpec, ...] = ()  # multi-token-prediction layers: in the checkpoint, loaded only for speculative decoding
    max_position_embeddings: int = 0
    model_dtype: str = "bf16"  # activation / default KV cache dtype
    weight_format: str = ""  # label of the stored format, e.g. "fp8", "fp8+mxfp4 experts"
    source: str = ""  # where the config came from
    notes: tuple[str, ...] = field(default_factory=tuple)  # assumptions made while parsing
    architectures: tuple[str, ...] = ()  # the config's `architectures` (the model class vLLM picks)
    # The config wraps the text model with parts the plan leaves out (a vision
    # tower and projector: `text_config` next to `vision_config`).
    multimodal_parts_left_out: bool = False

    def with_(self, **changes) -> "ModelArch":
        return replace(self, **changes)
