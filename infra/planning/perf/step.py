"""The time of one engine step on each pipeline stage: a roofline over the operations
a batch runs, plus communication and fixed costs.

Operations of one stage's rank (`ops.stage_ops`): GEMMs per compute dtype (dense
weights, read once per step), the routed experts (only those the batch routes to),
the LM head (once per sampled sequence), attention (each KV-cache kind's reads and
FLOPs), TP all-reduces, and the per-layer and per-step fixed costs.

Overlap (why the terms are combined as they are):
- within one operation, compute and memory overlap (a kernel streams its operands
  while it computes): the operation takes max(FLOPs / achieved peak, bytes /
  achieved bandwidth), the roofline;
- operations follow each other on one CUDA stream: their times add;
- TP all-reduces sit between the operations whose outputs they sum (vLLM does not
  overlap them with compute): they add;
- the CPU's work per step (scheduling, input preparation, sampling) adds to the GPU's
  without async scheduling; with it the next step is prepared while the GPU runs, so
  the step takes the longer of the two.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from bisect import bisect_left
from itertools import accumulate
from operator import mul
from typing import Sequence

from infra.planning.perf.fitted import DEFAULT, Efficiency, for_gpu_kernels
from infra.planning.perf.hardware import Hardware
from infra.planning.perf.ops import AttentionTerm, StageOps, expected_distinct_experts


@dataclass(frozen=True)
class StepParts:
    """One stage's step time by kind of work; `bound` names the largest."""

    compute_s: float  # operations whose FLOPs bound them
    memory_s: float  # operations whose bytes bound them
    communication_s: float
    overhead_s: float  # per-layer fixed costs and, without overlap, the CPU's step
    total_s: float

    @property
    def bound(self) -> str:
        parts = {"compute": self.compute_s, "memory": self.memory_s, "communication": self.communication_s,
                 "overhead": self.overhead_s}  # fmt: skip
        return max(parts, key=parts.get)


def _threshold_sums(contexts: Sequence[int], thresholds: Sequence[int]) -> dict:
    """{None: Σ c} and {T: Σ min(c, T)} for each threshold, from one sort: the contexts
    below T count whole, the others T each."""
    if not contexts:
        return dict.fromkeys([None, *thresholds], 0)
    ordered = sorted(contexts)
    prefix = list(accumulate(ordered))
    out = {None: prefix[-1]}
    n = len(ordered)
    for t in thresholds:
        j = bisect_left(ordered, t)
        out[t] = (prefix[j - 1] if j else 0) + t * (n - j)
    return out


def _prefill_sum_min(before: int, new: int, threshold: int | None) -> float:
    """Σ over the chunk's queries j = 1..new of min(before + j, threshold): the entries
    causal attention reaches (each query sees the context before it and itself)."""
    lo, hi = before + 1, before + new
    if threshold is None or hi <= threshold:
        return (lo + hi) * new / 2
    if lo > threshold:
        return threshold * new
    below = (lo + threshold) * (threshold - lo + 1) / 2
    return below + threshold * (hi - threshold)


def _prefill_attention(term: tuple, prefills: Sequence[tuple[int, int]], flops: float,
                       nbytes: float) -> tuple[float, float]:  # fmt: skip
    """(flops, nbytes) of one layer's attention with each prefill chunk's added, in order: a
    chunk computes over the entries each of its queries reaches and reads its context once."""
    thr, div, b_entry, _, pf_entry, b_seq, f_seq, pctx = term
    for new, before in prefills:
        if div:
            flops += _prefill_sum_min(before, new, thr) / div * pf_entry
            seen = before + new if thr is None else min(before + new, thr)
            nbytes += seen / div * b_entry
        flops += new * f_seq + (before + new) * pctx
        nbytes += b_seq
    return flops, nbytes


def _emitted(n_decode: int, query_len: int, prefills: Sequence[tuple[int, int]]) -> int:
    """The tokens a step hands on, at most, for `seq_overhead_s` to charge: each decoding
    sequence's query_len positions (1, or 1 + k drafted with MTP) and one per prefill chunk."""
    return n_decode * query_len + len(prefills)


