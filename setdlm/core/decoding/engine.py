"""The decoding engine shared by AR, MDLM, BD3LM and SetDLM.

Decoding is a series of backbone forwards. Before each one, the family's ``OrderPolicy`` says,
for every row of the batch, which canvas positions go in, how they see each other, how many of
the leading inputs become cached, and which positions are predicted (the "targets") with at
least how many commits (k). The engine does everything else, once, for every family:

- builds the batched inputs (rows padded to a common width; padding is masked out) and the
  attention mask over [cached slots | inputs];
- runs the backbone, its final norm and LM head on the targets' inputs only, and counts the
  forward (NFE is counted, never configured);
- commits the chosen inputs' keys/values to the per-row KV cache and drops the rest;
- applies the logits processors to all targets at once, masks the mask token, picks tokens
  (greedy or sampled from the row's own generator) and their confidences, and commits the k
  most confident plus every one at or above τ;
- checks the stopping rules on each row's contiguous decoded prefix and ends the row exactly
  at its stop point.

A row's tokens never depend on the other rows of its batch: each row has its own window,
cache length and generator. ``generate`` decodes one static batch; ``pool.py`` drives the same
step for continuous batching.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from setdlm.core.decoding import processors
from setdlm.core.decoding.config import DecodeConfig, PolicyOptions
from setdlm.core.decoding.parallelism import content_tokens, end_ids, parallelism_factor
from setdlm.core.decoding.sampling import (
    choose_tokens,
    greedy_tokens,
    nucleus_filter,
    probabilities,
    select_by_confidence,
)
from setdlm.core.decoding.stopping import StopRule
from setdlm.core.kv_cache import KVCache


@dataclass
class RowState:
    """One sequence being decoded. ``tokens`` is its canvas (mask id = not decoded yet)."""

    index: int
    tokens: list[int]
    positions: list[int]  # position id of each canvas slot
    generated: list[int]  # canvas slots of the generated region, left to right
    prompt_length: int
    infill: bool
    generator: torch.Generator | None
    policy: Any = None  # the family policy's own per-row state
    done: bool = False
    stop_at: int | None = None  # kept length of the generated region after a stop
    # Stop once this many tokens are decoded, as an EOS there would: a workload's known output
    # length replayed on a model that does not produce it (benchmarks); None: no such stop.
    stop_after: int | None = None
    prefix: list[int] = field(default_factory=list)  # contiguous decoded generated tokens
    steps: int = 0  # forwards in which the row committed predictions
    forwards: int = 0  # forwards the row took part in
    # positions the row fed the backbone, summed over its forwards (prefill included): the
    # compute it cost, whether or not a position's prediction was committed
    positions_evaluated: int = 0
    committed: int = 0  # tokens committed by predictions
    confidence: dict[int, float] = field(default_factory=dict)  # slot -> its token's confidence
    stop_checked: int = 0  # length of ``prefix`` the stop rules have already searched
    # Continuous batching only: when the row took a slot of the pool, whether its prefill was
    # planned, and the time of the forwards it took part in (shared with their other rows).
    admitted_at: float = 0.0
    prefilled: bool = False
    forward_seconds: float = 0.0


@dataclass
class RowInputs:
    """What one row feeds to one forward."""

    slots: list[int]  # canvas slots, in input order
    attend: torch.Tensor | None  # (Q, Q) bool: how the inputs see each other; None = all
    num_cached: int = 0  # the first ``num_cached`` inputs enter the KV cache after the forward
    # (input index whose logits predict, canvas slot predicted); empty = cache-only forward
    targets: list[tuple[int, int]] = field(default_factory=list)
    k: int = 1  # commit at least this many targets (the most confident)
    # Canvas slots of the row that confidences are ranked over, in its order, when it is more
    # than the targets (MDLM and BD3LM rank their whole block, decoded slots at +inf, as the
    # official sampler does; the row's composition decides how torch's sort orders ties).
    # None: the targets, in order.
    ranked: list[int] | None = None
    # Keep only the row's first ``keep_cached`` cache slots (in the order they were cached)
    # before this forward, dropping the others; None keeps them all. A policy whose cache is
    # approximate uses it to recompute part or all of its cache (once per block, say).
    keep_cached: int | None = None


class OrderPolicy(ABC):
    """A decoding order and cache policy (setdlm/families.py names each one and says which
    families decode with it, and whether its cache is exact).

    ``Options`` is the policy's own knobs; ``RowState.policy`` holds its typed per-row state.
    """

    Options: ClassVar[type[PolicyOptions]]
    uses_cache: bool = True
    # When the cache plus the inputs would outgrow the model length, drop the slots with the
    # smallest position ids instead of the oldest ones.
    crop_by_position: bool = False

    def __init__(self, family, config: DecodeConfig, options: PolicyOptions | None = None):
        options = self.Options() if options is None else options
        if not isinstance(options, self.Options):
            raise TypeError(
                f"{type(self).__name__} takes {self.Options.__name__}, got "
                f"{type(options).__name__} (the options of {options.name!r})"
            )
        self.family = family
        self.config = config
        self.options = options

    @abstractmethod
    def setup(self, row: RowState) -> None:
        """Adjust the canvas and create ``row.policy`` before the first forward."""

    def prefill(self, row: RowState) -> RowInputs | None:
        """Inputs of the forward that caches the context before decoding (None: nothing)."""
        return None

    @abstractmethod
    def plan(self, row: RowState) -> RowInputs | None:
        """Inputs of the next forward, or None when the row has nothing left to do."""

    @abstractmethod
    def observe(self, row: RowState, committed: list[int]) -> None:
        """Called after every forward with the canvas slots committed by predictions."""

    def official_stop_check(self, row: RowState) -> StopCheck:
        """When the official sampler runs its stopping criteria (``stop_cadence="official"``),
        called after ``observe``. Default: after every forward, cut exactly at the stop (AR)."""
        return StopCheck(due=True)


@dataclass(frozen=True)
class StopCheck:
    due: bool  # the official checks its stopping criteria after this forward
    # Leading generated slots the official keeps when the check finds a stop (it truncates its
    # canvas there, so tokens past the stop are returned and counted); None: exactly the stop.
    keep: int | None = None


@dataclass
class GenerationOutput:
    """Per-row results of one ``generate`` call."""

    output_ids: list[list[int]]  # prompt/context plus the decoded tokens, masks removed
    new_token_ids: list[list[int]]  # generated tokens up to the stop point
    # Probability of each new token under the distribution it was picked from, when committed.
    new_token_confidences: list[list[float]]
    num_generated: list[int]  # counted generated tokens (stop point included, no padding)
    # the generated tokens that are text (EOS and padding excluded): tokens per forward's
    num_content: list[int]
    row_forwards: list[int]  # backbone forwards each row took part in
    row_steps: list[int]  # forwards in which each row committed predictions
    row_positions: list[int]  # positions each row fed the backbone, over all its forwards
    # the official parallelism factor per row: tokens committed per decoding step, EOS and
    # positions after it included (setdlm/core/decoding/parallelism.py)
    parallelism: list[float]
    stopped: list[bool]  # the row met a stop condition before its budget ran out
    # Wall time from the row's start to its end: the whole call in a static batch, the row's
    # own time in the pool with continuous batching.
    row_latency_seconds: list[float]
    # The row's share of the call's wall time; the shares add up to the call. Static batch: the
    # call over the batch size; continuous: the time since the previous row finished.
    row_share_seconds: list[float]
    nfe: int  # backbone forwards run for the whole batch (counted)
    forward_seconds: float  # wall time inside backbone forwards
    wall_seconds: float  # wall time of the whole call


class _ForwardCounter:
    def __init__(self, family, synchronize: bool):
        self.family = family
        self.synchronize = synchronize and torch.cuda.is_available()
        self.calls = 0
        self.seconds = 0.0

    def __call__(self, input_ids, position_ids, attention_mask, cache, outputs_at):
        if self.synchronize:
            torch.cuda.synchronize()
        start = time.perf_counter()
        logits = self.family.decode_forward(
            input_ids, position_ids, attention_mask, cache, outputs_at=outputs_at
        )
        if self.synchronize:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return logits


def generate(
    family,
    prompts: list[list[int]],
    config: DecodeConfig,
    seeds: list[int] | None = None,
    tokenizer=None,
    synchronize_forwards: bool = False,
    policy_options: dict | None = None,
    stop_after: list[int | None] | None = None,
) -> GenerationOutput:
    """Decode every prompt (a list of token ids; mask ids inside it ask for infilling).

    ``stop_after`` (one per prompt): stop a row once that many tokens are decoded, as if an EOS
    stood there (see ``RowState.stop_after``)."""
    start_wall = time.perf_counter()
    if not prompts:
        raise ValueError("generate() needs at least one prompt")
    device = family.device
    mask_id = family.config.mask_token_id
    policy = family.decode_policy(config, **(policy_options or {}))
    stop_rule = StopRule(config, tokenizer)
    stops = checked_stop_after(stop_after, len(prompts))
    rows = [_new_row(b, p, config, mask_id, seeds, device, stops[b]) for b, p in enumerate(prompts)]
    for row in rows:
        policy.setup(row)
    cache = None
    if policy.uses_cache:
        capacity = cache_capacity(family, (len(row.tokens) for row in rows))
        cache = KVCache(family.num_layers, len(rows), device, capacity)
    forward = _ForwardCounter(family, synchronize_forwards)

    prefill = [policy.prefill(row) for row in rows]
    if any(inputs is not None for inputs in prefill):
        _step(family, policy, rows, prefill, cache, forward, config, stop_rule)
    while True:
        plans = [None if row.done else policy.plan(row) for row in rows]
        for row, inputs in zip(rows, plans, strict=True):
            if inputs is None:
                row.done = True
        if all(inputs is None for inputs in plans):
            break
        _step(family, policy, rows, plans, cache, forward, config, stop_rule)
    wall = time.perf_counter() - start_wall
    timing = RowTiming(latency=[wall] * len(rows), share=[wall / len(rows)] * len(rows))
    ends = end_token_ids(family, config)
    return collect(rows, mask_id, timing, forward.calls, forward.seconds, wall, ends)


def end_token_ids(family, config: DecodeConfig) -> frozenset[int]:
    """The ids that are not text in a decode: its stop ids, the model's EOS and padding."""
    return end_ids(config.eos_token_ids, family.config.eos_token_id, family.config.pad_token_id)


