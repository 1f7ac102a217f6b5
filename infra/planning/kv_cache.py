"""KV cache groups, blocks and admission, as vLLM forms them.

vLLM sizes the KV cache in blocks of one shared pool. Layers are put in
groups that share a block table (`v1/core/kv_cache_planning.py
get_kv_cache_groups`, before 0.33 in `v1/core/kv_cache_utils.py`); every
group takes its own blocks from the pool for each request, and a block costs
`bytes_per_block` (the widest group's pages on the rank) whatever group holds
it. So:

    num_blocks       = KV bytes of the rank // bytes_per_block, minimum over all ranks
    blocks/request   = sum over groups of the group's per-request reservation
    max concurrency  = num_blocks / blocks per request

This module is the arithmetic of those functions, on `LayerKV` (one vLLM
`KVCacheSpec` per cache layer, built by `infra.planning.kv_specs`). It is pure
and knows no model: every model goes through the same grouping code.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

from infra.catalog.quant import cdiv, round_up
from infra.planning.vllm_release import Release


@dataclass(frozen=True)
class LayerKV:
    """One cache layer as vLLM registers it (a KVCacheSpec), on one rank.

    `spec` is the spec class: "full" (FullAttentionSpec), "mla"
    (MLAAttentionSpec), "sliding" (SlidingWindowSpec), "sliding_mla"
    (SlidingWindowMLASpec) or "mamba" (MambaSpec). `page_bytes` is
    `page_size_bytes` with vLLM's padding; `identity` holds the other fields
    vLLM's spec equality compares (head size, dtype, ...).
    """

    name: str
    layer: int  # decoder layer index (MTP layers follow the model's)
    kind: str  # the cache's name in the plan
    spec: str
    block_size: int
    page_bytes: int
    window: int = 0
    tokens_per_state: int = 1
    stride_alignment: int = 1  # KVCacheSpec.get_block_stride_alignment(), bytes
    speculative_blocks: int = 0  # MambaSpec.num_speculative_blocks
    mamba_align: bool = False  # mamba_cache_mode == "align"
    checkpoint_blocks: int = 0  # MambaSpec.num_prefill_checkpoint_blocks
    extra_retained: int = 0  # SlidingWindowSpec.extra_retained_tokens
    identity: tuple = ()
    draft: bool = field(default=False, compare=False)  # is_draft: excluded from equality, as in vLLM

    @property
    def key(self) -> tuple:
        """What vLLM's spec equality compares (frozen-dataclass ==, `is_draft` excluded)."""
        return (
            self.spec, self.block_size, self.page_bytes, self.window, self.tokens_per_state, self.stride_alignment,
            self.speculative_blocks, self.mamba_align, self.checkpoint_blocks, self.extra_retained, self.identity,
        )  # fmt: skip

    def with_block_size(self, block_size: int, page_bytes: int) -> "LayerKV":
        return replace(self, block_size=block_size, page_bytes=page_bytes)


@dataclass(frozen=True)
class Group:
    """A KV cache group (KVCacheGroupSpec): layers sharing one block table."""

    layers: tuple[LayerKV, ...]

    @property
    def first(self) -> LayerKV:
        return self.layers[0]

    @property
    def block_size(self) -> int:
        return self.first.block_size

    @property
    def kind(self) -> str:
        kinds = list(dict.fromkeys(layer.kind for layer in self.layers))
        return "+".join(kinds)

    @property
    def page_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({layer.page_bytes for layer in self.layers}))


# --- Uniformity (v1/kv_cache_interface.py is_uniform_with_collection / is_uniform_type) ---


