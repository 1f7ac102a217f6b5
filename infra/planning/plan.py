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
    variant_arch,
    weight_bytes,
)
from infra.errors import UserError
from infra.planning import cudagraph, kv_cache, memory, model_serving, performance, serving, startup, system_nodes
from infra.planning.monitoring_sizing import Shape
from infra.planning.contract import Deployment, GpuNodes, ServeCommand
from infra.planning.cost import CostLines, cost_lines
from infra.planning.cold_start_cost import ColdStartCost, cold_start_cost
from infra.planning.layout import Evaluation, Knobs, Layout, divisors, evaluate, shares_moe_layers
from infra.planning.memory import KV_DTYPE_BYTES, GiB, RankBudget
from infra.planning.request import (
    GPU_MEMORY_UTILIZATION_RANGE,
    KV_CACHE_DTYPES,
    SPECULATIVE_CHOICES,
    SPECULATIVE_METHODS,
    WEIGHT_FORMAT_CHOICES,
    PlanRequest,
)
from infra.planning.performance import performance_json
from infra.planning.sla_search import (
    by_sla_throughput,
    choose_max_num_seqs,
    defaults_note,
    mtp_note,
    describe_layout,
    layout_capacity,
    perf_setup,
    settle_max_num_seqs,
)
from infra.planning.vllm_release import Release, release

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
    max_num_seqs: int = 0  # the --max-num-seqs the plan passes
    max_num_seqs_bound: str = ""  # what set it (_max_num_seqs)
    speculative: dict | None = None  # the --speculative-config the plan passes
    performance: performance.Capacity | None = None  # what the layout delivers against the SLA; None: no SLA given
    runner_up: dict | None = None  # the objective's second choice and why the plan's beat it
    benchmark: performance.BenchmarkLoad | None = None  # what the benchmark Job sends, and the prediction for it

    @property
    def system_request(self) -> system_nodes.SystemRequest | None:
        """The system pods' inputs: Prometheus sized from this plan's shape as components/stack.py sizes it."""
        system = self.request.system
        if system is None:
            return None
        shape = Shape(gpu_nodes=self.nodes, gpus_per_node=self.instance.gpu_count, vcpus_per_gpu_node=self.instance.vcpus,
                      system_nodes=system.count, engines=self.evaluation.layout.dp, ray_pods=self.nodes)  # fmt: skip
        return system_nodes.request_for(system, shape)

    @property
    def system_nodes(self) -> system_nodes.Fit | None:
        """The system pods against the system node group (infra/planning/system_nodes.py); None: not asked."""
        req = self.system_request
        return system_nodes.fit(req) if req is not None else None

    @property
    def startup(self) -> startup.Startup:
        """Cold start, probe budget, Pulumi's wait and vLLM's timeouts (infra/planning/startup.py)."""
        return startup.startup_plan(self.storage, self.pod)

    @property
    def cold_start_cost(self) -> ColdStartCost:
        """One cold start's storage reads and GPU wait, and the first `up`'s staging (infra/planning/cold_start_cost.py)."""
        return cold_start_cost(
            storage_kind=self.request.storage_kind,
            checkpoint_bytes=self.storage.checkpoint_bytes,
            nodes=self.nodes,
            cold_start_s=self.startup.cold_start_s,
            gpu_usd_per_hour=self.cost.hourly_usd,
        )

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

    def _kv_json(self) -> dict:
        ev, tight = self.evaluation, self.constrained
        out = {
            "dtype": self.layout.kv_cache_dtype,
            "tokens": ev.kv_tokens if self.stages else 0,
            "tokens_per_replica": ev.kv_tokens_per_replica if self.stages else 0,
            "bytes_per_token": tight.kv_bytes_per_token if tight else 0,
            "max_concurrency": ev.max_concurrency if self.stages else 0.0,
            "max_concurrency_per_replica": ev.max_concurrency_per_replica if self.stages else 0.0,
            "max_model_len": self.knobs.max_model_len,
            "block_size": ev.kv.block_size if ev.kv else 0,
            "num_blocks": ev.num_blocks if self.stages else 0,
            "bytes_per_block": tight.kv_bytes_per_block if tight else 0,
            "blocks_per_request": ev.request_blocks if self.stages else 0,
            "bytes_per_request": ev.request_blocks * tight.kv_bytes_per_block if tight else 0,
            "groups": [],
        }
        if ev.kv and tight is not None:
            on_rank = ev.kv.stage_groups[tight.stage]
            for group, layers in zip(ev.kv.groups, on_rank):
                out["groups"].append(
                    {
                        "kind": group.kind,
                        "layers": len(group.layers),
                        "layers_on_rank": len(layers),
                        "block_size": group.block_size,
                        "page_bytes": sum(layer.page_bytes for layer in layers),
                        "layer_page_bytes": list(group.page_sizes),
                        "blocks_per_request": kv_cache.blocks_per_request(group.first, ev.admission),
                    }
                )
        return out

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

    def _max_capture_size(self) -> int:
        """The largest batch vLLM captures a CUDA graph for at the --max-num-seqs passed
        (cudagraph.capture_sizes, as the memory budget counts them)."""
        k, gpu = self.knobs, self.instance.gpu
        return max(cudagraph.capture_sizes(
            k.release, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=k.max_num_batched_tokens,
            decode_query_len=1 + k.num_speculative_tokens, sm100=gpu.compute_capability.startswith("10"),
            ceiling=cudagraph.model_ceiling(k.release, self.model.model_type)))  # fmt: skip

    def to_json_dict(self) -> dict:
        arch, lay, tight, ev = self.model, self.layout, self.constrained, self.evaluation
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
                "cudagraph_bytes": tight.cudagraph_bytes,
                "cudagraph_estimate_bytes": tight.cudagraph_estimate_bytes,
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
            "kv_cache": self._kv_json(),
            "vllm": {
                "version": self.knobs.release.version,
                "async_scheduling": self.knobs.async_scheduling,
                "max_num_batched_tokens": self.knobs.max_num_batched_tokens,
                "max_num_seqs": self.max_num_seqs,
                "max_num_seqs_bound": self.max_num_seqs_bound,
                "cudagraph_max_capture_size": self._max_capture_size(),
                "speculative": self.speculative,
                "extensible_kv_cache": self.knobs.release.extensible_kv_cache,
                "cudagraph_accounting": _cudagraph_accounting(self.knobs.release),
                "sliding_window_in_flight_tokens": ev.admission.sliding_tokens if ev.admission else 0,
                "notes": list(ev.notes),
            },
            "vllm_args": list(self.serving_args),
            "ray_start_params": dict(self.ray_params),
            "pod": asdict(self.pod),
            "node": {"root_volume_gib": serving.ROOT_VOLUME_GIB},
            "storage": asdict(self.storage),
            "system_nodes": self.system_nodes.to_json_dict() if self.system_nodes else None,
            "startup": asdict(self.startup),
            "feasible": self.feasible,
            "errors": self.errors,
            "warnings": list(self.warnings),
            "assumptions": list(self.model.notes),
            "cost": asdict(self.cost),
            "cold_start_cost": asdict(self.cold_start_cost),
            "objective": self.request.objective,
            "runner_up": self.runner_up,
            "performance": {**performance_json(self.performance, self.model.model_type), "benchmark": asdict(self.benchmark) if self.benchmark else None}
            if self.performance else None,
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
    for name in ("tp", "pp", "dp", "max_model_len", "max_num_batched_tokens", "max_num_seqs", "num_speculative_tokens"):
        value = getattr(req, name)
        need(value is None or value >= 1, f"{name.replace('_', '-')} must be at least 1, got {value}")
    release(req.vllm_version)  # refuses a release outside the supported range
    need(req.speculative_method is None or req.speculative_method in SPECULATIVE_CHOICES,
         f"speculative method {req.speculative_method!r} is not one the planner accounts for: {', '.join(SPECULATIVE_CHOICES)}")  # fmt: skip
    need(req.num_speculative_tokens is None or req.speculative_method in SPECULATIVE_METHODS,
         "num-speculative-tokens needs a speculative method (mtp)")  # fmt: skip
    if req.max_num_batched_tokens and req.max_num_seqs:
        # config/scheduler.py SchedulerConfig.verify_max_model_len
        need(req.max_num_batched_tokens >= req.max_num_seqs,
             f"max-num-batched-tokens ({req.max_num_batched_tokens}) must be at least max-num-seqs ({req.max_num_seqs}), as vLLM requires")  # fmt: skip
    if req.objective == "min-cost":
        need(bool(req.target_concurrency), "the min-cost objective needs a target concurrency (sequences at max-model-len)")
    else:
        need(req.instance_type is not None and req.nodes is not None, "an instance type and a node count are needed")
        need(req.nodes >= 1, f"nodes must be at least 1, got {req.nodes}")


