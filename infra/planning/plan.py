"""The Plan: one object with every number the cluster and the serving engine need."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from infra.catalog.arch import ModelArch
from infra.catalog.instances import INSTANCE_TYPES, InstanceType, get_instance_type
from infra.catalog.models import (
    checkpoint_repo,
    load_model,
    params_active,
    params_total,
    published_variants,
    weight_bytes,
    with_weight_format,
)
from infra.errors import UserError
from infra.planning import memory, model_serving, serving, startup
from infra.planning.contract import Deployment, GpuNodes, ServeCommand
from infra.planning.cost import CostLines, cost_lines
from infra.planning.layout import Evaluation, Knobs, Layout, divisors, evaluate
from infra.planning.memory import KV_DTYPE_BYTES, RankBudget
from infra.planning.request import GPU_MEMORY_UTILIZATION_RANGE, KV_CACHE_DTYPES, WEIGHT_FORMAT_CHOICES, PlanRequest

MAX_SEARCH_NODES = 16  # cheapest-hardware search: node counts tried per instance type


@dataclass
class Plan:
    request: PlanRequest
    model: ModelArch
    checkpoint: str | None  # Hugging Face repository (or path) of the weights to serve; None if none is published
    weight_format: str | None  # the --weight-format planned with; None: the checkpoint's own
    instance: InstanceType
    nodes: int
    knobs: Knobs
    evaluation: Evaluation
    serving_args: list[str]
    pod: serving.PodResources
    ray_params: dict[str, str]
    storage: serving.Storage
    cost: CostLines
    warnings: list[str] = field(default_factory=list)
    alternatives: list[Evaluation] = field(default_factory=list)  # other layouts considered, best first

    @property
    def startup(self) -> startup.Startup:
        """Cold start, probe budget, Pulumi's wait and vLLM's timeouts (infra/planning/startup.py)."""
        return startup.startup_plan(self.storage, self.pod)

    @property
    def layout(self) -> Layout:
        return self.evaluation.layout

    @property
    def feasible(self) -> bool:
        return self.evaluation.feasible

    @property
    def errors(self) -> list[str]:
        return list(self.evaluation.errors)

    @property
    def stages(self) -> list[RankBudget]:
        return self.evaluation.stages

    @property
    def constrained(self) -> RankBudget | None:
        return self.evaluation.constrained if self.stages else None

    def deployment(self) -> Deployment:
        """The typed figures the components take (infra/planning/contract.py); refuses a plan it cannot serve."""
        if not self.feasible:
            raise UserError("the plan does not fit, so there is nothing to deploy: " + "; ".join(self.errors or ["infeasible"]))
        if not self.checkpoint:
            raise UserError(f"no published checkpoint of {self.model.name} is known: the serving layer needs weights to load")
        if self.pod.gpus != self.instance.gpu_count:
            raise UserError("the plan's pod does not take all of the node's GPUs; the serving layer runs one pod per node")
        return Deployment(
            nodes=GpuNodes(
                instance_type=self.instance.name,
                count=self.nodes,
                gpus_per_node=self.instance.gpu_count,
                efa_interfaces=self.pod.efa_interfaces,
                root_volume_gib=serving.ROOT_VOLUME_GIB,
            ),
            pod=self.pod,
            ray_start_params=tuple(self.ray_params.items()),
            storage=self.storage,
            startup=self.startup,
            serve=ServeCommand(checkpoint=self.checkpoint, vllm_args=tuple(self.serving_args)),
        )

    def to_json_dict(self) -> dict:
        arch, lay, tight = self.model, self.layout, self.constrained
        per_rank = {}
        if tight is not None:
            per_rank = {
                "stage": tight.stage,
                "gpu_visible_bytes": tight.gpu_visible_bytes,
                "weights_bytes": tight.weights_bytes,
                "activation_bytes": tight.activation_bytes,
                "kv_cache_bytes": tight.kv_cache_bytes,
                "comm_buffer_bytes": tight.comm_buffer_bytes,
                "cuda_overhead_bytes": tight.cuda_overhead_bytes,
                "headroom_bytes": tight.headroom_bytes,
            }
        return {
            "model": {
                "name": arch.name,
                "checkpoint": self.checkpoint,
                "model_type": arch.model_type,
                "params_total": params_total(arch),
                # Input embedding left out (a lookup, not compute), as DeepSeek, Kimi and OpenAI count.
                "params_active": params_active(arch, include_embedding=False),
                "weight_bytes": weight_bytes(arch),
                "weight_format": arch.weight_format,
            },
            "instance": {"type": self.instance.name, "gpu": self.instance.gpu.name},
            "layout": {
                "tp": lay.tp,
                "pp": lay.pp,
                "ep": lay.ep,
                "dp": lay.dp,
                "expert_parallel": lay.expert_parallel,
                "nodes": self.nodes,
                "gpus_per_node": self.instance.gpu_count,
                "layers_per_stage": [s.layers for s in self.stages],
            },
            "per_rank": per_rank,
            "stages": [asdict(s) for s in self.stages],
            "kv_cache": {
                "dtype": lay.kv_cache_dtype,
                "tokens": self.evaluation.kv_tokens if self.stages else 0,
                "tokens_per_replica": self.evaluation.kv_tokens_per_replica if self.stages else 0,
                "bytes_per_token": tight.kv_bytes_per_token if tight else 0,
                "bytes_per_sequence": tight.kv_bytes_per_sequence if tight else 0,
                "max_concurrency": self.evaluation.max_concurrency if self.stages else 0,
                "max_model_len": self.knobs.max_model_len,
                "block_size": self.knobs.block_size,
            },
            "vllm_args": list(self.serving_args),
            "ray_start_params": dict(self.ray_params),
            "pod": asdict(self.pod),
            "node": {"root_volume_gib": serving.ROOT_VOLUME_GIB},
            "storage": asdict(self.storage),
            "startup": asdict(self.startup),
            "feasible": self.feasible,
            "errors": self.errors,
            "warnings": list(self.warnings),
            "assumptions": list(self.model.notes),
            "cost": asdict(self.cost),
        }


# --- Input checks --------------------------------------------------------------


def _check_request(req: PlanRequest) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise UserError(msg)

    low, high = GPU_MEMORY_UTILIZATION_RANGE  # the stack config takes the same range
    need(low <= req.gpu_memory_utilization <= high, f"gpu-memory-utilization must be in {low}..{high}, got {req.gpu_memory_utilization}")
    need(req.kv_cache_dtype is None or req.kv_cache_dtype in KV_CACHE_DTYPES, f"kv-cache-dtype {req.kv_cache_dtype!r} is not one of vLLM's: {', '.join(KV_CACHE_DTYPES)}")
    need(req.weight_format is None or req.weight_format in WEIGHT_FORMAT_CHOICES,
         f"weight format {req.weight_format!r} is not one of: {', '.join(WEIGHT_FORMAT_CHOICES)}")  # fmt: skip
    for name in ("tp", "pp", "dp", "max_model_len", "max_num_batched_tokens", "max_num_seqs"):
        value = getattr(req, name)
        need(value is None or value >= 1, f"{name.replace('_', '-')} must be at least 1, got {value}")
    if req.objective == "min-cost":
        need(bool(req.target_concurrency), "the min-cost objective needs a target concurrency (sequences at max-model-len)")
    else:
        need(req.instance_type is not None and req.nodes is not None, "an instance type and a node count are needed")
        need(req.nodes >= 1, f"nodes must be at least 1, got {req.nodes}")


def _knobs(req: PlanRequest, arch: ModelArch, itype: InstanceType) -> Knobs:
    visible = itype.gpu.visible_memory_bytes
    max_len = req.max_model_len or min(arch.max_position_embeddings or serving.DEFAULT_MAX_MODEL_LEN_CAP, serving.DEFAULT_MAX_MODEL_LEN_CAP)
    kinds = {spec.kind for layer in arch.layers for spec in layer.caches}
    return Knobs(
        gpu_memory_utilization=req.gpu_memory_utilization,
        max_model_len=max_len,
        max_num_batched_tokens=req.max_num_batched_tokens or serving.default_batched_tokens(visible),
        max_num_seqs=req.max_num_seqs or serving.default_max_num_seqs(visible),
        block_size=serving.BLOCK_SIZE_MLA if serving.uses_mla_blocks(kinds) else serving.BLOCK_SIZE_DEFAULT,
    )


# --- Candidates --------------------------------------------------------------


def candidate_layouts(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int) -> list[Layout]:
    """Every layout the search tries (or just the one the request pins down).

    Searched: TP over the divisors of a node's GPUs; PP > 1 only with whole-node
    stages (TP = GPUs per node) over a divisor of the node count; the rest of the
    GPUs as replicas; expert parallel off and on for MoE models; the model's own
    KV dtype, and FP8 KV where the GPU supports FP8.
    """
    gpn = itype.gpu_count
    total = gpn * nodes
    pairs = []
    for tp in divisors(gpn):
        if req.tp and tp != req.tp:
            continue
        # Whole-node stages, and PP only when it takes every node (vLLM has no PP with DP).
        pps = [1] + ([nodes] if tp == gpn and nodes > 1 else [])
        if req.pp:
            pps = [req.pp]
        for pp in pps:
            if total % (tp * pp):
                continue
            dp = total // (tp * pp)
            if req.dp and dp != req.dp:
                continue
            pairs.append((tp, pp, dp))
    if req.tp and req.tp > gpn:
        pairs.append((req.tp, req.pp or 1, req.dp or max(1, total // (req.tp * (req.pp or 1)))))
    if not pairs and (req.tp or req.pp or req.dp):
        tp, pp = req.tp or 1, req.pp or 1
        pairs.append((tp, pp, req.dp or max(1, total // (tp * pp))))
    eps = [False, True] if arch.num_experts else [False]
    if req.expert_parallel is not None:
        eps = [req.expert_parallel]
    kvs = [req.kv_cache_dtype] if req.kv_cache_dtype else ["auto"] + (["fp8"] if itype.gpu.supports_fp8 else [])
    return [Layout(tp, pp, dp, ep, kv) for tp, pp, dp in pairs for ep in eps for kv in kvs if not (ep and tp == 1)]


def _rank_key(ev: Evaluation):
    """Best first: feasible; the model's own KV dtype before FP8 (FP8 KV is a
    fallback, it costs accuracy); most concurrent sequences at max-model-len; most
    KV tokens; fewer pipeline stages; no expert parallel unless it wins. Among
    layouts that do not fit, the one that comes closest (least weight on its
    fullest GPU) comes first, so its errors are the ones reported."""
    lay = ev.layout
    closest = max((s.weights_bytes for s in ev.stages), default=float("inf"))
    return (
        not ev.feasible,
        0 if ev.feasible else closest,
        lay.kv_cache_dtype != "auto" and KV_DTYPE_BYTES.get(lay.kv_cache_dtype) is not None,
        -ev.max_concurrency if ev.feasible else 0,
        -ev.kv_tokens if ev.feasible else 0,
        lay.pp,
        lay.expert_parallel,
    )


def search(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int, knobs: Knobs) -> list[Evaluation]:
    return sorted((evaluate(arch, itype, nodes, lay, knobs) for lay in candidate_layouts(req, arch, itype, nodes)), key=_rank_key)


# --- The plan --------------------------------------------------------------------


@dataclass(frozen=True)
class ModelOption:
    arch: ModelArch
    checkpoint: str | None
    weight_format: str | None  # None: the checkpoint's own


def model_options(req: PlanRequest) -> list[ModelOption]:
    """The weights to plan with, in order of preference: the format asked for; or
    the model's own checkpoint, then its other published checkpoints (larger
    formats first), used only when the ones before do not fit."""
    arch = load_model(req.model)
    variants = published_variants(req.model)
    if req.weight_format:
        return [ModelOption(with_weight_format(arch, req.weight_format), variants.get(req.weight_format), req.weight_format)]
    options = [ModelOption(arch, checkpoint_repo(req.model), None)]
    for fmt, repo in variants.items():
        options.append(ModelOption(with_weight_format(arch, fmt), repo, fmt))
    return options


def _cheapest(req: PlanRequest, arch: ModelArch) -> tuple[InstanceType, int, list[Evaluation]]:
    """Cheapest instance type and node count whose best layout holds the target concurrency."""
    choices = []
    types = [get_instance_type(req.instance_type)] if req.instance_type else list(INSTANCE_TYPES.values())
    for itype in types:
        knobs = _knobs(req, arch, itype)
        node_counts = [req.nodes] if req.nodes else range(1, (req.max_nodes or MAX_SEARCH_NODES) + 1)
        for nodes in node_counts:
            ranked = search(req, arch, itype, nodes, knobs)
            if ranked and ranked[0].feasible and ranked[0].max_concurrency >= req.target_concurrency:
                choices.append((itype.price_usd_per_hour * nodes, -ranked[0].max_concurrency, itype.name, nodes, itype, ranked))
                break  # more nodes of the same type only cost more
    if not choices:
        raise UserError(
            f"no instance type in the catalog holds {req.target_concurrency} concurrent sequences of "
            f"{arch.name} within {req.max_nodes or MAX_SEARCH_NODES} nodes"
        )
    _, _, _, nodes, itype, ranked = min(choices, key=lambda c: c[:4])
    return itype, nodes, ranked


def make_plan(req: PlanRequest) -> Plan:
    _check_request(req)
    options = model_options(req)
    option, fallback_note = options[0], None
    if req.objective == "min-cost":
        itype, nodes, ranked = _cheapest(req, option.arch)
    else:
        itype, nodes = get_instance_type(req.instance_type), req.nodes
        ranked = []
        for candidate in options:
            tried = search(req, candidate.arch, itype, nodes, _knobs(req, candidate.arch, itype))
            if not ranked:
                ranked, option = tried, candidate  # the preferred option's errors, if nothing fits
            if tried and tried[0].feasible:
                if candidate is not options[0]:
                    fallback_note = (
                        f"the model's own checkpoint does not fit ({ranked[0].errors[0] if ranked[0].errors else 'no layout'}); "
                        f"planned with its published {candidate.weight_format} checkpoint {candidate.checkpoint}"
                    )
                ranked, option = tried, candidate
                break
    if not ranked:
        raise UserError(f"no layout to try for {nodes} x {itype.name}")
    arch = option.arch
    knobs = _knobs(req, arch, itype)
    best = ranked[0]
    warnings = ([fallback_note] if fallback_note else []) + _warnings(req, arch, itype, best)
    if req.weight_format and option.checkpoint is None:
        warnings.append(
            f"no published {req.weight_format} checkpoint of {req.model} is known: serve one you quantised "
            "(vLLM does not convert between 4-bit and 8-bit formats at load time)"
        )

    # max-num-seqs: what the KV cache holds at a typical context, capped at vLLM's
    # default. The budget keeps the profile run at the cap (more sampler logits),
    # so the derived value only ever leaves more room than planned.
    max_num_seqs = knobs.max_num_seqs
    if req.max_num_seqs is None and best.feasible:
        typical = min(knobs.max_model_len, serving.TYPICAL_CONTEXT_TOKENS)
        tight = best.constrained
        fits = tight.kv_cache_bytes // max(_seq_bytes(arch, best, tight.stage, typical), 1)
        max_num_seqs = max(1, min(knobs.max_num_seqs, int(fits)))

    lay = best.layout
    pod = serving.pod_resources(itype)
    storage = startup.storage_plan(
        checkpoint_bytes=weight_bytes(arch, include_mtp=True),
        nodes=nodes,
        cold_start_target_s=req.cold_start_target_s,
    )
    if best.feasible and storage.estimated_cold_start_s > req.cold_start_target_s:
        warnings.append(
            f"estimated cold start {storage.estimated_cold_start_s:,.0f} s exceeds the target "
            f"{req.cold_start_target_s:,.0f} s: each node reads {storage.per_node_read_bytes / 1e9:,.0f} GB "
            f"at most at {serving.NFS_CLIENT_BYTES_PER_S / 2**20:,.0f} MiB/s per NFS client"
        )
    cost = cost_lines(
        price_usd_per_hour=itype.price_usd_per_hour,
        nodes=nodes,
        tco_categories=req.tco.categories if req.tco else None,
        api_price_usd_per_mtok=req.api_price_usd_per_mtok,
        throughput_tokens_per_s=req.throughput_tokens_per_s,
    )
    args = serving.vllm_args(
        tp=lay.tp,
        pp=lay.pp,
        dp=lay.dp,
        expert_parallel=lay.expert_parallel,
        gpu_memory_utilization=knobs.gpu_memory_utilization,
        max_model_len=knobs.max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        kv_cache_dtype=lay.kv_cache_dtype,
    )
    return Plan(
        request=req,
        model=arch,
        checkpoint=option.checkpoint,
        weight_format=option.weight_format,
        instance=itype,
        nodes=nodes,
        knobs=knobs,
        evaluation=best,
        serving_args=args + model_serving.model_args(arch),
        pod=pod,
        ray_params=serving.ray_start_params(pod),
        storage=storage,
        cost=cost,
        warnings=warnings + best.warnings,
        alternatives=ranked[1:],
    )


def _seq_bytes(arch: ModelArch, ev: Evaluation, stage: int, seq_len: int) -> int:
    layers = memory.stage_layers(arch, ev.layout.pp)[stage]
    kv_bytes = memory.kv_element_bytes(ev.layout.kv_cache_dtype, arch.model_dtype)
    return memory.bytes_per_sequence(layers, ev.layout.tp, kv_bytes, seq_len)


def _warnings(req: PlanRequest, arch: ModelArch, itype: InstanceType, ev: Evaluation) -> list[str]:
    out = []
    lay = ev.layout
    if lay.pp > 1 and lay.tp < itype.gpu_count:
        out.append(
            f"pipeline stages share a node (TP {lay.tp} < {itype.gpu_count} GPUs per node): "
            "NVLink would serve tensor parallelism better"
        )
    if req.kv_cache_dtype is None and lay.kv_cache_dtype != "auto":
        out.append(f"KV cache in {lay.kv_cache_dtype}: the model's own dtype leaves no room at this max-model-len")
    if ev.stages:
        tight = ev.constrained
        if tight.headroom_bytes < 0:
            out.append(
                f"headroom is {tight.headroom_bytes / 2**30:.2f} GiB: the CUDA context and CUDA graphs, which vLLM "
                "does not count, do not fit in 1 - gpu-memory-utilization; lower the utilization"
            )
    return out
