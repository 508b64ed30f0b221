"""Masked diffusion (MDLM): tokens revealed in a uniformly random order, no KV cache.

config -> mask (bidirectional) -> loss (SUBS NELBO, one t per sequence) -> decoding policy
(semi-autoregressive blocks over the full canvas, a bidirectional forward every step).
"""

from __future__ import annotations

from dataclasses import dataclass

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
from setdlm.core.family import Family, per_sequence_mean, subs_log_probs
from setdlm.core.outputs import LossOutput
from setdlm.core.schedules import sample_t


class MDLM(Family):
    def loss(self, batch, *, generator=None, randomness=None) -> LossOutput:
        """Train: CE over masked targets / #masked. Eval: NELBO, sum of (1/t)·CE / #targets.

        randomness may give ``t`` ((B,) or (B, L)) and ``x_t`` (the noised input); whatever is
        not given is drawn from ``generator``.
        """
        ids, attention, context = self.batch_tensors(batch)  # (B, L) each
        t, x_t = self._noise(ids, attention, context, generator, randomness or {})  # (B, L) each
        mask = self._attention(attention, context)  # (B, L, L)
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        logits = self.backbone(x_t, positions, mask, timesteps=self._conditioning(t))  # (B, L, V)
        return self._subs_loss(ids, x_t, t, attention, context, logits)

    # The pieces below are shared with BD3LM, which only changes the noise blocks and the mask.
    def _noise(self, ids, attention, context, generator, randomness):
        t = randomness.get("t")
        if t is None:
            t = sample_t(
                ids.shape[0], ids.shape[1], self._noise_block(), self.config.schedule.eps, generator
            )
        t = torch.as_tensor(t, device=ids.device, dtype=torch.float32)
        t_per_token = t[:, None].expand(ids.shape) if t.ndim == 1 else t  # (B, L)
        x_t = randomness.get("x_t")
        if x_t is None:
            x_t = self._mask_tokens(ids, attention, context, t_per_token, generator)
        return t_per_token, torch.as_tensor(x_t, device=ids.device)

    def _noise_block(self) -> int | None:
        return None  # one t per sequence

    def _mask_tokens(self, ids, attention, context, t, generator):
        """Mask each target token independently with probability t (SPEC 1.4)."""
        draw = uniform(ids.shape, generator, ids.device)
        masked = (draw < t) & attention & ~context  # (B, L): padding and prompt stay clean
        if self.config.keep_clean_bos:  # the LM1B/OWT recipe: chunks start with a clean BOS
            masked[:, 0] = False
        return torch.where(masked, self.config.mask_token_id, ids)

    def _attention(self, attention, context):
        length = attention.shape[1]
        if (
            self.config.official_compat
            and self.config.backbone_kind == "qwen3"
            and attention.all()
            and not context.any()
        ):
            # Official quirk (SPEC 8.3.2): no mask is passed, and Qwen3 then runs causally.
            return masks.causal_mask(length, device=attention.device).expand(len(attention), -1, -1)
        return masks.with_padding(
            masks.bidirectional_mask(length, device=attention.device), attention
        )

    def _conditioning(self, t):
        del t  # time-agnostic: the official denoisers condition adaLN on sigma = 0
        return None

    def _subs_loss(self, ids, x_t, t, attention, context, logits) -> LossOutput:
        length = ids.shape[1]
        # the last L positions: BD3LM's backbone returns [clean | noisy], 2L of them
        log_probs = subs_log_probs(logits[:, -length:], x_t, self.config.mask_token_id)
        target_log_probs = log_probs.gather(-1, ids[..., None]).squeeze(-1)  # (B, L)
        targets = attention & ~context  # (B, L)
        if self.training and self.config.train_on_context:  # the prompt is learned too
            targets = attention
        masked = x_t == self.config.mask_token_id  # (B, L)
        # A kept clean BOS is never scored in eval (it was never masked, so it says nothing).
        start = 1 if (self.config.keep_clean_bos and not self.training) else 0
        token_mask = targets[:, start:].float()  # (B, L - start)
        ce = -target_log_probs[:, start:] * token_mask  # (B, L - start)
        # The NELBO terms: -alpha'/(1 - alpha) = 1/t times the cross-entropy of each target.
        nlls = ce * self.config.schedule.loss_weight(t[:, start:])
        if self.training:  # training minimizes the unweighted CE per masked token
            loss = per_sequence_mean(ce, masked[:, start:].sum(dim=-1).float())
        else:
            loss = per_sequence_mean(nlls, token_mask.sum(dim=-1))
        extras = {"t": t, "x_t": x_t, "target_log_probs": target_log_probs}
        return LossOutput(loss, nlls, token_mask, extras)


@dataclass(frozen=True)
class SemiAutoregressiveOptions(PolicyOptions):
    name = "semi-ar"
    flat_identity = True
    block_size: int | None = None  # decoding block; None: the whole model length

    def __post_init__(self):
        check_size("block_size", self.block_size)


