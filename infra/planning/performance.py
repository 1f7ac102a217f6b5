"""What a planned layout delivers under the stack's workload, against its SLA.

The performance model (infra/planning/perf/) simulates `vllm bench serve` against the
layout; this module asks it the plan's questions:

- the SLA capacity: the highest closed-loop concurrency whose p99 TTFT and p99 TPOT (and
  p99 ITL when the SLA sets one) meet the SLA, found by doubling then bisection, and the
  highest Poisson request rate that does;
- the throughput and latencies there, and what binds first beyond it;
- the curve of the `perf` command at a few concurrencies up to it.

Latencies are steady-state: the first `concurrency` requests of a closed loop (sent at
once when the benchmark starts) and the last `concurrency` (sent while the loop drains)
are left out, so a p99 is that of a loaded server, not of its start. Throughput is
Little's law over the measured requests: concurrency / mean end-to-end latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from infra.errors import UserError
from infra.planning.perf import predict, published_error, sharegpt
from infra.planning.perf.workload import Workload, latency_ms

# ShareGPT as `vllm bench serve --dataset-name sharegpt` sends it (ShareGPT_V3_unfiltered_
# cleaned_split): the dataset's own pairs (perf/sharegpt.py, counted with DeepSeek's
# tokenizer), scaled to the mean input and output tokens of the 49 ShareGPT rows of
# tests/fixtures/perf/measurements.jsonl (printed totals / successful requests under
# three models' tokenizers; each row cites its source), 219.3 and 200.4: the pairs' own
# means, 222 and 202, are one tokenizer's.
SHAREGPT_INPUT_TOKENS = 219
SHAREGPT_OUTPUT_TOKENS = 200
PRESETS = {"sharegpt": (SHAREGPT_INPUT_TOKENS, SHAREGPT_OUTPUT_TOKENS)}

# Requests a closed-loop point measures beyond its warm-up and drain (each `concurrency`
# long): at least MIN_MEASURED, and MEASURED_PER_SLOT per concurrent request.
MIN_MEASURED = 64
MEASURED_PER_SLOT = 2
# The bisection stops when the bracket is within this share of its low end (or 1).
BISECT_TOLERANCE = 1 / 8
# The Poisson rate search's first tries, as shares of the closed loop's throughput at the
# capacity: 1 - RATE_HIGH is within BISECT_TOLERANCE, so a rate that meets there is the answer.
RATE_HIGH = 0.9
RATE_LOW = 0.6


@dataclass(frozen=True)
class Sla:
    ttft_p99_ms: float
    tpot_p99_ms: float
    itl_p99_ms: float | None = None

    def misses(self, ttft_p99: float, tpot_p99: float, itl_p99: float) -> tuple[str, ...]:
        out = []
        if ttft_p99 > self.ttft_p99_ms:
            out.append("ttft")
        if tpot_p99 > self.tpot_p99_ms:
            out.append("tpot")
        if self.itl_p99_ms is not None and itl_p99 > self.itl_p99_ms:
            out.append("itl")
        return tuple(out)


@dataclass(frozen=True)
class WorkloadSpec:
    """Request lengths of the stack's traffic: means, and a lognormal spread (std / mean; 0 =
    every request the same), or a named preset; the share of each prompt already in vLLM's
    prefix cache (a shared system prompt, say)."""

    input_tokens: int
    output_tokens: int
    spread: float = 0.0
    preset: str | None = None
    prefix_cache_hit_rate: float = 0.0

    @classmethod
    def from_preset(cls, name: str, prefix_cache_hit_rate: float = 0.0) -> "WorkloadSpec":
        if name not in PRESETS:
            raise UserError(f"unknown workload preset {name!r}; known: {', '.join(PRESETS)}")
        i, o = PRESETS[name]
        return cls(i, o, sharegpt.spread(), name, prefix_cache_hit_rate)  # the preset's pairs' spread

    def workload(self) -> Workload:
        if self.preset == "sharegpt":
            return Workload.sharegpt(self.input_tokens, self.output_tokens)
        if self.spread:
            return Workload.lognormal(self.input_tokens, self.output_tokens, self.spread)
        return Workload.fixed(self.input_tokens, self.output_tokens)

    def describe(self) -> str:
        what = self.preset or ("lognormal" if self.spread else "fixed")
        spread = f", spread {self.spread:g}" if self.spread and not self.preset else ""
        hit = f", {self.prefix_cache_hit_rate:.0%} of each prompt cached" if self.prefix_cache_hit_rate else ""
        return f"{what}: {self.input_tokens:,} input / {self.output_tokens:,} output tokens{spread}{hit}"


@dataclass(frozen=True)
class LoadPoint:
    """One steady-state load: its throughput and latencies (ms; p50 and p99)."""

    concurrency: int | None
    request_rate: float | None
    requests_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    itl_p99_ms: float
    preemptions: int
    misses: tuple[str, ...]  # the SLA's terms this point misses: ttft, tpot, itl

    @property
    def meets(self) -> bool:
        return not self.misses

    @property
    def total_tokens_per_s(self) -> float:
        return self.input_tokens_per_s + self.output_tokens_per_s


@dataclass(frozen=True)
class Capacity:
    sla: Sla
    workload: WorkloadSpec
    gpus: int
    concurrency: int  # the SLA capacity (closed loop); 0: not even one request meets the SLA
    requests_per_s: float  # the highest Poisson rate that meets the SLA; 0 if none
    at: LoadPoint | None  # the point at the capacity concurrency
    single: LoadPoint  # one request at a time
    beyond: LoadPoint | None  # the first concurrency tried that misses (None: the search hit its ceiling)
    binding: str  # what stops more: ttft, tpot, itl, kv-admission (preemptions), max-num-seqs (the ceiling)
    ceiling: int  # the most concurrent requests the search tried (the engine's max-num-seqs x replicas)
    curve: tuple[LoadPoint, ...] = field(default=())
    outclassed: bool = False  # stopped early: `beyond` already serves no more than what it had to beat

    def with_rate(self, requests_per_s: float) -> "Capacity":
        return replace(self, requests_per_s=requests_per_s)

    @property
    def output_tokens_per_s(self) -> float:
        return self.at.output_tokens_per_s if self.at else 0.0

    def refusal(self) -> str:
        """Why not even one request at a time meets the SLA, in figures."""
        p, s = self.single, self.sla
        parts = []
        if "ttft" in p.misses:
            parts.append(f"TTFT p99 at concurrency 1 is {p.ttft_p99_ms:,.0f} ms > {s.ttft_p99_ms:,.0f} ms")
        if "tpot" in p.misses:
            parts.append(f"TPOT p99 at concurrency 1 is {p.tpot_p99_ms:,.1f} ms > {s.tpot_p99_ms:,.1f} ms")
        if "itl" in p.misses:
            parts.append(f"ITL p99 at concurrency 1 is {p.itl_p99_ms:,.1f} ms > {s.itl_p99_ms:,.1f} ms")
        return "; ".join(parts)


def closed_loop(s: predict.Setup, w: WorkloadSpec, sla: Sla, concurrency: int, *, seed: int = 0) -> LoadPoint:
    """Steady state of `vllm bench serve --max-concurrency C` (see the module's docstring)."""
    c = concurrency
    measured = max(MIN_MEASURED, MEASURED_PER_SLOT * c)
    res = predict.run(s, w.workload(), concurrency=c, request_rate=None, num_prompts=2 * c + measured, seed=seed,
                      prefix_cache_hit_rate=w.prefix_cache_hit_rate)  # fmt: skip
    # One replica's requests in the order they were sent; the replica had ceil(C / dp) slots.
    slots = math.ceil(c / s.layout.dp)
    reqs = sorted(res.requests)
    keep = reqs[slots:-slots] if len(reqs) > 2 * slots + 8 else reqs
    return _point(s, sla, keep, concurrency=c, rate=None, preemptions=res.preemptions, itl_p99_ms=res.itl_ms.p99,
                  requests_per_s=c / (sum(r[2] - r[0] for r in keep) / len(keep)))  # fmt: skip


def open_loop(s: predict.Setup, w: WorkloadSpec, sla: Sla, rate: float, *, prompts: int, seed: int = 0) -> LoadPoint:
    """Poisson arrivals at `rate` requests/s over all replicas; the first tenth of the requests
    (the empty server filling) left out."""
    res = predict.run(s, w.workload(), concurrency=None, request_rate=rate, num_prompts=prompts, seed=seed,
                      prefix_cache_hit_rate=w.prefix_cache_hit_rate)  # fmt: skip
    reqs = sorted(res.requests)
    keep = reqs[len(reqs) // 10:]
    return _point(s, sla, keep, concurrency=None, rate=rate, preemptions=res.preemptions, itl_p99_ms=res.itl_ms.p99,
                  requests_per_s=rate)


def _point(s: predict.Setup, sla: Sla, reqs: list, *, concurrency, rate, preemptions: int, itl_p99_ms: float,
           requests_per_s: float) -> LoadPoint:  # fmt: skip
    extra = predict.request_overhead(s)  # predict.run adds it to its own TTFT figures
    ttft = latency_ms([(first - sent + extra, 1) for sent, first, *_ in reqs])
    tpot = latency_ms([((last - first) / (out - 1), 1) for _, first, last, _, out in reqs if out > 1])
    itl_p99 = itl_p99_ms  # the whole run's chunk gaps (the simulation keeps no per-request ITL)
    n = len(reqs)
    mean_in = sum(r[3] for r in reqs) / n
    mean_out = sum(r[4] for r in reqs) / n
    return LoadPoint(
        concurrency=concurrency, request_rate=rate, requests_per_s=requests_per_s,
        input_tokens_per_s=requests_per_s * mean_in, output_tokens_per_s=requests_per_s * mean_out,
        ttft_p50_ms=ttft.p50, ttft_p99_ms=ttft.p99, tpot_p50_ms=tpot.p50, tpot_p99_ms=tpot.p99, itl_p99_ms=itl_p99,
        preemptions=preemptions, misses=sla.misses(ttft.p99, tpot.p99, itl_p99),
    )  # fmt: skip


def sla_capacity(s: predict.Setup, w: WorkloadSpec, sla: Sla, *, with_rate: bool = True, must_beat: float = 0.0,
                 hint: tuple[int, int | None] | None = None) -> Capacity:  # fmt: skip
    """The SLA capacity of a setup (see the module's docstring). The search's ceiling is
    the engine's max-num-seqs on every replica: beyond it requests queue for a slot.

    `must_beat` (output tokens/s): stop as soon as a concurrency that misses the SLA serves
    no more than that. A closed loop's throughput grows with its concurrency, so no
    concurrency below it, the capacity included, can beat it; the result is then
    `outclassed`, its capacity only the best found so far.

    `hint` (lo, hi): another layout's bracket, tried first. Layouts that differ little
    (expert parallel on or off, say) share it, and then two points settle the search; a
    worse one misses at lo serving less than `must_beat`, and one point settles it."""
    ceiling = s.knobs.max_num_seqs * s.layout.dp
    points: dict[int, LoadPoint] = {}

    def at(c: int) -> LoadPoint:
        if c not in points:
            points[c] = closed_loop(s, w, sla, c)
        return points[c]

    def beaten(lo: float, hi: float | None) -> bool:
        return must_beat > 0 and hi is not None and at(int(hi)).output_tokens_per_s <= must_beat

    single = at(1)
    if not _ok(single):
        return Capacity(sla, w, s.gpus, 0, 0.0, None, single, single, _binding(single), ceiling)
    start, top = 1.0, None
    if hint is not None and 1 < hint[0] <= ceiling:
        if _ok(at(hint[0])):
            start = float(hint[0])
            if hint[1] is not None and hint[1] <= ceiling and not _ok(at(hint[1])):
                top = float(hint[1])
        else:
            top = float(hint[0])
    lo, hi = (start, top) if beaten(start, top) else _edge(
        lambda c: sla_ratios(sla, at(int(c))), start, float(ceiling), integer=True, hi=top, stop=beaten)
    best = at(int(lo))
    beyond = at(int(hi)) if hi is not None else None
    binding = _binding(beyond) if beyond is not None else "max-num-seqs"
    outclassed = beaten(lo, hi)
    rate = rate_capacity(s, w, sla, best) if with_rate and not outclassed else 0.0
    curve = tuple(points[c] for c in sorted(points))
    return Capacity(sla, w, s.gpus, int(lo), rate, best, single, beyond, binding, ceiling, curve, outclassed)


def _ok(p: LoadPoint) -> bool:
    return p.meets and p.preemptions == 0


def sla_ratios(sla: Sla, p: LoadPoint) -> tuple[float, ...]:
    """How close a point is to the SLA: each p99 over its threshold (1 = at it); a point
    that preempts counts as over (the KV cache is full)."""
    ratios = (p.ttft_p99_ms / sla.ttft_p99_ms, p.tpot_p99_ms / sla.tpot_p99_ms) + (
        (p.itl_p99_ms / sla.itl_p99_ms,) if sla.itl_p99_ms else ())
    return ratios if _ok(p) else ratios + (1.0 + 1e-9,)


def _secant(a: tuple[float, tuple], b: tuple[float, tuple]) -> float | None:
    """Where the first term to reach 1 gets there, each term linear through points a and b."""
    (x0, y0), (x1, y1) = a, b
    crossings = [x1 + (1.0 - v1) * (x1 - x0) / (v1 - v0) for v0, v1 in zip(y0, y1) if (v1 - v0) * (x1 - x0) > 0]
    return min(crossings) if crossings else None


def _edge(load, lo: float, ceiling: float, *, integer: bool, hi: float | None = None, first_step: float = 4.0,
          tolerance: float = BISECT_TOLERANCE, stop=None) -> tuple[float, float | None]:  # fmt: skip
    """The largest x in [lo, ceiling] whose load terms are all <= 1, given lo's are, as a
    bracket (lo that meets; hi that does not, or None when the ceiling meets). Each guess is
    where the secant through the two latest points says the first term reaches 1 (the terms
    grow about linearly near the SLA), kept within first_step x lo while nothing misses and
    inside the bracket after; every other guess within a bracket bisects, so the search
    cannot stall. Large loads cost the most to simulate, so it steps up rather than over.
    `stop(lo, hi)`, when given, ends the search early once it returns true."""
    known = [(lo, load(lo))]
    step = 1.0 if integer else 0.0
    for i in range(40):
        if hi is None and lo >= ceiling:
            break
        if hi is not None and hi - lo <= max(step, lo * tolerance):
            break
        if stop is not None and stop(lo, hi):
            break
        # Without a miss yet: at most first_step x lo, and less the nearer lo is to the SLA
        # (a term at 0.9 of its threshold would take more than 1 / 0.9^2 of the load to miss).
        nearest = max(max(y) for x, y in known if x == lo)
        top = hi - step if hi is not None else min(max(lo * min(first_step, 1 / max(nearest, 1e-9) ** 2),
                                                       lo + max(step, lo * tolerance / 2)), ceiling)  # fmt: skip
        guess = _secant(known[-2], known[-1]) if len(known) > 1 else None
        if guess is None or (i % 2 and hi is not None):
            guess = (lo + hi) / 2 if hi is not None else top
        x = min(max(guess, lo + max(step, lo * tolerance / 2)), top)
        if integer:
            x = float(round(x))
        if x <= lo or (hi is not None and x >= hi):
            break
        y = load(x)
        known.append((x, y))
        if max(y) <= 1.0:
            lo = x
        else:
            hi = x
    return lo, hi


def _binding(p: LoadPoint) -> str:
    if p.misses:
        return p.misses[0]
    return "kv-admission" if p.preemptions else "none"


def rate_capacity(s: predict.Setup, w: WorkloadSpec, sla: Sla, at_capacity: LoadPoint) -> float:
    """The highest Poisson rate that meets the SLA, at most the capacity concurrency's
    throughput (an open loop's bursts never let it sustain more), to within the bisection's
    tolerance: 90% of it when that meets (the rest of the bracket is within 1/8), else
    searched between 60% and 90%; 0 if even 60% misses. Over requests worth ~4 of the
    capacity's round trips each."""
    top = at_capacity.requests_per_s
    prompts = max(MIN_MEASURED * 2, 4 * (at_capacity.concurrency or 1))
    points: dict[float, LoadPoint] = {}

    def load(rate: float) -> tuple[float, ...]:
        if rate not in points:
            points[rate] = open_loop(s, w, sla, rate, prompts=prompts)
        return sla_ratios(sla, points[rate])

    high, low = RATE_HIGH * top, RATE_LOW * top
    if max(load(high)) <= 1.0:
        return high
    if max(load(low)) > 1.0:
        return 0.0
    return _edge(load, low, top, integer=False, hi=high)[0]


def _point_json(p: LoadPoint, gpus: int) -> dict:
    return {
        "concurrency": p.concurrency,
        "request_rate": p.request_rate,
        "requests_per_s": p.requests_per_s,
        "input_tokens_per_s": p.input_tokens_per_s,
        "output_tokens_per_s": p.output_tokens_per_s,
        "total_tokens_per_s": p.total_tokens_per_s,
        "output_tokens_per_s_per_gpu": p.output_tokens_per_s / gpus,
        "ttft_ms": {"p50": p.ttft_p50_ms, "p99": p.ttft_p99_ms},
        "tpot_ms": {"p50": p.tpot_p50_ms, "p99": p.tpot_p99_ms},
        "itl_ms": {"p99": p.itl_p99_ms},
        "preemptions": p.preemptions,
        "meets_sla": p.meets,
        "misses": list(p.misses),
    }


def performance_json(c: Capacity, model_type: str) -> dict:
    """The plan's `performance` section (names tools read: docs/planning.md, "Performance");
    `model_type`: the model's, for the model's error on published runs of its family."""
    w = c.workload
    at = _point_json(c.at, c.gpus) if c.at else None
    capacity = {
        "concurrency": c.concurrency,
        "requests_per_s": c.requests_per_s,  # the highest Poisson rate within the SLA
        "binding": c.binding,
        "ceiling": c.ceiling,
        "closed_loop_requests_per_s": at["requests_per_s"] if at else 0.0,
        "input_tokens_per_s": at["input_tokens_per_s"] if at else 0.0,
        "output_tokens_per_s": at["output_tokens_per_s"] if at else 0.0,
        "total_tokens_per_s": at["total_tokens_per_s"] if at else 0.0,
        "output_tokens_per_s_per_gpu": at["output_tokens_per_s_per_gpu"] if at else 0.0,
        "ttft_ms": at["ttft_ms"] if at else None,
        "tpot_ms": at["tpot_ms"] if at else None,
    }
    return {
        "sla": {"ttft_p99_ms": c.sla.ttft_p99_ms, "tpot_p99_ms": c.sla.tpot_p99_ms, "itl_p99_ms": c.sla.itl_p99_ms},
        "workload": {"preset": w.preset, "input_tokens": w.input_tokens, "output_tokens": w.output_tokens,
                     "spread": w.spread, "prefix_cache_hit_rate": w.prefix_cache_hit_rate, "describe": w.describe()},
        "sla_capacity": capacity,
        "single_request": _point_json(c.single, c.gpus),
        "beyond": _point_json(c.beyond, c.gpus) if c.beyond else None,
        "curve": [_point_json(p, c.gpus) for p in c.curve],
        "refusal": c.refusal() if not c.concurrency else "",
        # How near the model has come to published runs it was not fitted on (perf/published_error.py).
        "model_error": published_error.model_error(model_type),
    }


# --- The benchmark Job's load ------------------------------------------------------------

# `vllm bench serve --dataset-name random` draws each length uniformly within mean x (1 +- R),
# R < 1 (benchmarks/datasets/utils.py get_sampling_params); a fixed prefix shared by every
# request (--random-prefix-len) comes before the drawn part. ASSUMPTION: the workload's
# lognormal spread s is stood in for by the uniform of the same std / mean (R = s x sqrt(3)),
# at most BENCH_MAX_RANGE_RATIO; the prediction beside the measurement is for that load.
BENCH_MAX_RANGE_RATIO = 0.9
MIN_BENCH_PROMPTS = 200
BENCH_PROMPTS_PER_SLOT = 4


@dataclass(frozen=True)
class BenchmarkLoad:
    """What the benchmark Job sends (random dataset, closed loop at the SLA capacity) and what
    the model predicts `vllm bench serve` prints for it (whole run, as the tool reports)."""

    input_len: int  # --random-input-len: the drawn part, after the shared prefix
    output_len: int  # --random-output-len (with --ignore-eos, exactly the drawn length)
    range_ratio: float  # --random-range-ratio
    prefix_len: int  # --random-prefix-len
    concurrency: int  # --max-concurrency
    prompts: int  # --num-prompts
    predicted: tuple[tuple[str, float], ...]  # (result key as serve.py writes it, value)


def benchmark_load(s: predict.Setup, w: WorkloadSpec, concurrency: int, *, seed: int = 0) -> BenchmarkLoad:
    prefix = int(round(w.input_tokens * w.prefix_cache_hit_rate))
    drawn = max(1, w.input_tokens - prefix)
    ratio = round(min(BENCH_MAX_RANGE_RATIO, w.spread * math.sqrt(3)), 3)
    prompts = max(MIN_BENCH_PROMPTS, BENCH_PROMPTS_PER_SLOT * concurrency)
    load = Workload.uniform(prefix + drawn, w.output_tokens, ratio) if ratio else Workload.fixed(prefix + drawn, w.output_tokens)
    res = predict.run(s, load, concurrency=concurrency, request_rate=None, num_prompts=prompts, seed=seed,
                      prefix_cache_hit_rate=prefix / (prefix + drawn))  # fmt: skip
    # The keys `vllm bench serve --save-result` writes (0.34.0 benchmarks/serve.py: median_<metric>_ms
    # always, p<p>_<metric>_ms per --metric-percentiles, output_throughput, request_throughput).
    predicted = (
        ("median_ttft_ms", res.ttft_ms.p50), ("p99_ttft_ms", res.ttft_ms.p99),
        ("median_tpot_ms", res.tpot_ms.p50), ("p99_tpot_ms", res.tpot_ms.p99),
        ("output_throughput", res.output_tokens_per_s), ("request_throughput", res.requests_per_s),
    )  # fmt: skip
    if s.knobs.num_speculative_tokens:
        # serve.py (0.34.0) writes the drafts accepted over the run, in percent, when the
        # server exports vllm:spec_decode_* metrics; the model assumes the rate it is given.
        predicted += (("spec_decode_acceptance_rate", 100 * s.serving.acceptance_rate),)
    return BenchmarkLoad(drawn, w.output_tokens, ratio, prefix, concurrency, prompts, predicted)
