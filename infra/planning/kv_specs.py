"""The KV cache specs vLLM registers for a model, from the catalog's cache description.

One `LayerKV` per cache layer (`v1/worker/gpu/attn_utils.py get_kv_cache_spec`
walks the attention layers in registration order), with the block size the
attention backend chooses and vLLM's page padding. Then `kv_cache.py` groups
them exactly as vLLM does, whatever the model.

Block sizes (`platforms/interface.py update_block_size_for_backend`, 0.18+;
`platforms/cuda.py check_and_update_config` before):
- GQA and sliding-window attention (FlashAttention: any multiple of 16): the
  release's default, 16 up to 0.33, 64 from 0.34.
- MLA on Hopper: FlashMLA forced 64 up to 0.17; FlashAttention-MLA (multiple
  of 16) from 0.18, so the default block again.
- DeepSeek-V3.2's sparse MLA and indexer: 64 (FlashMLA-sparse pages and
  DEEPSEEK_V32_INDEXER [64]). ASSUMPTION: the same in every release modelled.
- DeepSeek-V4: 256 (FLASHMLA_SPARSE_DSV4 and DEEPSEEK_V4_INDEXER accept only
  256); its SWA cache fixes 64 and the compressor states 4 / 8
  (catalog `CacheSpec.block_size`).
- Hybrid linear-attention models (Kimi K3): `_align_hybrid_block_size` raises
  the attention block until one attention page covers a KDA state.
ASSUMPTION: Hopper kernels. Blackwell's CUTLASS / FlashInfer MLA choose other
sizes; the planner keeps the Hopper figures there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.catalog.arch import CacheSpec, LayerSpec, ModelArch
from infra.catalog.quant import cdiv, round_up
from infra.planning import memory
from infra.planning.kv_cache import LayerKV
from infra.planning.vllm_release import Release

# DeepSeek-V4's attention backends (models/deepseek_v4/sparse_mla.py, v1/attention/backends/mla/indexer.py)
# take only 256-token blocks.
DSV4_BLOCK = 256
# DeepSeek-V3.2's sparse MLA pages (v1/attention/backends/mla/indexer.py DeepseekV32IndexerBackend: [64]).
SPARSE_MLA_BLOCK = 64

# _align_hybrid_block_size (0.34): the MLA decode kernels want the block a
# multiple of 128; FlashAttention-MLA's smallest kernel block is 16.
HYBRID_MLA_ALIGNMENT = 128
HYBRID_BACKEND_ALIGNMENT = 16
# models/kimi_k3/nvidia/kda.py resolve_kda_prefill_backend: FlashKDA (SM90, SM10x,
# SM12x; bf16 input, bounded gate) exports prefill checkpoints every 16 tokens
# (model_executor/layers/mamba/kda_checkpoint.py kda_prefill_checkpoint_alignment), which adds one Mamba
# block per request (KimiK3DeltaAttention.get_kv_cache_spec). ASSUMPTION: the
# FlashKDA kernels are built into the serving image.
FLASHKDA_CHECKPOINT_ALIGNMENT = 16


@dataclass(frozen=True)
class KVSettings:
    """What shapes a model's KV specs beyond its config."""

    release: Release
    tp: int
    kv_bytes: int  # element size of --kv-cache-dtype
    model_dtype: str
    max_model_len: int
    num_speculative_tokens: int = 0  # > 0: the MTP layers are loaded and cache too


def entry_bytes(spec: CacheSpec, s: KVSettings, *, extra_rows: int = 0) -> int:
    """Bytes of one stored entry (state) of a cache on one TP rank (`memory.cache_entry_bytes`:
    heads split over TP and replicated past their count, max_tp_shards)."""
    return memory.cache_entry_bytes(
        spec, s.tp, s.kv_bytes, memory.MODEL_DTYPE_BYTES.get(s.model_dtype, 2), extra_rows=extra_rows
    )


def _has(arch: ModelArch, *kinds: str) -> bool:
    return any(c.kind in kinds for layer in arch.layers for c in layer.caches)


def is_hybrid(arch: ModelArch) -> bool:
    return _has(arch, "linear_state")


def block_outermost(arch: ModelArch) -> bool:
    """The resolved KV layout is block-outermost (BLHNC) when a backend declares it:
    DeepSeek-V4's indexer packs its pages beside the latent pages
    (indexer.py DeepseekV4IndexerBackend.supported_kv_cache_layouts)."""
    return arch.model_type == "deepseek_v4"


def _attention_page_per_token(arch: ModelArch, s: KVSettings) -> int:
    """Page bytes of one token of the model's full-attention layers (the MLA latent for
    Kimi K3): `attn_page_size_1_token` of _align_hybrid_block_size."""
    for layer in arch.layers:
        for c in layer.caches:
            if c.spec_class in ("full", "mla"):
                return entry_bytes(c, s)
    return 0