@dataclass
class BlockState:
    """Where a row is in its decoding blocks (semi-AR MDLM and the block policies)."""

    blocks: list[list[int]]  # canvas slots of each decoding block, left to right
    per_step: list[int]  # tokens each step of a block must commit at least
    current: int = 0  # index of the block being decoded
    step: int = 0  # steps taken in the current block
    finished_end: int | None = None  # end slot of a block the last forward finished


class SemiAutoregressivePolicy(OrderPolicy):
    """Blocks of B positions left to right; each step is a bidirectional forward over the
    canvas (padded with mask tokens up to the model length, as in training) that decodes the
    current block's most confident masked positions. Nothing is cached."""

    Options = SemiAutoregressiveOptions
    uses_cache = False

    def __init__(self, family, config: DecodeConfig, options=None):
        super().__init__(family, config, options)
        self.block = self.options.block_size or family.config.length
        self.length = family.config.length

    def setup(self, row: RowState) -> None:
        mask_id = self.family.config.mask_token_id
        if len(row.tokens) < self.length:
            row.tokens.extend([mask_id] * (self.length - len(row.tokens)))
            row.positions = list(range(len(row.tokens)))
        blocks = decode_blocks(row, self.block, self.config)
        if self.config.official_compat and not row.infill:
            # The official canvas is padded to the model length with the generation pad token,
            # which the official runs set to the mask token: the padding inside the blocks it
            # opens is decoded as well. A budget that does not end on a block boundary then
            # yields more tokens (and forwards) than max_new_tokens; they count as generated.
            row.generated = [s for block in blocks for s in block if s >= row.prompt_length]
        row.policy = BlockState(blocks, tokens_per_step(self.block, self.config.num_steps))

    def plan(self, row: RowState) -> RowInputs | None:
        state = row.policy
        mask_id = self.family.config.mask_token_id
        while state.current < len(state.blocks):
            block = state.blocks[state.current]
            masked = [s for s in block if row.tokens[s] == mask_id]
            if masked:
                break
            state.current, state.step = state.current + 1, 0
        else:
            return None
        end = max(block) + 1
        first = max(0, min(end, len(row.tokens)) - self.length) if end > self.length else 0
        slots = list(range(first, min(first + self.length, len(row.tokens))))
        targets = [(s - first, s) for s in masked]
        return RowInputs(slots, None, 0, targets, k=step_quota(state), ranked=block)

    def observe(self, row: RowState, committed: list[int]) -> None:
        del committed
        state = row.policy
        state.step += 1
        block = state.blocks[state.current]
        mask_id = self.family.config.mask_token_id
        if all(row.tokens[s] != mask_id for s in block):
            state.finished_end = block[-1] + 1

    def official_stop_check(self, row: RowState) -> StopCheck:
        return block_end_stop_check(row)


def decode_blocks(row: RowState, block_size: int, config: DecodeConfig) -> list[list[int]]:
    """The canvas slots of each decoding block (shared by MDLM and BD3LM).

    Blocks sit at multiples of ``block_size`` in absolute position (where the model was
    trained to see block boundaries), from the block holding the first generated slot. By
    default they cover the generated region exactly (the last one may be partial). With
    official_compat there are ceil(max_new_tokens / block) of them from the aligned start, as
    in the official sampler, cut at the end of the canvas: fewer new tokens than the budget
    when the prompt does not start on a boundary, and, for MDLM, whose canvas runs on to the
    model length, possibly more. Infilling blocks cover the input and are kept only where
    they hold masked slots.
    """
    if not row.generated:
        return []
    start = block_size * (row.generated[0] // block_size)
    if row.infill:
        end = row.prompt_length
    elif config.official_compat:
        count = -(-config.max_new_tokens // block_size)
        end = min(start + count * block_size, len(row.tokens))
    else:
        end = row.generated[-1] + 1
    # official_compat: every slot after the prompt is a masked canvas slot, the padding too
    to_decode = set(row.generated) if row.infill or not config.official_compat else None
    blocks = []
    for block_start in range(start, end, block_size):
        slots = list(range(block_start, min(block_start + block_size, end)))
        if (slots[-1] >= row.prompt_length) if to_decode is None else to_decode.intersection(slots):
            blocks.append(slots)
    return blocks


def block_end_stop_check(row: RowState) -> StopCheck:
    """The official MDLM/BD3LM samplers run their stopping criteria once a block is finished,
    on the canvas up to its end, and truncate there (shared by MDLM and BD3LM)."""
    end, row.policy.finished_end = row.policy.finished_end, None
    if end is None:
        return StopCheck(due=False)
    return StopCheck(due=True, keep=sum(1 for s in row.generated if s < end))


def uniform(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """U[0, 1) draws from ``generator`` (on its own device), moved to ``device``."""
    source = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=source).to(device)


def step_quota(state: BlockState) -> int:
    """Tokens the current step must commit at least (the linear schedule; 1 when exhausted)."""
    return state.per_step[state.step] if state.step < len(state.per_step) else 1
