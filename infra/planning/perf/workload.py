"""The client side of a benchmark, as `vllm bench serve` (0.34) runs it: request lengths, send
times, the concurrency limit, and the metrics it reports.

- Lengths: fixed, integer-uniform around a mean (`--random-range-ratio`, as
  benchmarks/datasets/utils.py get_sampling_params draws them for RandomDataset),
  lognormal from a mean and a spread, ShareGPT's own pairs (`Workload.sharegpt`,
  sharegpt.py), or (input, output) pairs from a JSON-lines file.
- Send times of an open loop: benchmarks/serve.py get_request (burstiness 1, a Poisson
  process): cumulative exponential gaps, rescaled so the last request is sent at
  exactly num_prompts / rate.

Everything is drawn from random.Random(seed), so a seed gives the same requests.
"""

from __future__ import annotations

import json
import math
import random
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

from infra.errors import UserError
from infra.planning.perf import sharegpt

KINDS = ("fixed", "uniform", "lognormal", "sharegpt", "pairs")


@dataclass(frozen=True)
class Workload:
    """Input and output lengths (tokens) of the requests of one benchmark.

    `kind` says how lengths are drawn: "fixed" (input_len, output_len), "uniform"
    (range_ratio around them), "lognormal" (means input_len, output_len and
    coefficient of variation `spread` = std / mean), "sharegpt" (ShareGPT's pairs scaled
    to the means input_len, output_len) or "pairs" (the given pairs, in order).
    """

    kind: str = "fixed"
    input_len: int = 0
    output_len: int = 0
    range_ratio: float = 0.0
    spread: float = 0.0
    pairs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"unknown workload kind {self.kind!r}; known kinds: {', '.join(KINDS)}")
        if self.kind == "pairs":
            if not self.pairs:
                raise UserError("a workload of pairs needs at least one (input, output) pair")
        elif self.input_len < 1 or self.output_len < 1:
            raise UserError(f"input and output lengths must be >= 1 tokens, got {self.input_len} and {self.output_len}")
        if not 0.0 <= self.range_ratio < 1.0:  # get_sampling_params: "range_ratio must be in [0, 1)"
            raise UserError(f"range ratio must be in [0, 1), got {self.range_ratio}")
        if not 0 <= self.spread < math.inf:  # NaN and inf too: the draws would be NaN or inf tokens
            raise UserError(f"lognormal spread (std / mean) must be a finite number >= 0, got {self.spread}")

    @classmethod
    def fixed(cls, input_len: int, output_len: int) -> Workload:
        return cls("fixed", input_len, output_len)

    @classmethod
    def uniform(cls, input_len: int, output_len: int, range_ratio: float) -> Workload:
        return cls("uniform", input_len, output_len, range_ratio=range_ratio)

    @classmethod
    def lognormal(cls, input_mean: int, output_mean: int, spread: float) -> Workload:
        return cls("lognormal", input_mean, output_mean, spread=spread)

    @classmethod
    def sharegpt(cls, input_mean: int, output_mean: int) -> Workload:
        """ShareGPT as `vllm bench serve --dataset-name sharegpt` sends it: the pairs its
        ShareGPTDataset keeps (sharegpt.py), shuffled with the seed and taken in turn, each
        length scaled so that the sample's means are these (its model's tokenizer counts a
        few percent apart from the pairs' DeepSeek one). vLLM shuffles the whole dataset with
        its seed: the same law, not the same requests."""
        return cls("sharegpt", input_mean, output_mean)

    @classmethod
    def from_jsonl(cls, path: str) -> Workload:
        return cls("pairs", pairs=read_pairs(path))

    def sample(self, n: int, seed: int) -> list[tuple[int, int]]:
        """n (input, output) lengths, the same for the same seed."""
        rng = random.Random(seed)
        if self.kind == "fixed":
            return [(self.input_len, self.output_len)] * n
        if self.kind == "uniform":
            ins, outs = _uniform_bounds(self.input_len, self.range_ratio), _uniform_bounds(self.output_len, self.range_ratio)
            # get_sampling_params draws all inputs, then all outputs; we draw pairwise (same law).
            return [(rng.randint(*ins), max(1, rng.randint(*outs))) for _ in range(n)]
        if self.kind == "lognormal":
            return self._lognormal_prefix(n, seed)
        if self.kind == "sharegpt":
            return self._sharegpt(n, seed)
        # A custom dataset is taken in file order; when it is shorter than n,
        # datasets.py maybe_oversample_requests adds random.choices of it.
        pairs = list(self.pairs[:n])
        return pairs + rng.choices(self.pairs, k=n - len(pairs)) if len(pairs) < n else pairs

    def _lognormal_prefix(self, n: int, seed: int) -> list[tuple[int, int]]:
        """The first n pairs of the seed's lognormal sequence. Pairs are drawn in turn from one
        generator, so n of them are the start of any longer sample: each process keeps the pairs
        drawn so far with their generator and draws only what a larger n adds (an SLA search
        samples the same seed at a dozen growing sizes, up to tens of thousands of requests)."""
        if len(_DRAWN) >= _DRAWN_MAX and (self, seed) not in _DRAWN:
            _DRAWN.clear()
        rng, drawn = _DRAWN.setdefault((self, seed), (random.Random(seed), []))
        if len(drawn) < n:
            drawn.extend((_lognormal(rng, self.input_len, self.spread), _lognormal(rng, self.output_len, self.spread))
                         for _ in range(n - len(drawn)))  # fmt: skip
        return drawn[:n]

    def _sharegpt(self, n: int, seed: int) -> list[tuple[int, int]]:
        """The first n of the seed's order of the pairs (datasets.py maybe_oversample_requests
        draws random.choices of them past the last), scaled to the means."""
        order = _sharegpt_order(seed)
        taken = order[:n]
        if n > len(order):
            taken += random.Random(seed).choices(order, k=n - len(order))
        if not taken:
            return []
        scale_in = self.input_len * len(taken) / sum(p for p, _ in taken)
        scale_out = self.output_len * len(taken) / sum(o for _, o in taken)
        return [(max(1, round(p * scale_in)), max(1, round(o * scale_out))) for p, o in taken]


