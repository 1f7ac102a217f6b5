"""The engine's fast paths (scheduler._Engine.fast_forward): many steady decode steps at once,
exactly as the engine would run them one by one.

Steady decode: every running request decodes 1 + k tokens a step; nobody arrives, finishes,
is admitted or preempted; no allocation fails; acceptance is deterministic (k == 0, or
acceptance 0 or 1), so every output carries the same number of tokens and draws no random
number. Then the requests' counters move in lock step and only the step model needs calling
per step: the fast paths advance them once, at the end. Each fast path stops before the first
step that would be anything else, and the engine goes on step by step from there.

- `single_stage` (pp == 1): the same batch, every running request, step after step.
- `pipelined` (pp > 1): the requests split into groups, each the requests of one micro-batch,
  which stay together (they are scheduled by the same Scheduler.schedule call and their output
  arrives by the same take_output); the replay runs the engine's own loop (_Engine.run:
  schedule, launch, launch_empty, take_output) over groups instead of requests.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.planning.perf.scheduler import _Engine, _Req
    from infra.planning.perf.workload import Client


def _deterministic(e: _Engine) -> bool:
    """Every output carries the same tokens and draws no random number (take_output)."""
    return not e.k or e.acceptance <= 0.0 or e.acceptance >= 1.0


def _holds_what_it_decodes(e: _Engine) -> bool:
    """No running request holds more than its next decode needs: the replay only grows blocks,
    and a request still holding its last prefill chunk's gives some back at its next step
    (a sliding window, scheduler.KVPool.held_for), which the engine's own step does."""
    if not e.gives_back:
        return True
    blocks, floor = e.blocks, 1 + e.lookahead
    return all(r.blocks <= blocks[r.computed + floor] for r in e.running)


def _tokens_per_output(e: _Engine) -> int:
    return 1 + (e.k if e.acceptance >= 1.0 else 0)


# --- pp == 1 ---------------------------------------------------------------------------------


