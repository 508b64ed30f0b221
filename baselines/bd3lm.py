"""Block diffusion (BD3LM): blocks of S left to right, random order inside a block, the block
cache committed in the first forward of the next block.

config -> mask (two-stream block-diffusion mask) -> loss (SUBS NELBO, one t per block, the
vectorized 2L forward) -> decoding policy (blocks with a KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from setdlm.baselines.mdlm import (
    MDLM,
    BlockState,
    block_end_stop_check,
    decode_blocks,
    step_quota,
    uniform,
)
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
from setdlm.core.outputs import LossOutput


class BD3LM(MDLM):
    def loss(self, batch, *, generator=None, randomness=None) -> LossOutput:
        """MDLM's SUBS loss on the noisy half of concat(x0, x_t), one t per block of S.

        In training a block left with no masked token gets a random subset re-masked (the
        official ``_ensure_no_unmasked_blocks``), unless ``x_t`` is given in ``randomness``.
        """
        randomness = dict(randomness or {})
        ids, attention, context = self.batch_tensors(batch)  # (B, L) each
        t, x_t = self._noise(ids, attention, context, generator, randomness)  # (B, L) each
        if self.training and "x_t" not in randomness:
            # a block with nothing masked would teach nothing this step (official behaviour)
            x_t = self._remask_clean_blocks(ids, x_t, context | ~attention, generator)
        length = ids.shape[1]
        # One forward for every block: the clean stream x0 supplies each block's context (the
        # blocks before it), the noisy stream x_t is denoised (the vectorized 2L training).
        inputs = torch.cat([ids, x_t], dim=1)  # (B, 2L)
        positions = torch.arange(length, device=ids.device).repeat(2).expand(len(ids), -1)
        mask = masks.with_padding(
            masks.two_stream_mask(length, self.config.block_size, device=ids.device), attention
        )  # (B, 2L, 2L)
        logits = self.backbone(inputs, positions, mask, timesteps=self._conditioning(t))
        return self._subs_loss(ids, x_t, t, attention, context, logits)

    def _noise_block(self) -> int | None:
        return self.config.block_size

    def _remask_clean_blocks(self, ids, x_t, frozen, generator):
        """Re-mask 1..S random tokens of every block that has no masked and no frozen token.

        The draws have the official shapes (an extra block of padding is appended even when
        L is a multiple of S), so a generator seeded like the official global RNG replays it.
        """
        size = self.config.block_size
        batch, length = x_t.shape
        pad = size - length % size
        mask_id = self.config.mask_token_id
        padded = torch.cat([x_t, x_t.new_full((batch, pad), self.config.pad_token_id)], dim=1)
        frozen = torch.cat([frozen, frozen.new_zeros(batch, pad)], dim=1)
        blocks = padded.shape[1] // size
        # (B, blocks): a block with no masked and no frozen (prompt, padding) token
        untouched = ((padded == mask_id) | frozen).view(batch, blocks, size).sum(-1) == 0
        if not untouched.any():
            return x_t
        source = generator.device if generator is not None else x_t.device
        # re-mask count + 1 positions of each block (count in [0, S)), chosen by a random order
        count = torch.randint(0, size, untouched.shape, generator=generator, device=source)
        order = torch.argsort(
            uniform((batch, blocks * size), generator, x_t.device).view(batch, blocks, size),
            dim=-1,
            stable=True,
        )  # (B, blocks, S)
        chosen = (order <= count.to(x_t.device)[..., None]).view(batch, -1)  # (B, blocks * S)
        chosen &= untouched.repeat_interleave(size, dim=1)
        padded = torch.where(chosen, mask_id, padded)
        if self.config.keep_clean_bos:
            padded[:, 0] = ids[:, 0]
        return padded[:, :length]


@dataclass(frozen=True)
class BlockCacheOptions(PolicyOptions):
    name = "block-cache"
    flat_identity = True
    block_size: int | None = None  # decoding block; None: the trained block size S
    # Cache a finished block inside the next block's first forward (saves one NFE per block).
    fused_block_cache: bool = True

    def __post_init__(self):
        check_size("block_size", self.block_size)


@dataclass
class BlockCacheState(BlockState):
    pending: list[int] = field(default_factory=list)  # a finished block not yet cached
    sending_pending: bool = False  # the planned forward caches ``pending``
    cache_only: bool = False  # the planned forward only caches (fused_block_cache off)
    predicted: int = 0  # the row's forwards with predictions, at the last observe


class BlockCachePolicy(OrderPolicy):
    """Decode block after block; inside a block, each step sees the cache plus the whole
    block (bidirectionally) and commits its most confident masked positions. A finished block
    enters the cache in the next block's first forward (fused), or in a forward of its own."""

    Options = BlockCacheOptions

    def __init__(self, family, config: DecodeConfig, options=None):
        super().__init__(family, config, options)
        self.block = self.options.block_size or family.config.block_size

    def setup(self, row: RowState) -> None:
        row.policy = BlockCacheState(
            decode_blocks(row, self.block, self.config),
            tokens_per_step(self.block, self.config.num_steps),
        )

    def prefill(self, row: RowState) -> RowInputs | None:
        """Cache the context outside the decoding blocks, block-causally (as trained)."""
        mask_id = self.family.config.mask_token_id
        in_blocks = {s for block in row.policy.blocks for s in block}
        context = [
            s for s in range(row.prompt_length) if s not in in_blocks and row.tokens[s] != mask_id
        ]
        context = context[-self.family.config.length :]
        if not context:
            return None
        block_ids = torch.tensor([row.positions[s] for s in context]) // self.block
        attend = block_ids[None, :] <= block_ids[:, None]
        return RowInputs(context, attend, len(context))

    def plan(self, row: RowState) -> RowInputs | None:
        state = row.policy
        if state.current >= len(state.blocks):
            return None  # the last block is never cached: nothing would read it
        pending = state.pending
        state.sending_pending = bool(pending)
        state.cache_only = bool(pending) and not self.options.fused_block_cache
        if state.cache_only:
            return RowInputs(pending, None, len(pending))  # a finished block sees itself whole
        block = state.blocks[state.current]
        mask_id = self.family.config.mask_token_id
        attend = masks.clean_then_noisy_mask(
            len(pending), len(block), clean_causal=False, noisy_see_each_other=True
        )
        targets = [(len(pending) + i, s) for i, s in enumerate(block) if row.tokens[s] == mask_id]
        return RowInputs(
            pending + block, attend, len(pending), targets, k=step_quota(state), ranked=block
        )

    def observe(self, row: RowState, committed: list[int]) -> None:
        del committed
        state = row.policy
        if state.sending_pending:
            state.pending = []
        # the prompt-cache and cache-only forwards predict nothing: they are not sampler steps
        predicted, state.predicted = row.steps > state.predicted, row.steps
        if not predicted:
            return
        state.step += 1
        block = state.blocks[state.current]
        mask_id = self.family.config.mask_token_id
        if all(row.tokens[s] != mask_id for s in block):
            state.pending, state.current, state.step = block, state.current + 1, 0
            state.finished_end = block[-1] + 1

    def official_stop_check(self, row: RowState) -> StopCheck:
        return block_end_stop_check(row)