def cache_capacity(family, canvas_lengths) -> int:
    """KV slots to allocate once: the longest canvas, at most the model length."""
    return max(1, min(family.config.length, max(canvas_lengths, default=1)))


def checked_stop_after(stop_after: list[int | None] | None, count: int) -> list[int | None]:
    """``stop_after`` checked against ``count`` prompts: one length (>= 1) or None each."""
    if stop_after is None:
        return [None] * count
    if len(stop_after) != count:
        raise ValueError(f"stop_after has {len(stop_after)} lengths for {count} prompts")
    for b, length in enumerate(stop_after):
        if length is not None and (isinstance(length, bool) or int(length) != length or length < 1):
            raise ValueError(f"stop_after[{b}] must be a whole number >= 1 or None, got {length!r}")
    return [None if length is None else int(length) for length in stop_after]


# --------------------------------------------------------------------------------- internals
def _new_row(b, prompt, config, mask_id, seeds, device, stop_after=None) -> RowState:
    prompt = [int(t) for t in prompt]
    infill = mask_id in prompt
    if infill:
        tokens = prompt
        generated = [i for i, t in enumerate(prompt) if t == mask_id]
    else:
        tokens = prompt + [mask_id] * config.max_new_tokens
        generated = list(range(len(prompt), len(tokens)))
    generator = None
    if config.do_sample:
        if seeds is None:
            raise ValueError("sampling needs a seed per prompt (seeds=[...])")
        generator = torch.Generator(device=device).manual_seed(int(seeds[b]))
    return RowState(
        index=b,
        tokens=tokens,
        positions=list(range(len(tokens))),
        generated=generated,
        prompt_length=len(prompt),
        infill=infill,
        generator=generator,
        stop_after=stop_after,
    )


