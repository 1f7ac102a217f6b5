"""Parallel layouts: which ones are allowed, and what each one leaves for the KV cache.

Placement rules (why):
- Tensor parallelism stays inside one node: it all-reduces twice per layer and
  needs NVLink (~900 GB/s per H100) rather than the network (~50 GB/s per
  400 Gb/s EFA card). TP must divide the GPUs of a node and the model's heads.
- Pipeline parallelism is the dimension that crosses nodes: in a searched
  layout each pipeline stage is one whole node (TP = GPUs per node). A layout
  with stages inside one node is accepted when asked for explicitly, with a
  warning.
- Expert parallelism, when on, spreads whole experts over vLLM's expert group,
  the TP ranks of a stage and, with replicas, every replica's (EP size = TP x
  DP); without it each expert's columns are split over the same GPUs.
- Data parallelism fills the GPUs left over after TP with replicas of the
  model, served by one `vllm serve` (`--data-parallel-size`; the ranks of
  other nodes started through Ray, serving.data_parallel_over_nodes). A dense
  model's replicas each hold the whole model; a MoE model's share its experts
  (over TP x DP GPUs) and run each MoE layer together, exchanging its tokens
  (over EFA when they span nodes; plan.dp_moe_warnings says how far the
  performance model follows). vLLM runs data parallelism only without pipeline
  parallelism, so a layout has PP > 1 or DP > 1, not both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from infra.catalog.arch import ModelArch, Role
from infra.catalog.instances import InstanceType
from infra.catalog.quant import mxfp4_moe_backend
from infra.planning import cudagraph, kv_cache, kv_specs, memory
from infra.planning.kv_cache import Admission, Group, LayerKV
from infra.planning.memory import GiB, RankBudget
from infra.planning.vllm_release import Release


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    expert_parallel: bool
    kv_cache_dtype: str

    @property
    def ep(self) -> int:
        """Expert-parallel group size: every GPU of the engine, TP x DP (vLLM 0.34.0
        fused_moe/config.py FusedMoEParallelConfig.make: ep_size is the TP size flattened
        across DP); 1 when experts are tensor-sharded."""
        return self.tp * self.dp if self.expert_parallel else 1


@dataclass(frozen=True)
class Knobs:
    """Serving knobs that change the memory budget, and the vLLM release that counts it."""

    gpu_memory_utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    release: Release
    async_scheduling: bool
    num_speculative_tokens: int = 0  # MTP speculative decoding when > 0

    def replace(self, **changes) -> "Knobs":
        return replace(self, **changes)


@dataclass(frozen=True)
class KVLayout:
    """How vLLM groups and pages the model's KV cache for one TP x PP layout."""

    groups: tuple[Group, ...]  # the model's groups (get_global_kv_cache_groups)
    stage_groups: tuple[tuple[tuple[LayerKV, ...], ...], ...]  # each group's layers on each stage
    bytes_per_block: tuple[int, ...]  # per stage
    block_size: int  # cache_config.block_size
    block_outermost: bool


