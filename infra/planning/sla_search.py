"""The plan's SLA questions: what each candidate layout delivers under the stack's workload
(infra/planning/performance.py on the performance model), which one the
sla-throughput-per-dollar objective keeps and why, and the --max-num-seqs that follows."""

from __future__ import annotations

from infra.catalog.arch import ModelArch
from infra.catalog.instances import InstanceType
from infra.errors import UserError
from infra.planning import capacity_cache, kv_cache, performance, serving
from infra.planning.layout import Evaluation, Knobs, evaluate, shares_moe_layers
from infra.planning.perf import predict
from infra.planning.perf.hardware import hardware
from infra.planning.request import PlanRequest

# Parallel shapes (TP x PP x DP, each with its expert-parallel twin) the SLA objective
# simulates, best by the memory ranking first (sla_candidates): each costs a capacity
# search (seconds for prod's TP 8 x PP 4, tens of ms for a data-parallel shape). Four
# 8-GPU nodes have five: TP 8 x PP 4 and TP 8, 4, 2, 1 with replicas.
SLA_CANDIDATES = 6
MAX_SETTLE_ROUNDS = 4  # settle_max_num_seqs
_CAPACITIES: dict = {}
# Output tokens/s within the SLA closer than this share are a tie: the performance model
# does not tell such layouts apart (e.g. expert parallel on or off: it leaves out the
# all-to-all), so the memory ranking's order decides, not the simulation's last digits.
TIE = 0.01
_RATES: dict = {}