def _step(family, policy, rows, plans, cache, forward, config, stop_rule) -> None:
    """One forward for the rows with a plan (B rows; a row without one idles as padding)."""
    mask_id = family.config.mask_token_id
    device = family.device
    width = max(len(p.slots) for p in plans if p is not None)  # Q: the widest row's inputs
    if cache is not None:
        for b, inputs in enumerate(plans):
            if inputs is not None and inputs.keep_cached is not None:
                cache.truncate_row(b, inputs.keep_cached)
        _crop_cache(cache, policy, plans, family.config.length)
    ids, positions, num_cached = [], [], []  # rows padded to Q with masks at position 0
    for row, inputs in zip(rows, plans, strict=True):
        slots = [] if inputs is None else inputs.slots
        padding = width - len(slots)
        ids.append([row.tokens[s] for s in slots] + [mask_id] * padding)
        positions.append([row.positions[s] for s in slots] + [0] * padding)
        num_cached.append(0 if inputs is None else inputs.num_cached)
        row.forwards += inputs is not None
        row.positions_evaluated += len(slots)
    input_ids, position_ids = torch.tensor([ids, positions]).unbind(0)  # (B, Q) each, one copy
    attend = _attention(plans, width, cache, device)  # (B, Q, C + Q), or None: all visible
    # (B, D): the inputs whose logits predict a target; the LM head runs on these rows only
    outputs_at = _target_inputs(plans).to(device)
    # (B, D, V) logits of the targets, rows padded to the most targets (padding reads input 0)
    logits = forward(input_ids.to(device), position_ids.to(device), attend, cache, outputs_at)
    if cache is not None:  # each row's first num_cached inputs stay; the rest is dropped
        cache.commit_prefix(num_cached, position_ids)
    committed = _decode_targets(family, rows, plans, logits, config)  # per row: slots committed
    for b, (row, inputs) in enumerate(zip(rows, plans, strict=True)):
        if inputs is not None:
            policy.observe(row, committed[b])
            if not row.infill:
                _check_stop(row, mask_id, stop_rule, policy, config.stop_cadence)