@dataclass
class Evaluation:
    layout: Layout
    stages: list[RankBudget]
    knobs: Knobs | None = None
    kv: KVLayout | None = None
    admission: Admission | None = None
    request_blocks: int = 0  # blocks one request at max-model-len takes from the pool (all groups)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why the knobs are what they are
    weights_per_gpu_bound: float = float("inf")  # a refused replica's weights / its GPUs (ranks how close it came)

    @property
    def feasible(self) -> bool:
        return not self.errors

    @property
    def num_blocks(self) -> int:
        """Blocks of the engine's pool: the minimum over all ranks (get_kv_cache_configs)."""
        return min((s.num_blocks for s in self.stages), default=0)

    @property
    def constrained(self) -> RankBudget:
        """The stage whose rank holds the fewest blocks: it caps the whole engine."""
        return min(self.stages, key=lambda s: (s.num_blocks, s.kv_cache_bytes))


    @property
    def max_concurrency_per_replica(self) -> float:
        """vLLM's 'Maximum concurrency for max-model-len tokens per request'."""
        need = self.request_blocks
        return self.num_blocks / need if need and self.stages else 0.0

    @property
    def max_concurrency(self) -> float:
        return self.max_concurrency_per_replica * self.layout.dp

    @property
    def sequences_per_replica(self) -> int:
        return int(self.max_concurrency_per_replica)

    @property
    def kv_tokens_per_replica(self) -> int:
        """vLLM's 'GPU KV cache size' of one engine."""
        if not self.kv or not self.stages:
            return 0
        return kv_cache.kv_tokens(self.num_blocks, list(self.kv.groups), self.admission, release=self.knobs.release,
                                  need=self.request_blocks)  # fmt: skip

    @property
    def kv_tokens(self) -> int:
        return self.kv_tokens_per_replica * self.layout.dp


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_errors(arch: ModelArch, itype: InstanceType, nodes: int, layout: Layout) -> list[str]:
    """Reasons a layout cannot run at all, before any memory is counted."""
    gpn = itype.gpu_count
    errors = []
    if layout.tp > gpn:
        errors.append(
            f"tensor parallel {layout.tp} is larger than a node ({gpn} GPUs per {itype.name}); "
            "TP never crosses nodes (NVLink ~900 GB/s vs ~50 GB/s per EFA card): use pipeline parallel across nodes"
        )
    elif gpn % layout.tp:
        errors.append(f"tensor parallel {layout.tp} does not divide the {gpn} GPUs of a {itype.name}")
    for heads in arch.tp_divides:
        if heads % layout.tp:
            errors.append(f"tensor parallel {layout.tp} does not divide the model's {heads} attention heads")
            break
    if layout.pp > len(arch.layers):
        errors.append(f"pipeline parallel {layout.pp} exceeds the model's {len(arch.layers)} layers")
    total = nodes * gpn
    if layout.tp * layout.pp * layout.dp != total:
        errors.append(
            f"TP {layout.tp} x PP {layout.pp} x DP {layout.dp} = {layout.tp * layout.pp * layout.dp} GPUs, "
            f"but {nodes} x {itype.name} have {total}"
        )
    if layout.pp > 1 and layout.dp > 1:
        errors.append(
            f"pipeline parallel {layout.pp} with data parallel {layout.dp}: vLLM runs data parallelism only "
            "without pipeline parallelism; use fewer nodes or more pipeline stages"
        )
    if layout.expert_parallel and not arch.num_experts:
        errors.append("expert parallel was asked for, but the model has no routed experts")
    if nodes > 1 and layout.dp < nodes and itype.max_efa_interfaces == 0:
        # Stages (or a replica) that span nodes exchange activations every step; this
        # stack carries that traffic over EFA only (one subnet, the EFA security group):
        # across nodes over TCP the step time is bound by the network.
        errors.append(
            f"a model replica spans {nodes // max(layout.dp, 1)} {itype.name} nodes, which have no EFA: "
            "the stack runs multi-node replicas over EFA only; pick an EFA instance type or one node per replica"
        )
    errors.extend(moe_data_parallel_errors(arch, layout))
    errors.extend(fp8_block_moe_errors(arch, layout))
    if arch.model_type == "deepseek_v4" and layout.kv_cache_dtype not in DSV4_PACKED_KV_DTYPES:
        # models/deepseek_v4/nvidia/model.py _select_dsv4_attn_cls: without --attention-backend,
        # SM12 runs DeepseekV4FlashInferSM120Attention (nvidia/flashinfer_sparse.py) and every
        # other CUDA GPU DeepseekV4FlashMLAAttention (nvidia/flashmla.py); both keep
        # use_fp8_ds_mla_layout = True, whose packed layout (attention.py
        # _resolve_dsv4_kv_cache_dtype) turns auto and fp8* into fp8_ds_mla and refuses any
        # other KV dtype. The planner takes the canonical spellings only.
        errors.append(
            f"--kv-cache-dtype {layout.kv_cache_dtype}: vLLM runs DeepSeek-V4 on {itype.gpu.name} with its packed "
            "FP8 KV layout, which refuses it; use auto or fp8 (both mean fp8_ds_mla)"
        )
    return errors


DSV4_PACKED_KV_DTYPES = ("auto", "fp8", "fp8_ds_mla")


