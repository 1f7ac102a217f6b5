"""Continuous batching of one vLLM 0.34 replica, step by step, on a step-time model.

The engine follows v1/core/sched/scheduler.py Scheduler.schedule and
v1/engine/core.py step_with_batch_queue; the client follows `vllm bench serve`
(benchmarks/serve.py, lib/endpoint_request_func.py). Simplified on purpose:
no prefix caching, FCFS policy only, no long_prefill_token_threshold (default 0),
no watermark (default 0), no encoder inputs or KV connectors. CPU time per step is
the step model's (step.py adds it, or overlaps the step's part with async scheduling).

Async scheduling (v1/core/sched/async_scheduler.py): a decode is scheduled again
before its previous output returns, with placeholder tokens (num_output_placeholders,
spec_token_ids = [-1] * k), every `pp` steps (decode_stagger). Modelled as such: its
KV and token counts run ahead optimistically (rejected drafts roll back on output),
but its batch cannot start on stage 0 before the token it builds on exists.

Steady decode (every running request decoding, nothing arriving, finishing or failing) runs
many steps at once in fast_forward.py, with exactly the results of running them one by one.

Data parallelism: `vllm bench serve` spreads requests over dp identical replicas; we
simulate one replica fed round-robin (every dp-th prompt, concurrency ceil(C / dp),
rate R / dp) and scale its throughputs by how many such replicas run at once.
"""

from __future__ import annotations

import math
import random
from collections import deque, namedtuple
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from infra.errors import UserError
from infra.planning.perf import fast_forward
from infra.planning.perf.workload import Client, SimResult, Workload, send_times, serve_metrics

LIMITS = ("token_budget", "max_num_seqs", "kv_admission", "none")  # what stopped admission in a step


class StepCost(Protocol):
    """The step-time model (step.py StepModel): a pure function of the batch."""

    pp: int

    def stage_seconds(self, decode_contexts: Sequence[int], prefills: Sequence[tuple[int, int]], query_len: int) -> Sequence[float]: ...

    def hop_seconds(self, tokens: int) -> float: ...


@dataclass(frozen=True)
class KVPool:
    num_blocks: int  # blocks of one replica's pool (the engine's minimum over ranks), null block included
    # Blocks a request with N tokens is charged at admission (vLLM's cap: a sliding window its
    # window plus every token in flight), all groups.
    blocks_for: Callable[[int], int]
    # Blocks it holds with N tokens of which the last `in_flight` are being computed: a sliding
    # window only its window and those (SlidingWindowManager.remove_skipped_blocks frees the
    # blocks the window has passed at every allocate_slots). None: as charged at admission.
    held_for: Callable[[int, int], int] | None = None

    def held(self, tokens: int, in_flight: int) -> int:
        return self.blocks_for(tokens) if self.held_for is None else self.held_for(tokens, in_flight)


class _Req:
    __slots__ = ("prompt", "max_out", "end", "sent", "num_tokens", "computed", "placeholders", "drafts", "prefill_end",
                 "blocks", "emitted", "first", "last", "done", "inflight", "eligible", "epoch", "token_ready",
                 "cached_tokens", "cached_blocks", "cache_ahead", "cache_taken_at")

    def __init__(self, prompt: int, max_out: int, sent: float):
        self.prompt, self.max_out, self.sent = prompt, max_out, sent
        self.end = prompt + max_out  # tokens when it finishes
        self.num_tokens = prompt  # prompt + output tokens received (Request.num_tokens)
        self.computed = 0  # Request.num_computed_tokens (runs ahead of outputs while batches are in flight)
        self.placeholders = 0  # Request.num_output_placeholders (async scheduling)
        self.drafts = 0  # len(Request.spec_token_ids)
        self.prefill_end = prompt  # tokens to compute before the next sample (prompt, or all after a preemption)
        self.blocks = self.emitted = self.inflight = self.eligible = self.epoch = 0
        self.first = self.last = -1.0
        self.token_ready = 0.0  # when the output this request's next decode reads arrives
        self.done = False
        # Prefix caching of a preempted request (_Engine._cache_hit): the tokens it had computed,
        # the blocks that held them, the free blocks ahead of them in the pool's queue, and the
        # engine's count of blocks taken when they were freed.
        self.cached_tokens = self.cached_blocks = self.cache_ahead = self.cache_taken_at = 0


