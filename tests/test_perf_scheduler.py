"""The serving simulator (infra/planning/perf/scheduler.py) on a stand-in step model.

Step times are constants chosen here, so every expected figure is derived by hand:
a lone request's TTFT is its prefill steps, its TPOT one decode step; a closed loop of
identical requests completes C requests every `output` steps; and so on.
"""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.errors import UserError
from infra.planning.perf import scheduler
from infra.planning.perf.scheduler import KVPool, simulate
from infra.planning.perf.workload import Workload, latency_ms, percentile, send_times

T = 0.010  # seconds per step on each stage


class ConstantStep:
    """Every batch takes `seconds` on each of `pp` stages; hops take `hop`."""

    def __init__(self, pp: int = 1, seconds: float = T, hop: float = 0.0):
        self.pp, self.seconds, self.hop = pp, seconds, hop
        self.calls = []

    def stage_seconds(self, decode_contexts, prefills, query_len):
        self.calls.append((list(decode_contexts), list(prefills), query_len))
        return [self.seconds] * self.pp

    def hop_seconds(self, tokens):
        return self.hop


def blocks_of_16(tokens: int) -> int:
    return -(-tokens // 16)


BIG_POOL = KVPool(num_blocks=1_000_000, blocks_for=blocks_of_16)


def run(workload=Workload.fixed(100, 10), *, cost=None, pool=BIG_POOL, concurrency=1, rate=None, prompts=1, **kw):
    args = dict(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192, async_scheduling=False)
    args.update(kw)
    return simulate(cost or ConstantStep(), pool, workload, concurrency=concurrency, request_rate=rate,
                    num_prompts=prompts, **args)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_lone_request_ttft_is_its_prefill_step_and_tpot_one_decode_step(async_scheduling):
    result = run(Workload.fixed(100, 10), async_scheduling=async_scheduling)
    assert result.ttft_ms.mean == pytest.approx(T * 1e3)
    assert result.tpot_ms.mean == pytest.approx(T * 1e3)
    assert result.itl_ms.p99 == pytest.approx(T * 1e3)
    assert result.duration_s == pytest.approx(10 * T)  # 1 prefill step (first token) + 9 decode steps
    assert result.completed == 1 and result.requests[0][4] == 10


def test_closed_loop_completes_c_requests_per_request_time():
    # 4 identical requests run side by side for 10 steps each; the next 4 go out as they finish.
    result = run(Workload.fixed(100, 10), concurrency=4, prompts=12)
    assert result.requests_per_s == pytest.approx(4 / (10 * T))
    assert result.output_tokens_per_s == pytest.approx(4 * 10 / (10 * T))
    assert result.total_tokens_per_s == pytest.approx(4 * 110 / (10 * T))
    assert result.mean_batch_size == pytest.approx(4 * 9 / 10)  # 9 of every 10 steps decode all 4


def test_chunked_prefill_takes_ceil_prompt_over_budget_steps():
    cost = ConstantStep()
    result = run(Workload.fixed(1000, 2), cost=cost, max_num_batched_tokens=256)
    assert result.ttft_ms.mean == pytest.approx(math.ceil(1000 / 256) * T * 1e3)
    assert [p for _, p, _ in cost.calls[:4]] == [[(256, 0)], [(256, 256)], [(256, 512)], [(232, 768)]]
    assert result.limits["token_budget"] > 0


def test_max_num_seqs_caps_the_batch_and_queues_the_rest():
    free = run(Workload.fixed(100, 50), concurrency=8, prompts=32, max_num_seqs=8)
    capped = run(Workload.fixed(100, 50), concurrency=8, prompts=32, max_num_seqs=4)
    assert capped.mean_batch_size <= 4
    assert capped.limits["max_num_seqs"] > 0.5
    # With a constant step time a queued request waits before its first token, then decodes as fast.
    assert capped.ttft_ms.mean > 10 * free.ttft_ms.mean
    assert capped.tpot_ms.mean == pytest.approx(free.tpot_ms.mean)
    assert capped.requests_per_s == pytest.approx(free.requests_per_s / 2, rel=0.05)


def test_a_small_pool_limits_admission_to_what_fits():
    # 100 tokens take 7 blocks; 20 usable blocks (+ the null block) admit 2 prompts at a time.
    pool = KVPool(num_blocks=21, blocks_for=blocks_of_16)
    result = run(Workload.fixed(100, 5), pool=pool, concurrency=4, prompts=8)
    assert result.limits["kv_admission"] > 0
    assert result.mean_batch_size <= 2
    assert result.completed == 8


def test_decode_growth_beyond_the_pool_preempts_and_recomputes():
    # Admission checks only the prompt (scheduler_reserve_full_isl), so 8 requests that grow
    # to 13 blocks each overflow a 60-block pool while decoding.
    pool = KVPool(num_blocks=61, blocks_for=blocks_of_16)
    result = run(Workload.fixed(16, 190), pool=pool, concurrency=8, prompts=16)
    assert result.preemptions > 0
    assert result.completed == 16
    assert all(out == 190 for *_, out in result.requests)


def test_pipeline_lone_request_tpot_is_all_stages_and_hops():
    result = run(Workload.fixed(100, 20), cost=ConstantStep(pp=2, hop=0.001))
    assert result.tpot_ms.mean == pytest.approx((2 * T + 0.001) * 1e3)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_pipeline_runs_two_micro_batches_in_flight(async_scheduling):
    # Prompts as long as the budget go to separate batches, hence separate micro-batches.
    workload, cost = Workload.fixed(512, 200), ConstantStep(pp=2)
    one = run(workload, cost=cost, concurrency=1, prompts=4, max_num_batched_tokens=512, async_scheduling=async_scheduling)
    two = run(workload, cost=cost, concurrency=2, prompts=8, max_num_batched_tokens=512, async_scheduling=async_scheduling)
    assert two.output_tokens_per_s == pytest.approx(2 * one.output_tokens_per_s, rel=0.02)
    assert two.tpot_ms.mean == pytest.approx(one.tpot_ms.mean, rel=0.02)


def test_open_loop_above_capacity_queues_ever_longer():
    # One request at a time takes 20 steps = 0.2 s; 50 req/s is far beyond that with max_num_seqs 2.
    short = run(Workload.fixed(100, 20), concurrency=None, rate=50.0, prompts=100, max_num_seqs=2)
    long = run(Workload.fixed(100, 20), concurrency=None, rate=50.0, prompts=400, max_num_seqs=2)
    assert long.ttft_ms.mean > 3 * short.ttft_ms.mean


def test_open_loop_below_capacity_keeps_up_with_the_rate():
    result = run(Workload.fixed(100, 20), concurrency=None, rate=5.0, prompts=200)
    assert result.requests_per_s == pytest.approx(5.0, rel=0.05)
    assert result.ttft_ms.p50 == pytest.approx(T * 1e3, rel=0.5)


def test_same_seed_same_result_other_seed_other_result():
    workload = Workload.uniform(200, 100, 0.5)
    a = run(workload, concurrency=8, rate=40.0, prompts=50, seed=3, num_speculative_tokens=2, acceptance_rate=0.6)
    b = run(workload, concurrency=8, rate=40.0, prompts=50, seed=3, num_speculative_tokens=2, acceptance_rate=0.6)
    c = run(workload, concurrency=8, rate=40.0, prompts=50, seed=4, num_speculative_tokens=2, acceptance_rate=0.6)
    assert a == b
    assert a != c


def test_speculation_fully_accepted_halves_the_steps_with_one_draft():
    plain = run(Workload.fixed(100, 101))
    spec = run(Workload.fixed(100, 101), num_speculative_tokens=1, acceptance_rate=1.0)
    assert plain.steps == 101 and spec.steps == 51  # 1 prefill + 100 decodes, or 50 of 2 tokens
    assert spec.tpot_ms.mean == pytest.approx(plain.tpot_ms.mean / 2)
    assert spec.itl_ms.mean == pytest.approx(T * 1e3)  # vllm bench: one ITL per chunk of 2 tokens


def test_speculation_decodes_query_one_plus_k_tokens():
    cost = ConstantStep()
    run(Workload.fixed(100, 30), cost=cost, num_speculative_tokens=3, acceptance_rate=0.5)
    assert {q for _, _, q in cost.calls} == {4}


def test_rejected_drafts_cost_steps():
    none = run(Workload.fixed(100, 2000), num_speculative_tokens=3, acceptance_rate=0.0)
    some = run(Workload.fixed(100, 2000), num_speculative_tokens=3, acceptance_rate=0.7)
    assert none.steps == 2000
    # Expected accepted of 3 chained draws at 0.7: 0.7 + 0.49 + 0.343 = 1.533 -> 2.533 tokens a step.
    assert some.steps == pytest.approx(1 + 1999 / 2.533, rel=0.05)


def test_data_parallel_replicas_scale_throughput():
    one = run(Workload.fixed(100, 20), concurrency=4, prompts=40)
    two = run(Workload.fixed(100, 20), concurrency=8, prompts=80, dp=2)
    assert two.requests_per_s == pytest.approx(2 * one.requests_per_s)
    assert two.completed == 80


def test_requests_longer_than_max_model_len_are_the_callers_to_refuse():
    with pytest.raises(AssertionError):
        run(Workload.fixed(100, 100), max_model_len=150)


class VaryingStep:
    """Stage times that depend on the batch and differ by stage, and hops by tokens: every
    float the pipeline computes (stage free times, waits, ITL gaps) is one a replay could
    round differently."""

    def __init__(self, pp: int = 1):
        self.pp = pp

    def stage_seconds(self, decode_contexts, prefills, query_len):
        work = 1.3e-5 * len(decode_contexts) * query_len + 7e-9 * sum(decode_contexts) + 3.1e-6 * sum(n for n, _ in prefills)
        return [0.0071 + 0.0013 * s + work * (1 + 0.3 * s) for s in range(self.pp)]

    def hop_seconds(self, tokens):
        return 1.7e-4 + 3e-7 * tokens


def _fast_forward_off(monkeypatch):
    monkeypatch.setattr(scheduler._Engine, "fast_forward", lambda self, now, client: None)


def _same_with_and_without_fast_forward(**kw):
    fast = run(**kw)
    with pytest.MonkeyPatch.context() as m:  # step by step, the step model called every step (no memo)
        _fast_forward_off(m)
        m.setattr(scheduler._Engine, "stage_seconds", lambda self, c, p: self.cost.stage_seconds(c, p, 1 + self.k))
        slow = run(**kw)
    assert fast == slow


def blocks_of_16_and_a_window(tokens: int) -> int:
    """Two KV groups: full attention in blocks of 16, a 40-token sliding window in blocks of 8."""
    return -(-tokens // 16) + min(-(-tokens // 8), 6)


def held_of_16_and_a_window(tokens: int, in_flight: int) -> int:
    """What the same two groups hold with `in_flight` tokens being computed: the window keeps
    its 40 tokens and those (vLLM frees the blocks a window has passed), as
    kv_cache.blocks_per_request at that many tokens in flight."""
    return -(-tokens // 16) + min(-(-tokens // 8), -(-(40 - 1 + in_flight) // 8) + 1)


def _pool(num_blocks: int, blocks, held: bool) -> KVPool:
    return KVPool(num_blocks, blocks, held_for=held_of_16_and_a_window if held and blocks is blocks_of_16_and_a_window else None)


@settings(max_examples=25, deadline=None)
@given(
    concurrency=st.sampled_from([1, 3, 8]), rate=st.sampled_from([None, 30.0]), async_scheduling=st.booleans(),
    pp=st.sampled_from([1, 2]), k=st.sampled_from([0, 2]), accept=st.sampled_from([0.0, 1.0, 0.5]),
    num_blocks=st.sampled_from([40, 1000]), budget=st.sampled_from([64, 2048]), cache=st.booleans(),
)
def test_fast_forward_gives_what_step_by_step_gives(concurrency, rate, async_scheduling, pp, k, accept, num_blocks, budget,
                                                    cache):
    _same_with_and_without_fast_forward(
        workload=Workload.uniform(60, 40, 0.5), cost=ConstantStep(pp=pp), pool=KVPool(num_blocks, blocks_of_16),
        concurrency=concurrency, rate=rate, prompts=12, async_scheduling=async_scheduling,
        num_speculative_tokens=k, acceptance_rate=accept, max_num_batched_tokens=budget, seed=1, prefix_caching=cache)


@settings(max_examples=100, deadline=None)
@given(
    pp=st.sampled_from([2, 3, 4]), async_scheduling=st.booleans(), k=st.sampled_from([0, 1, 3]),
    accept=st.sampled_from([0.0, 1.0, 0.6]), concurrency=st.sampled_from([1, 2, 5, 16]),
    rate=st.sampled_from([None, 20.0, 200.0]), output=st.sampled_from([30, 150]),
    num_blocks=st.sampled_from([60, 200, 100_000]), blocks=st.sampled_from([blocks_of_16, blocks_of_16_and_a_window]),
    budget=st.sampled_from([100, 500, 4096]), max_num_seqs=st.sampled_from([3, 256]), batches=st.sampled_from([None, "pp"]),
    seed=st.integers(0, 3), cache=st.booleans(), held=st.booleans(),
)
def test_pipelined_fast_forward_gives_what_step_by_step_gives(pp, async_scheduling, k, accept, concurrency, rate, output,
                                                              num_blocks, blocks, budget, max_num_seqs, batches, seed, cache,
                                                              held):  # fmt: skip
    # batches "pp": async scheduling with only pp batches in flight (releases before 0.34 without Model Runner V2).
    # held: the window gives back the blocks it has passed (KVPool.held_for).
    _same_with_and_without_fast_forward(
        workload=Workload.uniform(80, output, 0.5), cost=VaryingStep(pp=pp), pool=_pool(num_blocks, blocks, held),
        concurrency=concurrency, rate=rate, prompts=20, async_scheduling=async_scheduling, num_speculative_tokens=k,
        acceptance_rate=accept, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=350,
        max_concurrent_batches=pp if batches else None, seed=seed, prefix_caching=cache)


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("k", [0, 2])
def test_fast_forward_skips_most_steps_of_a_long_decode(monkeypatch, pp, async_scheduling, k):
    calls = []
    original = scheduler._Engine.schedule
    monkeypatch.setattr(scheduler._Engine, "schedule", lambda self: calls.append(1) or original(self))
    result = run(Workload.fixed(100, 1000), cost=VaryingStep(pp=pp), concurrency=16, prompts=32,
                 async_scheduling=async_scheduling, num_speculative_tokens=k, acceptance_rate=1.0)
    assert result.steps >= 2000 / (1 + k) and len(calls) < 200


def test_a_preempted_request_finds_its_prompt_in_the_prefix_cache():
    """Two 1,000-token prompts in a pool of 80 blocks of 16 (1,280 tokens), admitted by their
    first chunk as releases before 0.19 do: the newer one runs out of blocks and is
    preempted; without prefix caching it computes its whole prompt again, with it (vLLM's
    default) only what was evicted. Less prefill work: the run ends sooner."""
    kw = dict(workload=Workload.fixed(1000, 150), pool=KVPool(80, blocks_of_16), concurrency=2, prompts=2,
              max_num_batched_tokens=256, cost=VaryingStep(), reserve_full_input=False)
    plain = run(**kw)
    cached = run(**kw, prefix_caching=True)
    assert plain.preemptions >= 1 and cached.preemptions >= 1
    assert cached.duration_s < plain.duration_s


def test_percentiles_match_numpy_linear():
    values = [4.0, 1.0, 3.0, 2.0]
    # numpy.percentile([1, 2, 3, 4], [50, 90, 99]) == [2.5, 3.7, 3.97]
    assert latency_ms([(v / 1e3, 1) for v in values]).p90 == pytest.approx(3.7)
    assert percentile([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], 99) == pytest.approx(3.97)
    # counts expand: [1, 1, 1, 5] -> p50 = 1, p90 = 5 - 0.3 * 4 = 3.8
    assert percentile([1.0, 5.0], [3, 4], 50) == pytest.approx(1.0)
    assert percentile([1.0, 5.0], [3, 4], 90) == pytest.approx(3.8)
    assert latency_ms([]).mean == 0.0


def test_uniform_lengths_follow_vllm_bench_bounds():
    pairs = Workload.uniform(1000, 100, 0.1).sample(2000, seed=0)
    assert min(i for i, _ in pairs) == 900 and max(i for i, _ in pairs) == 1100
    # get_sampling_params' float rounding included: ceil(100 * (1 + 0.1)) == 111.
    assert min(o for _, o in pairs) == 90 and max(o for _, o in pairs) == math.ceil(100 * (1 + 0.1))
    assert Workload.uniform(1000, 100, 0.1).sample(5, seed=1) == Workload.uniform(1000, 100, 0.1).sample(5, seed=1)


def test_lognormal_lengths_have_the_given_mean():
    pairs = Workload.lognormal(1000, 200, 0.5).sample(20000, seed=0)
    assert sum(i for i, _ in pairs) / len(pairs) == pytest.approx(1000, rel=0.03)
    assert sum(o for _, o in pairs) / len(pairs) == pytest.approx(200, rel=0.03)


def test_tpot_is_per_request_and_leaves_out_one_token_outputs():
    """benchmarks/serve.py calculate_metrics (0.10.2-0.13.0): TPOT = (latency - ttft) / (output - 1)
    per request with output > 1, mean over requests; throughput over the duration to the last token."""
    from infra.planning.perf.workload import serve_metrics

    m = serve_metrics([(0.0, 1.0, 4.0, 10, 4), (0.0, 2.0, 2.0, 10, 1)], {}, 1)
    assert m["tpot_ms"].mean == pytest.approx(1000.0)  # (4 - 1) / 3 s; the 1-token request left out
    assert m["ttft_ms"].mean == pytest.approx(1500.0)
    assert m["output_tokens_per_s"] == pytest.approx(5 / 4.0)


def _intake(sends: list[float], frontend_s: float, probe: list[float]) -> list[tuple[float, int]]:
    """When each request reaches the engine's waiting queue, the API server taking `frontend_s`
    of its time per request: (first probe time it is there, request index)."""
    from collections import deque

    from infra.planning.perf.workload import Client

    made = []
    client = Client([(10, 10)] * len(sends), sends, len(sends), lambda p, o, sent: made.append(sent) or len(made) - 1,
                    frontend_s=frontend_s)  # fmt: skip
    waiting, seen = deque(), []
    for t in probe:
        client.send_due(t, waiting)
        while waiting:
            seen.append((t, waiting.popleft()))
    return seen


def test_the_api_server_hands_a_lone_request_over_after_its_intake():
    seen = _intake([1.0], 0.010, [1.0, 1.009, 1.0101])
    assert seen == [(1.0101, 0)]


def test_the_api_server_shares_its_loop_so_a_burst_reaches_the_engine_together():
    """Processor sharing, not first come first served: 100 requests sent at once all reach the
    engine at 100 x 10 ms (one at a time, the first would be there at 10 ms)."""
    seen = _intake([0.0] * 100, 0.010, [0.5, 0.999, 1.0 + 1e-9])
    assert [t for t, _ in seen] == [1.0 + 1e-9] * 100 and [i for _, i in seen] == list(range(100))


def test_a_request_sent_during_anothers_intake_halves_its_pace():
    """A at 0 and B at 0.5, 1 s each: alone A does half its work by 0.5, then both share the
    loop, so A finishes at 1.5 (not 1.0) and B, alone again, at 2.0."""
    seen = _intake([0.0, 0.5], 1.0, [0.5, 1.4999, 1.5, 1.9999, 2.0])
    assert seen == [(1.5, 0), (2.0, 1)]
    from infra.planning.perf.workload import Client

    client = Client([(10, 10)] * 2, [0.0, 0.5], 2, lambda p, o, sent: object(), frontend_s=1.0)
    from collections import deque

    client.send_due(0.6, deque())
    assert client.next_send() == pytest.approx(1.5)  # the engine may sleep until then


def test_send_times_end_at_num_prompts_over_rate():
    times = send_times(100, 10.0, seed=0)
    assert times == sorted(times) and times[-1] == pytest.approx(10.0)
    assert send_times(3, None, seed=0) == [0.0, 0.0, 0.0]


def test_jsonl_workload_reads_pairs_and_names_bad_lines(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"input_tokens": 10, "output_tokens": 5}\n\n{"input_tokens": 20, "output_tokens": 7}\n')
    workload = Workload.from_jsonl(str(good))
    assert workload.sample(3, seed=0)[:2] == [(10, 5), (20, 7)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input_tokens": 10, "output_tokens": 5}) + '\n{"input_tokens": "ten", "output_tokens": 5}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: input_tokens must be an integer"):
        Workload.from_jsonl(str(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(UserError, match=r"broken.jsonl:1: not JSON"):
        Workload.from_jsonl(str(broken))
    with pytest.raises(UserError, match="cannot read"):
        Workload.from_jsonl(str(tmp_path / "missing.jsonl"))


def test_a_pool_too_small_for_one_prompt_is_a_user_error():
    with pytest.raises(UserError, match="needs 7 KV blocks"):
        run(Workload.fixed(100, 5), pool=KVPool(num_blocks=5, blocks_for=blocks_of_16))


def _cap(tokens: int) -> int:
    """Admission's charge of a 40-token window in blocks of 8 beside full attention in blocks of 16:
    the window plus 256 tokens in flight (kv_cache.blocks_per_request's cap)."""
    return -(-tokens // 16) + -(-min(40 - 1 + 256, tokens) // 8) + 1


def _window_held(tokens: int, in_flight: int) -> int:
    """What the same groups hold with `in_flight` tokens being computed."""
    return -(-tokens // 16) + -(-min(40 - 1 + in_flight, tokens) // 8) + 1


@pytest.mark.parametrize("reserve_full_input", [False, True])
def test_a_waiting_request_is_admitted_by_its_chunk_or_by_admissions_cap_of_its_input(reserve_full_input):
    """A 1,000-token prompt in chunks of 64, in a pool of 79 free blocks. Its first chunk holds 13
    (the window keeps its 40 tokens and the chunk); admission's cap of the whole input is 101. Before
    0.19 vLLM admits by the first chunk, and the window gives blocks back as it moves, so it runs;
    from 0.19 (scheduler_reserve_full_isl) the whole input must fit the cap, and it never does."""
    kw = dict(workload=Workload.fixed(1000, 10), pool=KVPool(80, _cap, held_for=_window_held),
              max_num_batched_tokens=64, reserve_full_input=reserve_full_input)  # fmt: skip
    assert _window_held(64, 64) == 13 and _cap(1000) == 101
    if reserve_full_input:
        with pytest.raises(UserError, match="needs 101 KV blocks"):
            run(**kw)
    else:
        assert run(**kw).completed == 1


@pytest.mark.parametrize("k", [0, 2])
def test_a_decode_holds_its_tokens_and_lookahead_slots(k):
    """A decoding request is charged for 1 + k scheduled tokens and k lookahead slots in flight
    (vLLM num_lookahead_tokens); a prefill chunk for its tokens: every count asked of the held
    blocks is at 1 + 2k or more tokens in flight."""
    asked = []

    def held(tokens: int, in_flight: int) -> int:
        asked.append((tokens, in_flight))
        return _window_held(tokens, in_flight)

    run(Workload.fixed(100, 40), pool=KVPool(10**6, _cap, held_for=held), num_speculative_tokens=k, acceptance_rate=1.0)
    # The requests' own counts (the engine also probes the pool at max-model-len, 8,192 here).
    assert min(f for tokens, f in asked if tokens < 8192) == 1 + 2 * k