def expert_shards(layout: Layout) -> int:
    """The GPUs each routed expert's intermediate columns are split over without expert parallel:
    vLLM 0.34.0 flattens TP across DP for MoE layers (model_executor/layers/fused_moe/config.py
    FusedMoEParallelConfig.make, flatten_tp_across_dp_and_pcp: tp_size = dp_size x tp_size), so
    with DP > 1 every GPU of the engine holds a slice of every expert."""
    return layout.tp * layout.dp


def _split(layout: Layout) -> str:
    return f"tensor parallel {layout.tp}" if layout.dp == 1 else f"TP {layout.tp} x DP {layout.dp}"


def moe_data_parallel_errors(arch: ModelArch, layout: Layout) -> list[str]:
    """vLLM 0.34.0 asserts that a routed expert's intermediate size divides over the GPUs its
    columns are split over (fused_moe/config.py FusedMoEConfig.__post_init__: `assert
    self.intermediate_size % tp_size == 0`, tp_size the flattened one of expert_shards) and
    stops at start-up when it does not. TP alone divides it for every catalog model; TP x DP
    over a node count such as 3 or 5 need not (2,048 over 4 x 6 GPUs)."""
    if not arch.num_experts or layout.expert_parallel:
        return []
    shards, inter = expert_shards(layout), arch.moe_intermediate_size
    if inter % shards == 0:
        return []
    return [
        f"without expert parallel vLLM splits each routed expert's {inter:,} intermediate columns over all {shards} "
        f"GPUs ({_split(layout)}), and {shards} does not divide {inter:,}: it stops at start-up; turn expert parallel "
        "on (gpu-serving:serving.expertParallel true) or use another TP or node count"
    ]


def fp8_block_moe_errors(arch: ModelArch, layout: Layout) -> list[str]:
    """vLLM refuses block-FP8 experts whose intermediate size per rank is not a multiple of
    the block (model_executor/layers/quantization/utils/fp8_utils.py validate_fp8_block_shape_moe,
    called by fp8.py Fp8MoEMethod.create_weights): block_n always, block_k once the attention's
    TP > 1 (its get_tensor_model_parallel_world_size). The size per rank is the expert's over
    expert_shards (TP x DP); with expert parallel the experts are whole on each rank."""
    for inter, (block_n, block_k) in _fp8_block_experts(arch):
        per_rank = inter if layout.expert_parallel else inter // expert_shards(layout)
        if per_rank % block_n or (layout.tp > 1 and per_rank % block_k):
            return [
                f"{_split(layout)} leaves {per_rank} of the experts' {inter} intermediate columns per "
                f"GPU, not a multiple of the checkpoint's FP8 block {block_n}x{block_k}: vLLM refuses it; "
                "turn expert parallel on or use a smaller TP"
            ]
    return []


def _fp8_block_experts(arch: ModelArch) -> tuple[tuple[int, tuple[int, int]], ...]:
    """(intermediate size, block) of every distinct block-FP8 FusedMoE shape, once per model."""
    cache = _model_cache(arch)
    if "fp8_block_experts" not in cache:
        found = {
            (shape.inter, tuple(group.scheme.block))
            for layer in arch.layers
            for group in layer.params
            if group.role == Role.ROUTED_EXPERT and group.scheme is not None
            and (group.scheme.kind, group.scheme.strategy) == ("fp8", "block")
            for shape in group.shapes
            if getattr(shape, "inter", None) is not None
        }  # fmt: skip
        cache["fp8_block_experts"] = tuple(sorted(found))
    return cache["fp8_block_experts"]


@dataclass(frozen=True)
class StageFigures:
    """What one rank of a pipeline stage holds, independent of the GPU and of the
    knobs other than TP and the KV element size."""

    layers: tuple
    weights: int
    kv_per_token: int
    graph_layers: int  # layers whose CUDA graphs the rank captures (the MTP layers on the last stage)
    mla_graph_layers: int


# The search evaluates the same stages for every instance type and node count:
# computing them once per model keeps a full catalog search well under a second.
# Keyed by id(arch) with the arch kept alive beside its figures, so ids are not reused.
_FIGURES: dict[int, tuple[ModelArch, dict]] = {}
_FIGURES_MAX_MODELS = 16