def _attention(plans, width: int, cache, device) -> torch.Tensor | None:
    """(B, Q, C + Q) mask over [cached slots | inputs], or None when everything is visible.

    None (no padded input, no stale cache slot, every input sees every input) lets the
    backbone skip building and applying a mask: the common case of AR and MDLM at batch 1.
    """
    uniform_cache = cache is None or len(set(cache.lengths_on_host)) == 1
    if uniform_cache and all(
        p is not None and p.attend is None and len(p.slots) == width for p in plans
    ):
        return None
    cached = 0 if cache is None else cache.width
    # Built on the host in one tensor; cached slots are all visible when every row is as long.
    attend = torch.ones((len(plans), width, cached + width), dtype=torch.bool)
    for b, inputs in enumerate(plans):
        if inputs is None:
            attend[b] = False
        elif inputs.attend is not None or len(inputs.slots) < width:
            q = len(inputs.slots)
            attend[b, :, cached:] = False
            attend[b, :q, cached : cached + q] = True if inputs.attend is None else inputs.attend
    attend = attend.to(device)
    if not uniform_cache:
        attend[:, :, :cached] &= cache.key_valid()[:, None, :]
    return attend


def _crop_cache(cache, policy, plans, max_tokens: int) -> None:
    """Drop cached slots of rows whose cache plus inputs would exceed the model length."""
    lengths = cache.lengths_on_host  # no wait for the device
    overflow = [
        length + (len(p.slots) if p is not None else 0) - max_tokens
        for length, p in zip(lengths, plans, strict=True)
    ]
    if max(overflow) <= 0:
        return
    width = cache.width
    if policy.crop_by_position:
        order_key = cache.cached_positions().masked_fill(~cache.key_valid(), 2**62)
    else:  # slots are in insertion order: drop the oldest
        order_key = torch.arange(width, device=cache.device).expand(cache.batch_size, -1)
    rank = order_key.argsort(dim=1, stable=True).argsort(dim=1)  # 0 = dropped first
    extra = torch.tensor(overflow, device=cache.device).clamp(min=0)
    cache.keep_slots(rank >= extra[:, None])


