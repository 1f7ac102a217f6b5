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
from infra.planning import kv_cache, memory, model_serving, performance, serving, startup
from infra.planning.contract import Deployment, GpuNodes, ServeCommand
from infra.planning.cost import CostLines, cost_lines
from infra.planning.layout import Evaluation, Knobs, Layout, divisors, evaluate
from infra.planning.memory import KV_DTYPE_BYTES, GiB, RankBudget
from infra.planning.request import (
    GPU_MEMORY_UTILIZATION_RANGE,
    KV_CACHE_DTYPES,
    SPECULATIVE_METHODS,
    WEIGHT_FORMAT_CHOICES,
    PlanRequest,
)
from infra.planning.performance import performance_json
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
            "startup": asdict(self.startup),
            "feasible": self.feasible,
            "errors": self.errors,
            "warnings": list(self.warnings),
            "assumptions": list(self.model.notes),
            "cost": asdict(self.cost),
            "objective": self.request.objective,
            "runner_up": self.runner_up,
            "performance": performance_json(self.performance) if self.performance else None,
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
    need(req.speculative_method is None or req.speculative_method in SPECULATIVE_METHODS,
         f"speculative method {req.speculative_method!r} is not one the planner accounts for: {', '.join(SPECULATIVE_METHODS)}")  # fmt: skip
    need(req.num_speculative_tokens is None or req.speculative_method is not None,
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
    if not req.speculative_method:
        return 0
    if not arch.mtp_layers:
        raise UserError(f"{arch.name} has no multi-token-prediction layers: speculative method {req.speculative_method!r} needs them")
    return req.num_speculative_tokens or 1


def _knobs(req: PlanRequest, arch: ModelArch, itype: InstanceType) -> Knobs:
    """vLLM's defaults for this release and GPU, where the request leaves a knob open."""
    r = release(req.vllm_version)
    visible, name = itype.gpu.visible_memory_bytes, itype.gpu.name
    max_len = req.max_model_len or min(arch.max_position_embeddings or serving.DEFAULT_MAX_MODEL_LEN_CAP, serving.DEFAULT_MAX_MODEL_LEN_CAP)
    return Knobs(
        gpu_memory_utilization=req.gpu_memory_utilization,
        max_model_len=max_len,
        max_num_batched_tokens=req.max_num_batched_tokens or serving.default_batched_tokens(visible, name, r),
        max_num_seqs=req.max_num_seqs or serving.default_max_num_seqs(visible, name, r),
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
    return [Layout(tp, pp, dp, ep, kv) for tp, pp, dp in pairs for ep in eps for kv in kvs if not (ep and tp == 1)]


def _batch_options(req: PlanRequest, arch: ModelArch, knobs: Knobs) -> list[tuple[int, bool]]:
    """(max-num-batched-tokens, async scheduling) pairs the search tries besides vLLM's
    defaults: smaller chunks and synchronous scheduling shrink what each request
    reserves in sliding-window and state groups (max_in_flight_tokens), nothing else."""
    mnbts = [req.max_num_batched_tokens] if req.max_num_batched_tokens else serving.searched_batched_tokens(knobs.max_num_batched_tokens)
    asyncs = [knobs.async_scheduling]
    if req.async_scheduling is None and knobs.async_scheduling and knobs.release.at_least("0.26"):
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
    on, then the largest chunk)."""
    base = evaluate(arch, itype, nodes, layout, knobs)
    if not base.stages or not _has_windowed_groups(base) or any("weights do not fit" in e for e in base.errors):
        return base
    options = _batch_options(req, arch, knobs)
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


# --- Performance ---------------------------------------------------------------------

# Feasible layouts the SLA objective simulates, best by the memory ranking first: each
# costs a capacity search (seconds for prod), and past the first few the memory ranking
# has only FP8-KV or expert-parallel twins left.
SLA_CANDIDATES = 4
MAX_SETTLE_ROUNDS = 4  # settle_max_num_seqs
_CAPACITIES: dict = {}
_RATES: dict = {}


def _perf_setup(arch: ModelArch, itype: InstanceType, ev: Evaluation):
    """The performance model's setup of an evaluated layout at its knobs (perf/predict.py)."""
    from infra.planning.perf import predict
    from infra.planning.perf.hardware import hardware

    k, lay = ev.knobs, ev.layout
    srv = predict.Serving(
        tp=lay.tp, pp=lay.pp, dp=lay.dp, expert_parallel=lay.expert_parallel, kv_cache_dtype=lay.kv_cache_dtype,
        max_model_len=k.max_model_len, max_num_seqs=k.max_num_seqs, max_num_batched_tokens=k.max_num_batched_tokens,
        gpu_memory_utilization=k.gpu_memory_utilization, async_scheduling=k.async_scheduling,
        num_speculative_tokens=k.num_speculative_tokens, vllm_version=k.release.version,
    )  # fmt: skip
    return predict.setup(arch, hardware(instance_type=itype.name), srv)


def layout_capacity(req: PlanRequest, arch: ModelArch, itype: InstanceType, ev: Evaluation, *, with_rate: bool = True,
                    must_beat: float = 0.0, hint: tuple[int, int | None] | None = None) -> performance.Capacity:  # fmt: skip
    """The SLA capacity of one evaluated layout at its knobs (infra/planning/performance.py),
    with the highest Poisson rate within the SLA when `with_rate`; memoised (a plan asks for
    the same one more than once, and so do tests). An outclassed result stands for any
    `must_beat` at least what its first miss served."""
    key = (arch.name, arch.weight_format, arch.model_type, itype.name, ev.layout, ev.knobs, req.workload, req.sla)
    cap = _CAPACITIES.get(key)
    if cap is None or (cap.outclassed and cap.beyond.output_tokens_per_s > must_beat):
        cap = performance.sla_capacity(_perf_setup(arch, itype, ev), req.workload, req.sla, with_rate=False,
                                       must_beat=must_beat, hint=hint)  # fmt: skip
        _CAPACITIES[key] = cap
    if with_rate and cap.concurrency and not cap.outclassed:
        if key not in _RATES:
            _RATES[key] = performance.rate_capacity(_perf_setup(arch, itype, ev), req.workload, req.sla, cap.at)
        cap = cap.with_rate(_RATES[key])
    return cap


def describe_layout(ev: Evaluation) -> str:
    lay = ev.layout
    ep = " with expert parallel" if lay.expert_parallel else ""
    kv = f", {lay.kv_cache_dtype} KV" if lay.kv_cache_dtype != "auto" else ""
    k = ev.knobs
    knobs = f" (--max-num-batched-tokens {k.max_num_batched_tokens}, {'async' if k.async_scheduling else 'no async'} scheduling)" if k else ""
    return f"TP {lay.tp} x PP {lay.pp} x DP {lay.dp}{ep}{kv}{knobs}"


def by_sla_throughput(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int, ranked: list[Evaluation],
                      defaults: Knobs) -> tuple[list[Evaluation], performance.Capacity, dict | None, tuple | None]:  # fmt: skip
    """Objective sla-throughput-per-dollar: among the first SLA_CANDIDATES feasible layouts
    (the model's own KV dtype before FP8 KV, which costs accuracy), each at its tuned knobs
    and at vLLM's defaults, the most output tokens/s at the SLA capacity per dollar-hour.
    Refuses (one line, the best figures reachable) when none meets the SLA even one request
    at a time."""
    feasible = [ev for ev in ranked if ev.feasible]
    own = [ev for ev in feasible if ev.layout.kv_cache_dtype == "auto"]
    pool = []
    for ev in (own or feasible)[:SLA_CANDIDATES]:
        # tune() may have traded speed for KV at max-model-len (a smaller chunk, no async
        # scheduling); at the workload's lengths vLLM's defaults can serve far more, so they
        # go first (the first sets the bracket the others start from).
        if ev.knobs != defaults:
            at_defaults = evaluate(arch, itype, nodes, ev.layout, defaults)
            if at_defaults.feasible:
                pool.append(at_defaults)
        pool.append(ev)
    # Each candidate only has to beat the best so far: its search stops at a miss that serves
    # less (performance.sla_capacity must_beat). The Poisson rate only for the winner.
    # The best so far's bracket is each next one's first guess (performance.sla_capacity hint).
    caps, top, hint = [], 0.0, None
    for ev in pool:
        cap = layout_capacity(req, arch, itype, ev, with_rate=False, must_beat=top, hint=hint)
        caps.append((ev, cap))
        if cap.concurrency and not cap.outclassed and cap.output_tokens_per_s > top:
            top = cap.output_tokens_per_s
            hint = (cap.concurrency, cap.beyond.concurrency if cap.beyond else None)
    meeting = sorted((ec for ec in caps if ec[1].concurrency > 0), key=lambda ec: -_best_case(ec[1]))
    if not meeting:
        ev, cap = min(caps, key=lambda ec: max(performance._load(req.sla, ec[1].single)))
        raise UserError(
            f"no layout of {nodes} x {itype.name} meets the SLA for {arch.name} ({req.workload.describe()}): the closest, "
            f"{describe_layout(ev)}, misses it one request at a time: {cap.refusal()}"
        )
    meeting[0] = (meeting[0][0], layout_capacity(req, arch, itype, meeting[0][0]))
    usd_hour = itype.price_usd_per_hour * nodes
    (win_ev, win), rest = meeting[0], meeting[1:]
    runner_up = None
    if rest or len(caps) > 1:
        ev2, cap2 = rest[0] if rest else next(ec for ec in caps if ec[1].concurrency == 0)
        tie = cap2.concurrency and not cap2.outclassed and abs(win.output_tokens_per_s - cap2.output_tokens_per_s) <= 0.01 * win.output_tokens_per_s
        best2 = _best_case(cap2)
        why = (
            f"a tie within 1% ({win.output_tokens_per_s:,.0f} against {cap2.output_tokens_per_s:,.0f} output tokens/s "
            f"within the SLA): the performance model does not tell them apart (it leaves out expert parallel's "
            f"all-to-all), so the memory ranking decides: {describe_layout(win_ev)} holds "
            f"{win_ev.max_concurrency:,.2f} sequences at max-model-len against {ev2.max_concurrency:,.2f}"
        ) if tie else (
            f"{describe_layout(win_ev)} serves {win.output_tokens_per_s:,.0f} output tokens/s within the SLA (concurrency "
            f"{win.concurrency}, bound by {win.binding}) against "
            + (f"none for {describe_layout(ev2)}, which misses it: {cap2.refusal()}" if not cap2.concurrency else
               f"less than {best2:,.0f} for {describe_layout(ev2)} (it misses the SLA at concurrency "
               f"{cap2.beyond.concurrency}, serving that much there)" if cap2.outclassed else
               f"{best2:,.0f} for {describe_layout(ev2)} (concurrency {cap2.concurrency}, bound by {cap2.binding})")
            + f", on the same ${usd_hour:,.2f} an hour"
        )
        runner_up = {
            "layout": describe_layout(ev2), "concurrency": cap2.concurrency, "output_tokens_per_s": best2,
            "output_tokens_per_s_is_upper_bound": cap2.outclassed,
            "output_tokens_per_s_per_usd_hour": best2 / usd_hour if usd_hour else None, "why": why,
        }  # fmt: skip
    # The same layout at the knobs tune() chose for KV, beaten by vLLM's defaults: the plan says so.
    twin = next(((ev, cap) for ev, cap in caps if ev is not win_ev and ev.layout == win_ev.layout
                 and ev.knobs != win_ev.knobs and win_ev.knobs == defaults), None)  # fmt: skip
    order = [win_ev] + [ev for ev in ranked if ev is not win_ev]
    return order, win, runner_up, twin


def _defaults_note(chosen: Evaluation, cap: performance.Capacity, tuned: Evaluation, tuned_cap: performance.Capacity) -> str:
    k, kt = chosen.knobs, tuned.knobs
    other = (f"less than {_best_case(tuned_cap):,.0f}" if tuned_cap.outclassed else f"{tuned_cap.output_tokens_per_s:,.0f}")
    return (
        f"vLLM's batch defaults (--max-num-batched-tokens {k.max_num_batched_tokens}, async scheduling "
        f"{'on' if k.async_scheduling else 'off'}) over the knobs that hold the most sequences at max-model-len "
        f"(--max-num-batched-tokens {kt.max_num_batched_tokens}, async scheduling {'on' if kt.async_scheduling else 'off'}): "
        f"{cap.output_tokens_per_s:,.0f} output tokens/s within the SLA against {other}, at the cost of "
        f"{chosen.admission.sliding_tokens:,} in-flight tokens reserved per request in each sliding-window group instead of "
        f"{tuned.admission.sliding_tokens:,}: {chosen.max_concurrency:,.2f} sequences at max-model-len instead of "
        f"{tuned.max_concurrency:,.2f}"
    )


def settle_max_num_seqs(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int, ev: Evaluation,
                        cap: performance.Capacity | None, n: int, bound: str) -> tuple[Evaluation, int, str]:  # fmt: skip
    """The layout evaluated at the --max-num-seqs the plan passes: vLLM captures CUDA graphs
    up to min(2 x max-num-seqs, 512) sizes and profiles the sampler at max-num-seqs, so a
    smaller value leaves more for the KV cache, which can move the bounds of --max-num-seqs
    again. Repeated until it settles (a few rounds: each only ever frees memory)."""
    default = ev.knobs.max_num_seqs
    for _ in range(MAX_SETTLE_ROUNDS):
        settled = evaluate(arch, itype, nodes, ev.layout, ev.knobs.replace(max_num_seqs=n))
        if not settled.feasible:
            break
        settled.notes.extend(note for note in ev.notes if note not in settled.notes)
        ev = settled
        again, why = choose_max_num_seqs(req, settled, settled.knobs.replace(max_num_seqs=default), cap)
        if again == n:
            break
        n, bound = again, why
    return ev, n, bound


def _best_case(cap: performance.Capacity) -> float:
    """Output tokens/s within the SLA; for a search stopped early (outclassed), the most it
    could be: what its first miss served."""
    return cap.beyond.output_tokens_per_s if cap.outclassed else cap.output_tokens_per_s


def choose_max_num_seqs(req: PlanRequest, ev: Evaluation, knobs: Knobs, cap: performance.Capacity | None) -> tuple[int, str]:
    """--max-num-seqs and what set it. With a workload: the SLA capacity per replica, capped
    by the requests the KV cache holds at the workload's mean lengths and by vLLM's default
    (and max-num-batched-tokens, which vLLM requires it under), never below what the
    max-model-len worst case holds. Without one: the requests the KV cache holds at a
    typical context (serving.TYPICAL_CONTEXT_TOKENS), capped alike."""
    if req.max_num_seqs is not None:
        return knobs.max_num_seqs, "pinned"
    if not ev.feasible:
        return knobs.max_num_seqs, "vllm-default"
    groups, adm, r = list(ev.kv.groups), ev.admission, knobs.release
    extra = knobs.num_speculative_tokens
    bounds = {"vllm-default": knobs.max_num_seqs, "max-num-batched-tokens": knobs.max_num_batched_tokens}
    if cap is not None and req.workload is not None:
        length = min(knobs.max_model_len, req.workload.input_tokens + req.workload.output_tokens + extra)
        bounds["kv-at-workload"] = ev.num_blocks // max(kv_cache.request_blocks(groups, adm, release=r, max_len=length), 1)
        if cap.concurrency and cap.binding != "max-num-seqs":
            bounds["sla-capacity"] = -(-cap.concurrency // ev.layout.dp)
    else:
        length = min(knobs.max_model_len, serving.TYPICAL_CONTEXT_TOKENS + extra)
        bounds["kv-at-typical-context"] = ev.num_blocks // max(kv_cache.request_blocks(groups, adm, release=r, max_len=length), 1)
    bound = min(bounds, key=lambda b: (bounds[b], b != "sla-capacity"))
    value = bounds[bound]
    floor = max(1, int(ev.max_concurrency_per_replica))
    if cap is not None and value < floor:
        return floor, "max-model-len-floor"
    return max(1, value), bound


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
        best.notes.append(_defaults_note(best, capacity, *tuned_twin))
    if capacity is not None and capacity.concurrency == 0:
        warnings.append(f"{describe_layout(best)} misses the SLA even one request at a time: {capacity.refusal()}")
    speculative = (
        {"method": req.speculative_method, "num_speculative_tokens": knobs.num_speculative_tokens}
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
        max_num_seqs=max_num_seqs,
        max_num_seqs_bound=max_num_seqs_bound,
        speculative=speculative,
        performance=capacity,
        runner_up=runner_up,
    )


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