def _model_cache(arch: ModelArch) -> dict:
    if id(arch) not in _FIGURES:
        if len(_FIGURES) >= _FIGURES_MAX_MODELS:
            _FIGURES.clear()
        _FIGURES[id(arch)] = (arch, {})
    return _FIGURES[id(arch)][1]


def total_weight_bytes(arch: ModelArch) -> int:
    from infra.catalog.models import weight_bytes

    cache = _model_cache(arch)
    if "weights" not in cache:
        cache["weights"] = weight_bytes(arch)
    return cache["weights"]


def _is_mla_layer(layer) -> bool:
    return any(c.spec_class in ("mla", "sliding_mla") for c in layer.caches)


def mtp_weight_bytes(arch: ModelArch, tp: int, *, expert_shards: int | None = None, expert_parallel: bool = False,
                     routed: bool | None = None, mxfp4_backend: str = "none") -> int:  # fmt: skip
    """The MTP draft layers' weights on one rank of the last stage: vLLM loads them with
    the target (v1/worker/gpu/model_runner.py load_model wraps both loads in one
    DeviceMemoryProfiler); embedding and LM head are shared with the target. Their experts
    are split like the target's (`expert_shards`, TP alone by default). `routed`: as in
    memory.stage_weight_bytes, which counts them as a stage of those layers alone."""
    return memory.stage_weight_bytes(
        arch, arch.mtp_layers, first=False, last=False, tp=tp, expert_shards=expert_shards or tp,
        expert_parallel=expert_parallel, routed=routed, mxfp4_backend=mxfp4_backend,
    )  # fmt: skip


def stage_figures(
    arch: ModelArch,
    pp: int,
    tp: int,
    kv_bytes: int,
    speculative: bool,
    *,
    expert_parallel: bool = False,
    expert_shards: int | None = None,
    mxfp4_backend: str = "none",
) -> list[StageFigures]:
    """`expert_shards`: the GPUs each routed expert is split over, TP x DP (layout.expert_shards;
    TP alone by default). `expert_parallel` and the MoE kernel gpt-oss's MXFP4 experts run on
    (`mxfp4_backend`, quant.mxfp4_moe_backend) only change how quantised experts are split and
    padded."""
    cache = _model_cache(arch)
    if "quantised" not in cache:
        cache["quantised"] = any(g.scheme is not None for layer in arch.layers for g in layer.params)
    shards = expert_shards or tp
    if not arch.num_experts:
        shards = tp  # nothing is split by it
    if not cache["quantised"] and (not arch.num_experts or arch.num_experts % shards == 0):
        expert_parallel, mxfp4_backend = False, "none"  # the same figures either way (an even split)
    quant = dict(expert_parallel=expert_parallel, mxfp4_backend=mxfp4_backend)
    key = ("stages", pp, tp, shards, kv_bytes, speculative, expert_parallel, mxfp4_backend)
    if key not in cache:
        groups = memory.stage_layers(arch, pp)

        def weights(wkey: tuple, **split) -> list[int]:  # per stage, not per KV dtype
            if wkey not in cache:
                cache[wkey] = [
                    memory.stage_weight_bytes(arch, layers, first=i == 0, last=i == len(groups) - 1, **split)
                    + (mtp_weight_bytes(arch, **split) if speculative and i == len(groups) - 1 else 0)
                    for i, layers in enumerate(groups)
                ]
            return cache[wkey]

        # The routed experts depend on their split (TP x DP GPUs) and not on TP alone (every
        # catalog model's are Experts shapes), the rest on TP: a search over DP reuses both.
        rest = weights(("weights", pp, tp, speculative), tp=tp, expert_shards=shards, routed=False)
        routed = weights(("experts", pp, shards, speculative, expert_parallel, mxfp4_backend), tp=tp,
                         expert_shards=shards, routed=True, **quant)  # fmt: skip
        out = []
        for i, layers in enumerate(groups):
            last = i == len(groups) - 1
            weights_bytes = rest[i] + routed[i]
            graph = list(layers) + (list(arch.mtp_layers) if last and speculative else [])
            out.append(
                StageFigures(
                    layers=layers,
                    weights=weights_bytes,
                    kv_per_token=memory.bytes_per_token(layers, tp, kv_bytes),
                    graph_layers=len(graph),
                    mla_graph_layers=sum(1 for layer in graph if _is_mla_layer(layer)),
                )
            )
        cache[key] = out
    return cache[key]