def _target_inputs(plans) -> torch.Tensor:
    """(B, D) long: each row's target inputs, padded to the most targets with input 0 (whose
    prediction is never used); D = 0 in a forward that only caches."""
    inputs = [[i for i, _ in p.targets] if p is not None else [] for p in plans]
    depth = max(len(r) for r in inputs)
    return torch.tensor([r + [0] * (depth - len(r)) for r in inputs], dtype=torch.long)


def _decode_targets(family, rows, plans, target_logits, config: DecodeConfig) -> list[list[int]]:
    """Pick tokens for every target and commit the confident ones; returns committed slots.

    target_logits: (B, D, V), row b's first len(targets) entries its targets' (the
    backbone's output at ``_target_inputs``; a tensor of its own, written into).
    """
    committed: list[list[int]] = [[] for _ in rows]
    counts = [len(p.targets) if p is not None else 0 for p in plans]
    if not any(counts):
        return committed
    mask_id = family.config.mask_token_id
    target_logits = _apply_processors(target_logits, rows, plans, config, mask_id)
    if config.do_sample or config.top_p < 1.0:
        probs = nucleus_filter(probabilities(target_logits, mask_id), config.top_p)  # (B, D, V)
        generators = [row.generator for row in rows] if config.do_sample else None
        tokens, confidence = choose_tokens(probs, config.do_sample, generators, counts)  # (B, D)
    else:  # the same tokens and confidences, without the probability table where it is slower
        tokens, confidence = greedy_tokens(target_logits, mask_id)  # (B, D)
    # the one transfer to the host per step: the commit rule and the stops read these
    token_rows, confidence_rows = tokens.tolist(), confidence.tolist()
    for b, (row, inputs) in enumerate(zip(rows, plans, strict=True)):
        n = counts[b]
        if not n:
            continue
        values = confidence_rows[b][:n]
        for i in _chosen_targets(inputs, values, config.confidence_threshold, confidence):
            slot = inputs.targets[i][1]
            row.tokens[slot] = token_rows[b][i]
            row.confidence[slot] = values[i]
            committed[b].append(slot)
            row.committed += 1
        row.steps += 1
    return committed


def _chosen_targets(inputs: RowInputs, values: list[float], threshold: float, like) -> list[int]:
    """Indices of the targets to commit; values: one confidence per target, computed in
    ``like``'s dtype on its device."""
    options = {"dtype": like.dtype, "device": like.device}
    if inputs.ranked is None:
        return select_by_confidence(values, None, inputs.k, threshold, **options)
    target_of = {slot: i for i, (_, slot) in enumerate(inputs.targets)}
    where = [target_of.get(slot, -1) for slot in inputs.ranked]  # row entry -> target or -1
    if len(set(where) - {-1}) != len(inputs.targets):
        raise ValueError("RowInputs.ranked must hold every target slot once")
    row = [values[i] if i >= 0 else math.inf for i in where]
    decoded = [i < 0 for i in where]
    chosen = select_by_confidence(row, decoded, inputs.k, threshold, **options)
    return sorted(where[j] for j in chosen)