def single_stage(e: _Engine, now: float, client: Client) -> float | None:
    """The same steps as schedule/launch/take_output with one stage (every running request a
    decode of 1 + k tokens), stopped before anything changes the batch: a finish, an arrival,
    a failed allocation, max_model_len."""
    running, k, q = e.running, e.k, 1 + e.k
    if not running or not _deterministic(e) or len(running) * q > e.max_tokens:
        return None
    if e.async_:  # one batch in flight: the previous step of these same requests
        if len(e.in_flight) != 1 or len(e.in_flight[0].entries) != len(running):
            return None
        if any(b[0] is not r or b[2] != k for b, r in zip(e.in_flight[0].entries, running)):
            return None
    elif e.in_flight:
        return None
    limit = e._admit([], [], e.max_tokens - len(running) * q, "none", dry=True)
    if limit is None:
        return None
    advance = _tokens_per_output(e)
    margin = 2 if e.async_ else 1  # async: keep clear of the "extra step" check too
    steps = math.inf
    for r in running:
        if r.computed < r.prefill_end or r.num_tokens + r.drafts + r.placeholders - r.computed != q or e.step + 1 < r.eligible:
            return None
        steps = min(steps, (r.max_out - r.emitted - 1) // advance + 1 - margin,
                    (e.max_model_len - 1 - q - r.computed) // advance + 1)
        if steps < 2:  # a request finishes within a step: no run to skip, whatever the others
            return None
    steps = _steps_that_fit(e, steps, q + e.lookahead, advance)
    if steps < 2 or not _holds_what_it_decodes(e):
        return None
    return _advance(e, now, client, steps, advance, limit)


def _steps_that_fit(e: _Engine, steps: int, ahead: int, advance: int) -> int:
    """The most steps (<= steps) whose block growth, over all running requests, fits the free blocks."""
    blocks = e.blocks
    while steps >= 2:
        last = (steps - 1) * advance + ahead
        if sum(max(0, blocks[r.computed + last] - r.blocks) for r in e.running) <= e.free:
            return steps
        steps //= 2
    return steps


def _advance(e: _Engine, now: float, client: Client, steps: int, advance: int, limit: str) -> float:
    running = e.running
    contexts0 = [r.computed for r in running]
    stage_free = e.stage_free
    outputs = [e.in_flight.popleft().done] if e.async_ else []  # the previous step's output comes first
    done, schedule_at = stage_free[0], now
    for j in range(steps):
        if j:
            schedule_at = outputs[-2] if e.async_ else outputs[-1]  # the engine schedules after an output
            arrival = client.next_send()
            if arrival is not None and arrival <= schedule_at:
                break  # a request arrives: back to the full scheduler
        shift = j * advance
        seconds = e.stage_seconds([c + shift for c in contexts0], ())[0]
        done = max(schedule_at, done) + seconds
        outputs.append(done)
        e.step += 1
        e.steps += 1
        e.step_seconds += seconds
    ran = len(outputs) - (1 if e.async_ else 0)
    stage_free[0] = done
    e.decodes += ran * len(running)
    e.limit_counts[limit] += ran
    if e.async_:  # the last step stays in flight, its output not yet applied
        outputs.pop()
    _apply_outputs(e, outputs, ran, advance, done)
    return outputs[-1]


def _apply_outputs(e: _Engine, outputs: list[float], ran: int, advance: int, last_done: float) -> None:
    """Each request got len(outputs) chunks of `advance` tokens, at the given times."""
    blocks, itl, ahead, running = e.blocks, e.itl, 1 + e.k + e.lookahead, e.running
    n_out = len(outputs)
    for r in running:
        grown = blocks[r.computed + (ran - 1) * advance + ahead]
        if grown > r.blocks:
            e.free -= grown - r.blocks
            e.taken += grown - r.blocks
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
    if e.async_:
        k = e.k
        for r in running:
            r.token_ready, r.eligible = last_done, e.step + 1
        e.queue([(r, 1 + k, k, r.epoch) for r in running], last_done)


# --- pp > 1 ----------------------------------------------------------------------------------


class _Group:
    """The requests of one micro-batch: what they share (the fields a schedule or an output
    changes alike for all of them) and, per request, what differs at the start."""

    __slots__ = ("reqs", "computed0", "key0", "held", "peak", "shift", "placeholders", "drafts", "eligible", "token_ready",
                 "inflight", "outputs", "last", "room", "ahead", "top", "limit", "hop")

    def __init__(self, reqs: list[_Req]):
        r = reqs[0]
        self.reqs = reqs  # in running order: the order schedule() puts them in a batch
        self.computed0 = [r.computed for r in reqs]
        self.key0 = tuple(self.computed0)  # with the shift, the batch's key in the step-time memo
        self.held = [r.blocks for r in reqs]  # blocks each holds
        self.shift = 0  # computed = computed0 + shift
        self.peak = -math.inf  # the largest shift the replay scheduled the group at: its blocks cover it
        self.placeholders, self.drafts, self.eligible, self.token_ready, self.inflight = (
            r.placeholders, r.drafts, r.eligible, r.token_ready, r.inflight)
        self.outputs, self.last = 0, 0.0  # outputs applied by the replay, the time of the latest
        self.room = min(r.max_out - r.emitted for r in reqs)  # tokens before the first finish
        self.ahead = max(r.computed - r.prompt - r.max_out for r in reqs)  # for async's "extra step" check
        self.top = max(self.computed0)  # for max_model_len
        self.limit, self.hop = "none", 0.0


_STOP = object()  # the next schedule call would do something the replay does not model


def pipelined(e: _Engine, now: float, client: Client) -> float | None:
    """Replay the engine's loop over groups until the first step it does not model; None if
    not even one step could be replayed."""
    if not e.running or not _deterministic(e):
        return None
    blocked = e.ff_blocked
    if blocked is not None and any(b is blocked for b in e.in_flight):
        return None  # that batch still holds an entry no replay can move (_groups)
    groups = _groups(e)
    if groups is None or not _admission_stays_shut(e, groups) or not _holds_what_it_decodes(e):
        return None
    replay = _Pipeline(e, groups, now)
    if not replay.run(client.next_send()):
        return None
    replay.commit()
    return replay.now


def _groups(e: _Engine) -> list[_Group] | None:
    """The running requests by micro-batch, None unless every one is a steady decode.

    A request's signature: the batches in flight it is in, and the fields schedule and
    take_output change. Requests of one signature are scheduled and receive outputs together;
    each batch in flight must hold exactly one signature (else it is a mix the replay cannot
    move as one, e.g. after a merge, a finish or a preemption)."""
    q, k, sync = 1 + e.k, e.k, not e.async_
    # Requests are keys by identity (_Req defines no __eq__): no id() call per entry.
    running = set(e.running)
    # Only current decodes of running requests: no prefill chunk, stale or finished entry.
    # Such an entry stays so while its batch is in flight (a request that leaves the running
    # set comes back only with a new epoch): remember the batch, the newest such first (it
    # stays in flight the longest).
    for b in reversed(e.in_flight):
        for r, n, drafts, epoch in b.entries:
            if n != q or drafts != k or epoch != r.epoch or r not in running:
                e.ff_blocked = b
                return None
    batches: dict = {}  # request -> positions of the batches in flight it is in
    for pos, b in enumerate(e.in_flight):
        for entry in b.entries:
            r = entry[0]
            batches[r] = batches.get(r, ()) + (pos,)
    for b in e.in_flight:  # each batch in flight one micro-batch: else a mix the replay cannot move as one
        if b.entries:
            where = batches[b.entries[0][0]]
            for entry in b.entries:
                if batches[entry[0]] != where:
                    return None
    by_signature: dict[tuple, list] = {}
    for r in e.running:
        inside = batches.get(r, ())
        if r.first < 0 or r.computed < r.prefill_end or r.inflight != len(inside):
            return None
        n = r.num_tokens + r.drafts + r.placeholders - r.computed
        # async: n stays 1 + k throughout; sync: 1 + k when the output is back, -k while in flight.
        if (sync and r.inflight > 1) or n != (-k if sync and r.inflight else q):
            return None
        key = (inside, r.placeholders, r.drafts, r.eligible, r.token_ready, r.inflight)
        by_signature.setdefault(key, []).append(r)
    groups = [_Group(reqs) for reqs in by_signature.values()]
    if any(len(g.reqs) * q > e.max_tokens for g in groups):  # a batch cut by the token budget
        return None
    return groups


def _admission_stays_shut(e: _Engine, groups: list[_Group]) -> bool:
    """No schedule call of the replay admits a waiting request; record each group's limit.

    _admit sees the budget a group leaves (or all of it, on a call that schedules nobody),
    the running count and the free blocks. The first two stay as they are, the free blocks
    only shrink: a request that cannot be admitted now cannot be during the replay."""
    q, limits = 1 + e.k, {}
    for budget in {e.max_tokens, *(e.max_tokens - len(g.reqs) * q for g in groups)}:
        limits[budget] = e._admit([], [], budget, "none", dry=True)
        if limits[budget] is None:
            return False
    hop = e.cost.hop_seconds
    for g in groups:
        g.limit = limits[e.max_tokens - len(g.reqs) * q]
        g.hop = hop(len(g.reqs) * q)
    return True


class _Pipeline:
    """_Engine.run's loop over groups; engine counters move as it goes, requests at commit."""

    def __init__(self, e: _Engine, groups: list[_Group], now: float):
        self.e, self.groups, self.now = e, groups, now
        self.q, self.k = 1 + e.k, e.k
        self.advance = _tokens_per_output(e)
        self.rollback = e.k + 1 - self.advance  # rejected drafts: computed goes back by as many
        group_of = {id(r): g for g in groups for r in g.reqs}
        # The batches in flight as (group or None if empty, done, the engine's batch or None if new).
        self.flight = deque((group_of[id(b.entries[0][0])] if b.entries else None, b.done, b) for b in e.in_flight)
        self.soonest = min(g.eligible for g in groups)  # async: no schedule call takes a group before
        self.ready = sum(not g.inflight for g in groups)  # sync: groups whose output is back
        self.roomy: bool | None = None  # the pool cannot run out during the replay (known at the first schedule)

    def run(self, arrival: float | None) -> bool:
        """True if at least one action (schedule call or output) was replayed."""
        e, flight, moved = self.e, self.flight, False
        async_, max_batches = e.async_, e.max_batches
        while arrival is None or arrival > self.now:  # else send_due adds a request at the loop's top
            if len(flight) < max_batches:
                step = e.step + 1
                if async_ and step < self.soonest:  # nobody eligible: step_with_batch_queue queues an empty step
                    e.step = step
                    flight.append((None, max(self.now, flight[-1][1]) if flight else self.now, None))
                    moved = True
                    continue
                g = self._due(step)
                if g is _STOP:
                    break
                if g is not None:
                    self._launch(g)
                    moved = True
                    continue
                if not flight or not self._can_take():  # sync: schedule() finds nobody ready
                    break
                e.step = step  # and the engine takes an output
            elif flight[0][0] is None:  # an empty step's "output"
                self.now = flight.popleft()[1]
                moved = True
                continue
            elif not self._can_take():
                break
            self._take()
            moved = True
        return moved

    def _due(self, step: int):
        """The group the schedule call of `step` takes: None if nobody, _STOP if it would do
        anything but schedule one whole group of 1 + k-token decodes."""
        e, q = self.e, self.q
        if e.async_:  # PP + async: a request is eligible `pp` steps after its last schedule
            due = [g for g in self.groups if step >= g.eligible]
        else:  # sync: a request is scheduled once its output is back
            if not self.ready:
                return None
            due = [g for g in self.groups if not g.inflight]
        if not due:
            return None
        if len(due) > 1:  # groups merge into one batch: the engine does it, then it is steady again
            return _STOP
        g = due[0]
        if g.top + g.shift + q + 1 > e.max_model_len:  # schedule(): n capped at max_model_len
            return _STOP
        # async_scheduler: placeholders already cover max_tokens -> the request sits the step out.
        if e.async_ and g.placeholders and g.ahead + g.shift + 2 - g.placeholders >= 0:
            return _STOP
        if not self._allocate(g):  # allocate_slots fails: a preemption
            return _STOP
        return g

    def _allocate(self, g: _Group) -> bool:
        """allocate_slots for the group's next step (blocks for computed + 1 + k + lookahead
        tokens), if all of it fits the free blocks. Blocks never shrink as tokens grow, so a
        shift at or below the group's peak needs none, and when the pool cannot run out
        before the replay must stop anyway, the blocks are settled at commit instead."""
        x = g.shift
        if x <= g.peak:
            return True
        if self.roomy is None:
            self.roomy = self._pool_outlasts_replay()
        if not self.roomy:
            e = self.e
            blocks, extra = e.blocks, self.q + e.lookahead
            grown = [blocks[c + x + extra] for c in g.computed0]
            need = sum(b - h for b, h in zip(grown, g.held) if b > h)
            if need > e.free:
                return False
            e.free -= need
            e.taken += need
            g.held = list(map(max, grown, g.held))
        g.peak = x
        return True

    def _pool_outlasts_replay(self) -> bool:
        """Every group's blocks at the highest shift it could be scheduled at fit the free blocks.

        A group in flight `f` times with outputs `o` has been scheduled f - f0 + o times (f0 at
        the start), f <= max_batches; its shift is q per schedule less the rollback per output,
        and it stops before an output that would finish a request (o <= (room - 1) // advance)
        or a step that max_model_len would cut."""
        e, q = self.e, self.q
        blocks, extra, need = e.blocks, q + e.lookahead, 0
        for g in self.groups:
            outputs = (g.room - 1) // self.advance
            schedules = outputs + e.max_batches - g.inflight
            highest = min(schedules * q - self.rollback * outputs, e.max_model_len - q - 1 - g.top)
            need += sum(max(0, blocks[c + highest + extra] - h) for c, h in zip(g.computed0, g.held))
        return need <= e.free

    def _launch(self, g: _Group) -> None:
        """schedule() then launch() of the group's batch (the same float operations, in order)."""
        e, q = self.e, self.q
        e.step += 1
        times = e.shifted_stage_seconds(g.key0, g.shift)
        free, hop = e.stage_free, g.hop
        t = self.now if self.now > g.token_ready else g.token_ready  # waits for the token it builds on
        if t < 0.0:
            t = 0.0
        for s, seconds in enumerate(times):  # max(...) spelt out: this loop runs ~10^5 times a curve
            if s:
                t += hop
            if free[s] > t:
                t = free[s]
            t += seconds
            free[s] = t
        g.shift += q
        g.inflight += 1
        if e.async_:  # _after_sample_scheduled: placeholders, k drafts, next decode pp steps later
            g.placeholders += q
            g.drafts = self.k
            g.eligible = e.step + e.pp
            g.token_ready = t
            soonest = g.eligible
            for other in self.groups:
                if other.eligible < soonest:
                    soonest = other.eligible
            self.soonest = soonest
        else:
            g.drafts = 0
            self.ready -= 1
        self.flight.append((g, t, None))
        e.steps += 1
        e.decodes += len(g.reqs)
        e.step_seconds += max(times)
        e.limit_counts[g.limit] += 1

    def _can_take(self) -> bool:
        """The oldest batch's output finishes nobody."""
        g = self.flight[0][0]
        return g is None or (g.outputs + 1) * self.advance < g.room

    def _take(self) -> None:
        """take_output of the oldest batch: its group gets `advance` tokens each."""
        g, done, _ = self.flight.popleft()
        self.now = done
        if g is None:
            return
        g.inflight -= 1
        g.shift -= self.rollback
        if self.e.async_:
            g.placeholders -= self.q
        else:
            g.drafts = self.k  # the drafter proposes k tokens for the next step
            self.ready += 1
        itl = self.e.itl
        if g.outputs:
            gap = done - g.last
            itl[gap] = itl.get(gap, 0) + len(g.reqs)
        else:  # the first gap is each request's own
            for r in g.reqs:
                gap = done - r.last
                itl[gap] = itl.get(gap, 0) + 1
        g.outputs += 1
        g.last = done

    def commit(self) -> None:
        """Write the groups back into their requests, and the batches in flight into the engine."""
        e = self.e
        if self.roomy:  # settle the blocks allocate_slots gave out, at each group's peak
            blocks, extra = e.blocks, self.q + e.lookahead
            for g in self.groups:
                if g.peak > -math.inf:
                    grown = [max(h, blocks[c + g.peak + extra]) for c, h in zip(g.computed0, g.held)]
                    e.free -= sum(grown) - sum(g.held)
                    e.taken += sum(grown) - sum(g.held)
                    g.held = grown
        for g in self.groups:
            tokens = g.outputs * self.advance
            for r, computed, held in zip(g.reqs, g.computed0, g.held):
                r.computed, r.blocks = computed + g.shift, held
                r.num_tokens += tokens
                r.emitted += tokens
                r.placeholders, r.drafts, r.eligible, r.token_ready, r.inflight = (
                    g.placeholders, g.drafts, g.eligible, g.token_ready, g.inflight)
                if g.outputs:
                    r.last = g.last
        q, k = self.q, self.k
        e.in_flight.clear()
        for g, done, batch in self.flight:
            if batch is not None:
                e.in_flight.append(batch)
            else:
                e.queue([(r, q, k, r.epoch) for r in g.reqs] if g else [], done)
