"""Continuous batching of one vLLM 0.34 replica, step by step, on a step-time model.

The engine follows v1/core/sched/scheduler.py Scheduler.schedule and
v1/engine/core.py step_with_batch_queue; the client follows `vllm bench serve`
(benchmarks/serve.py, lib/endpoint_request_func.py). Simplified on purpose:
no prefix caching, FCFS policy only, no long_prefill_token_threshold (default 0),
no watermark (default 0), no encoder inputs or KV connectors. CPU time per step is
the step model's (step.py adds it, or overlaps it with async scheduling).

Async scheduling (v1/core/sched/async_scheduler.py): a decode is scheduled again
before its previous output returns, with placeholder tokens (num_output_placeholders,
spec_token_ids = [-1] * k), every `pp` steps (decode_stagger). Modelled as such: its
KV and token counts run ahead optimistically (rejected drafts roll back on output),
but its batch cannot start on stage 0 before the token it builds on exists.

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
from infra.planning.perf.workload import Client, SimResult, Workload, send_times, serve_metrics

LIMITS = ("token_budget", "max_num_seqs", "kv_admission", "none")  # what stopped admission in a step


class StepCost(Protocol):
    pp: int

    def stage_seconds(self, decode_contexts: Sequence[int], prefills: Sequence[tuple[int, int]], query_len: int) -> Sequence[float]: ...

    def hop_seconds(self, tokens: int) -> float: ...


@dataclass(frozen=True)
class KVPool:
    num_blocks: int  # blocks of one replica's pool (the engine's minimum over ranks), null block included
    blocks_for: Callable[[int], int]  # blocks one request holds with N tokens in the KV cache (all groups)


class _Req:
    __slots__ = ("prompt", "max_out", "sent", "num_tokens", "computed", "placeholders", "drafts", "prefill_end",
                 "blocks", "emitted", "first", "last", "done", "inflight", "eligible", "epoch", "token_ready")

    def __init__(self, prompt: int, max_out: int, sent: float):
        self.prompt, self.max_out, self.sent = prompt, max_out, sent
        self.num_tokens = prompt  # prompt + output tokens received (Request.num_tokens)
        self.computed = 0  # Request.num_computed_tokens (runs ahead of outputs while batches are in flight)
        self.placeholders = 0  # Request.num_output_placeholders (async scheduling)
        self.drafts = 0  # len(Request.spec_token_ids)
        self.prefill_end = prompt  # tokens to compute before the next sample (prompt, or all after a preemption)
        self.blocks = self.emitted = self.inflight = self.eligible = self.epoch = 0
        self.first = self.last = -1.0
        self.token_ready = 0.0  # when the output this request's next decode reads arrives
        self.done = False


class _Blocks(dict):
    """pool.blocks_for memoised: a decode asks for it every step."""

    def __init__(self, blocks_for: Callable[[int], int], max_len: int):
        super().__init__()
        self.blocks_for, self.max_len = blocks_for, max_len

    def __missing__(self, tokens: int) -> int:
        value = self[tokens] = self.blocks_for(min(tokens, self.max_len))
        return value


# A batch in flight: entries (request, tokens, drafts scheduled or -1 if it samples nothing, epoch), output time.
_Batch = namedtuple("_Batch", "entries done")


class _Engine:
    """One replica: its queues, KV pool, batches in flight and pipeline stages."""

    def __init__(self, cost: StepCost, pool: KVPool, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, async_scheduling: bool, k: int, acceptance: float, seed: int,
                 reserve_full_input: bool = True, max_concurrent_batches: int | None = None):
        self.cost, self.pp = cost, cost.pp
        self.blocks, self.free = _Blocks(pool.blocks_for, max_model_len), pool.num_blocks - 1  # block 0 is the null block
        self.max_seqs, self.max_tokens, self.max_model_len = max_num_seqs, max_num_batched_tokens, max_model_len
        self.async_, self.k, self.acceptance, self.rng = async_scheduling, k, acceptance, random.Random(seed)
        # config/vllm.py max_concurrent_batches: PP batches fill the pipeline, +1 to overlap with async scheduling.
        self.max_batches = max_concurrent_batches or (self.pp + 1 if async_scheduling else self.pp)
        self.reserve_full_input = reserve_full_input
        self.lookahead = k  # vllm.py num_lookahead_tokens: MTP/EAGLE reserve k slots past the scheduled tokens
        self.running, self.waiting, self.in_flight = [], deque(), deque()  # of _Req, _Req, _Batch
        self.stage_free = [0.0] * self.pp
        self.step, self.steps, self.decodes, self.preemptions, self.step_seconds = 0, 0, 0, 0, 0.0
        self.limit_counts = dict.fromkeys(LIMITS, 0)
        self.finished: list[_Req] = []
        self.itl: dict[float, int] = {}  # interval -> how many chunks arrived that long after the previous

    def schedule(self) -> tuple[list, list, list, float] | None:
        """One Scheduler.schedule call: (entries, decode contexts, prefills, earliest start) or None if empty."""
        self.step += 1
        budget, running, blocks, lookahead = self.max_tokens, self.running, self.blocks, self.lookahead
        async_, step, mml = self.async_, self.step, self.max_model_len
        entries, contexts, prefills = [], [], []
        start, limit, preempted, i = 0.0, "none", False, 0
        # scheduler.py schedule: first the RUNNING requests, in order, while budget is left.
        while i < len(running) and budget > 0:
            r = running[i]
            i += 1
            # async_scheduler: placeholders already cover max_tokens -> no extra step.
            if r.placeholders and r.computed + 2 - r.placeholders >= r.prompt + r.max_out:
                continue
            if step < r.eligible:  # PP + async: decode_stagger steps between a request's decodes
                continue
            n = r.num_tokens + r.drafts + r.placeholders - r.computed  # num_tokens_with_spec + placeholders - computed
            n = min(n, mml - r.computed - 1)  # "input position does not exceed the max model len"
            if n > budget:
                n, limit = budget, "token_budget"
            if n <= 0:  # e.g. a sync decode whose output has not returned yet
                continue
            need = blocks[r.computed + n + lookahead] - r.blocks
            if need > self.free:
                # allocate_slots failed: preempt the last running request (FCFS), maybe this one.
                victim = None
                while need > self.free and victim is not r:
                    victim = running.pop()
                    self._preempt(victim)
                preempted, limit = True, "kv_admission"
                if victim is r:
                    break
            if need > 0:
                self.free -= need
                r.blocks += need
            budget -= n
            before = r.computed
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
            if drafts >= 0:
                self._after_sample_scheduled(r, drafts)
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
            # allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl, default True):
            # the whole input must fit in the free blocks, not just the first chunk. Releases
            # before the option (vllm_release.Release.reserve_full_input) ask for the chunk's.
            n = min(total, budget)  # chunked prefill: as much of the prompt as the budget allows
            need = blocks[n + self.lookahead]
            if self.reserve_full_input and blocks[total] > need:
                need = blocks[total]
            if need > self.free:
                return "kv_admission"
            if dry:
                return None
            if n < total:
                limit = "token_budget"
            r.blocks = blocks[n + self.lookahead]
            self.free -= r.blocks
            del waiting[j]
            running.append(r)
            r.prefill_end, r.computed, r.inflight = total, n, r.inflight + 1
            budget -= n
            prefills.append((n, 0))
            drafts = 0 if n == total else -1
            entries.append((r, n, drafts, r.epoch))
            if drafts == 0:
                self._after_sample_scheduled(r, 0)
        return limit

    def _preempt(self, r: _Req) -> None:
        """scheduler.py _preempt_request: blocks freed, computed tokens reset, back at the front of waiting."""
        self.free += r.blocks
        r.blocks = r.computed = r.placeholders = r.drafts = r.eligible = 0
        r.epoch += 1  # outputs of batches still in flight are stale: delivered, but do not touch the counters
        self.waiting.appendleft(r)
        self.preemptions += 1

    def launch(self, now: float, entries: list, contexts: list, prefills: list, start: float) -> None:
        """The batch flows through the stages in order, each busy until its part is done."""
        stage_times = self.cost.stage_seconds(contexts, prefills, 1 + self.k)
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
        self.in_flight.append(_Batch(entries, t))
        self.steps += 1
        self.decodes += len(contexts)
        self.step_seconds += max(stage_times)

    def launch_empty(self, now: float) -> None:
        """step_with_batch_queue queues an empty step too; it only advances the step count."""
        self.in_flight.append(_Batch([], max(now, self.in_flight[-1].done) if self.in_flight else now))

    def take_output(self, client: Client) -> float:
        """Block on the oldest batch (step_with_batch_queue) and apply it (update_from_output)."""
        batch = self.in_flight.popleft()
        now = batch.done
        client.send_due(now, self.waiting)
        k, p, rng, async_, itl = self.k, self.acceptance, self.rng, self.async_, self.itl
        for r, _, drafts, epoch in batch.entries:
            r.inflight -= 1
            if drafts < 0 or r.done:
                continue
            accepted = drafts if p >= 1.0 else 0
            if 0.0 < p < 1.0:
                while accepted < drafts and rng.random() < p:  # chained: a draft counts only after all before it
                    accepted += 1
            if epoch == r.epoch:
                r.computed -= drafts - accepted  # rejected drafts' slots are recomputed
                if async_:
                    r.placeholders -= 1 + drafts
                else:
                    r.drafts = k  # the drafter proposes k tokens for the next step
            emitted = min(1 + accepted, r.max_out - r.emitted)
            r.num_tokens += emitted
            r.emitted += emitted
            # endpoint_request_func.py: one ITL sample per streamed chunk, however many tokens it carries.
            if r.first < 0:
                r.first = now
            else:
                gap = now - r.last
                itl[gap] = itl.get(gap, 0) + 1
            r.last = now
            if r.emitted >= r.max_out:
                self._finish(r, client, now)
        client.send_due(now, self.waiting)
        return now

    def _finish(self, r: _Req, client: Client, now: float) -> None:
        r.done, self.free, r.blocks = True, self.free + r.blocks, 0
        (self.running if r in self.running else self.waiting).remove(r)
        self.finished.append(r)
        client.release(now)

    def fast_forward(self, now: float, client: Client) -> float | None:
        """Run many identical decode steps at once; None when the next step is not one of them.

        The same steps as schedule/launch/take_output (pp == 1, every running request a decode
        of 1 + k tokens, deterministic acceptance), stopped before anything changes the batch:
        a finish, an arrival, a failed allocation, max_model_len. Per step only the step model
        runs; request counters are advanced once at the end.
        """
        running, k, q = self.running, self.k, 1 + self.k
        if self.pp != 1 or not running or (k and 0.0 < self.acceptance < 1.0) or len(running) * q > self.max_tokens:
            return None
        if self.async_:  # one batch in flight: the previous step of these same requests
            if len(self.in_flight) != 1 or len(self.in_flight[0].entries) != len(running):
                return None
            if any(e[0] is not r or e[2] != k for e, r in zip(self.in_flight[0].entries, running)):
                return None
        elif self.in_flight:
            return None
        limit = self._admit([], [], self.max_tokens - len(running) * q, "none", dry=True)
        if limit is None:
            return None
        advance = 1 + (k if self.acceptance >= 1.0 else 0)  # tokens a step adds to each request
        margin = 2 if self.async_ else 1  # async: keep clear of the "extra step" check too
        steps = math.inf
        for r in running:
            if r.computed < r.prefill_end or r.num_tokens + r.drafts + r.placeholders - r.computed != q or self.step + 1 < r.eligible:
                return None
            steps = min(steps, (r.max_out - r.emitted - 1) // advance + 1 - margin,
                        (self.max_model_len - 1 - q - r.computed) // advance + 1)
        steps = self._steps_that_fit(steps, q + self.lookahead, advance)
        if steps < 2:
            return None
        return self._advance(now, client, steps, advance, limit)

    def _steps_that_fit(self, steps: int, ahead: int, advance: int) -> int:
        """The most steps (<= steps) whose block growth, over all running requests, fits the free blocks."""
        blocks = self.blocks
        while steps >= 2:
            last = (steps - 1) * advance + ahead
            if sum(max(0, blocks[r.computed + last] - r.blocks) for r in self.running) <= self.free:
                return steps
            steps //= 2
        return steps

    def _advance(self, now: float, client: Client, steps: int, advance: int, limit: str) -> float:
        running, q = self.running, 1 + self.k
        contexts0 = [r.computed for r in running]
        stage_free, stage_seconds = self.stage_free, self.cost.stage_seconds
        outputs = [self.in_flight.popleft().done] if self.async_ else []  # the previous step's output comes first
        done, schedule_at = stage_free[0], now
        for j in range(steps):
            if j:
                schedule_at = outputs[-2] if self.async_ else outputs[-1]  # the engine schedules after an output
                arrival = client.next_send()
                if arrival is not None and arrival <= schedule_at:
                    break  # a request arrives: back to the full scheduler
            shift = j * advance
            seconds = stage_seconds([c + shift for c in contexts0], (), q)[0]
            done = max(schedule_at, done) + seconds
            outputs.append(done)
            self.step += 1
            self.steps += 1
            self.step_seconds += seconds
        ran = len(outputs) - (1 if self.async_ else 0)
        stage_free[0] = done
        self.decodes += ran * len(running)
        self.limit_counts[limit] += ran
        if self.async_:  # the last step stays in flight, its output not yet applied
            outputs.pop()
        self._apply_outputs(running, outputs, ran, advance, done)
        return outputs[-1]

    def _apply_outputs(self, running: list[_Req], outputs: list[float], ran: int, advance: int, last_done: float) -> None:
        """Each request got len(outputs) chunks of `advance` tokens, at the given times."""
        blocks, itl, ahead = self.blocks, self.itl, 1 + self.k + self.lookahead
        n_out = len(outputs)
        for r in running:
            grown = blocks[r.computed + (ran - 1) * advance + ahead]
            if grown > r.blocks:
                self.free -= grown - r.blocks
                r.blocks = grown
            r.computed += n_out * advance
            r.num_tokens += n_out * advance
            r.emitted += n_out * advance
            if r.first < 0:
                r.first = outputs[0]
            else:
                gap = outputs[0] - r.last
                itl[gap] = itl.get(gap, 0) + 1
            r.last = outputs[-1]
        for before, after in zip(outputs, outputs[1:]):
            itl[after - before] = itl.get(after - before, 0) + len(running)
        if self.async_:
            k = self.k
            for r in running:
                r.token_ready, r.eligible = last_done, self.step + 1
            self.in_flight.append(_Batch([(r, 1 + k, k, r.epoch) for r in running], last_done))

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
                raise UserError(f"a request of {r.num_tokens} tokens needs {self.blocks[r.num_tokens]} KV blocks; the pool has {self.free}")
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
             max_concurrent_batches: int | None = None) -> SimResult:
    """`vllm bench serve` against one replica of dp: closed loop at `concurrency`, open loop at
    `request_rate` (Poisson), or both (rate capped at a concurrency)."""
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
                     max_concurrent_batches=max_concurrent_batches)
    engine.run(Client(mine, send_times(len(mine), rate, seed), slots, _Req))
    done, steps = engine.finished, max(engine.steps, 1)
    return SimResult(
        **serve_metrics([(r.sent, r.first, r.last, r.prompt, r.emitted) for r in done], engine.itl, replicas),
        completed=round(len(done) * len(lengths) / len(mine)), preemptions=engine.preemptions,
        mean_batch_size=engine.decodes / steps, mean_step_s=engine.step_seconds / steps, steps=engine.steps,
        limits={name: count / steps for name, count in engine.limit_counts.items()},
    )