def _apply_processors(logits, rows, plans, config: DecodeConfig, mask_id: int):
    if config.repetition_penalty != 1.0:
        if config.repetition_context == "visible":  # everything decoded or given
            seen = [[t for t in row.tokens if t != mask_id] for row in rows]
        else:  # the generated region's decoded tokens
            seen = [
                [row.tokens[s] for s in row.generated if row.tokens[s] != mask_id] for row in rows
            ]
        # on the host: the penalty finds the seen columns there, without waiting for the device
        presence = processors.token_presence(seen, logits.shape[-1], "cpu")
        logits = processors.repetition_penalty(logits, presence, config.repetition_penalty)
    if config.length_penalty is not None:
        before = torch.zeros(logits.shape[:2], dtype=torch.long)
        for b, (row, inputs) in enumerate(zip(rows, plans, strict=True)):
            if inputs is None or not inputs.targets:
                continue
            decoded_before = _decoded_before(row, mask_id)
            counts = [decoded_before.get(slot, len(row.generated)) for _, slot in inputs.targets]
            before[b, : len(counts)] = torch.tensor(counts)
        start, factor = config.length_penalty
        logits = processors.exponential_length_penalty(
            logits, before.to(logits.device), start, factor, config.eos_token_ids
        )
    return logits


def _decoded_before(row: RowState, mask_id: int) -> dict[int, int]:
    """For each generated slot, how many generated slots left of it are decoded."""
    counts, running = {}, 0
    for slot in row.generated:
        counts[slot] = running
        running += row.tokens[slot] != mask_id
    return counts


def _check_stop(row: RowState, mask_id: int, stop_rule: StopRule, policy, cadence: str) -> None:
    """Search the newly decoded prefix for a stop; "exact" looks after every forward and ends the
    row at the stop, "official" looks only when the official sampler would and keeps what it
    keeps."""
    while len(row.prefix) < len(row.generated):
        token = row.tokens[row.generated[len(row.prefix)]]
        if token == mask_id:
            break
        row.prefix.append(token)
    if not (stop_rule.active or row.stop_after) or len(row.prefix) == row.stop_checked:
        return
    check = policy.official_stop_check(row) if cadence == "official" else StopCheck(due=True)
    if not check.due:
        return
    end = stop_rule.stop_point(row.prefix, row.stop_checked) if stop_rule.active else None
    if row.stop_after is not None and len(row.prefix) >= row.stop_after:
        end = row.stop_after if end is None else min(end, row.stop_after)
    row.stop_checked = len(row.prefix)
    if end is not None:
        row.stop_at = end if check.keep is None else max(end, check.keep)
        row.done = True


@dataclass(frozen=True)
class RowTiming:
    latency: list[float]  # per row, see GenerationOutput.row_latency_seconds
    share: list[float]  # per row, see GenerationOutput.row_share_seconds


def collect(
    rows,
    mask_id,
    timing: RowTiming,
    nfe: int,
    forward_seconds: float,
    wall_seconds: float,
    end_ids: frozenset[int],
) -> GenerationOutput:
    """The ``GenerationOutput`` of finished rows, in the order given (``end_ids``: the ids that
    are not text, ``end_token_ids``)."""
    output_ids, new_ids, new_confidences = [], [], []
    for row in rows:
        kept = row.generated if row.stop_at is None else row.generated[: row.stop_at]
        new = [row.tokens[s] for s in kept if row.tokens[s] != mask_id]
        new_confidences.append([row.confidence[s] for s in kept if row.tokens[s] != mask_id])
        if row.infill:
            output = [t for t in row.tokens if t != mask_id]
        else:
            output = row.tokens[: row.prompt_length] + new
        output_ids.append(output)
        new_ids.append(new)
    return GenerationOutput(
        output_ids=output_ids,
        new_token_ids=new_ids,
        new_token_confidences=new_confidences,
        num_generated=[len(n) for n in new_ids],
        num_content=[content_tokens(n, end_ids) for n in new_ids],
        row_forwards=[row.forwards for row in rows],
        row_steps=[row.steps for row in rows],
        row_positions=[row.positions_evaluated for row in rows],
        parallelism=[parallelism_factor(row.committed, row.steps) for row in rows],
        stopped=[row.stop_at is not None for row in rows],
        row_latency_seconds=list(timing.latency),
        row_share_seconds=list(timing.share),
        nfe=nfe,
        forward_seconds=forward_seconds,
        wall_seconds=wall_seconds,
    )