def head_dim_factor(head_dim: float, half: float) -> float:
    """Prefill attention's fraction at `head_dim` over its fraction at 128: d / (d + d_half),
    relative (the work per tile grows with d, a tile's softmax and loads less so); calibrate.py
    fits d_half on FlashAttention-3 at 64, 192 and 256. ASSUMPTION: held at 256's beyond 256
    (no table reaches further)."""
    d = min(head_dim, 256.0)
    return d / (d + half) * (128 + half) / 128


def _roofline(flops: float, peak: float, nbytes: float, bandwidth: float) -> tuple[float, float]:
    """(compute-bound seconds, memory-bound seconds): one of them is zero."""
    c, m = flops / peak, nbytes / bandwidth
    return (c, 0.0) if c >= m else (0.0, m)


class StepModel:
    """The step-time model of one replica: built once per model, layout and hardware.

    Every stage is a weighted sum of the same few unit terms (a GEMM format per byte
    of weights, one MoE layer of a shape, one layer of an attention pattern, one
    all-reduce): a step computes each unit's (compute-bound, memory-bound) seconds once
    and each stage sums them with its own weights (bytes, layers, all-reduces).
    Within one format a GEMM's FLOPs per weight byte are the same whatever the layer,
    so its roofline scales with its bytes.
    """

    def __init__(self, stages: Sequence[StageOps], hw: Hardware, *, tp: int, eff: Efficiency = DEFAULT,
                 async_scheduling: bool = True, graph_max_tokens: int = 512, hop_bytes_per_token: int = 0,
                 hop_over_network: bool = False, num_speculative_tokens: int = 0, moe_dp: int = 1,
                 exchange_bytes_per_token: int = 0, exchange_over_network: bool = False) -> None:  # fmt: skip
        """`moe_dp`: the replicas whose MoE layers run together, sharing the experts (DP for a
        MoE model, else 1); each step they exchange `exchange_bytes_per_token` per token and MoE
        layer (_exchange), over the network when `exchange_over_network`. How many of them carry
        a batch like this one's: `moe_load` (all of them; at_load changes it)."""
        # What with_efficiency builds the same model from.
        self._options = dict(tp=tp, async_scheduling=async_scheduling, graph_max_tokens=graph_max_tokens,
                             hop_bytes_per_token=hop_bytes_per_token, hop_over_network=hop_over_network,
                             num_speculative_tokens=num_speculative_tokens, moe_dp=moe_dp,
                             exchange_bytes_per_token=exchange_bytes_per_token,
                             exchange_over_network=exchange_over_network)  # fmt: skip
        self.stages = tuple(stages)
        self.pp = len(self.stages)
        # The GPU's own kernel-fitted figures where the repo has its tables (A100: fitted.AMPERE).
        eff = for_gpu_kernels(eff, hw.gpu)
        self.hw, self.tp, self.eff = hw, tp, eff
        self.async_scheduling = async_scheduling
        self.graph_max_tokens = graph_max_tokens
        self.hop_bytes_per_token = hop_bytes_per_token
        self.hop_over_network = hop_over_network
        self.num_speculative_tokens = num_speculative_tokens
        self.moe_dp, self.exchange_bytes_per_token = moe_dp, exchange_bytes_per_token
        self.moe_load = moe_dp
        self.exchange_over_network = exchange_over_network
        self._bw = hw.gpu.hbm_bandwidth_bytes_per_s * eff.hbm
        # Compute-bound work at the kernels' fractions, at what a serving step reaches of them.
        served = eff.serving_compute
        self._peak = {d: hw.peak_flops(d) * getattr(eff, f"gemm_{d}") * served for d in ("bf16", "fp8", "fp4") if _has(hw, d)}
        self._peak["bf16_wo"] = hw.peak_flops("bf16") * eff.gemm_weight_only * served  # weight-only kernels (ops.gemm_kernel)
        self._attn_peak = hw.peak_flops("bf16") * eff.attention * served
        self._moe_peak = {(d, k): self._peak[d] * getattr(eff, f"moe_gemm_{k}") for d in ("bf16", "fp8", "fp4") if d in self._peak
                          for k in ("bf16", "fp8", "4bit", "marlin")}  # fmt: skip
        # Every threshold any stage's attention needs Σ min(c, T) for, computed once per step.
        self._thresholds = sorted({t.threshold for s in self.stages for t in s.attention if t.threshold is not None})
        units = _Units()
        self._weights = []  # per stage: ((unit index, weight), ...)
        for stage in self.stages:
            w = [(units.index(("gemm", g.compute, g.flops_per_token / g.weight_bytes, g.per_sampled_token)), g.weight_bytes)
                 for g in stage.gemms if g.weight_bytes]  # fmt: skip
            w += [(units.index(("moe", e.experts, e.top_k, e.flops_per_token, e.bytes_per_expert, e.compute, e.kernel,
                                 e.inter_per_rank, e.activation_bytes_per_token)), e.layers) for e in stage.experts]  # fmt: skip
            # The head-size term last: its fraction of the attention peak (calibrate.head_dim_factor).
            w += [(units.index(("attn", *_attention_tuple(a), head_dim_factor(a.head_dim, eff.attention_half_dim))), a.layers)
                  for a in stage.attention]  # fmt: skip
            if stage.allreduces:
                w.append((units.index(("allreduce", stage.allreduce_bytes_per_token)), stage.allreduces))
            moe_layers = sum(e.layers for e in stage.experts)
            if moe_dp > 1 and moe_layers:
                w.append((units.index(("exchange",)), moe_layers))
            self._weights.append(tuple(w))
        self._units = tuple(units.keys)
        # The fast path's forms of the same: units by kind, and each stage's weights as a
        # vector over all units.
        keys = self._units
        self._gemm_units = [(i, self._peak[u[1]], u[2], u[3]) for i, u in enumerate(keys) if u[0] == "gemm"]
        self._moe_units = [(i, u[1:]) for i, u in enumerate(keys) if u[0] == "moe"]
        self._attn_units = [(i, u[1:-1], u[-1]) for i, u in enumerate(keys) if u[0] == "attn"]
        self._allreduce_units = [(i, u[1]) for i, u in enumerate(keys) if u[0] == "allreduce"]
        self._exchange_units = [i for i, u in enumerate(keys) if u[0] == "exchange"]
        self._by_size: dict[tuple[int, int], list[float]] = {}  # _stage_bases
        self._attn_floors = [(term, eff.attention_floor_s if term[1] else 0.0, self._attn_peak * scale)
                             for _, term, scale in self._attn_units]  # fmt: skip
        # Each stage's per-kernel and per-layer fixed costs, with CUDA graphs and eager: the
        # one place both the fast path and `parts` take them from.
        per_kernel, eager = eff.kernel_overhead_s, eff.eager_layer_overhead_s
        self._fixed_graphed = [s.kernels * per_kernel + s.mla_layers * eff.mla_floor_s for s in self.stages]
        self._fixed_eager = [fixed + s.layers * eager for fixed, s in zip(self._fixed_graphed, self.stages)]
        # Each stage's time per decoding token in its MLA modules beyond their reads (their tables'
        # per-sequence slope: the absorbed BMMs, rotary and norms of each query, per head and not).
        self._mla_per_token = [s.mla_layers * eff.mla_seq_s + s.mla_heads * eff.mla_seq_head_s for s in self.stages]
        self._has_mla = any(self._mla_per_token)
        self._vectors = []
        for w in self._weights:
            vector = [0.0] * len(keys)
            for k, weight in w:
                vector[k] += weight
            self._vectors.append(vector)
        # Each stage's weights of the attention units alone (what changes with the contexts, step
        # by step); the rest of a stage's sum depends on the batch's sizes only (_stage_bases).
        self._attn_weights = [tuple(vector[i] for i, _, _ in self._attn_units) for vector in self._vectors]
        # The MTP drafter (the last stage's `draft`) is a model of its own, run k times a
        # decode step inside the target's step: no CPU step of its own.
        draft = self.stages[-1].draft if num_speculative_tokens else None
        self._draft = None if draft is None else StepModel(
            [draft], hw, tp=tp, eff=eff.replace(step_overhead_s=0.0, seq_overhead_s=0.0),
            async_scheduling=async_scheduling, graph_max_tokens=graph_max_tokens, moe_dp=moe_dp,
            exchange_bytes_per_token=exchange_bytes_per_token, exchange_over_network=exchange_over_network,
        )  # fmt: skip
        # The target's _threshold_sums hold the drafter's when its thresholds are among the target's.
        self._draft_takes_sums = self._draft is not None and set(self._draft._thresholds) <= set(self._thresholds)

    def with_efficiency(self, eff: Efficiency) -> "StepModel":
        """The same model at other achieved fractions (the fit)."""
        return StepModel(self.stages, self.hw, eff=eff, **self._options)

    def at_load(self, replicas: int) -> "StepModel":
        """This model with `replicas` of the `moe_dp` replicas as busy as the one simulated and the
        rest idle (a closed loop of fewer requests than replicas; vLLM steps an idle DP rank with
        a dummy batch, left out here): its MoE layers run and exchange fewer tokens."""
        replicas = max(1, min(replicas, self.moe_dp))
        if replicas == self.moe_load:
            return self
        other = copy.copy(self)
        other.moe_load, other._by_size = replicas, {}
        if self._draft is not None:
            other._draft = self._draft.at_load(replicas)
        return other

    # --- the fast path: what the scheduler simulation calls every step ---------------

    def stage_seconds(self, decode_contexts: Sequence[int], prefills: Sequence[tuple[int, int]], query_len: int = 1,
                      sums: dict | None = None) -> list[float]:  # fmt: skip
        """Each stage's `parts(...).total_s`, without building them (the simulation's hot path).
        `sums`: _threshold_sums of these contexts when the caller has them (the MTP drafter's
        thresholds are among the target's)."""
        n_decode = len(decode_contexts)
        tokens = n_decode * query_len + sum(new for new, _ in prefills)
        if sums is None:
            sums = _threshold_sums(decode_contexts, self._thresholds)
        eff = self.eff
        bw = self._bw
        attn = []
        for term, floor, peak in self._attn_floors:  # _attention and _roofline, spelt out (~10^5 calls a plan)
            thr, div, b_entry, f_entry, _, b_seq, f_seq, _ = term
            entries = sums[thr] / div if div else 0.0
            nbytes = entries * b_entry + n_decode * b_seq
            flops = query_len * (entries * f_entry + n_decode * f_seq)
            if prefills:
                flops, nbytes = _prefill_attention(term, prefills, flops, nbytes)
            c, m = flops / peak, nbytes / bw
            attn.append((c if c >= m else m) + floor)
        bases = self._stage_bases(tokens, n_decode + len(prefills))
        out = [base + sum(map(mul, weights, attn)) for base, weights in zip(bases, self._attn_weights)]
        if self._has_mla and n_decode:
            decoding = n_decode * query_len
            out = [t + per_token * decoding for t, per_token in zip(out, self._mla_per_token)]
        if self._draft is not None and n_decode:
            out[-1] += self._draft_seconds(decode_contexts, sums)
        cpu = eff.step_overhead_s
        out[0] = (max(out[0], cpu) if self.async_scheduling else out[0] + cpu) + eff.seq_overhead_s * _emitted(n_decode, query_len, prefills)
        return out

    def _stage_bases(self, tokens: int, sampled: int) -> list[float]:
        """Each stage's fixed costs and the unit terms that depend on the batch's sizes only
        (GEMMs, MoE layers, all-reduces), weighted: memoised, batches of the same sizes recur
        every few steps."""
        key = (tokens, sampled)
        bases = self._by_size.get(key)
        if bases is None:
            if len(self._by_size) > 1 << 16:
                self._by_size.clear()
            unit = self._size_units(tokens, sampled)
            fixed = self._fixed_graphed if tokens <= self.graph_max_tokens else self._fixed_eager
            bases = self._by_size[key] = [f + sum(map(mul, vector, unit)) for f, vector in zip(fixed, self._vectors)]
        return bases

    def _size_units(self, tokens: int, sampled: int) -> list[float]:
        eff = self.eff
        unit = [0.0] * len(self._units)
        per_byte = 1.0 / self._bw  # a GEMM unit is one byte of weights
        for i, peak, flops_per_byte, per_sampled in self._gemm_units:
            c = (sampled if per_sampled else tokens) * flops_per_byte / peak
            unit[i] = c if c > per_byte else per_byte
        for i, term in self._moe_units:
            c, m = self._moe(term, tokens)
            unit[i] = c + m + eff.moe_floor_s
        for i, bytes_per_token in self._allreduce_units:
            unit[i] = self._allreduce(tokens * bytes_per_token)
        for i in self._exchange_units:
            unit[i] = self._exchange(tokens)
        return unit

    def hop_seconds(self, tokens: int) -> float:
        """One batch's activations from one stage to the next (vLLM sends hidden states
        and residual, `hop_bytes_per_token` each token), over EFA between nodes."""
        if self.pp == 1 or tokens == 0:
            return 0.0
        if self.hop_over_network:
            return self.hw.network_latency_s + tokens * self.hop_bytes_per_token / self.hw.network_bytes_per_s
        return self.hw.intra_node_latency_s + tokens * self.hop_bytes_per_token / self.hw.intra_node_bytes_per_s

    # --- the model ---------------------------------------------------------------------

    def parts(self, decode_contexts: Sequence[int], prefills: Sequence[tuple[int, int]], query_len: int = 1) -> list[StepParts]:
        n_decode = len(decode_contexts)
        tokens = n_decode * query_len + sum(new for new, _ in prefills)
        sampled = n_decode + len(prefills)  # ASSUMPTION: every prefill chunk samples (the last chunk does)
        sums = _threshold_sums(decode_contexts, self._thresholds)
        unit = [self._unit(u, tokens, sampled, sums, prefills, query_len, n_decode) for u in self._units]
        eff = self.eff
        stage_fixed = self._fixed_graphed if tokens <= self.graph_max_tokens else self._fixed_eager
        cpu = eff.step_overhead_s
        out = []
        for i in range(self.pp):
            compute = memory = comm = fixed = 0.0
            for k, weight in self._weights[i]:
                c, m, x, f = unit[k]
                compute += weight * c
                memory += weight * m
                comm += weight * x
                fixed += weight * f
            overhead = fixed + stage_fixed[i]
            compute += self._mla_per_token[i] * n_decode * query_len
            gpu = compute + memory + comm + overhead
            if i == self.pp - 1:
                gpu += self._draft_seconds(decode_contexts)
            total = gpu
            if i == 0:
                total = (max(gpu, cpu) if self.async_scheduling else gpu + cpu) + eff.seq_overhead_s * _emitted(n_decode, query_len, prefills)
                overhead += total - gpu
            out.append(StepParts(compute, memory, comm, overhead, total))
        return out

    def _unit(self, u: tuple, tokens: int, sampled: int, sums: dict, prefills, query_len: int,
              n_decode: int) -> tuple[float, float, float, float]:  # fmt: skip
        """(compute-bound s, memory-bound s, communication s, fixed s) of one unit term."""
        kind = u[0]
        if kind == "gemm":  # per byte of weights
            _, compute, flops_per_byte, per_sampled = u
            m = sampled if per_sampled else tokens
            return (*_roofline(m * flops_per_byte, self._peak[compute], 1.0, self._bw), 0.0, 0.0)
        if kind == "moe":  # one MoE layer: the fused call's floor, then its roofline
            c, m = self._moe(u[1:], tokens)
            return c, m, 0.0, self.eff.moe_floor_s
        if kind == "attn":  # one layer
            floor = self.eff.attention_floor_s if u[2] else 0.0  # a kernel reading context (not a recurrent state)
            return (*self._attention(u[1:-1], sums, prefills, query_len, n_decode, self._attn_peak * u[-1]), 0.0, floor)
        if kind == "exchange":  # one MoE layer's dispatch and combine between replicas
            return 0.0, 0.0, self._exchange(tokens), 0.0
        return 0.0, 0.0, self._allreduce(tokens * u[1]), 0.0  # one all-reduce

    def _moe(self, term: tuple, tokens: int) -> tuple[float, float]:
        """The routed experts of one layer: FLOPs at the fused-MoE fraction, which falls as
        each expert's slice on the rank (n) narrows: e_max x n / (n + n_half) (calibrate.py),
        and the bytes of the call's own activations.
        With DP the layer runs every busy replica's tokens (`moe_load` x this one's: ASSUMPTION,
        the busy replicas evenly loaded), on the rank's share of the experts."""
        experts, top_k, flops, bytes_per_expert, compute, kernel, inter, activation_bytes = term
        tokens *= self.moe_load
        distinct = expected_distinct_experts(experts, top_k, tokens)
        half = self.eff.moe_half_inter
        peak = self._moe_peak[compute, kernel] * (inter / (inter + half) if inter else 1.0)
        c, m = _roofline(tokens * flops, peak, distinct * bytes_per_expert, self._bw)
        # The call's activations (ops.moe_activation_bytes): kernels and blocks of their own, added.
        # They are part of the call the tables time whole: when its FLOPs bound it, at the serving
        # share like them; when its weights' reads do (a small batch), at the bandwidth like those.
        share = self.eff.serving_compute if c else 1.0
        return c, m + tokens * activation_bytes / (self._bw * share)

    def _draft_seconds(self, decode_contexts: Sequence[int], sums: dict | None = None) -> float:
        """The MTP drafter proposes k tokens, one forward of its layer(s) per token (vLLM
        v1/spec_decode/eagle.py propose): k passes of the draft model at the decode batch.
        `sums`: the target's _threshold_sums of the same contexts, which hold the drafter's."""
        if self._draft is None or not decode_contexts:
            return 0.0
        shared = sums if self._draft_takes_sums else None
        return self.num_speculative_tokens * self._draft.stage_seconds(decode_contexts, (), 1, shared)[0]

    def _attention(self, term: tuple, sums: dict, prefills: Sequence[tuple[int, int]], query_len: int,
                   n_decode: int, peak: float) -> tuple[float, float]:  # fmt: skip
        """One layer's attention, (compute-bound s, memory-bound s): decode reads each
        sequence's cached entries once for its query tokens; a prefill chunk computes
        over the entries each of its queries reaches and reads its context once."""
        thr, div, b_entry, f_entry, pf_entry, b_seq, f_seq, pctx = term
        entries = sums[thr] / div if div else 0.0
        nbytes = entries * b_entry + n_decode * b_seq
        flops = query_len * (entries * f_entry + n_decode * f_seq)
        flops, nbytes = _prefill_attention(term, prefills, flops, nbytes)
        return _roofline(flops, peak, nbytes, self._bw)

    def _exchange(self, tokens: int) -> float:
        """One MoE layer's dispatch and combine between the replicas: vLLM 0.34.0's default
        all2all backend (config/parallel.py all2all_backend "allgather_reducescatter";
        distributed/device_communicators/all2all.py AgRsAll2AllManager) all-gathers every DP
        rank's hidden states, top-k weights and ids before the experts and reduce-scatters their
        outputs after, so a rank takes in the other busy replicas' tokens (`moe_load` - 1 times
        its own) x exchange_bytes_per_token, and every rank pays two latencies. Over NVLink inside
        a node (the all-reduce's fitted latency and fraction), over EFA (or the instance's network
        without it) when the group spans nodes. ASSUMPTION: one latency per collective, not one
        per ring step."""
        if self.moe_dp <= 1 or tokens == 0:
            return 0.0
        hw = self.hw
        if self.exchange_over_network:
            latency, bandwidth = hw.network_latency_s, hw.network_bytes_per_s or hw.socket_bytes_per_s
        else:
            latency, bandwidth = self.eff.allreduce_latency_s, hw.intra_node_bytes_per_s * self.eff.allreduce_bw
        return 2 * latency + (self.moe_load - 1) * tokens * self.exchange_bytes_per_token / bandwidth

    def _allreduce(self, nbytes: float) -> float:
        """Ring all-reduce over the TP group: latency + 2 (n - 1) / n x bytes / bus bandwidth."""
        n = self.tp
        if n <= 1 or nbytes == 0:
            return 0.0
        return self.eff.allreduce_latency_s + 2 * (n - 1) / n * nbytes / (self.hw.intra_node_bytes_per_s * self.eff.allreduce_bw)


class _Units:
    """Distinct unit terms, each with its index."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []
        self._index: dict[tuple, int] = {}

    def index(self, key: tuple) -> int:
        if key not in self._index:
            self._index[key] = len(self.keys)
            self.keys.append(key)
        return self._index[key]


def _attention_tuple(a: AttentionTerm) -> tuple:
    return (a.threshold, a.divisor if a.reads_context else 0, a.bytes_per_entry, a.flops_per_entry,
            a.prefill_flops_per_entry, a.bytes_per_sequence, a.flops_per_sequence_token, a.prefill_context_flops)


def _has(hw: Hardware, dtype: str) -> bool:
    g = hw.gpu
    return {"bf16": True, "fp8": g.fp8_dense_tflops is not None, "fp4": g.fp4_dense_tflops is not None}[dtype]
