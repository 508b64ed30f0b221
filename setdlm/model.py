"""Set Diffusion (SetDLM): decode arbitrarily ordered sets of tokens, caching after every step.

config -> mask (set-causal over a sampled staggered order) -> loss (any-order AR over that
order, SPEC 1.3) -> decoding policy (a sliding window of W positions at the leftmost mask; the
tokens committed in one step enter the KV cache in the next step's forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from setdlm.core import masks
from setdlm.core.decoding import (
    DecodeConfig,
    OrderPolicy,
    PolicyOptions,
    RowInputs,
    RowState,
    StopCheck,
)
from setdlm.core.decoding.config import check_size
from setdlm.core.decoding.sampling import tokens_per_step
from setdlm.core.family import SUBS_MASKED_LOGIT, Family, per_sequence_mean
from setdlm.core.outputs import LossOutput


class SetDLM(Family):
    @property
    def schedule(self):
        return self.config.schedule

    def loss(self, batch, *, generator=None, randomness=None) -> LossOutput:
        """Mean NLL of every target token given the tokens before it in one staggered order.

        randomness may give ``order`` (B, L) or ``first_hitting_times`` (B, L); otherwise the
        first-hitting times are drawn from ``generator``. Every target is masked in the noisy
        stream, so the value of t plays no role (there is no time weighting).
        """
        randomness = randomness or {}
        ids, attention, context = self.batch_tensors(batch)  # (B, L) each
        targets = attention & ~context  # (B, L)
        order = self._order(targets, generator, randomness)  # (B, L): positions, in order
        mask_id = self.config.mask_token_id
        # Every target is masked in the noisy stream; the set-causal mask decides what each
        # one sees of the clean stream: the tokens before it in the order (any-order AR).
        noisy = torch.where(targets, mask_id, ids)  # (B, L)
        clean_in_order = ids.gather(1, order)  # (B, L)
        inputs = torch.cat([clean_in_order, noisy.gather(1, order)], dim=1)  # (B, 2L)
        positions = order.repeat(1, 2)  # true positions, so RoPE is order-independent
        length = ids.shape[1]
        mask = masks.with_padding(
            masks.set_causal_mask(length, device=ids.device), attention.gather(1, order)
        )  # (B, 2L, 2L)
        logits = self.backbone(inputs, positions, mask)[:, length:].float()  # (B, L, V)
        logits[..., mask_id] = SUBS_MASKED_LOGIT  # never predict the mask token
        log_probs = torch.log_softmax(logits, dim=-1)
        target_log_probs = log_probs.gather(-1, clean_in_order[..., None]).squeeze(-1)  # (B, L)
        token_mask = self._token_mask(targets, order, clean_in_order)  # (B, L - start)
        start = ids.shape[1] - token_mask.shape[1]  # 1 where a kept BOS is not scored
        nlls = -target_log_probs[:, start:] * token_mask  # (B, L - start)
        loss = per_sequence_mean(nlls, token_mask.sum(dim=-1))
        extras = {"order": order, "target_log_probs": target_log_probs}
        return LossOutput(loss, nlls, token_mask, extras)

    def _order(self, targets, generator, randomness) -> torch.Tensor:
        if "order" in randomness:
            return torch.as_tensor(randomness["order"], device=targets.device)
        permute = targets.clone()
        if self.config.keep_clean_bos:
            permute[:, 0] = False  # BOS stays first, in the clean stream of every order
        if not permute.any():
            # Nothing to order; the official code makes no random draw in this case either.
            return torch.arange(targets.shape[1], device=targets.device).expand_as(targets)
        times = randomness.get("first_hitting_times")  # (B, L)
        if times is None:
            times = self.schedule.first_hitting_times(len(targets), generator=generator)
        # decoded first = hit first: the staggered schedule's order, targets only permuted
        return self.schedule.order(torch.as_tensor(times).to(targets.device), permute)

    def _token_mask(self, targets, order, clean_in_order) -> torch.Tensor:
        """Which loss terms count, in the permuted order of the loss terms.

        In eval with keep_clean_bos the BOS term (first in every order) is dropped. The
        official code keeps the target mask in the original order and, in eval, also drops
        every term whose token equals the pad id (a real EOS when pad == eos); official_compat
        reproduces that, otherwise the mask is permuted along with the terms.
        """
        drop_bos = self.config.keep_clean_bos and not self.training
        start = 1 if drop_bos else 0
        if self.config.official_compat:
            token_mask = targets[:, start:].float()
            if not self.training:
                token_mask = token_mask * (clean_in_order[:, start:] != self.config.pad_token_id)
            return token_mask
        return targets.gather(1, order)[:, start:].float()


@dataclass(frozen=True)
class SlidingWindowOptions(PolicyOptions):
    name = "sliding-window"
    flat_identity = True
    window: int | None = None  # W; None: the schedule's d (the paper's setting)
    # Infilling: cache both contexts before decoding ("full", the paper's setting, the
    # official cache_full_infill_context=true), or the left one only ("prefix", the official
    # default): visible tokens between masked spans then enter the cache once decoding has
    # passed them (the official l2r promotion), and the right context after the last span is
    # never seen.
    infill_cache: Literal["full", "prefix"] = "full"
    # Tokens committed in one step enter the cache in a sampled first-hitting order.
    fht_cache_order: bool = False

    def __post_init__(self):
        check_size("window", self.window)
        if self.infill_cache not in ("full", "prefix"):
            raise ValueError(f"infill_cache must be 'full' or 'prefix', got {self.infill_cache!r}")


@dataclass
class WindowState:
    """Where a row is in its sliding-window decoding."""

    per_step: list[int]  # tokens each step must commit at least
    hitting: dict[int, float] | None  # slot -> first-hitting time (fht_cache_order), or None
    pending: list[int] = field(default_factory=list)  # committed last step, not cached yet
    leftmost: int = 0  # index into row.generated of the leftmost mask
    step: int = 0  # sampler steps taken (forwards that predicted)
    # visible or committed slots in the cache, or promoted to it
    flagged: set[int] = field(default_factory=set)


class SlidingWindowPolicy(OrderPolicy):
    """The masked positions inside a window of W slots starting at the leftmost mask are
    denoised together; each step commits the most confident one(s) plus every one above τ.
    Tokens committed at step i are fed again at step i + 1 as clean inputs, causally among
    themselves, so that one forward both writes them to the cache and denoises the window.

    first_hitting_times: optional per-row vectors over the generated slots (replayed from a
    recording); otherwise they are drawn from the row's generator when fht_cache_order is on.
    """

    Options = SlidingWindowOptions

    def __init__(self, family, config: DecodeConfig, options=None, first_hitting_times=None):
        super().__init__(family, config, options)
        schedule = family.config.schedule
        self.window = min(schedule.window_size(), self.options.window or schedule.d)
        self.crop_by_position = self.options.fht_cache_order
        self.first_hitting_times = first_hitting_times

    def setup(self, row: RowState) -> None:
        hitting = None
        if self.options.fht_cache_order:
            if self.first_hitting_times is not None:
                times = list(self.first_hitting_times[row.index])
            else:
                times = self._sample_hitting_times(len(row.generated), row.generator)
            hitting = dict(zip(row.generated, times, strict=True))
        row.policy = WindowState(
            tokens_per_step(len(row.generated), self.config.num_steps), hitting
        )

    def _sample_hitting_times(self, count: int, generator) -> list[float]:
        """First-hitting times of ``count`` generated positions, drawn from the schedule.

        A generation longer than the schedule's N positions gets one draw per span of N,
        each span shifted one unit of time later, so that spans keep their left-to-right order.
        """
        schedule = self.family.config.schedule
        generator = generator or torch.Generator().manual_seed(0)
        times = []
        for span, start in enumerate(range(0, count, schedule.N)):
            length = min(schedule.N, count - start)
            draw = schedule.first_hitting_times(1, generator=generator, length=length)[0]
            times += (draw - span).tolist()
        return times

    def prefill(self, row: RowState) -> RowInputs | None:
        """Cache the visible tokens causally in order: the prompt, or, when infilling, both
        contexts (``infill_cache="full"``) or the left one only (``"prefix"``)."""
        mask_id = self.family.config.mask_token_id
        end = row.prompt_length
        if row.infill and self.options.infill_cache == "prefix":
            end = row.generated[0]
        context = [s for s in range(end) if row.tokens[s] != mask_id]
        context = context[-self.family.config.length :]
        row.policy.flagged.update(context)
        if not context:
            return None
        return RowInputs(context, masks.causal_mask(len(context)), len(context))

    def plan(self, row: RowState) -> RowInputs | None:
        state = row.policy
        mask_id = self.family.config.mask_token_id
        generated = row.generated
        while state.leftmost < len(generated) and row.tokens[generated[state.leftmost]] != mask_id:
            state.leftmost += 1
        if state.leftmost == len(generated):
            return None  # done; the last commits are never cached: nothing would read them
        window_end = row.positions[generated[state.leftmost]] + self.window
        active = []
        for slot in generated[state.leftmost :]:
            if row.positions[slot] >= window_end:
                break
            if row.tokens[slot] == mask_id:
                active.append(slot)
        pending = state.pending
        attend = masks.clean_then_noisy_mask(
            len(pending), len(active), clean_causal=True, noisy_see_each_other=False
        )
        targets = [(len(pending) + i, slot) for i, slot in enumerate(active)]
        quota = state.per_step[state.step] if state.step < len(state.per_step) else 1
        return RowInputs(pending + active, attend, len(pending), targets, k=quota)

    def observe(self, row: RowState, committed: list[int]) -> None:
        state = row.policy
        # sampler steps are the forwards that predicted (the prompt-cache forward comes here too)
        state.step = row.steps
        cached_now = state.pending  # fed as clean inputs to this forward, so now in the cache
        state.flagged.update(cached_now)
        if state.hitting is None:
            state.pending = sorted(committed)
        else:  # as in training, ties within a set are broken by first-hitting time
            state.pending = sorted(committed, key=lambda s: (-state.hitting[s], s))
        if row.infill and self.options.infill_cache == "prefix":
            self._promote(row, cached_now + committed)

    def _promote(self, row: RowState, passed: list[int]) -> None:
        """Prefix-only infilling (the official ``l2r`` promotion): once decoding has committed
        or cached a position, every visible token left of it that is not cached yet joins the
        next forward's clean inputs (in position order, with the commits) and so the cache. The
        right context after the last masked span is never passed, so it is never seen."""
        mask_id = self.family.config.mask_token_id
        state = row.policy
        if not passed or all(row.tokens[s] != mask_id for s in row.generated):
            return
        frontier = max(row.positions[s] for s in passed)
        waiting = set(state.pending)
        promoted = [
            s
            for s in range(len(row.tokens))
            if row.positions[s] <= frontier
            and row.tokens[s] != mask_id
            and s not in state.flagged
            and s not in waiting
        ]
        if promoted:
            state.flagged.update(promoted)
            state.pending = sorted(state.pending + promoted, key=lambda s: row.positions[s])

    def official_stop_check(self, row: RowState) -> StopCheck:
        """The official sampler runs its stopping criteria after step i when i % W == 0 and
        i > 0 (steps counted from 0, the prompt-cache forward excluded), unless nothing is left
        to decode, on its canvas up to the end of the window (leftmost mask + W), and
        truncates there."""
        mask_id = self.family.config.mask_token_id
        step = row.steps - 1
        open_slots = [s for s in row.generated if row.tokens[s] == mask_id]
        if step == 0 or step % self.window or not open_slots:
            return StopCheck(due=False)
        window_end = row.positions[open_slots[0]] + self.window
        return StopCheck(
            due=True, keep=sum(1 for s in row.generated if row.positions[s] < window_end)
        )