class _Blocks(dict):
    """A pool's blocks per token count memoised, at admission (`in_flight` None) or held with
    `in_flight` tokens being computed: a decode asks for it every step."""

    def __init__(self, pool: KVPool, max_len: int, in_flight: int | None = None):
        super().__init__()
        self.max_len = max_len
        self.blocks_for = pool.blocks_for if in_flight is None else lambda tokens: pool.held(tokens, in_flight)

    def __missing__(self, tokens: int) -> int:
        value = self[tokens] = self.blocks_for(min(tokens, self.max_len))
        return value


# A batch in flight: entries (request, tokens, drafts scheduled or -1 if it samples nothing, epoch), output time.
_Batch = namedtuple("_Batch", "entries done")


class _Engine:
    """One replica: its queues, KV pool, batches in flight and pipeline stages."""

    def __init__(self, cost: StepCost, pool: KVPool, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, async_scheduling: bool, k: int, acceptance: float, seed: int,
                 reserve_full_input: bool = True, max_concurrent_batches: int | None = None,
                 prefix_caching: bool = False):
        self.cost, self.pp = cost, cost.pp
        # Held while decoding (1 + k tokens and k lookahead slots in flight): never shrinks as tokens
        # grow (fast_forward.py rests on it). A prefill chunk's are `chunk_blocks`; admission's cap,
        # `admit_blocks`.
        self.pool, self.decode_in_flight = pool, 1 + 2 * k
        self.blocks = _Blocks(pool, max_model_len, self.decode_in_flight)
        self.admit_blocks = _Blocks(pool, max_model_len)
        self.chunk_blocks: dict[tuple[int, int], int] = {}
        # Whether a request ever holds fewer blocks than admission charges (a sliding window shorter
        # than max-model-len): only then does a step give blocks back, or the fast path wait for it.
        self.gives_back = pool.held_for is not None and pool.held(max_model_len, 1) < pool.held(max_model_len, max_model_len)
        self.free = pool.num_blocks - 1  # block 0 is the null block
        self.max_seqs, self.max_tokens, self.max_model_len = max_num_seqs, max_num_batched_tokens, max_model_len
        self.async_, self.k, self.acceptance, self.rng = async_scheduling, k, acceptance, random.Random(seed)
        # config/vllm.py max_concurrent_batches: PP batches fill the pipeline, +1 to overlap with async scheduling.
        self.max_batches = max_concurrent_batches or (self.pp + 1 if async_scheduling else self.pp)
        self.reserve_full_input = reserve_full_input
        self.prefix_caching = prefix_caching
        self.taken = 0  # blocks taken from the free queue so far (its head: the least recently freed)
        self.lookahead = k  # vllm.py num_lookahead_tokens: MTP/EAGLE reserve k slots past the scheduled tokens
        self.running, self.waiting, self.in_flight = [], deque(), deque()  # of _Req, _Req, _Batch
        self.stage_free = [0.0] * self.pp
        self._stage_memo: dict[tuple, Sequence[float]] = {}
        self._stage_memo_size = 0
        self._shifted_memo: dict = {}
        self.ff_blocked = None  # a batch in flight that keeps the pipelined fast path out (fast_forward._groups)
        self.ff_due = True  # an output was taken since the pipelined fast path last tried (fast_forward)
        self.step, self.steps, self.decodes, self.preemptions, self.step_seconds = 0, 0, 0, 0, 0.0
        self.limit_counts = dict.fromkeys(LIMITS, 0)
        self.finished: list[_Req] = []
        self.itl: dict[float, int] = {}  # interval -> how many chunks arrived that long after the previous

    def held(self, tokens: int, in_flight: int) -> int:
        """Blocks a request holds with `tokens` of which `in_flight` are being computed."""
        if in_flight <= self.decode_in_flight:
            return self.blocks[tokens]
        key = (min(tokens, self.max_model_len), in_flight)
        value = self.chunk_blocks.get(key)
        if value is None:
            value = self.chunk_blocks[key] = self.pool.held(*key)
        return value

    def schedule(self) -> tuple[list, list, list, float] | None:
        """One Scheduler.schedule call: (entries, decode contexts, prefills, earliest start) or None if empty."""
        self.step += 1
        budget, running, blocks, lookahead = self.max_tokens, self.running, self.blocks, self.lookahead
        async_, step, mml, k, pp = self.async_, self.step, self.max_model_len, self.k, self.pp
        decoding, gives_back = self.decode_in_flight, self.gives_back
        entries, contexts, prefills = [], [], []
        start, limit, preempted = 0.0, "none", False
        # scheduler.py schedule: first the RUNNING requests, in order, while budget is left (a
        # preemption pops the list's tail, which the iteration then does not reach).
        for r in running:
            if budget <= 0:
                break
            if step < r.eligible:  # PP + async: decode_stagger steps between a request's decodes
                continue
            # async_scheduler: placeholders already cover max_tokens -> no extra step.
            if r.placeholders and r.computed + 2 - r.placeholders >= r.end:
                continue
            before = r.computed
            n = r.num_tokens + r.drafts + r.placeholders - before  # num_tokens_with_spec + placeholders - computed
            if before + n >= mml:  # "input position does not exceed the max model len": n <= mml - before - 1
                n = mml - before - 1
            if n > budget:
                n, limit = budget, "token_budget"
            if n <= 0:  # e.g. a sync decode whose output has not returned yet
                continue
            slots = n + lookahead
            # self.held, its decode branch inlined: this loop runs for every scheduled request.
            need = (blocks[before + slots] if slots <= decoding else self.held(before + slots, slots)) - r.blocks
            if need < 0 and gives_back:  # remove_skipped_blocks: a sliding window's blocks it has passed go back
                self.free -= need
                r.blocks += need
            elif need > 0:  # needing no new block never fails: the free count is never negative
                if need > self.free:
                    # allocate_slots failed: preempt the last running request (FCFS), maybe this one.
                    victim = None
                    while need > self.free and victim is not r:
                        victim = running.pop()
                        self._preempt(victim)
                    preempted, limit = True, "kv_admission"
                    if victim is r:
                        break
                self.free -= need
                self.taken += need
                r.blocks += need
            budget -= n
            r.computed = before + n
            r.inflight += 1
            if before >= r.prefill_end:  # a decode: its query is 1 + drafts
                contexts.append(before)
                drafts = n - 1
                if r.token_ready > start:
                    start = r.token_ready
            else:
                prefills.append((n, before))
                drafts = 0 if r.computed >= r.num_tokens + r.placeholders else -1  # -1: a chunk that samples nothing
            entries.append((r, n, drafts, r.epoch))
            if drafts >= 0:  # _after_sample_scheduled, spelt out
                if async_:
                    r.placeholders += 1 + drafts
                    r.drafts, r.eligible = k, step + pp
                else:
                    r.drafts = 0
        # Then the WAITING requests, only if nobody was preempted this step.
        if not preempted:
            limit = self._admit(entries, prefills, budget, limit)
        if not entries:
            return None
        self.limit_counts[limit] += 1
        return entries, contexts, prefills, start

    def _after_sample_scheduled(self, r: _Req, drafts: int) -> None:
        if self.async_:
            # async_scheduler._update_after_schedule: placeholders for the sampled and draft tokens,
            # k placeholder drafts for the next step, next decode pp steps later.
            r.placeholders += 1 + drafts
            r.drafts = self.k
            r.eligible = self.step + self.pp
        else:
            r.drafts = 0  # schedule(): spec_token_ids = [] until update_draft_token_ids

    def _admit(self, entries: list, prefills: list, budget: int, limit: str, dry: bool = False) -> str | None:
        """Admit waiting requests (FCFS); return why admission stopped. dry: None if it would admit one."""
        waiting, running, blocks = self.waiting, self.running, self.blocks
        j = 0
        while j < len(waiting):
            if len(running) >= self.max_seqs:  # max_num_running_reqs
                return "max_num_seqs"
            if budget <= 0:
                return "token_budget"
            r = waiting[j]
            if r.inflight:  # preempted, its stale output still in flight: skip_request, it drains
                j += 1
                continue
            total = r.num_tokens  # prompt, plus the outputs of a preempted request (recompute)
            hit = self._cache_hit(r, total) if r.cached_tokens else 0
            # allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl, default True):
            # the whole input must fit in the free blocks, not just the first chunk. Releases
            # before the option (vllm_release.Release.reserve_full_input) ask for the chunk's.
            n = min(total - hit, budget)  # chunked prefill: as much of the prompt as the budget allows
            chunk = self.held(hit + n + self.lookahead, n + self.lookahead)
            need = chunk
            if self.reserve_full_input and self.admit_blocks[total] > need:  # with the admission cap
                need = self.admit_blocks[total]
            if need > self.free:
                return "kv_admission"
            if dry:
                return None
            if n < total:
                limit = "token_budget"
            r.blocks = chunk
            self.free -= r.blocks
            self.taken += r.blocks
            r.cached_tokens = 0
            del waiting[j]
            running.append(r)
            r.prefill_end, r.computed, r.inflight = total, hit + n, r.inflight + 1
            budget -= n
            prefills.append((n, hit))
            drafts = 0 if hit + n == total else -1
            entries.append((r, n, drafts, r.epoch))
            if drafts == 0:
                self._after_sample_scheduled(r, 0)
        return limit

    def _cache_hit(self, r: _Req, total: int) -> int:
        """Tokens of a preempted request still in the prefix cache (vLLM's default,
        config/cache.py enable_prefix_caching = True; v1/core/kv_cache_manager.py
        get_computed_blocks): its blocks were freed to the tail of the free queue, and every
        block taken since came from its head, so the blocks taken beyond those that were
        ahead of them evicted its blocks from its tail end. At most all tokens but one (the
        last is computed again to sample), in whole blocks. ASSUMPTION: a request re-taking
        its own cached blocks does not move the others' place in the queue."""
        evicted = max(0, self.taken - r.cache_taken_at - r.cache_ahead)
        left = r.cached_blocks - evicted
        if left <= 0:
            return 0
        hit = 0
        lo, hi = 0, min(r.cached_tokens, total - 1)
        while lo <= hi:  # the most tokens whose blocks the surviving ones cover
            mid = (lo + hi) // 2
            if self.blocks[mid] <= left:
                hit, lo = mid, mid + 1
            else:
                hi = mid - 1
        return hit

    def _preempt(self, r: _Req) -> None:
        """scheduler.py _preempt_request: blocks freed, computed tokens reset, back at the front of waiting."""
        if self.prefix_caching and r.computed:
            r.cached_tokens, r.cached_blocks = r.computed, r.blocks
            r.cache_ahead, r.cache_taken_at = self.free, self.taken
        self.free += r.blocks
        r.blocks = r.computed = r.placeholders = r.drafts = r.eligible = 0
        r.epoch += 1  # outputs of batches still in flight are stale: delivered, but do not touch the counters
        self.waiting.appendleft(r)
        self.preemptions += 1

    def launch(self, now: float, entries: list, contexts: list, prefills: list, start: float) -> None:
        """The batch flows through the stages in order, each busy until its part is done."""
        stage_times = self.stage_seconds(contexts, prefills)
        free = self.stage_free
        t = max(now, start)
        hop = self.cost.hop_seconds(sum(e[1] for e in entries)) if self.pp > 1 else 0.0
        for s, seconds in enumerate(stage_times):
            t = max(t + hop if s else t, free[s]) + seconds
            free[s] = t
        if self.async_:
            for e in entries:
                if e[2] >= 0:
                    e[0].token_ready = t
        self.queue(entries, t)
        self.steps += 1
        self.decodes += len(contexts)
        self.step_seconds += max(stage_times)

    def launch_empty(self, now: float) -> None:
        """step_with_batch_queue queues an empty step too; it only advances the step count."""
        self.queue([], max(now, self.in_flight[-1].done) if self.in_flight else now)

    def queue(self, entries: list, done: float) -> None:
        self.in_flight.append(_Batch(entries, done))

    def stage_seconds(self, contexts: Sequence[int], prefills: Sequence[tuple[int, int]]) -> Sequence[float]:
        """cost.stage_seconds, memoised: the step model is a pure function of the batch, and
        batches recur (each request of a fixed-length workload decodes at the same contexts;
        a closed loop's waves repeat the same batches). Bounded to ~1M contexts of keys."""
        key = (tuple(contexts), tuple(prefills))
        times = self._stage_memo.get(key)
        if times is None:
            if self._stage_memo_size > 1 << 20:
                self._stage_memo.clear()
                self._stage_memo_size = 0
            times = self._stage_memo[key] = self.cost.stage_seconds(contexts, prefills, 1 + self.k)
            self._stage_memo_size += len(contexts) + len(prefills) + 1
        return times

    def shifted_stage_seconds(self, contexts0: tuple[int, ...], shift: int) -> Sequence[float]:
        """stage_seconds of a decode batch whose contexts are `contexts0` each plus `shift`
        (the fast path's steady groups), memoised on that pair: the same call, the same result."""
        key = (contexts0, shift)
        times = self._shifted_memo.get(key)
        if times is None:
            if len(self._shifted_memo) > 1 << 16:
                self._shifted_memo.clear()
            times = self._shifted_memo[key] = self.stage_seconds([c + shift for c in contexts0], ())
        return times

    def take_output(self, client: Client) -> float:
        """Block on the oldest batch (step_with_batch_queue) and apply it (update_from_output)."""
        batch = self.in_flight.popleft()
        now = batch.done
        self.ff_due = True
        client.send_due(now, self.waiting)
        k, p, rng, async_, itl = self.k, self.acceptance, self.rng, self.async_, self.itl
        all_accepted, draws = p >= 1.0, 0.0 < p < 1.0
        # endpoint_request_func.py: one ITL sample per streamed chunk, however many tokens it carries.
        # A batch's requests mostly had their previous chunk at the same time: a run of those is one
        # interval, counted once (`run` requests whose previous chunk arrived at `run_last`).
        run_last, run = -1.0, 0
        for r, _, drafts, epoch in batch.entries:
            r.inflight -= 1
            if drafts < 0 or r.done:
                continue
            accepted = drafts if all_accepted else 0
            if draws:
                while accepted < drafts and rng.random() < p:  # chained: a draft counts only after all before it
                    accepted += 1
            if epoch == r.epoch:
                if accepted != drafts:
                    r.computed -= drafts - accepted  # rejected drafts' slots are recomputed
                if async_:
                    r.placeholders -= 1 + drafts
                else:
                    r.drafts = k  # the drafter proposes k tokens for the next step
            emitted = r.max_out - r.emitted
            if emitted > 1 + accepted:
                emitted = 1 + accepted
            r.num_tokens += emitted
            r.emitted += emitted
            if r.first < 0:
                r.first = now
            elif r.last == run_last:
                run += 1
            else:
                if run:
                    gap = now - run_last
                    itl[gap] = itl.get(gap, 0) + run
                run_last, run = r.last, 1
            r.last = now
            if r.emitted >= r.max_out:
                self._finish(r, client, now)
        if run:
            gap = now - run_last
            itl[gap] = itl.get(gap, 0) + run
        client.send_due(now, self.waiting)
        return now

    def _finish(self, r: _Req, client: Client, now: float) -> None:
        r.done, self.free, r.blocks = True, self.free + r.blocks, 0
        (self.running if r in self.running else self.waiting).remove(r)
        self.finished.append(r)
        client.release(now)

    def fast_forward(self, now: float, client: Client) -> float | None:
        """Run many identical decode steps at once (fast_forward.py); None when the next step is
        not one of them.

        With pp > 1 the fast path tries once after each output the engine takes: after a
        launch it finds the new batch in flight (a prefill, or a merge of micro-batches) and
        after its own replay the step that stopped it, and building its groups costs as much
        as a step. Whether it runs a step or the engine does, the step is the same."""
        if self.pp == 1:
            return fast_forward.single_stage(self, now, client)
        if not self.ff_due:
            return None
        self.ff_due = False
        return fast_forward.pipelined(self, now, client)

    def run(self, client: Client) -> None:
        """v1/engine/core.py step_with_batch_queue: fill the batch queue, else block on its oldest batch."""
        now = 0.0
        while True:
            client.send_due(now, self.waiting)
            skipped = self.fast_forward(now, client)
            if skipped is not None:
                now = skipped
                continue
            if len(self.in_flight) < self.max_batches and (self.running or self.waiting):
                scheduled = self.schedule()
                if scheduled:
                    self.launch(now, *scheduled)
                    continue
                if self.async_ and self.running:
                    self.launch_empty(now)
                    continue
            if self.in_flight:
                now = self.take_output(client)
            elif self.waiting and not self.running:
                r = self.waiting[0]
                raise UserError(f"a request of {r.num_tokens} tokens needs {self.admit_blocks[r.num_tokens]} KV blocks; the pool has {self.free}")
            elif self.running:
                raise AssertionError("running requests but nothing to schedule and no batch in flight")
            elif client.next_send() is not None:
                now = client.next_send()
            else:
                return


