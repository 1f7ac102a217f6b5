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
class ParamGroup:
    role: Role
    shard: Shard
    count: int  # number of parameters
    fmt: str  # key of infra.catalog.formats.FORMATS, as stored in the checkpoint


class CacheDtype(str, Enum):
    KV = "kv"  # follows --kv-cache-dtype (model dtype by default)
    FP8 = "fp8"  # always one byte per element (e.g. the sparse indexer's keys)
    FP32 = "fp32"  # recurrent states of linear attention


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
    """

    kind: str  # "gqa" | "mla" | "sliding" | "compressed" | "indexer" | "linear_state"
    elements_per_entry: int  # per head when sharded_heads > 0, else per entry
    sharded_heads: int = 0
    dtype: CacheDtype = CacheDtype.KV
    window: int | None = None
    compress_ratio: int = 1
    per_sequence: bool = False
    extra_bytes_per_entry: int = 0  # e.g. per-entry quantisation scales
    note: str = ""


@dataclass(frozen=True)
class LayerSpec:
    index: int
    attention: str  # human label: "gqa", "mla", "sliding", "csa-4", "hca-128", "kda", ...
    params: tuple[ParamGroup, ...]
    caches: tuple[CacheSpec, ...]
    moe: bool = False


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
