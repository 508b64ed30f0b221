"""Continuous batching: a pool of B slots decoding any number of prompts.

A static batch (``engine.generate``) runs until its slowest row is done, so when rows need very
different numbers of forwards (a low τ, stop rules, different prompt lengths) its last forwards
carry mostly finished rows. Here a row that finishes (stop rule or budget) leaves its slot at
once, and the next waiting prompt takes the slot in the very next forward, its prefill
included: the slot's KV-cache row is emptied, not reallocated. Once no prompt is waiting,
finished rows are dropped from the batch and from the cache, so the tail of the run does not
pad its forwards with empty rows.

A new row's first forward (its prompt prefill, or AR's first step over the whole prompt) is
as wide as its prompt, while the other rows feed a few tokens each; run together, every row
is padded to the prompt's width. So the new rows' first forward runs apart, over the new rows
only and into a KV cache of their own whose rows are then copied into their slots; from their
second forward on they decode with the others. (Measured on the mini benchmark on a CPU: the
padded forwards cost more than the extra forward saves, for every family and τ.)

Every row keeps its own canvas, window, cache length and generator, exactly as in the static
engine, and a forward's rows never see each other; so a row's tokens, NFE and confidences are
those of decoding it alone, whatever the pool size and the order in which prompts arrive.
Rows finish in any order: ``on_finished`` hears each one as it leaves the pool (so a caller can
save it at once), and the returned output lists them in prompt order.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from setdlm.core.decoding.config import DecodeConfig
from setdlm.core.decoding.engine import (
    GenerationOutput,
    OrderPolicy,
    RowInputs,
    RowState,
    RowTiming,
    _ForwardCounter,
    _new_row,
    _step,
    cache_capacity,
    checked_stop_after,
    collect,
    end_token_ids,
)
from setdlm.core.decoding.stopping import StopRule
from setdlm.core.kv_cache import KVCache

# on_finished(prompt index, that row's one-row GenerationOutput)
FinishedCallback = Callable[[int, GenerationOutput], None]


def generate_continuous(
    family,
    prompts: list[list[int]],
    config: DecodeConfig,
    batch_size: int,
    seeds: list[int] | None = None,
    tokenizer=None,
    on_finished: FinishedCallback | None = None,
    synchronize_forwards: bool = False,
    policy_options: dict | None = None,
    stop_after: list[int | None] | None = None,
) -> GenerationOutput:
    """Decode every prompt through a pool of ``batch_size`` slots (see the module docstring);
    ``stop_after`` as in ``engine.generate``.

    The returned output is in prompt order. ``nfe`` and ``forward_seconds`` are those of the
    whole pool; per row, ``row_latency_seconds`` is its time in the pool and
    ``row_share_seconds`` the time since the previous row finished (they add up to the call).
    A one-row output handed to ``on_finished`` has the row's own forwards as ``nfe``, the time
    of those forwards (shared with their other rows) as ``forward_seconds``, and its latency as
    ``wall_seconds``.
    """
    start = time.perf_counter()
    if not prompts:
        raise ValueError("generate_continuous() needs at least one prompt")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pool = _Pool(family, prompts, config, seeds, tokenizer, batch_size, policy_options, start)
    pool.stop_after = checked_stop_after(stop_after, len(prompts))
    pool.on_finished = on_finished
    pool.forward = _ForwardCounter(family, synchronize_forwards)
    while True:
        plans = pool.plan_next_forward()
        if not plans:
            break
        pool.step(pool.batch_rows(), plans, pool.cache)
    wall = time.perf_counter() - start
    order = range(len(prompts))
    timing = RowTiming(
        latency=[pool.latency[i] for i in order], share=[pool.share[i] for i in order]
    )
    finished = [pool.finished[i] for i in order]
    forwards, seconds = pool.forward.calls, pool.forward.seconds
    return collect(finished, pool.mask_id, timing, forwards, seconds, wall, pool.end_ids)


class _Pool:
    """The rows being decoded (one per KV-cache row), the prompts waiting, the rows done."""

    def __init__(self, family, prompts, config, seeds, tokenizer, batch_size, options, start):
        self.family, self.prompts, self.config, self.seeds = family, prompts, config, seeds
        self.device = family.device
        self.mask_id = family.config.mask_token_id
        self.end_ids = end_token_ids(family, config)
        self.policy: OrderPolicy = family.decode_policy(config, **(options or {}))
        self.stop_rule = StopRule(config, tokenizer)
        self.on_finished: FinishedCallback | None = None
        self.stop_after: list[int | None] = [None] * len(prompts)
        self.forward: _ForwardCounter | None = None
        size = min(batch_size, len(prompts))
        # infilling prompts hold their masks already: an upper bound, capped at the model length
        budget = config.max_new_tokens
        self.capacity = cache_capacity(family, (len(p) + budget for p in prompts))
        self.cache = self._new_cache(size)
        self.rows: list[RowState | None] = [None] * size  # slot b is the cache's row b
        self.waiting = deque(range(len(prompts)))
        self.finished: dict[int, RowState] = {}
        self.latency: dict[int, float] = {}
        self.share: dict[int, float] = {}
        self.last_finish = start

    def step(self, rows: list[RowState], plans: list[RowInputs], cache) -> None:
        """One forward of ``rows`` through the static engine's step (a None plan: the row sits
        this forward out)."""
        before = self.forward.seconds
        _step(
            self.family, self.policy, rows, plans, cache, self.forward, self.config, self.stop_rule
        )
        for row in rows:
            row.forward_seconds += self.forward.seconds - before

    def plan_next_forward(self) -> list[RowInputs | None]:
        """Fill free slots, retire rows with nothing left to do, and return one plan per row of
        ``self.rows`` (empty when every prompt is done; None for a slot left idle)."""
        plans: dict[int, RowInputs] = {}  # slot -> the inputs of its row's next forward
        while True:
            self._admit_into_free_slots()
            for b, row in enumerate(self.rows):
                if row is None or b in plans:
                    continue
                inputs = self._next_inputs(row)
                if inputs is None:
                    self._retire(b)
                else:
                    plans[b] = inputs
            if not (self.waiting and any(row is None for row in self.rows)):
                break
        fresh = [b for b in plans if self.rows[b].forwards == 0]
        if fresh and len(fresh) < len(plans) and self.cache is not None:
            self._first_forward_apart(fresh, plans)
        if not self.waiting:  # finished rows leave the batch: later forwards are narrower
            active = [b for b, row in enumerate(self.rows) if row is not None]
            if len(active) < len(self.rows):
                if self.cache is not None and active:
                    self.cache.keep_rows(active)
                self.rows = [self.rows[b] for b in active]
                plans = {i: plans[b] for i, b in enumerate(active) if b in plans}
        return [plans.get(b) for b in range(len(self.rows))] if plans else []

    def batch_rows(self) -> list[RowState]:
        """The rows of the next forward, one per cache row (an empty slot: an idle row)."""
        return [row if row is not None else _idle_row() for row in self.rows]

    def _next_inputs(self, row: RowState) -> RowInputs | None:
        if not row.prefilled:
            row.prefilled = True
            inputs = self.policy.prefill(row)
            if inputs is not None:
                return inputs
        if row.done:
            return None
        inputs = self.policy.plan(row)
        row.done = inputs is None
        return inputs

    def _admit_into_free_slots(self) -> None:
        for b, row in enumerate(self.rows):
            if row is not None or not self.waiting:
                continue
            index = self.waiting.popleft()
            prompt, stop = self.prompts[index], self.stop_after[index]
            row = _new_row(index, prompt, self.config, self.mask_id, self.seeds, self.device, stop)
            self.policy.setup(row)
            row.admitted_at = time.perf_counter()
            if self.cache is not None:
                self.cache.reset_row(b)
            self.rows[b] = row

    def _first_forward_apart(self, slots: list[int], plans: dict[int, RowInputs]) -> None:
        """Run the planned first forward of the rows in ``slots`` over those rows only, copy the
        cache they wrote into their slots, and plan their next forward (with the others)."""
        rows = [self.rows[b] for b in slots]
        own_cache = self._new_cache(len(rows))
        self.step(rows, [plans[b] for b in slots], own_cache)
        self.cache.adopt_rows(slots, own_cache)
        for b in slots:
            inputs = self._next_inputs(self.rows[b])
            if inputs is None:  # done in one forward: its slot idles until the next forward
                del plans[b]
                self._retire(b)
            else:
                plans[b] = inputs

    def _new_cache(self, rows: int) -> KVCache | None:
        if not self.policy.uses_cache:
            return None
        return KVCache(self.family.num_layers, rows, self.device, self.capacity)

    def _retire(self, b: int) -> None:
        row, self.rows[b] = self.rows[b], None
        now = time.perf_counter()
        self.finished[row.index] = row
        self.latency[row.index] = now - row.admitted_at
        self.share[row.index] = now - self.last_finish
        self.last_finish = now
        if self.on_finished is not None:
            timing = RowTiming(latency=[self.latency[row.index]], share=[self.share[row.index]])
            one = collect(
                [row],
                self.mask_id,
                timing,
                row.forwards,
                row.forward_seconds,
                timing.latency[0],
                self.end_ids,
            )
            self.on_finished(row.index, one)


def _idle_row() -> RowState:
    """A placeholder for an empty slot: it has nothing to decode and takes part in no forward."""
    return RowState(
        index=-1,
        tokens=[],
        positions=[],
        generated=[],
        prompt_length=0,
        infill=False,
        generator=None,
        done=True,
        prefilled=True,
    )