def _uniform_with(first: LayerKV, layers: list[LayerKV]) -> bool:
    """`first.is_uniform_with_collection(...)`: the registry's base class for full
    attention and MLA (both group with FullAttentionSpec); the same window for
    sliding windows (SlidingWindowMLASpec also compares bounded_replay, off here);
    the same state layout for Mamba."""
    if first.spec in ("full", "mla"):
        return all(s.spec in ("full", "mla") for s in layers)
    if first.spec == "sliding":
        return all(s.spec in ("sliding", "sliding_mla") and s.window == first.window for s in layers)
    if first.spec == "sliding_mla":
        return all(s.spec == "sliding_mla" and s.window == first.window for s in layers)
    if first.spec == "mamba":
        return all(
            s.spec == "mamba" and s.speculative_blocks == first.speculative_blocks
            and s.checkpoint_blocks == first.checkpoint_blocks and s.page_bytes == first.page_bytes
            for s in layers
        )  # fmt: skip
    raise ValueError(f"unknown KV cache spec {first.spec!r}")


def is_uniform_type(layers: list[LayerKV]) -> bool:
    """UniformTypeKVCacheSpecs.is_uniform_type: one block size, one spec type."""
    if len({s.block_size for s in layers}) > 1:
        return False
    return _uniform_with(layers[0], layers)


def is_uniform_spec(layers: list[LayerKV]) -> bool:
    """kv_cache_planning.py is_kv_cache_spec_uniform: every layer the same spec."""
    return len({s.key for s in layers}) <= 1


# --- Grouping -------------------------------------------------------------------------------


def approximate_gcd(values: list[int], *, lower_bound: int | None = None) -> int:
    """kv_cache_planning.py `_approximate_gcd`: the chunk size d in [lower_bound,
    max(values)] that minimises sum(ceil(x / d) * d - x); ties prefer larger d."""
    min_d = max(1, lower_bound if lower_bound is not None else 1)
    max_d = max(values)
    if min_d > max_d:
        return min_d
    best_d, best_pad = min_d, None
    for d in range(min_d, max_d + 1):
        pad = sum((d - (x % d)) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best_d):
            best_pad, best_d = pad, d
    return best_d


def _layers_per_page(bucket: list[LayerKV]) -> dict[int, list[LayerKV]]:
    out: dict[int, list[LayerKV]] = {}
    for layer in bucket:
        out.setdefault(layer.page_bytes, []).append(layer)
    return out


def _max_layers_per_page_size(bucket: list[LayerKV]) -> int:
    """UniformTypeKVCacheSpecs.get_max_layers_per_page_size (Counter.most_common)."""
    return Counter(layer.page_bytes for layer in bucket).most_common(1)[0][1]


