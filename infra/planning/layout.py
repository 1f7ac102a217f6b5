"""Parallel layouts: which ones are allowed, and what each one leaves for the KV cache.

Placement rules (why):
- Tensor parallelism stays inside one node: it all-reduces twice per layer and
  needs NVLink (~900 GB/s per H100) rather than the network (~50 GB/s per
  400 Gb/s EFA card). TP must divide the GPUs of a node and the model's heads.
- Pipeline parallelism is the dimension that crosses nodes: in a searched
  layout each pipeline stage is one whole node (TP = GPUs per node). A layout
  with stages inside one node is accepted when asked for explicitly, with a
  warning.
- Expert parallelism, when on, spreads whole experts over the TP ranks of a
  stage (EP size = TP, inside the node); its all-to-all uses NVLink, never EFA.
- Data parallelism fills the GPUs left over after TP with replicas of the
  model, served by one engine (`--data-parallel-size`), each replica with a
  full copy of the weights (for MoE models vLLM can shard experts across
  replicas; the plan does not count on it). vLLM runs data parallelism only
  without pipeline parallelism, so a layout has PP > 1 or DP > 1, not both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.catalog.arch import ModelArch
from infra.catalog.instances import InstanceType
from infra.planning import memory
from infra.planning.memory import GiB, RankBudget


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    expert_parallel: bool
    kv_cache_dtype: str

    @property
    def ep(self) -> int:
        """Expert-parallel group size (1 when experts are tensor-sharded)."""
        return self.tp if self.expert_parallel else 1


@dataclass(frozen=True)
class Knobs:
    """Serving knobs that change the memory budget."""

    gpu_memory_utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int


@dataclass
class Evaluation:
    layout: Layout
    stages: list[RankBudget]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.errors

    @property
    def constrained(self) -> RankBudget:
        """The stage whose rank holds the fewest sequences: it caps the whole engine."""
        return min(self.stages, key=lambda s: (s.max_sequences, s.kv_cache_bytes))

    @property
    def sequences_per_replica(self) -> int:
        best = self.constrained.max_sequences
        return int(best) if best != float("inf") else 0

    @property
    def max_concurrency(self) -> int:
        return self.sequences_per_replica * self.layout.dp

    @property
    def kv_tokens_per_replica(self) -> int:
        # The engine allocates the same number of blocks on every stage: the minimum.
        return min(s.kv_tokens for s in self.stages)

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
    return errors


@dataclass(frozen=True)
class StageFigures:
    """What one rank of a pipeline stage holds, independent of the GPU and knobs
    other than TP, the KV element size and max-model-len."""

    layers: tuple
    weights: int
    kv_per_token: int
    kv_per_sequence: int


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


def stage_figures(
    arch: ModelArch,
    pp: int,
    tp: int,
    kv_bytes: int,
    seq_len: int,
    *,
    expert_parallel: bool = False,
    compute_capability: float | None = None,
) -> list[StageFigures]:
    """`expert_parallel` and the GPU's `compute_capability` only change quantised
    experts that vLLM pads for the GPU's MoE kernel (gpt-oss MXFP4)."""
    cache = _model_cache(arch)
    if "quantised" not in cache:
        cache["quantised"] = any(g.scheme is not None for layer in arch.layers for g in layer.params)
    if not cache["quantised"]:
        expert_parallel, compute_capability = False, None  # the same figures either way
    key = (pp, tp, kv_bytes, seq_len, expert_parallel, compute_capability)
    if key not in cache:
        groups = memory.stage_layers(arch, pp)
        cache[key] = [
            StageFigures(
                layers=layers,
                weights=memory.stage_weight_bytes(
                    arch, layers, first=i == 0, last=i == len(groups) - 1, tp=tp, expert_shards=tp,
                    expert_parallel=expert_parallel, compute_capability=compute_capability,
                ),
                kv_per_token=memory.bytes_per_token(layers, tp, kv_bytes),
                kv_per_sequence=memory.bytes_per_sequence(layers, tp, kv_bytes, seq_len),
            )
            for i, layers in enumerate(groups)
        ]
    return cache[key]