# Workload._lognormal_prefix: (workload, seed) -> (its generator, the pairs drawn so far), a few per process.
_DRAWN: dict[tuple[Workload, int], tuple[random.Random, list[tuple[int, int]]]] = {}
_DRAWN_MAX = 16


def _sharegpt_order(seed: int) -> list[tuple[int, int]]:
    """ShareGPT's pairs shuffled with the seed (datasets.py ShareGPTDataset.load_data shuffles
    the dataset with its seed), kept per seed: a search samples one seed at many sizes."""
    order = _SHAREGPT_ORDERS.get(seed)
    if order is None:
        if len(_SHAREGPT_ORDERS) >= _DRAWN_MAX:
            _SHAREGPT_ORDERS.clear()
        order = _SHAREGPT_ORDERS[seed] = list(sharegpt.pairs())
        random.Random(seed).shuffle(order)
    return order


_SHAREGPT_ORDERS: dict[int, list[tuple[int, int]]] = {}


def _uniform_bounds(mean: int, ratio: float) -> tuple[int, int]:
    """benchmarks/datasets/utils.py get_sampling_params: integers in [floor(L(1-r)), ceil(L(1+r))]
    (tokenizer special tokens, which it subtracts from the input, are ignored here)."""
    return max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))


def _lognormal(rng: random.Random, mean: float, spread: float) -> int:
    """A lognormal length with the given mean and std / mean, rounded, at least 1."""
    sigma2 = math.log1p(spread * spread)
    return max(1, round(rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))))