def _mamba_state_bytes(layer: LayerSpec, s: KVSettings) -> int:
    return sum(
        entry_bytes(c, s, extra_rows=s.num_speculative_tokens)
        for c in layer.caches
        if c.spec_class == "mamba"
    )


@dataclass(frozen=True)
class BlockPlan:
    block_size: int  # cache_config.block_size (attention layers without their own)
    mamba_block_size: int = 0
    mamba_page_padded: int = 0  # cache_config.mamba_page_size_padded (0: unpadded)
    mamba_align: bool = False


def block_plan(arch: ModelArch, s: KVSettings) -> BlockPlan:
    """cache_config.block_size after the backend and hybrid alignment."""
    r = s.release
    if arch.model_type == "deepseek_v4":
        block = DSV4_BLOCK
    elif _has(arch, "indexer"):
        block = SPARSE_MLA_BLOCK
    elif _has(arch, "mla"):
        block = r.mla_block_size_hopper
    else:
        block = r.default_block_size
    if not is_hybrid(arch):
        return BlockPlan(block)
    # platforms/interface.py _align_hybrid_block_size with prefix caching on (the
    # default for hybrid models, config/model.py is_prefix_caching_supported), so
    # mamba_cache_mode "align" (model_executor/models/config.py MambaModelConfig).
    mamba_page = max(_mamba_state_bytes(layer, s) for layer in arch.layers if any(c.spec_class == "mamba" for c in layer.caches))
    page_1 = _attention_page_per_token(arch, s)
    kernel = max(HYBRID_BACKEND_ALIGNMENT, block)
    if _has(arch, "mla"):
        kernel = max(kernel, HYBRID_MLA_ALIGNMENT)
    kernel = math.lcm(kernel, FLASHKDA_CHECKPOINT_ALIGNMENT)
    attn_block = kernel * cdiv(mamba_page, kernel * page_1)
    attn_block = HYBRID_BACKEND_ALIGNMENT * cdiv(attn_block, HYBRID_BACKEND_ALIGNMENT)
    block = max(block, attn_block)
    padded = block * page_1
    return BlockPlan(block, mamba_block_size=block, mamba_page_padded=padded if padded != mamba_page else 0, mamba_align=True)


def layer_specs(layer: LayerSpec, s: KVSettings, plan: BlockPlan, *, draft: bool = False) -> list[LayerKV]:
    """The KV specs one decoder layer registers, in registration order."""
    out: list[LayerKV] = []
    mamba = [c for c in layer.caches if c.spec_class == "mamba"]
    for n, c in enumerate(layer.caches):
        if c.spec_class == "mamba":
            continue
        block = c.block_size or plan.block_size
        tps = c.compress_ratio if c.spec_class in ("full", "mla") else 1
        page = (block // tps) * entry_bytes(c, s)
        if c.page_alignment:
            page = round_up(page, c.page_alignment)  # kv_cache_interface.py _apply_alignment_padding
        out.append(
            LayerKV(
                name=f"{layer.index}.{n}.{c.kind}",
                layer=layer.index,
                kind=c.label,
                spec=c.spec_class,
                block_size=block,
                page_bytes=page,
                window=c.window or 0,
                tokens_per_state=tps,
                identity=(c.kind, c.elements_per_entry, c.dtype.value, c.extra_bytes_per_entry, c.sharded_heads),
                draft=draft,
            )
        )
    if mamba:
        # One MambaSpec per linear-attention layer: its states' bytes (the conv state
        # grows by one row per speculative token), padded to the attention page.
        page = _mamba_state_bytes(layer, s)
        if plan.mamba_page_padded:
            page = max(page, plan.mamba_page_padded)
        out.append(
            LayerKV(
                name=f"{layer.index}.mamba",
                layer=layer.index,
                kind="linear_state",
                spec="mamba",
                block_size=plan.mamba_block_size or s.max_model_len,
                page_bytes=page,
                speculative_blocks=s.num_speculative_tokens,
                mamba_align=plan.mamba_align,
                checkpoint_blocks=1 if plan.mamba_align else 0,
                identity=tuple((c.elements_per_entry, c.dtype.value, c.sharded_heads) for c in mamba),
                draft=draft,
            )
        )
    return out


def model_specs(arch: ModelArch, s: KVSettings) -> tuple[list[LayerKV], BlockPlan]:
    """Every cache layer of the model (MTP layers last, on the last stage, when
    speculative decoding loads them: attn_utils.get_kv_cache_spec marks them
    is_draft, which does not count for grouping)."""
    plan = block_plan(arch, s)
    specs = [spec for layer in arch.layers for spec in layer_specs(layer, s, plan)]
    if s.num_speculative_tokens:
        specs += [spec for layer in arch.mtp_layers for spec in layer_specs(layer, s, plan, draft=True)]
    return specs, plan