def perf_setup(arch: ModelArch, itype: InstanceType, ev: Evaluation):
    """The performance model's setup of an evaluated layout at its knobs (perf/predict.py)."""
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
    the same one more than once, and so do tests; across processes too when
    GPU_SERVING_SLA_CACHE names a directory, infra/planning/capacity_cache.py). An outclassed result stands for any
    `must_beat` at least what its first miss served."""
    key = (arch.name, arch.weight_format, arch.model_type, itype.name, ev.layout, ev.knobs, req.workload, req.sla)
    # On disk (capacity_cache, when GPU_SERVING_SLA_CACHE is set): the full model and instance figures too.
    disk_key = (arch, itype, ev.layout, ev.knobs, req.workload, req.sla)
    cap = _CAPACITIES.get(key) or capacity_cache.load("capacity", disk_key)
    setup = None
    if cap is None or (cap.outclassed and cap.beyond.output_tokens_per_s > must_beat):
        setup = perf_setup(arch, itype, ev)
        cap = performance.sla_capacity(setup, req.workload, req.sla, with_rate=False, must_beat=must_beat, hint=hint)
        capacity_cache.store("capacity", disk_key, cap)
    _CAPACITIES[key] = cap
    if with_rate and cap.concurrency and not cap.outclassed:
        if key not in _RATES:
            rate = capacity_cache.load("rate", disk_key)
            if rate is None:
                rate = performance.rate_capacity(setup or perf_setup(arch, itype, ev), req.workload, req.sla, cap.at)
                capacity_cache.store("rate", disk_key, rate)
            _RATES[key] = rate
        cap = cap.with_rate(_RATES[key])
    return cap


def describe_layout(ev: Evaluation) -> str:
    lay = ev.layout
    ep = " with expert parallel" if lay.expert_parallel else ""
    kv = f", {lay.kv_cache_dtype} KV" if lay.kv_cache_dtype != "auto" else ""
    k = ev.knobs
    mtp = f", MTP drafting {k.num_speculative_tokens}" if k and k.num_speculative_tokens else ""
    knobs = f" (--max-num-batched-tokens {k.max_num_batched_tokens}, {'async' if k.async_scheduling else 'no async'} scheduling{mtp})" if k else ""
    return f"TP {lay.tp} x PP {lay.pp} x DP {lay.dp}{ep}{kv}{knobs}"


# Draft tokens the search tries MTP with: one, the depth DeepSeek's MTP module is trained for
# (DeepSeek-V3 report, arXiv 2412.19437, section 2.2: D = 1) and the acceptance
# predict.DEFAULT_MTP_ACCEPTANCE cites is for.
SEARCHED_DRAFT_TOKENS = 1


def mtp_variant(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int, ev: Evaluation | None) -> Evaluation | None:
    """The layout with the model's MTP layers drafting SEARCHED_DRAFT_TOKENS, when the request
    leaves speculative decoding to the search and the model has MTP layers and it fits."""
    if ev is None or req.speculative_method is not None or not arch.mtp_layers or ev.knobs.num_speculative_tokens:
        return None
    drafted = evaluate(arch, itype, nodes, ev.layout, ev.knobs.replace(num_speculative_tokens=SEARCHED_DRAFT_TOKENS))
    return drafted if drafted.feasible else None


def mtp_note(chosen: Evaluation, cap: performance.Capacity, plain: Evaluation, plain_cap: performance.Capacity) -> str:
    """Why the plan turns MTP on, and what that rests on."""
    other = f"less than {_best_case(plain_cap):,.0f}" if plain_cap.outclassed else f"{plain_cap.output_tokens_per_s:,.0f}"
    return (
        f"MTP speculative decoding on (--speculative-config method mtp, {chosen.knobs.num_speculative_tokens} draft "
        f"token): {cap.output_tokens_per_s:,.0f} output tokens/s within the SLA against {other} without it, for "
        f"{chosen.max_concurrency:,.2f} sequences at max-model-len instead of {plain.max_concurrency:,.2f} (the draft layer's "
        f"weights, KV cache and CUDA graphs). ASSUMPTION: {predict.DEFAULT_MTP_ACCEPTANCE:.0%} of drafted tokens accepted "
        "(DeepSeek-V3 report, section 5.4.3); the benchmark Job prints the measured rate beside it "
        "(spec_decode_acceptance_rate); set gpu-serving:serving.speculative.method off to plan without it"
    )


def sla_candidates(arch: ModelArch, ranked: list[Evaluation]) -> list[Evaluation]:
    """The layouts the SLA objective simulates: the first of each parallel shape (TP x PP x
    DP) by the memory ranking and its expert-parallel twin, at most SLA_CANDIDATES shapes.
    The memory ranking alone would fill the list with one kind: a MoE model's data-parallel
    layouts hold the most sequences (the experts split over every GPU, the attention's
    weights once per replica) and are not always the fastest (each MoE layer's tokens
    exchanged between the replicas, over EFA across nodes). Those shapes come after the
    others: the order changes no outcome, but the first sets the bar the rest must beat and a
    candidate that cannot stops early (by_sla_throughput)."""
    shapes: dict[tuple, list[Evaluation]] = {}
    for ev in ranked:
        lay = ev.layout
        twins = shapes.setdefault((lay.tp, lay.pp, lay.dp), [])
        if len(shapes) <= SLA_CANDIDATES and all(t.layout.expert_parallel != lay.expert_parallel for t in twins):
            twins.append(ev)
    kept = list(shapes.values())[:SLA_CANDIDATES]
    kept.sort(key=lambda twins: shares_moe_layers(arch, twins[0].layout))  # stable: memory order within
    return [ev for twins in kept for ev in twins]


def by_sla_throughput(req: PlanRequest, arch: ModelArch, itype: InstanceType, nodes: int, ranked: list[Evaluation],
                      defaults: Knobs) -> tuple[list[Evaluation], performance.Capacity, dict | None, tuple | None]:  # fmt: skip
    """Objective sla-throughput-per-dollar: among the feasible layouts of sla_candidates
    (the model's own KV dtype before FP8 KV, which costs accuracy), each at its tuned knobs
    and at vLLM's defaults, the most output tokens/s at the SLA capacity per dollar-hour.
    Refuses (one line, the best figures reachable) when none meets the SLA even one request
    at a time."""
    feasible = [ev for ev in ranked if ev.feasible]
    own = [ev for ev in feasible if ev.layout.kv_cache_dtype == "auto"]
    pool = []
    for ev in sla_candidates(arch, own or feasible):
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
    caps, top, hint, lead = [], 0.0, None, None
    for ev in pool:
        cap = layout_capacity(req, arch, itype, ev, with_rate=False, must_beat=top, hint=hint)
        caps.append((ev, cap))
        if cap.concurrency and not cap.outclassed and cap.output_tokens_per_s > top * (1 + TIE):
            top, lead = cap.output_tokens_per_s, ev
            hint = (cap.concurrency, cap.beyond.concurrency if cap.beyond else None)
    # MTP on/off: the leader with the model's MTP layers drafting one token, when the request
    # leaves speculative decoding open (its memory: the draft layer's weights, KV and graphs).
    drafted = mtp_variant(req, arch, itype, nodes, lead)
    if drafted is not None:
        caps.append((drafted, layout_capacity(req, arch, itype, drafted, with_rate=False, must_beat=top, hint=hint)))
    meeting = sorted((ec for ec in caps if ec[1].concurrency > 0), key=lambda ec: -_best_case(ec[1]))
    if meeting:
        # A tie goes to the first in the memory ranking's order (caps keeps it; MTP last).
        best = _best_case(meeting[0][1])
        first = next(ec for ec in caps if ec[1].concurrency > 0 and not ec[1].outclassed
                     and ec[1].output_tokens_per_s >= best * (1 - TIE))  # fmt: skip
        meeting.remove(first)
        meeting.insert(0, first)
    if not meeting:
        ev, cap = min(caps, key=lambda ec: max(performance.sla_ratios(req.sla, ec[1].single)))
        raise UserError(
            f"no layout of {nodes} x {itype.name} meets the SLA for {arch.name} ({req.workload.describe()}): the closest, "
            f"{describe_layout(ev)}, misses it one request at a time: {cap.refusal()} (the best it reaches: TTFT p99 "
            f"{cap.single.ttft_p99_ms:,.0f} ms, TPOT p99 {cap.single.tpot_p99_ms:,.1f} ms)"
        )
    meeting[0] = (meeting[0][0], layout_capacity(req, arch, itype, meeting[0][0]))
    usd_hour = itype.price_usd_per_hour * nodes
    (win_ev, win), rest = meeting[0], meeting[1:]
    runner_up = None
    if rest or len(caps) > 1:
        ev2, cap2 = rest[0] if rest else next(ec for ec in caps if ec[1].concurrency == 0)
        tie = cap2.concurrency and not cap2.outclassed and abs(win.output_tokens_per_s - cap2.output_tokens_per_s) <= TIE * win.output_tokens_per_s
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
    # The same layout at the knobs tune() chose for KV, beaten by vLLM's defaults; or without
    # the MTP drafter that won: the plan says so.
    twin = next(((ev, cap) for ev, cap in caps if ev is not win_ev and ev.layout == win_ev.layout
                 and ev.knobs != win_ev.knobs and win_ev.knobs == defaults), None)  # fmt: skip
    if win_ev is drafted:
        twin = next((ev, cap) for ev, cap in caps if ev is lead)
    order = [win_ev] + [ev for ev in ranked if ev is not win_ev]
    return order, win, runner_up, twin


def defaults_note(chosen: Evaluation, cap: performance.Capacity, tuned: Evaluation, tuned_cap: performance.Capacity) -> str:
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
    again. Repeated until it settles (a few rounds: each only ever frees memory). It can
    also cycle at a block's edge (at 89 the KV cache holds 88 requests, at 88 it holds 89):
    then the largest value the KV cache at that value supports. The evaluation returned is
    always the one at the value returned, so the plan's figures are those of its flags."""
    default = ev.knobs.max_num_seqs
    tried: dict[int, tuple[Evaluation, int, str]] = {}  # value -> (its evaluation, the value it points to, its bound)
    for _ in range(MAX_SETTLE_ROUNDS):
        if n in tried:
            break
        settled = evaluate(arch, itype, nodes, ev.layout, ev.knobs.replace(max_num_seqs=n))
        if not settled.feasible:
            break
        settled.notes.extend(note for note in ev.notes if note not in settled.notes)
        again, why = choose_max_num_seqs(req, settled, settled.knobs.replace(max_num_seqs=default), cap)
        tried[n] = (settled, again, bound)
        if again == n:
            return settled, n, bound
        n, bound = again, why
    if not tried:
        return ev, default, "vllm-default"
    supported = [m for m, (_, points_to, _) in tried.items() if points_to >= m]
    m = max(supported) if supported else min(tried)
    return tried[m][0], m, tried[m][2]


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
    bounds = {"vllm-default": knobs.max_num_seqs, "max-num-batched-tokens": knobs.max_num_batched_tokens}
    with_workload = cap is not None and req.workload is not None
    # The requests the KV cache holds at one length (each charged its groups' blocks there,
    # plus the drafter's lookahead slots).
    tokens = (req.workload.input_tokens + req.workload.output_tokens) if with_workload else serving.TYPICAL_CONTEXT_TOKENS
    length = min(knobs.max_model_len, tokens + knobs.num_speculative_tokens)
    per_request = kv_cache.request_blocks(list(ev.kv.groups), ev.admission, release=knobs.release, max_len=length)
    bounds["kv-at-workload" if with_workload else "kv-at-typical-context"] = ev.num_blocks // max(per_request, 1)
    if with_workload and cap.concurrency and cap.binding != "max-num-seqs":
        bounds["sla-capacity"] = -(-cap.concurrency // ev.layout.dp)
    bound = min(bounds, key=lambda b: (bounds[b], b != "sla-capacity"))
    value = bounds[bound]
    floor = max(1, int(ev.max_concurrency_per_replica))
    if with_workload and value < floor:
        return floor, "max-model-len-floor"
    return max(1, value), bound