def evaluate(arch: ModelArch, itype: InstanceType, nodes: int, layout: Layout, knobs: Knobs) -> Evaluation:
    """The per-rank memory budget of every pipeline stage of one layout."""
    errors = layout_errors(arch, itype, nodes, layout)
    if errors:
        return Evaluation(layout, [], errors)
    gpu = itype.gpu
    kv_bytes = memory.kv_element_bytes(layout.kv_cache_dtype, arch.model_dtype)
    comm = memory.comm_buffer_bytes(
        tp=layout.tp,
        pp=layout.pp,
        expert_parallel=layout.expert_parallel,
        ep_size=layout.ep,
        gpus_per_node=itype.gpu_count,
    )
    stages = []
    figures = stage_figures(
        arch, layout.pp, layout.tp, kv_bytes, knobs.max_model_len,
        expert_parallel=layout.expert_parallel, compute_capability=float(gpu.compute_capability),
    )
    for i, fig in enumerate(figures):
        activation = memory.activation_peak_bytes(
            arch,
            fig.layers,
            last=i == len(figures) - 1,
            tp=layout.tp,
            max_num_batched_tokens=knobs.max_num_batched_tokens,
            max_num_seqs=knobs.max_num_seqs,
        )
        stages.append(
            memory.rank_budget(
                stage=i,
                layers=fig.layers,
                visible=gpu.visible_memory_bytes,
                utilization=knobs.gpu_memory_utilization,
                weights=fig.weights,
                activation=activation,
                comm=comm,
                kv_bytes_per_token=fig.kv_per_token,
                kv_bytes_per_sequence=fig.kv_per_sequence,
                block_size=knobs.block_size,
                distributed=layout.tp * layout.pp > 1,
            )
        )
    ev = Evaluation(layout, stages)
    ev.errors.extend(memory_errors(arch, itype, nodes, ev, knobs))
    return ev


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
    if gpu.visible_memory_bytes - int(util * gpu.visible_memory_bytes) < context:
        errors.append(
            f"gpu-memory-utilization {util:.2f} leaves {_gib((1 - util) * gpu.visible_memory_bytes)} per GPU, "
            f"less than the CUDA context and NCCL communicators ({_gib(context)}) that exist before vLLM starts: "
            "vLLM refuses to start; lower it"
        )
    worst = max(ev.stages, key=lambda s: s.weights_bytes)
    if worst.weights_bytes > worst.usable_bytes:
        lay = ev.layout
        gpus = lay.tp * lay.pp
        errors.append(
            f"the weights do not fit: {arch.name} in {arch.weight_format} needs {_gb(total_weight_bytes(arch))} of weights, "
            f"{_gb(worst.weights_bytes)} on the fullest GPU at TP {lay.tp} x PP {lay.pp}; "
            f"{gpus} x {gpu.name} hold {_gb(gpus * gpu.visible_memory_bytes)} as CUDA reports it "
            f"({_gb(gpu.visible_memory_bytes)} each), {_gb(gpus * worst.usable_bytes)} usable at "
            f"gpu-memory-utilization {util:.2f} ({_gb(worst.usable_bytes)} each)"
        )
        return errors
    tight = ev.constrained
    if tight.kv_cache_bytes <= 0 or tight.max_sequences < 1:
        errors.append(
            f"no room for one sequence of max-model-len {knobs.max_model_len:,} tokens on stage {tight.stage}: "
            f"it needs {_gib(tight.kv_bytes_per_sequence)} of KV cache per GPU, and "
            f"{_gib(tight.usable_bytes)} usable - {_gib(tight.weights_bytes)} weights - "
            f"{_gib(tight.activation_bytes)} activations - {_gib(tight.comm_buffer_bytes)} communication buffers "
            f"- {_gib(memory.NON_TORCH_BASE_BYTES)} non-torch leaves {_gib(tight.kv_cache_bytes)}"
        )
    return errors