def kv_layout(arch: ModelArch, *, release: Release, pp: int, tp: int, kv_bytes: int, max_model_len: int,
              num_speculative_tokens: int) -> KVLayout:
    """Groups, and bytes per block on each stage (cached per model and layout)."""
    cache = _model_cache(arch)
    key = ("kv", release.minor, pp, tp, kv_bytes, max_model_len, num_speculative_tokens)
    if key not in cache:
        outermost = kv_specs.block_outermost(arch)
        # The groups do not depend on PP, nor on max-model-len unless a Mamba block spans it.
        gkey = ("groups", release.minor, tp, kv_bytes, num_speculative_tokens,
                max_model_len if kv_specs.is_hybrid(arch) else None)  # fmt: skip
        if gkey not in cache:
            settings = kv_specs.KVSettings(
                release=release, tp=tp, kv_bytes=kv_bytes, model_dtype=arch.model_dtype, max_model_len=max_model_len,
                num_speculative_tokens=num_speculative_tokens,
            )  # fmt: skip
            specs, plan = kv_specs.model_specs(arch, settings)
            cache[gkey] = (kv_cache.kv_cache_groups(specs, release=release, block_outermost=outermost), plan)
        groups, plan = cache[gkey]
        stage_groups, per_block = [], []
        for i, layers in enumerate(memory.stage_layers(arch, pp)):
            ids = {layer.index for layer in layers}
            if i == pp - 1:
                ids |= {layer.index for layer in arch.mtp_layers}  # the drafter runs on the last stage
            projected = kv_cache.project(groups, ids)
            stage_groups.append(tuple(projected))
            per_block.append(kv_cache.bytes_per_block(projected, block_outermost=outermost))
        cache[key] = KVLayout(tuple(groups), tuple(stage_groups), tuple(per_block), plan.block_size, outermost)
    return cache[key]


def model_runner_v2(arch: ModelArch, r: Release) -> bool:
    """Whether release `r` runs this model with the V2 model runner (cached per model)."""
    cache = _model_cache(arch)
    key = ("mrv2", r.minor)
    if key not in cache:
        cache[key] = r.model_runner_v2(
            arch.architectures, moe=bool(arch.num_experts), hybrid=kv_specs.is_hybrid(arch),
            quantized=arch.weight_format not in ("", "bf16"),
        )  # fmt: skip
    return cache[key]


def admission(arch: ModelArch, layout: Layout, knobs: Knobs) -> Admission:
    """What a request is charged: the sliding-window in-flight tokens of this release."""
    r = knobs.release
    mrv2 = model_runner_v2(arch, r)
    tokens = r.sliding_window_tokens(layout.pp, knobs.max_num_batched_tokens, async_scheduling=knobs.async_scheduling, mrv2=mrv2)
    return Admission(max_model_len=knobs.max_model_len, sliding_tokens=tokens)