def _speculative_tokens(req: PlanRequest, arch: ModelArch) -> int:
    if req.speculative_method in (None, "off"):
        return 0
    if not arch.mtp_layers:
        raise UserError(f"{arch.name} has no multi-token-prediction layers: speculative method {req.speculative_method!r} needs them")
    return req.num_speculative_tokens or 1


def _knobs(req: PlanRequest, arch: ModelArch, itype: InstanceType) -> Knobs:
    """vLLM's defaults for this release and GPU, where the request leaves a knob open."""
    r = release(req.vllm_version)
    visible, name = itype.gpu.visible_memory_bytes, itype.gpu.name
    max_len = req.max_model_len or min(arch.max_position_embeddings or serving.DEFAULT_MAX_MODEL_LEN_CAP, serving.DEFAULT_MAX_MODEL_LEN_CAP)
    batched, seqs = serving.batch_knobs(req.max_num_batched_tokens, req.max_num_seqs, max_len, visible, name, r)
    return Knobs(
        gpu_memory_utilization=req.gpu_memory_utilization,
        max_model_len=max_len,
        max_num_batched_tokens=batched,
        max_num_seqs=seqs,
        release=r,
        async_scheduling=r.async_scheduling(ray=True) if req.async_scheduling is None else req.async_scheduling,
        num_speculative_tokens=_speculative_tokens(req, arch),
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
    return [Layout(tp, pp, dp, ep, kv) for tp, pp, dp in pairs for ep in eps for kv in kvs if not (ep and tp * dp == 1)]


def _batch_options(req: PlanRequest, arch: ModelArch, knobs: Knobs, windowed: bool = True) -> list[tuple[int, bool]]:
    """(max-num-batched-tokens, async scheduling) pairs the search tries besides vLLM's
    defaults: smaller chunks and synchronous scheduling shrink what each request
    reserves in sliding-window and state groups (max_in_flight_tokens); smaller chunks
    also shrink the activations of MoE layers that run every replica's tokens, which async
    scheduling does not change (`windowed` False: no window or state group to reserve for)."""
    mnbts = [req.max_num_batched_tokens] if req.max_num_batched_tokens else serving.searched_batched_tokens(knobs.max_num_batched_tokens)
    asyncs = [knobs.async_scheduling]
    if windowed and req.async_scheduling is None and knobs.async_scheduling and knobs.release.at_least("0.26"):
        asyncs.append(False)  # before 0.26 the reservation does not depend on it
    # config/scheduler.py: max-num-batched-tokens must be at least a pinned max-num-seqs (a derived
    # one is capped at it).
    options = [(m, a) for m in mnbts for a in asyncs if m >= (req.max_num_seqs or 1)]
    return [o for o in options if o != (knobs.max_num_batched_tokens, knobs.async_scheduling)]


def _has_windowed_groups(ev: Evaluation) -> bool:
    return bool(ev.kv) and any(g.first.spec in ("sliding", "sliding_mla") for g in ev.kv.groups)


def tune(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int, layout: Layout, knobs: Knobs) -> Evaluation:
    """The layout at vLLM's defaults, or at the batch knobs that admit clearly more.

    A sliding-window or compressor-state group reserves window - 1 + in-flight
    tokens per request, and in-flight = max_concurrent_batches (PP + 1 with async
    scheduling) x max-num-batched-tokens. The search keeps vLLM's defaults unless
    another choice holds BATCH_KNOB_GAIN more sequences at max-model-len; among
    choices within 2% of the best it takes the one nearest the defaults (async
    on, then the largest chunk). Replicas of a MoE model try smaller chunks too: each MoE
    layer's activations hold DP x max-num-batched-tokens tokens."""
    base = evaluate(arch, itype, nodes, layout, knobs)
    if not base.stages or any("weights do not fit" in e for e in base.errors):
        return base
    windowed = _has_windowed_groups(base)
    if not windowed and not shares_moe_layers(arch, layout):
        return base
    options = _batch_options(req, arch, knobs, windowed)
    if not options:
        return base

    def at(option: tuple[int, bool]) -> Evaluation:
        return evaluate(arch, itype, nodes, layout, knobs.replace(max_num_batched_tokens=option[0], async_scheduling=option[1]))

    # Concurrency only grows as the chunk shrinks and without async scheduling (fewer
    # in-flight tokens reserved, a smaller activation peak), so the smallest chunk
    # without async scheduling is the best any option reaches.
    extreme = at(min(options, key=lambda o: (o[1], o[0])))
    if not extreme.feasible or (base.feasible and extreme.max_concurrency < base.max_concurrency * (1 + serving.BATCH_KNOB_GAIN)):
        return base
    top = extreme.max_concurrency
    chosen = extreme
    # Nearest the defaults first: async scheduling as vLLM has it, then the largest chunk.
    for option in sorted(options, key=lambda o: (o[1] != knobs.async_scheduling, -o[0])):
        ev = extreme if option == (extreme.knobs.max_num_batched_tokens, extreme.knobs.async_scheduling) else at(option)
        if ev.feasible and ev.max_concurrency >= top * 0.98:
            chosen = ev
            break
    chosen.notes.append(_batch_note(base, chosen))
    return chosen


def _batch_note(base: Evaluation, chosen: Evaluation) -> str:
    b, c = base.knobs, chosen.knobs
    adm_b, adm_c = base.admission, chosen.admission
    if not _has_windowed_groups(chosen):  # replicas of a MoE model (tune)
        before = f"{base.max_concurrency:,.2f}" if base.feasible else "none (it does not fit)"
        return (
            f"--max-num-batched-tokens {c.max_num_batched_tokens} (vLLM's default {b.max_num_batched_tokens}): each MoE "
            f"layer runs the tokens of all {chosen.layout.dp} replicas, so its activations shrink with the chunk: "
            f"{chosen.constrained.activation_bytes / GiB:,.2f} GiB per GPU instead of "
            f"{base.constrained.activation_bytes / GiB:,.2f} GiB; "
            f"max concurrency at max-model-len {c.max_model_len:,}: {chosen.max_concurrency:,.2f} instead of {before}"
        )
    what = []
    if c.max_num_batched_tokens != b.max_num_batched_tokens:
        what.append(f"--max-num-batched-tokens {c.max_num_batched_tokens} (vLLM's default {b.max_num_batched_tokens})")
    if c.async_scheduling != b.async_scheduling:
        what.append("--no-async-scheduling" if not c.async_scheduling else "--async-scheduling")
    before = f"{base.max_concurrency:,.2f}" if base.feasible else "none (it does not fit)"
    return (
        f"{' and '.join(what)}: each sliding-window and compressor-state group reserves window - 1 + "
        f"{adm_c.sliding_tokens:,} in-flight tokens per request instead of {adm_b.sliding_tokens:,} "
        f"(max_concurrent_batches x max-num-batched-tokens): {chosen.request_blocks:,} blocks per request instead of "
        f"{base.request_blocks:,} (blocks of {chosen.constrained.kv_bytes_per_block:,} B on stage {chosen.constrained.stage}); "
        f"max concurrency at max-model-len {c.max_model_len:,}: {chosen.max_concurrency:,.2f} instead of {before}"
    )


def _cudagraph_accounting(r: Release) -> str:
    if r.extensible_kv_cache:
        return "measured: the KV cache is sized after the real capture (extensible KV cache)"
    if r.cudagraph_estimate:
        return "estimate subtracted from the KV budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)"
    return "not counted by vLLM: the graph pool must fit in the headroom"


def _rank_key(ev: Evaluation):
    """Best first: feasible; the model's own KV dtype before FP8 (FP8 KV is a
    fallback, it costs accuracy); most concurrent sequences at max-model-len; most
    KV tokens; fewer pipeline stages; no expert parallel unless it wins. Among
    layouts that do not fit, the one that comes closest (least weight on its
    fullest GPU) comes first, so its errors are the ones reported."""
    lay = ev.layout
    closest = max((s.weights_bytes for s in ev.stages), default=ev.weights_per_gpu_bound)
    return (
        not ev.feasible,
        0 if ev.feasible else closest,
        lay.kv_cache_dtype != "auto" and KV_DTYPE_BYTES.get(lay.kv_cache_dtype) is not None,
        -round(ev.max_concurrency, 6) if ev.feasible else 0,
        -ev.kv_tokens if ev.feasible else 0,
        lay.pp,
        lay.expert_parallel,
    )


def search(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int, knobs: Knobs) -> list[Evaluation]:
    return sorted((tune(req, arch, itype, nodes, lay, knobs) for lay in candidate_layouts(req, arch, itype, nodes)), key=_rank_key)


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
        repo = variants.get(req.weight_format)
        return [ModelOption(variant_arch(arch, req.weight_format, repo), repo, req.weight_format)]
    options = [ModelOption(arch, checkpoint_repo(req.model), None)]
    for fmt, repo in variants.items():
        options.append(ModelOption(variant_arch(arch, fmt, repo), repo, fmt))
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
    release(req.vllm_version).check_model(options[0].arch.model_type)
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
    capacity, runner_up, tuned_twin = None, None, None
    if req.sla is not None and req.workload is not None and ranked[0].feasible:
        if req.objective == "sla-throughput-per-dollar":
            ranked, capacity, runner_up, tuned_twin = by_sla_throughput(req, arch, itype, nodes, ranked, _knobs(req, arch, itype))
        else:
            capacity = layout_capacity(req, arch, itype, ranked[0])
    elif req.objective == "sla-throughput-per-dollar" and ranked[0].feasible:
        raise UserError("the sla-throughput-per-dollar objective needs an SLA and a workload (gpu-serving:serving.sla, .workload)")
    best = ranked[0]
    knobs = best.knobs or _knobs(req, arch, itype)
    warnings = ([fallback_note] if fallback_note else []) + _warnings(req, arch, itype, best)
    if req.weight_format and option.checkpoint is None:
        warnings.append(
            f"no published {req.weight_format} checkpoint of {req.model} is known: serve one you quantised "
            "(vLLM does not convert between 4-bit and 8-bit formats at load time)"
        )

    max_num_seqs, max_num_seqs_bound = choose_max_num_seqs(req, best, knobs, capacity)
    if req.max_num_seqs is None and best.feasible:
        best, max_num_seqs, max_num_seqs_bound = settle_max_num_seqs(
            req, arch, itype, nodes, best, capacity, max_num_seqs, max_num_seqs_bound)
        knobs = best.knobs
    if tuned_twin is not None:
        # The twin at the --max-num-seqs passed too, so the two KV figures compare like for like.
        twin, twin_cap = tuned_twin
        same = evaluate(arch, itype, nodes, twin.layout, twin.knobs.replace(max_num_seqs=knobs.max_num_seqs))
        note = mtp_note if knobs.num_speculative_tokens else defaults_note
        best.notes.append(note(best, capacity, same if same.feasible else twin, twin_cap))
    bench = None
    if req.predict_benchmark and capacity is not None and capacity.concurrency and best.feasible:
        # At the engine as deployed (its settled --max-num-seqs), the load the Job sends.
        bench = performance.benchmark_load(perf_setup(arch, itype, best), req.workload, capacity.concurrency)
    if capacity is not None and capacity.concurrency == 0:
        warnings.append(f"{describe_layout(best)} misses the SLA even one request at a time: {capacity.refusal()}")
    speculative = (
        {"method": req.speculative_method or "mtp", "num_speculative_tokens": knobs.num_speculative_tokens}
        if knobs.num_speculative_tokens
        else None
    )
    default_async = knobs.release.async_scheduling(ray=True)

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
        predicted_tokens_per_s=capacity.output_tokens_per_s if capacity and capacity.concurrency else None,
        duty_cycle=req.duty_cycle,
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
        speculative=speculative,
        async_scheduling=None if knobs.async_scheduling == default_async else knobs.async_scheduling,
        # The estimated FLOPs / bytes counters, where they measure this model as served (serving.py).
        mfu_metrics=serving.mfu_metrics_gap(arch, speculative=speculative is not None, dp=lay.dp) is None,
        nodes=nodes,
    )
    plan = Plan(
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
        max_num_seqs=max_num_seqs,
        max_num_seqs_bound=max_num_seqs_bound,
        speculative=speculative,
        performance=capacity,
        runner_up=runner_up,
        benchmark=bench,
    )
    if plan.system_request is not None:
        system_nodes.check(plan.system_request)  # a UserError naming the size that would fit
    return plan