def packed_groups(layers: list[LayerKV]) -> list[Group] | None:
    """kv_cache_planning.py `_get_packed_kv_cache_groups` (block-outermost layouts,
    mixed page sizes; 0.29+): greedy uniform-type buckets; buckets with one layer
    per page size and repeat are split into groups of `repeats_per_group` repeats
    (`_approximate_gcd` of their repeat counts, at least the largest mixed-page
    bucket's); Mamba buckets, and sliding-window buckets when nothing repeats, are
    split to fit the block the other buckets already need."""
    if len({s.page_bytes for s in layers}) <= 1:
        return None
    buckets: list[list[LayerKV]] = []
    for layer in layers:
        for bucket in buckets:
            # is_uniform_type(bucket + [layer]): the bucket is already uniform with its
            # first layer, so only the new layer needs checking.
            if layer.block_size == bucket[0].block_size and _uniform_with(bucket[0], [layer]):
                bucket.append(layer)
                break
        else:
            buckets.append([layer])

    bucketed = []
    for bucket in buckets:
        per_page = _layers_per_page(bucket)
        balanced = len({len(v) for v in per_page.values()}) == 1
        bucketed.append((bucket, per_page, balanced))

    min_repeats = max(
        (_max_layers_per_page_size(b) for b, per_page, balanced in bucketed if balanced and len(per_page) > 1),
        default=0,
    )
    repeats = (
        approximate_gcd([_max_layers_per_page_size(b) for b, _, balanced in bucketed if balanced], lower_bound=min_repeats)
        if min_repeats
        else None
    )

    def num_groups_for(bucket: list[LayerKV], balanced: bool) -> int:
        if balanced and repeats is not None:
            return cdiv(_max_layers_per_page_size(bucket), repeats)
        return 1

    def widest_group_bytes(per_page: dict[int, list[LayerKV]], n: int) -> int:
        return sum(cdiv(len(names), n) * page for page, names in per_page.items())

    def is_state_bucket(bucket: list[LayerKV]) -> bool:
        if bucket[0].spec == "mamba":
            return True
        return repeats is None and bucket[0].spec in ("sliding", "sliding_mla")

    anchor = max(
        (widest_group_bytes(per_page, len(b) if is_state_bucket(b) else num_groups_for(b, balanced))
         for b, per_page, balanced in bucketed),
        default=0,
    )  # fmt: skip

    groups = []
    for bucket, per_page, balanced in bucketed:
        n = num_groups_for(bucket, balanced)
        if anchor and is_state_bucket(bucket):
            per_block = max(anchor // bucket[0].page_bytes, 1)
            n = max(n, cdiv(len(bucket), per_block))
        if n == 1:
            groups.append(Group(tuple(bucket)))
            continue
        pattern_repeats = list(zip(*per_page.values()))
        for i in range(n):
            groups.append(Group(tuple(layer for repeat in pattern_repeats[i::n] for layer in repeat)))
    return groups


def unify_page_sizes(layers: list[LayerKV]) -> list[LayerKV]:
    """kv_cache_planning.py `unify_kv_cache_spec_page_size`: raise smaller pages to
    the largest by scaling the block size when it divides, else pad (Mamba and
    non-MLA attention only)."""
    pages = {s.page_bytes for s in layers}
    if len(pages) <= 1:
        return layers
    top = max(pages)
    out = []
    for s in layers:
        if s.page_bytes == top:
            out.append(s)
        elif s.spec == "mamba":
            out.append(s.with_block_size(s.block_size, top))
        elif top % s.page_bytes == 0:
            out.append(s.with_block_size(s.block_size * (top // s.page_bytes), top))
        elif s.spec in ("full", "sliding", "sliding_mla"):
            out.append(s.with_block_size(s.block_size, top))
        else:
            raise ValueError(f"layer {s.name}: page {s.page_bytes} B does not divide {top} B and an MLA page cannot be padded")
    return out


def uniform_page_size_groups(layers: list[LayerKV]) -> list[Group]:
    """kv_cache_planning.py `_get_kv_cache_groups_uniform_page_size`: one bucket per
    spec; groups of `min(layers per bucket)` layers (or the largest bucket when it
    is under 1.5x the smallest), assigned `layers[i::num_groups]`."""
    buckets: dict[tuple, list[LayerKV]] = {}
    for s in layers:
        buckets.setdefault(s.key, []).append(s)
    sizes = [len(b) for b in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups = []
    for bucket in buckets.values():
        n = cdiv(len(bucket), group_size)
        for i in range(n):
            groups.append(Group(tuple(bucket[i::n])))
    return groups


def kv_cache_groups(layers: list[LayerKV], *, release: Release, block_outermost: bool) -> list[Group]:
    """kv_cache_planning.py `get_kv_cache_groups` for the whole model (every PP
    stage's layers merged, `get_global_kv_cache_groups`), hybrid manager on."""
    if not layers:
        return []
    if is_uniform_spec(layers) or is_uniform_type(layers):
        return [Group(tuple(layers))]
    if release.packed_kv_groups and block_outermost:
        packed = packed_groups(layers)
        if packed:
            return packed
    return uniform_page_size_groups(unify_page_sizes(layers))


def project(groups: list[Group], layer_ids: set[int]) -> list[tuple[LayerKV, ...]]:
    """`_project_kv_cache_groups_to_worker`: each group's layers on one PP stage
    (a group with none there is kept, empty)."""
    return [tuple(s for s in g.layers if s.layer in layer_ids) for g in groups]


def bytes_per_block(stage_groups: list[tuple[LayerKV, ...]], *, block_outermost: bool) -> int:
    """kv_cache_planning.py `_get_kv_cache_bytes_per_block` on one rank: the widest
    group's pages (layer-outermost: each page padded to its block stride;
    block-outermost: the sum rounded up to every layer's stride alignment)."""
    if not block_outermost:
        return max((sum(round_up(s.page_bytes, s.stride_alignment) for s in g) for g in stage_groups), default=0)
    widest = max((sum(s.page_bytes for s in g) for g in stage_groups), default=0)
    alignment = math.lcm(*(s.stride_alignment for g in stage_groups for s in g)) if widest else 1
    return round_up(widest, alignment)


# --- Per-request reservations ---------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """What a request is charged (VllmConfig.max_in_flight_tokens and friends)."""

    max_model_len: int
    sliding_tokens: int  # tokens in flight a sliding window holds beyond its window


def blocks_per_request(spec: LayerKV, adm: Admission, max_len: int | None = None) -> int:
    """`cdiv(max_memory_usage_bytes, page_size_bytes)` of one group's spec
    (v1/kv_cache_interface.py): full attention and MLA cdiv(L, block);
    sliding windows cdiv(min(window - 1 + extra + in-flight tokens, L), block) + 1
    (SlidingWindowSpec.max_admission_blocks_per_request); Mamba 1 + speculative
    blocks, or 2 + speculative + checkpoint blocks in align mode."""
    length = adm.max_model_len if max_len is None else max_len
    if spec.spec in ("full", "mla"):
        return cdiv(length, spec.block_size)
    if spec.spec in ("sliding", "sliding_mla"):
        tokens = min(spec.window - 1 + spec.extra_retained + adm.sliding_tokens, length)
        return cdiv(tokens, spec.block_size) + 1
    if spec.spec == "mamba":
        if spec.mamba_align:
            return 2 + spec.speculative_blocks + spec.checkpoint_blocks
        return 1 + spec.speculative_blocks
    raise ValueError(f"unknown KV cache spec {spec.spec!r}")


def request_blocks(groups: list[Group], adm: Admission, *, release: Release, max_len: int | None = None) -> int:
    """Blocks one request at `max_len` (default max-model-len) takes from the pool.

    0.27+ (`get_max_concurrency_for_kv_cache_config`): the sum over groups of each
    group's blocks. Before: cdiv(sum over groups of max_memory_usage_bytes,
    page of group 0), the same number whenever the groups share one page size.
    """
    if not groups:
        return 0
    per_group = [blocks_per_request(g.first, adm, max_len) for g in groups]
    if release.concurrency_sum_of_ceils:
        return sum(per_group)
    pages = [g.first.page_bytes for g in groups]
    return cdiv(sum(b * p for b, p in zip(per_group, pages)), pages[0])


def max_concurrency(num_blocks: int, groups: list[Group], adm: Admission, *, release: Release, need: int | None = None) -> float:
    """vLLM's 'Maximum concurrency for L tokens per request' (num_blocks counts the null
    block); `need`: the request's blocks when already known."""
    need = request_blocks(groups, adm, release=release) if need is None else need
    return num_blocks / need if need else math.inf


def kv_tokens(num_blocks: int, groups: list[Group], adm: Admission, *, release: Release, need: int | None = None) -> int:
    """vLLM's 'GPU KV cache size: N tokens': int(max_concurrency x L) from 0.21;
    before, num_blocks // number of groups x the smallest block size."""
    if not groups:
        return 0
    if release.kv_tokens_from_concurrency:
        return int(max_concurrency(num_blocks, groups, adm, release=release, need=need) * adm.max_model_len)
    return num_blocks // len(groups) * min(g.block_size for g in groups)