def evaluate(arch: ModelArch, itype: InstanceType, nodes: int, layout: Layout, knobs: Knobs) -> Evaluation:
    """The per-rank memory budget of every pipeline stage of one layout, and the KV
    blocks, reservations and concurrency vLLM derives from it."""
    errors = layout_errors(arch, itype, nodes, layout)
    if errors:
        return Evaluation(layout, [], knobs, errors=errors)
    errors = weights_bound_errors(arch, itype, layout, knobs)
    if errors:
        return Evaluation(layout, [], knobs, errors=errors, weights_per_gpu_bound=total_weight_bytes(arch) / (layout.tp * layout.pp))
    gpu, r = itype.gpu, knobs.release
    kv_bytes = memory.kv_element_bytes(layout.kv_cache_dtype, arch.model_dtype)
    comm = memory.comm_buffer_bytes(
        tp=layout.tp, pp=layout.pp, expert_parallel=layout.expert_parallel, ep_size=layout.ep, gpus_per_node=itype.gpu_count,
    )  # fmt: skip
    spec_tokens = knobs.num_speculative_tokens
    kvl = kv_layout(arch, release=r, pp=layout.pp, tp=layout.tp, kv_bytes=kv_bytes, max_model_len=knobs.max_model_len,
                    num_speculative_tokens=spec_tokens)  # fmt: skip
    graphs = cudagraph.graph_count(
        r, max_num_seqs=knobs.max_num_seqs, max_num_batched_tokens=knobs.max_num_batched_tokens,
        decode_query_len=1 + spec_tokens, sm100=gpu.compute_capability.startswith("10"),
        ceiling=cudagraph.model_ceiling(r, arch.model_type),
    )  # fmt: skip
    adm = admission(arch, layout, knobs)
    groups = list(kvl.groups)
    need = kv_cache.request_blocks(groups, adm, release=r)

    def tokens_for(blocks: int) -> int:
        return kv_cache.kv_tokens(blocks, groups, adm, release=r, need=need)

    stages = []
    figures = stage_figures(
        arch, layout.pp, layout.tp, kv_bytes, bool(spec_tokens),
        expert_parallel=layout.expert_parallel, expert_shards=expert_shards(layout),
        mxfp4_backend=mxfp4_moe_backend(float(gpu.compute_capability), r.vendors_triton_kernels),
    )
    for i, fig in enumerate(figures):
        activation = memory.activation_peak_bytes(
            arch, fig.layers, last=i == len(figures) - 1, tp=layout.tp,
            max_num_batched_tokens=knobs.max_num_batched_tokens, max_num_seqs=knobs.max_num_seqs, dp=layout.dp,
        )  # fmt: skip
        pool = cudagraph.graph_bytes(layers=fig.graph_layers, mla_layers=fig.mla_graph_layers, graphs=graphs, estimate=False)
        estimate = (
            cudagraph.graph_bytes(layers=fig.graph_layers, mla_layers=fig.mla_graph_layers, graphs=graphs, estimate=True)
            if r.cudagraph_estimate
            else 0
        )
        stages.append(
            memory.rank_budget(
                release=r, stage=i, layers=len(fig.layers), visible=gpu.visible_memory_bytes,
                utilization=knobs.gpu_memory_utilization, weights=fig.weights, activation=activation, comm=comm,
                cudagraph=pool, cudagraph_estimate=estimate, kv_bytes_per_token=fig.kv_per_token,
                kv_bytes_per_block=kvl.bytes_per_block[i], distributed=engine_gpus(arch, layout) > 1,
                request_blocks=need, tokens_for=tokens_for,
            )  # fmt: skip
        )
    ev = Evaluation(layout, stages, knobs, kvl, adm, request_blocks=need)
    ev.errors.extend(memory_errors(arch, itype, nodes, ev, knobs))
    return ev


def shares_moe_layers(arch: ModelArch, layout: Layout) -> bool:
    """Replicas of a MoE model: vLLM 0.34.0 splits its experts over all TP x DP GPUs
    (fused_moe/config.py FusedMoEParallelConfig.make) and runs each MoE layer on every replica's
    tokens together (distributed/device_communicators/all2all.py AgRsAll2AllManager), so their
    memory, NCCL groups, activations and step time are shared."""
    return bool(arch.num_experts) and layout.dp > 1


def engine_gpus(arch: ModelArch, layout: Layout) -> int:
    """The GPUs that hold one copy of the weights between them: a replica's (TP x PP), or every
    replica's when they share a MoE model's layers."""
    return layout.tp * layout.pp * (layout.dp if shares_moe_layers(arch, layout) else 1)


def _split_name(arch: ModelArch, layout: Layout) -> str:
    shared = shares_moe_layers(arch, layout)
    return f"TP {layout.tp} x PP {layout.pp}" + (f" x DP {layout.dp}" if shared else "")