def read_pairs(path: str) -> tuple[tuple[int, int], ...]:
    """(input_tokens, output_tokens) of each line of a JSON-lines file; UserError names the bad line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UserError(f"{path}: cannot read the workload file: {e.strerror or e}") from None
    pairs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f'{path}:{number}: expected an object {{"input_tokens": int, "output_tokens": int}}')
        lengths = []
        for key in ("input_tokens", "output_tokens"):
            value = row.get(key)
            if type(value) is not int or value < 1:
                raise UserError(f"{path}:{number}: {key} must be an integer >= 1, got {value!r}")
            lengths.append(value)
        pairs.append((lengths[0], lengths[1]))
    if not pairs:
        raise UserError(f"{path}: no requests in the workload file")
    return tuple(pairs)


def send_times(n: int, rate: float | None, seed: int) -> list[float]:
    """When the client means to send each of n requests (seconds from the benchmark start).

    benchmarks/serve.py get_request: rate inf sends all at once; otherwise gaps are
    gamma(burstiness=1) = exponential draws, summed, then rescaled so the last send is at
    n / rate ("to close the gap for stabilizing the throughput data").
    """
    if rate is None or math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed ^ 0x5EED)
    times, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    scale = (n / rate) / times[-1] if times and times[-1] > 0 else 1.0
    return [x * scale for x in times]


class Client:
    """`vllm bench serve`: each request is sent at its time or, with --max-concurrency, when a
    slot frees (serve.py limited_request_func's semaphore); TTFT counts from the send.

    Between the client and the engine sits the API server, one process whose event loop
    takes each request in (HTTP, chat template, tokenization: `frontend_s` of its time) and
    hands it to the engine. The loop interleaves the requests it is taking in: each await
    (the request body, the tokenizer's executor, the engine client) puts the request back
    at the tail of asyncio's ready queue, behind every other request in intake. So the
    server's time is shared equally among them (processor sharing): a lone request reaches
    the engine `frontend_s` after it is sent, and a burst of n requests reaches it together,
    about n x `frontend_s` after the burst, not one every `frontend_s`."""

    def __init__(self, lengths: list[tuple[int, int]], times: list[float], slots: float, make_request,
                 frontend_s: float = 0.0):  # fmt: skip
        self.pending = deque(zip(times, lengths))
        self.make_request = make_request  # (prompt, output, sent) -> the engine's request
        self.slots, self.released_at = slots, 0.0
        self.frontend_s = frontend_s
        # Processor sharing: each request in intake is done when the work every one of them
        # has received (`shared`, growing at 1 / len(intake) per second) reaches its mark.
        self.clock, self.shared = 0.0, 0.0
        self.intake: deque = deque()  # (shared work at which it is done, request), in order

    def _serve(self, until: float, waiting: deque) -> None:
        """Run the API server to `until`, handing each request it finishes to `waiting`."""
        intake = self.intake
        while intake:
            k = len(intake)
            done_at = self.clock + (intake[0][0] - self.shared) * k
            if done_at > until:
                self.shared += (until - self.clock) / k
                break
            self.clock, self.shared = done_at, intake[0][0]
            waiting.append(intake.popleft()[1])
        if until > self.clock:
            self.clock = until

    def send_due(self, now: float, waiting: deque) -> None:
        while self.slots > 0 and self.pending and self.pending[0][0] <= now:
            when, (prompt, out) = self.pending.popleft()
            self.slots -= 1
            sent = max(when, self.released_at)
            self._serve(sent, waiting)
            self.intake.append((self.shared + self.frontend_s, self.make_request(prompt, out, sent)))
        self._serve(now, waiting)

    def release(self, now: float) -> None:
        self.slots += 1
        self.released_at = now

    def next_send(self) -> float | None:
        """When something next happens on the client's side: a send or an arrival at the engine."""
        times = []
        if self.slots > 0 and self.pending:
            times.append(self.pending[0][0])
        if self.intake:
            times.append(self.clock + (self.intake[0][0] - self.shared) * len(self.intake))
        return min(times) if times else None


@dataclass(frozen=True)
class Latency:
    mean: float
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class SimResult:
    """What one simulated `vllm bench serve` run reports, plus the engine's own counts."""

    duration_s: float  # benchmark start (time 0, as serve.py) to the last token, one replica
    completed: int  # over all dp replicas
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft_ms: Latency
    tpot_ms: Latency
    itl_ms: Latency
    preemptions: int  # one replica
    mean_batch_size: float  # decode sequences per (non-empty) step
    mean_step_s: float  # slowest stage of a batch, mean over steps
    steps: int
    limits: dict[str, float]  # fraction of steps whose admission stopped on each scheduler.LIMITS
    requests: tuple[tuple[float, float, float, int, int], ...]  # (sent, first token, finish, input, output), one replica


def latency_ms(samples: list[tuple[float, int]]) -> Latency:
    """Mean and percentiles of (value, count) samples in ms; empty gives zeros (serve.py: `x or 0`)."""
    samples.sort()
    total = sum(c for _, c in samples)
    if not total:
        return Latency(0.0, 0.0, 0.0, 0.0)
    mean = sum(v * c for v, c in samples) / total
    values, ends, seen = [], [], 0
    for v, c in samples:
        seen += c
        values.append(v)
        ends.append(seen)  # ranks < seen hold v
    return Latency(mean * 1e3, *(percentile(values, ends, q) * 1e3 for q in (50, 90, 99)))


def percentile(values: list[float], ends: list[int], q: float) -> float:
    """numpy.percentile(method="linear") of the sorted multiset where values[i] fills ranks below ends[i]."""
    n = ends[-1]
    quantile = q / 100
    virtual = n * quantile + (1 + quantile * -1) - 1  # numpy _compute_virtual_index, alpha = beta = 1
    below = math.floor(virtual)
    gamma = virtual - below
    lo = _at_rank(values, ends, min(max(below, 0), n - 1))
    hi = _at_rank(values, ends, min(max(below + 1, 0), n - 1))
    diff = hi - lo  # numpy _lerp, which interpolates from the nearer end
    return hi - diff * (1 - gamma) if gamma >= 0.5 else lo + diff * gamma


def _at_rank(values: list[float], ends: list[int], rank: int) -> float:
    return values[bisect_right(ends, rank)]


def serve_metrics(requests: list[tuple[float, float, float, int, int]], itl: dict[float, int], replicas: float) -> dict:
    """benchmarks/serve.py calculate_metrics over (sent, first token, last token, input, output) of each
    request and ITL (gap -> count); throughputs times the replicas serving alike. Duration runs from
    the benchmark start (time 0, before the first send) to the last token, as serve.py times it."""
    duration = max((last for _, _, last, _, _ in requests), default=0.0)
    per_s = replicas / duration if duration > 0 else 0.0
    outputs, inputs = sum(r[4] for r in requests), sum(r[3] for r in requests)
    # TPOT = (latency - ttft) / (output - 1), only for outputs > 1.
    tpots = [((last - first) / (out - 1), 1) for _, first, last, _, out in requests if out > 1]
    return dict(
        duration_s=duration, requests_per_s=len(requests) * per_s, output_tokens_per_s=outputs * per_s,
        total_tokens_per_s=(inputs + outputs) * per_s, ttft_ms=latency_ms([(first - sent, 1) for sent, first, *_ in requests]),
        tpot_ms=latency_ms(tpots), itl_ms=latency_ms(list(itl.items())), requests=tuple(requests),
    )