def dp_moe_warnings(arch: ModelArch, lay: Layout, gpus_per_node: int, fix: str = "gpu-serving:serving.dataParallel 1",
                    efa: bool = True) -> list[str]:  # fmt: skip
    """How far to trust the figures of a MoE model under data parallel (nothing to say otherwise): vLLM
    0.34.0 shards its experts over all TP x DP GPUs, with expert parallel or without
    (model_executor/layers/fused_moe/config.py FusedMoEParallelConfig.make,
    flatten_tp_across_dp_and_pcp), and the replicas exchange each MoE layer's tokens in step
    (config/parallel.py: all2all_backend "allgather_reducescatter" by default). The memory plan and
    the step model count both; the step model takes the replicas as evenly loaded, and one
    published run checks it (docs/planning.md, Performance)."""
    if not shares_moe_layers(arch, lay):
        return []
    across = ""
    if lay.tp * lay.dp > gpus_per_node:
        across = ", over EFA between nodes" if efa else ", over TCP between nodes, which have no EFA"
    return [
        f"data parallel {lay.dp} with a MoE model: the replicas share its experts (vLLM splits them over all "
        f"{lay.tp * lay.dp} GPUs, TP x DP) and step through each MoE layer together, exchanging its tokens (an "
        f"all-gather and a reduce-scatter{across}); the plan counts both, but "
        "the performance model takes the replicas as evenly loaded where vLLM's step waits for the busiest, and it "
        "predicts its one published data-parallel MoE run too fast: TPOT about two thirds of the measured, "
        "throughput about 1.6x (docs/planning.md, Performance); "
        f"{fix} avoids the shared layers"
    ]


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
    out.extend(dp_moe_warnings(arch, lay, itype.gpu_count, efa=itype.max_efa_interfaces > 0))
    if ev.stages:
        tight = ev.constrained
        r = ev.knobs.release
        if tight.headroom_bytes < 0:
            out.append(
                f"headroom is {tight.headroom_bytes / GiB:.2f} GiB: the CUDA context and what vLLM does not count "
                "do not fit in 1 - gpu-memory-utilization; lower the utilization"
            )
        if r.extensible_kv_cache and 0.7 < ev.knobs.gpu_memory_utilization < 1.0:
            # v1/worker/extensible_kv_cache.py measure_kv_cache_blocks warns the same way when
            # the utilisation withholds at least 1 GiB of memory free at start.
            withheld = memory.extensible_withheld_bytes(
                visible=tight.gpu_visible_bytes, requested=tight.usable_bytes, activation=tight.activation_bytes,
                context=memory.cuda_context_bytes(ev.layout.tp * ev.layout.pp > 1),
            )  # fmt: skip
            if withheld >= GiB:
                out.append(
                    f"vLLM {r.version} sizes the KV cache from the memory free after warm-up and CUDA-graph capture "
                    f"(extensible KV cache); gpu-memory-utilization {ev.knobs.gpu_memory_utilization:.2f} keeps "
                    f"{withheld / GiB:.2f} GiB per GPU out of it, which vLLM will warn about: raise it unless that "
                    "memory is meant for something vLLM does not see"
                )
    return out