def weights_bound_errors(arch: ModelArch, itype: InstanceType, layout: Layout, knobs: Knobs) -> list[str]:
    """The engine's GPUs hold every parameter at least once (TP/PP/EP and a MoE's DP only split
    them), so weights over their usable memory cannot fit on any of its ranks; refused before
    the per-stage budget is built (most of a full catalog search)."""
    gpu, util = itype.gpu, knobs.gpu_memory_utilization
    gpus = engine_gpus(arch, layout)
    usable = int(util * gpu.visible_memory_bytes)
    total = total_weight_bytes(arch)
    if total <= gpus * usable:
        return []
    return [_weights_do_not_fit(arch, itype, layout, util, usable)]


def _weights_do_not_fit(arch: ModelArch, itype: InstanceType, layout: Layout, util: float, usable: int,
                        fullest: int | None = None) -> str:
    """The refusal when the weights do not fit, with the replica's memory (and the fullest GPU's weights)."""
    gpu, gpus = itype.gpu, engine_gpus(arch, layout)
    where = f", {_gb(fullest)} on the fullest GPU at" if fullest is not None else " at"
    return (
        f"the weights do not fit: {arch.name} in {arch.weight_format} needs {_gb(total_weight_bytes(arch))} of "
        f"weights{where} {_split_name(arch, layout)}; {gpus} x {gpu.name} hold "
        f"{_gb(gpus * gpu.visible_memory_bytes)} as CUDA reports it ({_gb(gpu.visible_memory_bytes)} each), "
        f"{_gb(gpus * usable)} usable at gpu-memory-utilization {util:.2f} ({_gb(usable)} each)"
    )  # fmt: skip


def _gb(n: float) -> str:
    """Decimal units, as weights and GPU memory are quoted (TB above 1,000 GB)."""
    return f"{n / 1e12:,.2f} TB" if n >= 1e12 else f"{n / 1e9:,.1f} GB"


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def memory_errors(arch: ModelArch, itype: InstanceType, nodes: int, ev: Evaluation, knobs: Knobs) -> list[str]:
    """Why the memory does not work out, with the numbers that explain it."""
    errors = []
    gpu = itype.gpu
    util = knobs.gpu_memory_utilization
    context = memory.cuda_context_bytes(ev.layout.tp * ev.layout.pp > 1)
    if not knobs.release.extensible_kv_cache and gpu.visible_memory_bytes - int(util * gpu.visible_memory_bytes) < context:
        # Up to 0.33 vLLM refuses to start when free memory is below the request
        # (v1/worker/gpu_worker.py init_device); 0.34's extensible cache caps it instead.
        errors.append(
            f"gpu-memory-utilization {util:.2f} leaves {_gib((1 - util) * gpu.visible_memory_bytes)} per GPU, "
            f"less than the CUDA context and NCCL communicators ({_gib(context)}) that exist before vLLM starts: "
            "vLLM refuses to start; lower it"
        )
    worst = max(ev.stages, key=lambda s: s.weights_bytes)
    if worst.weights_bytes > worst.usable_bytes:
        errors.append(_weights_do_not_fit(arch, itype, ev.layout, util, worst.usable_bytes, fullest=worst.weights_bytes))
        return errors
    tight = ev.constrained
    need = ev.request_blocks
    # kv_cache_planning.py get_kv_cache_configs / _check_enough_kv_cache_memory: one request at
    # max-model-len must fit in the blocks left after the null block.
    if tight.kv_cache_bytes <= 0 or tight.num_blocks - 1 < need:
        per_request = need * tight.kv_bytes_per_block
        errors.append(
            f"no room for one sequence of max-model-len {knobs.max_model_len:,} tokens on stage {tight.stage}: "
            f"vLLM reserves {need:,} blocks of {tight.kv_bytes_per_block:,} B ({_gib(per_request)}) per request there, and "
            f"{_gib(tight.usable_bytes)} usable - {_gib(tight.weights_bytes)} weights - "
            f"{_gib(tight.activation_bytes)} activations - {_gib(tight.comm_buffer_bytes)} communication buffers "
            f"- {_gib(memory.NON_TORCH_BASE_BYTES)} non-torch"
            + (f" - {_gib(tight.cudagraph_estimate_bytes or tight.cudagraph_bytes)} CUDA graphs" if knobs.release.at_least("0.20") else "")
            + f" leaves {_gib(tight.kv_cache_bytes)}"
        )
    return errors