def simulate(cost: StepCost, pool: KVPool, workload: Workload, *, concurrency: int | None, request_rate: float | None,
             num_prompts: int, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
             async_scheduling: bool, num_speculative_tokens: int = 0, acceptance_rate: float = 0.0,
             seed: int = 0, dp: int = 1, reserve_full_input: bool = True,
             max_concurrent_batches: int | None = None, frontend_s: float = 0.0,
             prefix_caching: bool = False, prefix_hit_rate: float = 0.0) -> SimResult:
    """`vllm bench serve` against one replica of dp: closed loop at `concurrency`, open loop at
    `request_rate` (Poisson), or both (rate capped at a concurrency).

    `prefix_hit_rate`: the share of each prompt already in the prefix cache when it arrives
    (a shared system prompt): computed tokens start there, as v1/core/kv_cache_manager.py
    get_computed_blocks gives them (never the last token, which is computed to sample).
    ASSUMPTION: the shared prefix stays cached (other requests keep using it), and each
    request's blocks count in full (shared blocks counted once per request: conservative)."""
    assert concurrency is not None or request_rate is not None, "give a concurrency, a request rate or both"
    lengths = workload.sample(num_prompts, seed)
    assert all(i + o <= max_model_len for i, o in lengths), "the caller refuses requests longer than max_model_len"
    # Round-robin over dp replicas: this replica gets every dp-th request.
    mine = lengths[::dp]
    slots = math.ceil(concurrency / dp) if concurrency else math.inf
    rate = request_rate / dp if request_rate else None
    replicas = min(dp, concurrency / slots) if concurrency else dp  # replicas busy at once
    engine = _Engine(cost, pool, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     max_model_len=max_model_len, async_scheduling=async_scheduling, k=num_speculative_tokens,
                     acceptance=acceptance_rate, seed=seed, reserve_full_input=reserve_full_input,
                     max_concurrent_batches=max_concurrent_batches, prefix_caching=prefix_caching)
    make = _Req
    if prefix_hit_rate > 0:
        def make(prompt: int, out: int, sent: float) -> _Req:
            r = _Req(prompt, out, sent)
            hit = min(int(prompt * prefix_hit_rate), prompt - 1)
            if hit > 0:  # a cached prefix that nothing evicts (_Engine._cache_hit)
                r.cached_tokens, r.cached_blocks, r.cache_ahead = hit, engine.blocks[hit], 1 << 62
            return r
    engine.run(Client(mine, send_times(len(mine), rate, seed), slots, make, frontend_s=frontend_s))
    done, steps = engine.finished, max(engine.steps, 1)
    return SimResult(
        **serve_metrics([(r.sent, r.first, r.last, r.prompt, r.emitted) for r in done], engine.itl, replicas),
        completed=round(len(done) * len(lengths) / len(mine)), preemptions=engine.preemptions,
        mean_batch_size=engine.decodes / steps, mean_step_s=engine.step_seconds / steps, steps=engine.steps,
        limits={name: count / steps for name, count in engine.limit_counts.items()},
    )
